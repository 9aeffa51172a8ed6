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

// variant is a failure-detection profile under test: a Profile, with its
// settings changed by tune if set.
type variant struct {
	name    string
	profile Profile
	tune    func(*memberlist.Config)
}

// timing returns a variant of the device profile with other timings.
func timing(probe, timeout time.Duration, mult int) variant {
	return variant{
		name:    fmt.Sprintf("p%d-t%d-s%d", probe.Milliseconds(), timeout.Milliseconds(), mult),
		profile: ProfileDevice,
		tune: func(c *memberlist.Config) {
			c.ProbeInterval, c.ProbeTimeout, c.SuspicionMult = probe, timeout, mult
		},
	}
}

var (
	deviceVariant = variant{name: "device", profile: ProfileDevice}
	lanVariant    = variant{name: "default", profile: ProfileLAN}
	// candidates are the timings compared with the device profile: the
	// first is the profile as first tuned (probe 200 ms, timeout 100 ms,
	// suspicion multiplier 2).
	candidates = []variant{
		timing(200*time.Millisecond, 100*time.Millisecond, 2),
		timing(300*time.Millisecond, 200*time.Millisecond, 3),
		timing(200*time.Millisecond, 150*time.Millisecond, 6),
		timing(250*time.Millisecond, 200*time.Millisecond, 5),
		timing(300*time.Millisecond, 200*time.Millisecond, 5),
	}
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
func startCluster(v variant, n int, stallable bool) (*benchCluster, error) {
	c := &benchCluster{lines: &lineCounter{}}
	var addrs []string
	for i := range n {
		cfg := MembershipConfig{
			Meta:     Meta{ID: fmt.Sprintf("n%d", i), Transport: "127.0.0.1:7000", Capacity: 1},
			BindAddr: "127.0.0.1", Peers: slices.Clone(addrs), Profile: v.profile,
			Logger: slog.New(c.lines), tune: v.tune,
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
		return nil, fmt.Errorf("%s: %d members did not all see each other", v.name, n)
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
func measureDetection(v variant, n int) (detection, error) {
	c, err := startCluster(v, n, false)
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
			return detection{}, fmt.Errorf("%s: %w", v.name, err)
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

// benchVariants are the device profile and memberlist's LAN default,
// with the candidate timings too when EDGED_CANDIDATES is set.
func benchVariants() []variant {
	vs := []variant{deviceVariant, lanVariant}
	if os.Getenv("EDGED_CANDIDATES") != "" {
		vs = append(vs, candidates...)
	}
	return vs
}

// BenchmarkFailureDetection measures the time from a member's crash to
// every other member declaring it dead, with three members on loopback,
// for the device profile and, in the same iteration (concurrently), for
// memberlist's LAN default (and the candidate timings with
// EDGED_CANDIDATES=1). detection_ms is the device profile's mean,
// max_detection_ms its worst iteration, first_ms its mean time until the
// first member declared the crashed one dead; default_detection_ms is the
// LAN default's mean and ratio_vs_default the quotient.
func BenchmarkFailureDetection(b *testing.B) {
	const members = 3
	vs := benchVariants()
	got := make([][]detection, len(vs))
	for b.Loop() {
		errs := make([]error, len(vs))
		ds := make([]detection, len(vs))
		var wg sync.WaitGroup
		for i, v := range vs {
			wg.Go(func() { ds[i], errs[i] = measureDetection(v, members) })
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			b.Fatal(err)
		}
		for i := range vs {
			got[i] = append(got[i], ds[i])
		}
	}
	mean := func(ds []detection, f func(detection) time.Duration) float64 {
		var sum time.Duration
		for _, d := range ds {
			sum += f(d)
		}
		return ms(sum) / float64(len(ds))
	}
	all := func(d detection) time.Duration { return d.all }
	first := func(d detection) time.Duration { return d.first }
	worst := func(ds []detection) float64 {
		return ms(slices.MaxFunc(ds, func(a, b detection) int { return int(a.all - b.all) }).all)
	}
	def := mean(got[1], all)
	b.ReportMetric(mean(got[0], all), "detection_ms")
	b.ReportMetric(worst(got[0]), "max_detection_ms")
	b.ReportMetric(mean(got[0], first), "first_ms")
	b.ReportMetric(def, "default_detection_ms")
	b.ReportMetric(mean(got[0], all)/def, "ratio_vs_default")
	for i, v := range vs[2:] {
		b.ReportMetric(mean(got[i+2], all), v.name+"_detection_ms")
		b.ReportMetric(worst(got[i+2]), v.name+"_max_detection_ms")
	}
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
// three of memberlist's LAN default beside them (and three of each
// candidate timing with EDGED_CANDIDATES=1), for a fixed period
// (EDGED_FP_PERIOD, default 1 min) with no failure, under CPU contention
// (burn=N: testutil.Burn with N spinning goroutines in the process, on
// top of whatever else the machine runs), and counts the members wrongly
// reported failed (false_dead, summed over the members' views: a member
// seen dead by both others counts twice), the suspicions, refuted in
// time or not (suspicions, from memberlist's log), and the deaths
// memberlist declared that were not confirmed (unconfirmed_deaths: the
// member came back; see confirm), per period.
func BenchmarkFalsePositives(b *testing.B) {
	period := fpPeriod(b)
	vs := benchVariants()
	for _, burn := range []int{2, 8} {
		b.Run(fmt.Sprintf("burn=%d", burn), func(b *testing.B) {
			testutil.Burn(b, burn)
			dead, susp, spared := make([]int, len(vs)), make([]int, len(vs)), make([]int, len(vs))
			runs := 0
			var load []float64
			var maxLate time.Duration
			for b.Loop() {
				cs := make([]*benchCluster, 0, len(vs))
				for _, v := range vs {
					c, err := startCluster(v, 3, false)
					if err != nil {
						for _, c := range cs {
							c.shutdown()
						}
						b.Fatal(err)
					}
					cs = append(cs, c)
				}
				for _, c := range cs {
					for _, nd := range c.nodes {
						nd.m.Drain()
					}
					c.lines.reset()
				}
				load0 := loadAvg()
				late := watchLateness(period) // the observation window
				load = append(load, (load0+loadAvg())/2)
				maxLate = max(maxLate, late)
				for i, c := range cs {
					for _, nd := range c.nodes {
						for _, ev := range nd.m.Drain() {
							if ev.Kind == MemberFailed || ev.Kind == MemberLeft {
								dead[i]++
								b.Logf("%s: false positive: %s declared dead at %v", vs[i].name, ev.Node.ID, ev.At.Format(time.TimeOnly))
							}
						}
					}
					susp[i] += c.lines.suspicions()
					for _, nd := range c.nodes {
						spared[i] += int(nd.m.spared.Load())
					}
					c.shutdown()
				}
				runs++
			}
			n := float64(runs)
			b.ReportMetric(float64(dead[0])/n, "false_dead")
			b.ReportMetric(float64(susp[0])/n, "suspicions")
			b.ReportMetric(float64(spared[0])/n, "unconfirmed_deaths")
			b.ReportMetric(float64(dead[1])/n, "default_false_dead")
			b.ReportMetric(float64(susp[1])/n, "default_suspicions")
			for i, v := range vs[2:] {
				b.ReportMetric(float64(dead[i+2])/n, v.name+"_false_dead")
				b.ReportMetric(float64(susp[i+2])/n, v.name+"_suspicions")
			}
			b.ReportMetric(period.Seconds(), "period_s")
			b.ReportMetric(ms(maxLate), "max_sched_delay_ms")
			var sum float64
			for _, l := range load {
				sum += l
			}
			b.ReportMetric(sum/n, "loadavg")
		})
	}
}

// watchLateness waits for d and returns the longest a 10 ms ticker
// fired late meanwhile: how long the process's goroutines may wait for a
// CPU under the contention of the moment.
func watchLateness(d time.Duration) time.Duration {
	const tick = 10 * time.Millisecond
	t := time.NewTicker(tick)
	defer t.Stop()
	end := time.After(d)
	last := time.Now()
	var worst time.Duration
	for {
		select {
		case now := <-t.C:
			worst = max(worst, time.Since(last)-tick)
			last = now
		case <-end:
			return worst
		}
	}
}

// loadAvg is the machine's one-minute load average (0 if unknown).
func loadAvg() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	var l float64
	fmt.Sscan(string(b), &l)
	return l
}

// BenchmarkStallTolerance stalls one of three members (no packet in or
// out for stall=D, as a process frozen by swap or a long pause would be;
// the kernel keeps what arrives meanwhile) and reports the fraction of
// iterations in which the others declared it dead (dead_fraction for the
// device profile; the candidate timings' too with EDGED_CANDIDATES=1, run
// beside it): the other side of the trade against detection time.
func BenchmarkStallTolerance(b *testing.B) {
	vs := []variant{deviceVariant}
	if os.Getenv("EDGED_CANDIDATES") != "" {
		vs = append(vs, candidates...)
	}
	for _, stall := range []time.Duration{250 * time.Millisecond, 500 * time.Millisecond, 750 * time.Millisecond, time.Second, 1250 * time.Millisecond, 1500 * time.Millisecond, 2 * time.Second} {
		b.Run("stall="+stall.String(), func(b *testing.B) {
			dead := make([]int, len(vs))
			runs := 0
			for b.Loop() {
				var wg sync.WaitGroup
				errs := make([]error, len(vs))
				for i, v := range vs {
					wg.Go(func() {
						c, err := startCluster(v, 3, true)
						if err != nil {
							errs[i] = err
							return
						}
						defer c.shutdown()
						victim := c.nodes[2]
						victim.stall.stall(stall)
						// Watch until the stall is over and a probe round
						// and a suspicion timeout more.
						cfg := memberlistConfig(v.profile)
						if v.tune != nil {
							v.tune(cfg)
						}
						watch := stall + 2*cfg.ProbeInterval + time.Duration(cfg.SuspicionMult)*cfg.ProbeInterval
						if _, err := awaitEvent(c.nodes[0].m, MemberFailed, victim.m.cfg.Meta.ID, watch); err == nil {
							dead[i]++
						}
					})
				}
				wg.Wait()
				if err := errors.Join(errs...); err != nil {
					b.Fatal(err)
				}
				runs++
			}
			b.ReportMetric(float64(dead[0])/float64(runs), "dead_fraction")
			for i, v := range vs[1:] {
				b.ReportMetric(float64(dead[i+1])/float64(runs), v.name+"_dead_fraction")
			}
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
