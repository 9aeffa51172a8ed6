package test

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgedio/edged/internal/testutil"
)

// Rebalancing by handover with real edged processes: a node joins under
// MQTT load and only the window subtask whose key groups move to it
// pauses; the others keep processing.

// handoverSample is one reading of a window subtask's records-in counter.
type handoverSample struct {
	at   time.Time
	in   int64
	node int // index of the member that reported it
}

// windowSampler polls the records-in counters of the window subtasks on
// every node (the master's GET /jobs/sensors/operators, the workers' GET
// /cluster/worker) every period, by subtask.
type windowSampler struct {
	members []*clusterMember
	period  time.Duration
	mu      sync.Mutex
	series  map[int][]handoverSample
	polls   int
	stop    chan struct{}
	done    chan struct{}
	once    sync.Once
}

func startWindowSampler(members []*clusterMember, period time.Duration) *windowSampler {
	s := &windowSampler{members: members, period: period, series: map[int][]handoverSample{}, stop: make(chan struct{}), done: make(chan struct{})}
	go s.run()
	return s
}

func (s *windowSampler) run() {
	defer close(s.done)
	client := &http.Client{Timeout: time.Second}
	t := time.NewTicker(s.period)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		now := time.Now()
		got := map[int]handoverSample{}
		for i, m := range s.members {
			if !brokerUp(m.brokerAddr) {
				continue
			}
			if i == 0 {
				var l struct {
					Tasks []struct {
						Chain     string `json:"chain"`
						Subtask   int    `json:"subtask"`
						RecordsIn int64  `json:"records_in"`
					} `json:"tasks"`
				}
				if m.get(client, "/jobs/sensors/operators", &l) == nil {
					for _, ts := range l.Tasks {
						if isWindowChain(ts.Chain) {
							got[ts.Subtask] = handoverSample{at: now, in: ts.RecordsIn, node: i}
						}
					}
				}
				continue
			}
			var w struct {
				Jobs []struct {
					Tasks []struct {
						Chain     string `json:"Chain"`
						Subtask   int    `json:"Subtask"`
						RecordsIn int64  `json:"RecordsIn"`
					} `json:"tasks"`
				} `json:"jobs"`
			}
			if m.get(client, "/cluster/worker", &w) == nil {
				for _, j := range w.Jobs {
					for _, ts := range j.Tasks {
						if isWindowChain(ts.Chain) {
							got[ts.Subtask] = handoverSample{at: now, in: ts.RecordsIn, node: i}
						}
					}
				}
			}
		}
		s.mu.Lock()
		s.polls++
		for sub, x := range got {
			s.series[sub] = append(s.series[sub], x)
		}
		s.mu.Unlock()
	}
}

// isWindowChain reports whether a chain's head is the window operator:
// other chains name windows too (window-rows, sink-0-windows), and their
// records-in counters step only when windows fire.
func isWindowChain(chain string) bool {
	head, _, _ := strings.Cut(chain, " -> ")
	return head == "window" || strings.HasSuffix(head, "/window")
}

// describe returns subtask sub's samples between from and to, one per
// line: when, by which node, the counter.
func (s *windowSampler) describe(sub int, from, to time.Time) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var b strings.Builder
	for _, x := range s.series[sub] {
		if !x.at.Before(from) && !x.at.After(to) {
			fmt.Fprintf(&b, "%s %s %d\n", x.at.UTC().Format("15:04:05.000"), s.members[x.node].id, x.in)
		}
	}
	return b.String()
}

func (s *windowSampler) close() {
	s.once.Do(func() { close(s.stop) })
	<-s.done
}

// gaps returns, for subtask sub between from and to, the longest time
// its records-in counter stood still (or went back: a restart), when it
// began, and the number of samples between from and to. The last sample
// before from is the baseline of the first after it.
func (s *windowSampler) gaps(sub int, from, to time.Time) (time.Duration, time.Time, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var longest time.Duration
	var began time.Time
	n := 0
	var last *handoverSample
	for i := range s.series[sub] {
		x := &s.series[sub][i]
		if x.at.Before(from) {
			// The last sample before from is the baseline: a pause
			// that begins right after from (a handover's barrier
			// follows the rebalance's start within milliseconds) is
			// seen between it and the first sample after.
			last = x
			continue
		}
		if x.at.After(to) {
			continue
		}
		n++
		switch {
		case last == nil:
			last = x
		case x.in > last.in:
			last = x
		case x.in < last.in:
			// A restart resets the counter.
			longest, began = time.Hour, last.at
			last = x
		default:
			if d := x.at.Sub(last.at); d > longest {
				longest, began = d, last.at
			}
		}
	}
	return longest, began, n
}

