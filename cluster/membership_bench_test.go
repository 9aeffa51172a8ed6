package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/edgedio/edged/internal/testutil"
)

// benchNode is one member of a benchmark cluster.
type benchNode struct {
	m     *Membership
	stall *stallTransport // nil unless the node's network can be stalled
}

// benchCluster is n members of one profile on 127.0.0.1, each joined
// through every earlier one; memberlist's log lines of all of them are
// counted in lines.
type benchCluster struct {
	nodes []benchNode
	lines *lineCounter
}

// startCluster starts n members of profile p and waits until every one
// sees all n. With stallable, the last member's network can be stalled.
func startCluster(p Profile, n int, stallable bool) (*benchCluster, error) {
	c := &benchCluster{lines: &lineCounter{}}
	var addrs []string
	for i := range n {
		cfg := MembershipConfig{
			Meta:     Meta{ID: fmt.Sprintf("n%d", i), Transport: "127.0.0.1:7000", Capacity: 1},
			BindAddr: "127.0.0.1", Peers: slices.Clone(addrs), Profile: p,
			Logger: slog.New(c.lines),
		}
		var st *stallTransport
		if stallable && i == n-1 {
			cfg.wrapTransport = func(t memberlist.NodeAwareTransport) memberlist.NodeAwareTransport {
				st = newStallTransport(t)
				return st
			}
		}
		m, err := NewMembership(cfg)
		if err == nil {
			err = m.Start()
		}
		if err != nil {
			c.shutdown()
			return nil, err
		}
		c.nodes = append(c.nodes, benchNode{m: m, stall: st})
		addrs = append(addrs, m.Addr())
	}
	if !testutil.Within(testutil.DefaultTimeout, func() bool {
		for _, nd := range c.nodes {
			if len(nd.m.Members()) != n {
				return false
			}
		}
		return true
	}) {
		c.shutdown()
		return nil, fmt.Errorf("%s: %d members did not all see each other", p, n)
	}
	for _, nd := range c.nodes {
		nd.m.Drain() // the joins
	}
	return c, nil
}

func (c *benchCluster) shutdown() {
	for _, nd := range c.nodes {
		_ = nd.m.Shutdown()
	}
}

// awaitEvent drains m's events until one of kind for node arrives, or
// the timeout passes.
func awaitEvent(m *Membership, kind EventKind, node string, timeout time.Duration) (Event, error) {
	deadline := time.After(timeout)
	for {
		for _, ev := range m.Drain() {
			if ev.Kind == kind && ev.Node.ID == node {
				return ev, nil
			}
		}
		select {
		case <-m.Events():
		case <-deadline:
			return Event{}, fmt.Errorf("no %v event for %s within %v", kind, node, timeout)
		}
	}
}

// detection is one crash and what the survivors saw.
type detection struct {
	first, all time.Duration // until the first survivor, and every one, declared the node dead
}

