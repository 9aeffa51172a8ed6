package daemon

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/cluster"
	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/pipeline"
	"github.com/edgedio/edged/snapshot"
)

// fakeRebalancer is a rebalancer on a fake clock whose checkpoints and
// runs the test controls; step is driven by the test, no loop runs.
type fakeRebalancer struct {
	*rebalancer
	clock *clockwork.FakeClock
	mu    sync.Mutex
	// cpTriggered is the trigger time of the checkpoint in progress;
	// zero when none is.
	cpTriggered time.Time
	runs        []time.Time
	starts      []cluster.Start
}

func newFakeRebalancer(t *testing.T) *fakeRebalancer {
	t.Helper()
	gate, err := cluster.NewRebalanceGate(cluster.DefaultGateConfig())
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeRebalancer{clock: clockwork.NewFakeClockAt(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))}
	f.rebalancer = &rebalancer{clock: f.clock, log: slog.New(slog.NewTextHandler(io.Discard, nil)), gateMu: &sync.Mutex{}, gate: gate,
		checkpointing: func(since time.Time) bool {
			f.mu.Lock()
			defer f.mu.Unlock()
			hist := []snapshot.Stats{{Checkpoint: 1, Status: snapshot.Completed, Triggered: since.Add(-time.Hour)}}
			if !f.cpTriggered.IsZero() {
				hist = append(hist, snapshot.Stats{Checkpoint: 2, Status: snapshot.InProgress, Triggered: f.cpTriggered})
			}
			return checkpointBefore(hist, since)
		},
		exec: func(ctx context.Context, s cluster.Start) error {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.runs = append(f.runs, f.clock.Now())
			f.starts = append(f.starts, s)
			return nil
		},
		stop: make(chan struct{})}
	return f
}

func (f *fakeRebalancer) setCheckpoint(triggered time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cpTriggered = triggered
}

func (f *fakeRebalancer) nRuns() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.runs)
}

// askAsync asks for a rebalance from another goroutine (as an API handler
// does) and returns its outcome's channel once the request is queued.
func (f *fakeRebalancer) askAsync(t *testing.T, tr cluster.Trigger, node string) <-chan error {
	t.Helper()
	f.gateMu.Lock()
	before := len(f.waiters)
	f.gateMu.Unlock()
	out := make(chan error, 1)
	go func() { out <- f.ask(context.Background(), tr, node) }()
	testutil.Eventually(t, 5*time.Second, "the request is queued", func() bool {
		f.gateMu.Lock()
		defer f.gateMu.Unlock()
		return len(f.waiters) > before
	})
	return out
}

func (f *fakeRebalancer) waitingWhy() string {
	f.gateMu.Lock()
	defer f.gateMu.Unlock()
	return f.waiting
}