// startClusterPlaced is startClusterOf with cluster.placement rows added
// to every node's config (none when placement is empty).
func startClusterPlaced(t *testing.T, ids []string, running, p int, placement string) []*clusterMember {
	t.Helper()
	addrs := distinctAddrs(t, 4*len(ids))
	take := func() string {
		a := addrs[0]
		addrs = addrs[1:]
		return a
	}
	var members []*clusterMember
	for _, id := range ids {
		dir := filepath.Join(t.TempDir(), id)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		m := &clusterMember{id: id, transport: take(),
			node: &node{t: t, brokerAddr: take(), apiAddr: take(), logPath: filepath.Join(dir, "edged.log")}}
		m.cfgPath = filepath.Join(dir, "edged.yaml")
		m.gossip = take()
		members = append(members, m)
	}
	for _, m := range members {
		path := writeClusterConfigP(t, filepath.Dir(m.cfgPath), m, members, p)
		if placement != "" {
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			cfg := strings.Replace(string(b), "pipelines:\n", "  placement:\n"+placement+"pipelines:\n", 1)
			if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if m.id != ids[0] {
			m.readyFn = m.hostsAndServes
		}
	}
	killMembersAtCleanup(t, members, keepLog)
	for _, m := range members[1:running] {
		m.start()
	}
	members[0].start()
	client := &http.Client{Timeout: time.Second}
	testutil.Eventually(t, 60*time.Second, "the started workers host the job's tasks", func() bool {
		return allHostTasks(client, members[1:running])
	})
	return members
}

// A fourth node joins a three-node cluster (four configured) mid-stream
// under MQTT load. The job's subtasks of index 3 but the window's are
// pinned to the first node (cluster.placement), so the join moves only
// the window subtask whose home is the new node, a keyed subtask: the master invites the new node
// into the running deployment and hands the subtask over at a savepoint
// barrier, with no redeployment. The rebalance history says so (mode
// handover, the moved subtask's pause, the other window subtasks
// unpaused); the other window subtasks' records-in counters, sampled
// every 100 ms, never stand still for 500 ms (nor restart from 0) while
// readings flow; the
// job's epoch is the same; every window of every sensor arrives exactly
// once with the exact count and one result id.
func TestClusterJoinHandsOverOnlyMovedSubtask(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with four subprocesses")
	}
	var pinned strings.Builder
	for _, op := range []string{"source", "prepare", "timestamps", "sink-0-dead-letter", "late-rows", "sink-0-dead-letter-late",
		"window-rows", "sink-0-windows", "sink-0-dead-letter-sinks"} {
		fmt.Fprintf(&pinned, "    - {operator: sensors/%s, subtask: 3, node: a}\n", op)
	}
	joinHandsOver(t, pinned.String())
}

// The same join with no placement pinned (the default): the new node's
// source split, its window subtask and the rest of its subtasks move to
// it by handovers in waves, and the other window subtasks keep
// processing all the while, as above.
func TestClusterJoinDefaultPlacementKeepsUnmovedRunning(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with four subprocesses")
	}
	joinHandsOver(t, "")
}