// measureDetection starts n members of profile p, stops the last one
// without a leave (its gossip stops, its sockets close: what the others
// see of a SIGKILL) and returns how long until the others declare it
// dead.
func measureDetection(p Profile, n int) (detection, error) {
	c, err := startCluster(p, n, false)
	if err != nil {
		return detection{}, err
	}
	defer c.shutdown()
	victim := c.nodes[n-1].m
	killed := time.Now()
	if err := victim.Shutdown(); err != nil {
		return detection{}, err
	}
	var d detection
	for i, nd := range c.nodes[:n-1] {
		ev, err := awaitEvent(nd.m, MemberFailed, victim.cfg.Meta.ID, testutil.DefaultTimeout)
		if err != nil {
			return detection{}, fmt.Errorf("%s: %w", p, err)
		}
		took := ev.At.Sub(killed)
		if i == 0 || took < d.first {
			d.first = took
		}
		d.all = max(d.all, took)
	}
	return d, nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// BenchmarkFailureDetection measures the time from a member's crash to
// every other member declaring it dead, with three members on loopback,
// for the device profile and, in the same iteration (concurrently), for
// memberlist's LAN default. detection_ms is the device profile's mean,
// max_detection_ms its worst iteration, default_detection_ms the LAN
// default's mean, ratio_vs_default their quotient; first_ms is the device
// profile's mean time until the first member declared it dead.
func BenchmarkFailureDetection(b *testing.B) {
	const members = 3
	var dev, lan []detection
	for b.Loop() {
		var wg sync.WaitGroup
		var derr, lerr error
		var d, l detection
		wg.Go(func() { d, derr = measureDetection(ProfileDevice, members) })
		wg.Go(func() { l, lerr = measureDetection(ProfileLAN, members) })
		wg.Wait()
		if err := errors.Join(derr, lerr); err != nil {
			b.Fatal(err)
		}
		dev, lan = append(dev, d), append(lan, l)
	}
	mean := func(ds []detection, f func(detection) time.Duration) float64 {
		var sum time.Duration
		for _, d := range ds {
			sum += f(d)
		}
		return ms(sum) / float64(len(ds))
	}
	all := func(d detection) time.Duration { return d.all }
	worst := slices.MaxFunc(dev, func(a, b detection) int { return int(a.all - b.all) })
	b.ReportMetric(mean(dev, all), "detection_ms")
	b.ReportMetric(ms(worst.all), "max_detection_ms")
	b.ReportMetric(mean(dev, func(d detection) time.Duration { return d.first }), "first_ms")
	b.ReportMetric(mean(lan, all), "default_detection_ms")
	b.ReportMetric(mean(dev, all)/mean(lan, all), "ratio_vs_default")
}

// fpPeriod is how long BenchmarkFalsePositives watches each cluster:
// EDGED_FP_PERIOD (a Go duration), default one minute.
func fpPeriod(b *testing.B) time.Duration {
	s := os.Getenv("EDGED_FP_PERIOD")
	if s == "" {
		return time.Minute
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		b.Fatalf("EDGED_FP_PERIOD: %v", err)
	}
	return d
}

// BenchmarkFalsePositives runs three members of the device profile, and
// three of memberlist's LAN default beside them, for a fixed period
// (EDGED_FP_PERIOD, default 1 min) with no failure, under CPU contention
// (burn=N: testutil.Burn with N spinning goroutines, on top of whatever
// else the machine runs), and counts the members wrongly declared dead
// (false_dead, summed over the members' views: a member seen dead by
// both others counts twice) and the suspicions that preceded them or
// were refuted in time (suspicions, from memberlist's log).
func BenchmarkFalsePositives(b *testing.B) {
	period := fpPeriod(b)
	for _, burn := range []int{2, 8} {
		b.Run(fmt.Sprintf("burn=%d", burn), func(b *testing.B) {
			testutil.Burn(b, burn)
			var devDead, devSusp, lanDead, lanSusp, runs int
			for b.Loop() {
				dev, err := startCluster(ProfileDevice, 3, false)
				if err != nil {
					b.Fatal(err)
				}
				lan, err := startCluster(ProfileLAN, 3, false)
				if err != nil {
					dev.shutdown()
					b.Fatal(err)
				}
				dev.lines.reset()
				lan.lines.reset()
				time.Sleep(period) // the observation window, not a synchronisation
				for _, c := range []*benchCluster{dev, lan} {
					dead := 0
					for _, nd := range c.nodes {
						for _, ev := range nd.m.Drain() {
							if ev.Kind == MemberFailed || ev.Kind == MemberLeft {
								dead++
								b.Logf("false positive: %s declared dead at %v", ev.Node.ID, ev.At.Format(time.TimeOnly))
							}
						}
					}
					if c == dev {
						devDead, devSusp = devDead+dead, devSusp+c.lines.suspicions()
					} else {
						lanDead, lanSusp = lanDead+dead, lanSusp+c.lines.suspicions()
					}
					c.shutdown()
				}
				runs++
			}
			b.ReportMetric(float64(devDead)/float64(runs), "false_dead")
			b.ReportMetric(float64(devSusp)/float64(runs), "suspicions")
			b.ReportMetric(float64(lanDead)/float64(runs), "default_false_dead")
			b.ReportMetric(float64(lanSusp)/float64(runs), "default_suspicions")
			b.ReportMetric(period.Seconds(), "period_s")
		})
	}
}

// BenchmarkStallTolerance stalls one of three device-profile members (no
// packet in or out for stall=D, as a process frozen by swap or a long
// pause would be; the kernel keeps what arrives meanwhile) and reports the
// fraction of iterations in which the others declared it dead: the
// profile's side of the trade between detection time and false
// positives.
func BenchmarkStallTolerance(b *testing.B) {
	for _, stall := range []time.Duration{250 * time.Millisecond, 500 * time.Millisecond, 750 * time.Millisecond, time.Second, 1500 * time.Millisecond} {
		b.Run("stall="+stall.String(), func(b *testing.B) {
			dead, runs := 0, 0
			for b.Loop() {
				c, err := startCluster(ProfileDevice, 3, true)
				if err != nil {
					b.Fatal(err)
				}
				v := c.nodes[2]
				v.stall.stall(stall)
				// Watch until the stall is over and a full suspicion
				// timeout and probe round more.
				_, err = awaitEvent(c.nodes[0].m, MemberFailed, v.m.cfg.Meta.ID, stall+time.Second)
				if err == nil {
					dead++
				}
				c.shutdown()
				runs++
			}
			b.ReportMetric(float64(dead)/float64(runs), "dead_fraction")
		})
	}
}

// lineCounter is a slog.Handler that counts memberlist's suspicions.
type lineCounter struct{ suspect atomic.Int64 }

func (c *lineCounter) Enabled(context.Context, slog.Level) bool { return true }
func (c *lineCounter) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, "memberlist: Suspect ") {
		c.suspect.Add(1)
	}
	return nil
}
func (c *lineCounter) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c *lineCounter) WithGroup(string) slog.Handler      { return c }
func (c *lineCounter) suspicions() int                    { return int(c.suspect.Load()) }
func (c *lineCounter) reset()                             { c.suspect.Store(0) }