// A drain asked while a checkpoint is in progress is queued, not run,
// until that checkpoint ends; then it runs and its caller gets the
// outcome. A checkpoint triggered after the request does not hold it.
func TestRebalanceQueuedBehindCheckpoint(t *testing.T) {
	f := newFakeRebalancer(t)
	f.setCheckpoint(f.clock.Now().Add(-50 * time.Millisecond))
	done := f.askAsync(t, cluster.TriggerDrain, "c")
	for range 10 {
		f.clock.Advance(rebalancePoll)
		if f.step(context.Background()) {
			t.Fatal("the drain ran during a checkpoint")
		}
	}
	if why := f.waitingWhy(); !strings.Contains(why, "checkpoint") {
		t.Fatalf("waiting %q, want a checkpoint", why)
	}
	select {
	case err := <-done:
		t.Fatalf("the caller returned during the checkpoint: %v", err)
	default:
	}
	// The checkpoint ends; the next one starts after the request: it
	// does not hold the drain.
	f.setCheckpoint(f.clock.Now().Add(time.Millisecond))
	f.clock.Advance(rebalancePoll)
	if !f.step(context.Background()) {
		t.Fatalf("the drain did not run once the checkpoint ended (waiting %q)", f.waitingWhy())
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if s := f.starts[0]; len(s.Drain) != 1 || s.Drain[0] != "c" || triggerOf(s) != cluster.TriggerDrain {
		t.Fatalf("ran %+v", s)
	}
}

// A rebalance asked during a failover waits for the failover to end.
func TestRebalanceQueuedBehindFailover(t *testing.T) {
	f := newFakeRebalancer(t)
	f.gateMu.Lock()
	f.gate.Failover(true)
	f.gateMu.Unlock()
	done := f.askAsync(t, cluster.TriggerManual, "")
	for range 5 {
		f.clock.Advance(rebalancePoll)
		if f.step(context.Background()) {
			t.Fatal("the rebalance ran during a failover")
		}
	}
	if why := f.waitingWhy(); !strings.Contains(why, "failover") {
		t.Fatalf("waiting %q, want a failover", why)
	}
	f.gateMu.Lock()
	f.gate.Failover(false)
	f.gateMu.Unlock()
	f.clock.Advance(rebalancePoll)
	if !f.step(context.Background()) {
		t.Fatal("the rebalance did not run after the failover")
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// A caller that gives up leaves its request queued, and says why it
// waits.
func TestRebalanceCallerGivesUp(t *testing.T) {
	f := newFakeRebalancer(t)
	f.setCheckpoint(f.clock.Now().Add(-time.Millisecond))
	f.clock.Advance(time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan error, 1)
	go func() { out <- f.ask(ctx, cluster.TriggerManual, "") }()
	testutil.Eventually(t, 5*time.Second, "the request is queued", func() bool {
		f.gateMu.Lock()
		defer f.gateMu.Unlock()
		return len(f.waiters) == 1
	})
	f.step(context.Background())
	cancel()
	err := <-out
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "checkpoint") {
		t.Fatalf("err %v", err)
	}
	f.setCheckpoint(time.Time{})
	if !f.step(context.Background()) {
		t.Fatal("the abandoned request did not run")
	}
}

// A node flapping (leaving and joining every 2 s for 20 minutes, each
// join queued as liveView.follow queues it) does not start a rebalance
// storm: the wired loop runs a handful of rebalances, further and further
// apart, where without damping one would run every settle delay.
func TestRebalanceStormDamped(t *testing.T) {
	f := newFakeRebalancer(t)
	start := f.clock.Now()
	var lastJoin time.Time
	for f.clock.Since(start) < 20*time.Minute {
		if now := f.clock.Now(); now.Sub(lastJoin) >= 2*time.Second {
			f.gateMu.Lock()
			f.gate.Request(now, cluster.TriggerJoin, "d")
			f.requestedLocked(now)
			f.gateMu.Unlock()
			lastJoin = now
		}
		f.step(context.Background())
		f.clock.Advance(rebalancePoll)
	}
	n := f.nRuns()
	// 20 min of joins would settle-and-run every 5 s: 240 rebalances.
	// Damped: 10 s, 20 s, ... doubling to 5 min.
	if n < 3 || n > 12 {
		t.Fatalf("%d rebalances in 20 min of flapping: %v", n, f.runs)
	}
	var gaps []time.Duration
	for i := 1; i < n; i++ {
		gaps = append(gaps, f.runs[i].Sub(f.runs[i-1]))
	}
	for i := 1; i < len(gaps); i++ {
		if gaps[i] < gaps[i-1] {
			t.Fatalf("gaps between rebalances shrank while the node kept flapping: %v", gaps)
		}
	}
	if last := gaps[len(gaps)-1]; last < 4*time.Minute {
		t.Fatalf("the gap between rebalances grew only to %v: %v", last, gaps)
	}
	t.Logf("%d rebalances in 20 min of flapping, gaps %v", n, gaps)
}

func homesOf(jobs ...string) map[string]jobHome {
	out := map[string]jobHome{}
	for _, name := range jobs {
		h := jobHome{placement: map[actors.TaskKey]string{}, keyed: map[string]bool{name + "/window": true}}
		nodes := []string{"a", "b", "c"}
		for i := range 3 {
			h.placement[actors.TaskKey{UID: name + "/source", Subtask: i}] = nodes[i]
			h.placement[actors.TaskKey{UID: name + "/window", Subtask: i}] = nodes[i]
		}
		out[name] = h
	}
	return out
}

// checkRoom refuses a drain that would leave no majority or put a node
// over its capacity, naming the node, the count and the key; it counts
// keyed subtasks only, over every job.
func TestCheckRoom(t *testing.T) {
	capacities := map[string]int{"a": 2, "b": 0, "c": 2}
	rc := roomCheck{size: 3, alive: []string{"a", "b", "c"}, master: "a",
		capacity: func(id string) int { return capacities[id] }, homes: homesOf("j1")}
	load, _, err := checkRoom(rc)
	if err != nil || load["a"] != 1 || load["b"] != 1 || load["c"] != 1 {
		t.Fatalf("no drain: %v %v", load, err)
	}
	// Draining b puts its window subtask on a or c: 2 of 2, still room.
	rc.draining = []string{"b"}
	if load, _, err = checkRoom(rc); err != nil || load["b"] != 0 || load["a"]+load["c"] != 3 {
		t.Fatalf("drain b: %v %v", load, err)
	}
	// Two jobs: draining b would put 3 or 4 on a node with capacity 2
	// (a and c run 2 each already).
	rc.homes = homesOf("j1", "j2")
	_, _, err = checkRoom(rc)
	if !errors.Is(err, cluster.ErrOverCapacity) || !strings.Contains(err.Error(), "keyed subtasks, its cluster.capacity is 2") {
		t.Fatalf("drain b with two jobs: %v", err)
	}
	// No limits: room again.
	capacities["a"], capacities["c"] = 0, 0
	if _, _, err = checkRoom(rc); err != nil {
		t.Fatalf("no limit: %v", err)
	}
	// c is dead: draining b would leave a alone, no majority.
	rc.alive = []string{"a", "b"}
	_, _, err = checkRoom(rc)
	if !errors.Is(err, cluster.ErrRefused) || !strings.Contains(err.Error(), "no majority") {
		t.Fatalf("drain b with c dead: %v", err)
	}
	// A node drained before gets nothing: its subtasks count elsewhere.
	rc = roomCheck{size: 3, alive: []string{"a", "b", "c"}, drained: []string{"c"}, master: "a",
		capacity: func(string) int { return 0 }, homes: homesOf("j1")}
	if load, _, err = checkRoom(rc); err != nil || load["c"] != 0 || load["a"]+load["b"] != 3 {
		t.Fatalf("c drained: %v %v", load, err)
	}
}

// testClusterNode is a job-master node of cluster a, b, c without gossip
// (every configured node counts as alive) and without a transport.
func testClusterNode(t *testing.T, capacities map[string]int) *clusterNode {
	t.Helper()
	cfg := &pipeline.ClusterConfig{Node: "a", Listen: "127.0.0.1:1", Capacity: capacities["a"]}
	for _, id := range []string{"b", "c"} {
		cfg.Peers = append(cfg.Peers, pipeline.PeerConfig{ID: id, Capacity: capacities[id]})
	}
	gate, err := cluster.NewRebalanceGate(cluster.DefaultGateConfig())
	if err != nil {
		t.Fatal(err)
	}
	c := &clusterNode{cfg: cfg, log: slog.New(slog.NewTextHandler(io.Discard, nil)), master: true}
	c.live = &liveView{c: c, stop: make(chan struct{}), gate: gate, joining: map[string]bool{}}
	c.rb = c.newRebalancer()
	for name, h := range homesOf("j1", "j2") {
		job := &actors.Job{Name: name, Vertices: []*actors.Vertex{{UID: name + "/source", Parallelism: 3}, {UID: name + "/window", Parallelism: 3, Keyed: true}}}
		c.setHome(job, h.placement)
	}
	return c
}

// A drain the capacity does not allow is refused at once with the reason
// (ErrOverCapacity, which the API answers with 409 and the CLI prints),
// recorded in the rebalance history, and the node is not drained.
func TestDrainRefusedOverCapacity(t *testing.T) {
	c := testClusterNode(t, map[string]int{"a": 2, "c": 2})
	err := c.Drain(context.Background(), "b")
	if !errors.Is(err, cluster.ErrOverCapacity) || clusterStatusOf(err) != 409 {
		t.Fatalf("drain: %v", err)
	}
	c.live.mu.Lock()
	recs, drained := c.live.rebalances, c.live.drained["b"]
	c.live.mu.Unlock()
	if drained {
		t.Fatal("b drained after the refusal")
	}
	if len(recs) != 1 || recs[0].Outcome != cluster.RebalanceRefused || recs[0].Trigger != cluster.TriggerDrain ||
		!strings.Contains(recs[0].Error, "its cluster.capacity is 2") {
		t.Fatalf("history %+v", recs)
	}
	// The master and an unknown node are refused too.
	if err := c.Drain(context.Background(), "a"); !errors.Is(err, cluster.ErrRefused) {
		t.Fatalf("drain of the master: %v", err)
	}
	if err := c.Drain(context.Background(), "x"); !errors.Is(err, cluster.ErrUnknownNode) {
		t.Fatalf("drain of x: %v", err)
	}
}

// A rebalance whose room is gone by the time the gate opens is refused
// there and recorded; the drained node is not marked.
func TestRebalanceRefusedWhenItStarts(t *testing.T) {
	c := testClusterNode(t, map[string]int{"a": 2, "c": 2})
	err := c.runRebalance(context.Background(), cluster.Start{Triggers: []cluster.Trigger{cluster.TriggerDrain}, Drain: []string{"b"}})
	if !errors.Is(err, cluster.ErrOverCapacity) {
		t.Fatalf("run: %v", err)
	}
	c.live.mu.Lock()
	defer c.live.mu.Unlock()
	if c.live.drained["b"] || len(c.live.rebalances) != 1 || c.live.rebalances[0].Outcome != cluster.RebalanceRefused {
		t.Fatalf("drained %v, history %+v", c.live.drained, c.live.rebalances)
	}
}

// A drained node restarted before the gossip saw its old run die (killed
// before it left the membership, back within a failure-detection time)
// is never missing from the live nodes: its old run's failure and its
// new run's join come in one batch of events. It is undrained all the
// same, to be moved in as a join.
func TestDrainedNodeRestartedAtOnceIsUndrained(t *testing.T) {
	c := testClusterNode(t, nil)
	v := c.live
	v.mu.Lock()
	v.drained = map[string]bool{"b": true, "c": true}
	v.mu.Unlock()
	v.sawGone([]cluster.Event{
		{Kind: cluster.MemberFailed, Node: cluster.Meta{ID: "b", Boot: "1"}},
		{Kind: cluster.MemberJoined, Node: cluster.Meta{ID: "b", Boot: "2"}},
		{Kind: cluster.MemberUpdated, Node: cluster.Meta{ID: "c", Boot: "3"}},
	})
	v.mu.Lock()
	defer v.mu.Unlock()
	v.undrainReturnedLocked([]string{"a", "b", "c"})
	if v.drained["b"] || v.left["b"] {
		t.Fatalf("b restarted: drained %v left %v", v.drained, v.left)
	}
	if !v.drained["c"] {
		t.Fatalf("c, only updated, was undrained: drained %v left %v", v.drained, v.left)
	}
}

// A drained node stays drained while it is up and while it is gone; once
// it is back (it restarted) it is undrained, to be moved in as a join.
func TestDrainedNodeBackAfterRestart(t *testing.T) {
	c := testClusterNode(t, nil)
	v := c.live
	v.mu.Lock()
	defer v.mu.Unlock()
	v.drained = map[string]bool{"b": true}
	v.undrainReturnedLocked([]string{"a", "b", "c"})
	if !v.drained["b"] {
		t.Fatal("undrained while it had not left")
	}
	v.undrainReturnedLocked([]string{"a", "c"})
	if !v.drained["b"] || !v.left["b"] {
		t.Fatalf("gone: drained %v left %v", v.drained, v.left)
	}
	v.undrainReturnedLocked([]string{"a", "b", "c"})
	if v.drained["b"] || v.left["b"] {
		t.Fatalf("back: drained %v left %v", v.drained, v.left)
	}
	if got := v.placedLocked([]string{"a", "b", "c"}); len(got) != 3 {
		t.Fatalf("placed %v", got)
	}
}

// The drain's wait for the node's ingest logs: covered once each log is
// released up to the offset it had when the drain started.
func TestIngestCovered(t *testing.T) {
	target := map[string]uint64{"p": 100, "q": 5}
	l := IngestList{Pipelines: []IngestInfo{{Pipeline: "p", ReleasedOffset: 99, NextOffset: 120}, {Pipeline: "q", ReleasedOffset: 5}}}
	if ingestCovered(l, target) {
		t.Fatal("p at 99 of 100 counted as covered")
	}
	l.Pipelines[0].ReleasedOffset = 100
	if !ingestCovered(l, target) {
		t.Fatal("not covered at the targets")
	}
}

// weightedHomes is one job whose 40 keyed subtasks are all at home on d.
func weightedHomes() map[string]jobHome {
	h := jobHome{placement: map[actors.TaskKey]string{}, keyed: map[string]bool{"j/window": true}}
	for i := range 40 {
		h.placement[actors.TaskKey{UID: "j/window", Subtask: i}] = "d"
	}
	return map[string]jobHome{"j": h}
}

// The subtasks a drain spreads go by cluster.weight: with b of weight 2
// and a, c of weight 1, draining d puts about half of its 40 on b (at
// most 20, its share rounded up), where equal weights give b at most 14;
// the capacity stays the limit.
func TestCheckRoomUsesWeights(t *testing.T) {
	weights := map[string]int{"a": 1, "b": 2, "c": 1, "d": 1}
	rc := roomCheck{size: 4, alive: []string{"a", "b", "c", "d"}, master: "a", draining: []string{"d"},
		capacity: func(string) int { return 0 }, weight: func(id string) int { return weights[id] }, homes: weightedHomes()}
	load, _, err := checkRoom(rc)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("weights a 1, b 2, c 1: load %v", load)
	if load["d"] != 0 || load["a"]+load["b"]+load["c"] != 40 || load["b"] < 17 || load["b"] > 20 || load["a"] > 10 || load["c"] > 10 {
		t.Fatalf("weights a 1, b 2, c 1: load %v, want about 20 on b and 10 on a and c", load)
	}
	rc.weight = nil
	if load, _, err = checkRoom(rc); err != nil || load["b"] > 14 {
		t.Fatalf("equal weights: load %v %v", load, err)
	}
	// The weight does not lift the capacity: b may run 15.
	rc.weight = func(id string) int { return weights[id] }
	rc.capacity = func(id string) int {
		if id == "b" {
			return 15
		}
		return 0
	}
	if _, _, err = checkRoom(rc); !errors.Is(err, cluster.ErrOverCapacity) || !strings.Contains(err.Error(), "node b would run") {
		t.Fatalf("b over its capacity: %v", err)
	}
}

// The master's placement reads the weights from its config: a drain's
// room check and the next deployment (liveView.update) give the drained
// node's subtasks to b, of cluster.peers[].weight 3, three times as much
// as to a and c.
func TestClusterPlacementUsesConfiguredWeights(t *testing.T) {
	cfg := &pipeline.ClusterConfig{Node: "a", Listen: "127.0.0.1:1"}
	for _, p := range []pipeline.PeerConfig{{ID: "b", Weight: 3}, {ID: "c"}, {ID: "d"}} {
		cfg.Peers = append(cfg.Peers, p)
	}
	c := &clusterNode{cfg: cfg, log: slog.New(slog.NewTextHandler(io.Discard, nil)), master: true}
	c.live = &liveView{c: c, stop: make(chan struct{}), joining: map[string]bool{}}
	home := weightedHomes()["j"]
	c.setHome(&actors.Job{Name: "j", Vertices: []*actors.Vertex{{UID: "j/window", Parallelism: 40, Keyed: true}}}, home.placement)
	placement, err := c.room([]string{"d"})
	if err != nil {
		t.Fatal(err)
	}
	count := func(p map[actors.TaskKey]string) map[string]int {
		out := map[string]int{}
		for _, n := range p {
			out[n]++
		}
		return out
	}
	by := count(placement["j"])
	t.Logf("drain of d: %v", by)
	if by["d"] != 0 || by["b"] < 20 || by["b"] > 24 || by["a"] > 8 || by["c"] > 8 {
		t.Fatalf("drain of d placed %v, want about 24 on b and 8 on a and c", by)
	}
	// Once d is drained, the next deployment places the same way.
	c.live.drained = map[string]bool{"d": true}
	_, next, err := c.live.update(&actors.Cluster{Placement: home.placement})
	if err != nil {
		t.Fatal(err)
	}
	if got := count(next); got["b"] != by["b"] || got["a"] != by["a"] || got["c"] != by["c"] {
		t.Fatalf("deployment placed %v, the room check %v", got, by)
	}
}

// roundTripFunc is an http.RoundTripper of a function.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// A drain that a node's death overtakes (here while it waits for the
// drained node's ingest logs) is abandoned: the nodes left once b is gone
// would be no majority. It is refused with the reason, b is not drained
// (it stays, and does not leave), and a rebalance is queued to give b its
// subtasks back. Before, the drain moved everything to a and let b leave:
// one node of three, no majority, nothing ran.
func TestDrainAbandonedWhenANodeDiesMeanwhile(t *testing.T) {
	c := testClusterNode(t, nil)
	// b hosts subtasks (the test node runs no job): its drain waits for
	// its ingest logs.
	c.hostsFn = func(string) bool { return true }
	var cDead atomic.Bool
	c.live.aliveFn = func() []string {
		if cDead.Load() {
			return []string{"a", "b"}
		}
		return []string{"a", "b", "c"}
	}
	var left atomic.Bool
	c.peers = &peerClient{cfg: c.cfg, http: &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if strings.HasSuffix(r.URL.Path, "/cluster/leave") {
			left.Store(true)
		}
		// c dies while the drain reads b's ingest logs.
		cDead.Store(true)
		return nil, errors.New("connection refused")
	})}}
	err := c.runRebalance(context.Background(), cluster.Start{Triggers: []cluster.Trigger{cluster.TriggerDrain}, Drain: []string{"b"}})
	if !errors.Is(err, cluster.ErrRefused) || !strings.Contains(err.Error(), "no majority") || !strings.Contains(err.Error(), "the room the drain had when it started is gone") {
		t.Fatalf("run: %v", err)
	}
	if left.Load() {
		t.Fatal("b was asked to leave")
	}
	c.live.mu.Lock()
	defer c.live.mu.Unlock()
	if c.live.drained["b"] {
		t.Fatal("b stays drained")
	}
	if n := len(c.live.rebalances); n != 1 || c.live.rebalances[0].Outcome != cluster.RebalanceRefused {
		t.Fatalf("history %+v", c.live.rebalances)
	}
	if _, ok, _ := c.live.gate.Poll(time.Now().Add(time.Hour)); !ok {
		t.Fatal("no rebalance queued to give b its subtasks back")
	}
}

// drainRoomLost: a drain of b keeps its room while a and c are alive,
// and loses it once c is gone; with nothing draining there is no room to
// lose.
func TestDrainRoomLost(t *testing.T) {
	c := testClusterNode(t, nil)
	alive := []string{"a", "b", "c"}
	c.live.aliveFn = func() []string { return alive }
	if err := c.drainRoomLost([]string{"b"}); err != nil {
		t.Fatal(err)
	}
	alive = []string{"a", "b"}
	if err := c.drainRoomLost([]string{"b"}); !errors.Is(err, cluster.ErrRefused) {
		t.Fatalf("c dead: %v", err)
	}
	if err := c.drainRoomLost(nil); err != nil {
		t.Fatal(err)
	}
}