// joinHandsOver runs a join of a fourth node under paced MQTT load with
// the placement rows pinned (none: the default placement) and checks that
// it hands over with no redeployment, that only the moved window subtask
// pauses, and that the totals are exact.
func joinHandsOver(t *testing.T, pinned string) {
	maybeBurn(t)
	// A gap is 5 sampling periods without an increase (the moved
	// subtask's own pause is about 200 ms; a subtask that keeps running
	// shows none at this load); a redeployment restarts a subtask, and its
	// counter starts again from 0 (a gap too).
	const (
		period = 100 * time.Millisecond
		gap    = 5 * period
	)
	members := startClusterPlaced(t, []string{"a", "b", "c", "d"}, 3, 4, pinned)
	a, d := members[0], members[3]
	l := newPartialLoad(t, members, 3)
	client := &http.Client{Timeout: 2 * time.Second}
	waitAllAlive(t, a, 3)
	if n := keyGroupsOn(t, a, "d"); n != 0 {
		t.Fatalf("node d owns %d key groups before it started", n)
	}
	// Readings are paced at about 2,000 a second while d joins, so that
	// input flows through the whole rebalance.
	const n, pace, chunk = 60_000, 20 * time.Millisecond, 40
	next := 0
	l.publish(next, n/4)
	next = n / 4
	checkpointsSettled(t, a)
	before, err := a.rebalances(client)
	if err != nil {
		t.Fatal(err)
	}
	republishes := countRepublished(members)
	sampler := startWindowSampler(members, period)
	defer sampler.close()
	// d starts; readings keep flowing to a, b and c (d's share too: its
	// split stays on a) while it joins and its window subtask moves.
	d.start()
	// Readings flow from here on (none went out while d started).
	from := time.Now()
	var joined time.Time
	var published []time.Time // when each chunk was acknowledged
	tick := time.NewTicker(pace)
	defer tick.Stop()
	for next < n*3/4 {
		<-tick.C
		l.publish(next, next+chunk)
		published = append(published, time.Now())
		next += chunk
		if next%(10*chunk) == 0 && keyGroupsOn(t, a, "d") > 0 {
			joined = time.Now()
			break
		}
	}
	if joined.IsZero() {
		t.Fatalf("node d owns no key groups after %d readings", next)
	}
	// Readings flow on for a while after the handover, and until the
	// join's record is written: with the default placement the window
	// moves in one wave of several (the source split first, the sinks
	// last), and the rebalance ends after the last.
	joinEnded := func() bool {
		s, err := a.rebalances(client)
		if err != nil {
			return false
		}
		for i, r := range s.Rebalances {
			if i >= len(before.Rebalances) && r.Trigger == "join" && r.Outcome != "running" {
				return true
			}
		}
		return false
	}
	ended := false
	for end := time.Now().Add(2 * time.Second); next < n-10*chunk; next += chunk {
		<-tick.C
		l.publish(next, next+chunk)
		published = append(published, time.Now())
		if time.Now().After(end) && (next+chunk)%(10*chunk) == 0 {
			if ended = joinEnded(); ended {
				next += chunk // published
				break
			}
		}
	}
	if !ended && !joinEnded() {
		t.Fatalf("the join's rebalance had not ended after %d readings", next)
	}
	to := time.Now()
	sampler.close()
	t.Logf("node d owns %d key groups after %d readings, %v after it was up", keyGroupsOn(t, a, "d"), next, joined.Sub(from))

	s, err := a.rebalances(client)
	if err != nil {
		t.Fatal(err)
	}
	var rec *struct {
		Trigger        string             `json:"trigger"`
		Outcome        string             `json:"outcome"`
		MovedKeyGroups int                `json:"moved_key_groups"`
		BytesShipped   int64              `json:"bytes_shipped"`
		PauseMS        map[string]float64 `json:"pause_ms"`
		Error          string             `json:"error"`
	}
	var raw struct {
		Rebalances []struct {
			At       time.Time `json:"at"`
			Trigger  string    `json:"trigger"`
			Outcome  string    `json:"outcome"`
			Mode     string    `json:"mode"`
			Unpaused []string  `json:"unpaused"`
		} `json:"rebalances"`
	}
	if err := a.get(client, "/cluster", &raw); err != nil {
		t.Fatal(err)
	}
	mode := ""
	var unpaused []string
	var at time.Time
	for i := range s.Rebalances {
		r := &s.Rebalances[i]
		t.Logf("rebalance: %+v", *r)
		if i < len(before.Rebalances) || r.Trigger != "join" {
			continue
		}
		rec = r
		if i < len(raw.Rebalances) {
			mode, unpaused, at = raw.Rebalances[i].Mode, raw.Rebalances[i].Unpaused, raw.Rebalances[i].At
		}
	}
	if rec == nil {
		t.Fatalf("no join rebalance recorded: %+v", s.Rebalances)
	}
	if rec.Outcome != "done" || mode != "handover" {
		t.Fatalf("the join rebalance: outcome %q, mode %q (%s), want done by handover: the daemon redeployed the job", rec.Outcome, mode, rec.Error)
	}
	if (pinned != "" && len(rec.PauseMS) != 1) || rec.MovedKeyGroups == 0 || rec.BytesShipped == 0 {
		t.Fatalf("the join rebalance moved %d key groups, %d bytes, pauses %v: want one window subtask with its state", rec.MovedKeyGroups, rec.BytesShipped, rec.PauseMS)
	}
	moved := -1
	for k := range rec.PauseMS {
		i := strings.LastIndex(k, "/")
		if !isWindowChain(k[:i]) {
			continue
		}
		if moved >= 0 {
			t.Fatalf("pauses %v: two window subtasks moved", rec.PauseMS)
		}
		if _, err := fmt.Sscanf(k[i+1:], "%d", &moved); err != nil {
			t.Fatalf("pause of %q", k)
		}
	}
	if moved < 0 {
		t.Fatalf("pauses %v: no window subtask moved", rec.PauseMS)
	}
	t.Logf("moved window subtask %d, pause %v; unpaused %v", moved, rec.PauseMS, unpaused)
	// Every other window subtask kept processing: no gap in its
	// records-in counter while readings flowed, from the rebalance's
	// start (the gate opening, after the joins settled) until readings
	// stopped, two seconds after the new node owned its key groups.
	if at.Before(from) || at.After(to) {
		t.Fatalf("the rebalance started at %v, outside the sampled %v .. %v", at, from, to)
	}
	from = at
	// The sampler sees a pause where there is one: the moved subtask's
	// counter stands still or starts again from 0 on its new node.
	if longest, _, _ := sampler.gaps(moved, from, to); longest < period {
		t.Errorf("the moved window subtask %d shows no pause in its records-in counter: the sampler does not read the window's chain; its samples:\n%s", moved, sampler.describe(moved, from.Add(-time.Second), to))
	}
	for sub := range 4 {
		if sub == moved {
			continue
		}
		if !slices.ContainsFunc(unpaused, func(u string) bool { return strings.HasSuffix(u, fmt.Sprintf("/%d", sub)) }) {
			t.Errorf("window subtask %d is not recorded unpaused: %v", sub, unpaused)
		}
		longest, began, samples := sampler.gaps(sub, from, to)
		chunks := 0
		for _, at := range published {
			if !at.Before(began) && at.Before(began.Add(longest)) {
				chunks++
			}
		}
		if longest > 0 {
			t.Logf("window subtask %d: %d samples, longest standstill %v from %s (%v after the rebalance started), %d chunks of readings published meanwhile", sub, samples, longest,
				began.UTC().Format("15:04:05.000"), began.Sub(from), chunks)
		} else {
			t.Logf("window subtask %d: %d samples, its records-in grew between every two", sub, samples)
		}
		if samples < int((to.Sub(from))/(4*period)) {
			t.Errorf("window subtask %d: %d samples in %v: the sampler did not reach it", sub, samples, to.Sub(from))
		}
		if longest >= gap {
			t.Errorf("window subtask %d stood still for %v during the rebalance while readings flowed", sub, longest)
		}
	}
	if st, err := a.status(client); err != nil || st.Epoch != before.Epoch {
		t.Errorf("the job's epoch went from %d to %d (%v): it restarted", before.Epoch, st.Epoch, err)
	}
	if pinned == "" {
		// d's split runs on d now: its devices publish to it, so that its
		// watermark advances (the job sets no idle timeout).
		l.connect(3)
		delete(l.down, 3)
	}
	l.publish(next, n)
	l.finishChecked(n, 120*time.Second)
	if got := keyGroupsOn(t, a, "d"); got == 0 {
		t.Fatal("node d owns no key groups at the end")
	}
	checkPublishedOnceOverHandovers(t, members, republishes)
}