// stallTransport wraps a node's gossip transport so that its network can
// be stalled: while stalled, nothing it receives is handed to memberlist
// (the kernel queues it) and nothing it sends leaves.
type stallTransport struct {
	memberlist.NodeAwareTransport
	packets chan *memberlist.Packet
	streams chan net.Conn
	done    chan struct{}
	once    sync.Once
	wg      sync.WaitGroup

	mu   sync.Mutex
	gate chan struct{} // closed unless stalled
}

var errStallClosed = errors.New("stall transport shut down")

func newStallTransport(inner memberlist.NodeAwareTransport) *stallTransport {
	open := make(chan struct{})
	close(open)
	t := &stallTransport{NodeAwareTransport: inner, gate: open,
		packets: make(chan *memberlist.Packet), streams: make(chan net.Conn), done: make(chan struct{})}
	t.wg.Add(2)
	go func() {
		defer t.wg.Done()
		forward(t, inner.PacketCh(), t.packets, func(*memberlist.Packet) {})
	}()
	go func() {
		defer t.wg.Done()
		forward(t, inner.StreamCh(), t.streams, func(c net.Conn) { c.Close() })
	}()
	return t
}

func forward[T any](t *stallTransport, in <-chan T, out chan<- T, drop func(T)) {
	for {
		select {
		case v := <-in:
			if t.wait() != nil {
				drop(v)
				return
			}
			select {
			case out <- v:
			case <-t.done:
				drop(v)
				return
			}
		case <-t.done:
			return
		}
	}
}

// stall stops the node's network for d.
func (t *stallTransport) stall(d time.Duration) {
	g := make(chan struct{})
	t.mu.Lock()
	t.gate = g
	t.mu.Unlock()
	time.AfterFunc(d, func() { close(g) })
}

func (t *stallTransport) wait() error {
	t.mu.Lock()
	g := t.gate
	t.mu.Unlock()
	select {
	case <-g:
		return nil
	case <-t.done:
		return errStallClosed
	}
}

func (t *stallTransport) PacketCh() <-chan *memberlist.Packet { return t.packets }
func (t *stallTransport) StreamCh() <-chan net.Conn           { return t.streams }

func (t *stallTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	if err := t.wait(); err != nil {
		return time.Time{}, err
	}
	return t.NodeAwareTransport.WriteTo(b, addr)
}

func (t *stallTransport) WriteToAddress(b []byte, addr memberlist.Address) (time.Time, error) {
	if err := t.wait(); err != nil {
		return time.Time{}, err
	}
	return t.NodeAwareTransport.WriteToAddress(b, addr)
}

func (t *stallTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	if err := t.wait(); err != nil {
		return nil, err
	}
	return t.NodeAwareTransport.DialTimeout(addr, timeout)
}

func (t *stallTransport) DialAddressTimeout(addr memberlist.Address, timeout time.Duration) (net.Conn, error) {
	if err := t.wait(); err != nil {
		return nil, err
	}
	return t.NodeAwareTransport.DialAddressTimeout(addr, timeout)
}

func (t *stallTransport) Shutdown() error {
	err := t.NodeAwareTransport.Shutdown()
	t.once.Do(func() { close(t.done) })
	t.wg.Wait()
	return err
}
