package daemon

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/cluster"
	"github.com/edgedio/edged/internal/testutil"
)

// undrainNode is testClusterNode with b drained, a peer client whose
// peers do not answer, and a rebalancer on a fake clock whose runs are
// recorded instead of redeploying.
func undrainNode(t *testing.T) (*clusterNode, *clockwork.FakeClock, chan cluster.Start) {
	t.Helper()
	c := testClusterNode(t, nil)
	c.peers = &peerClient{cfg: c.cfg, http: &http.Client{}}
	fc := clockwork.NewFakeClockAt(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	runs := make(chan cluster.Start, 4)
	c.rb.clock = fc
	c.rb.exec = func(_ context.Context, s cluster.Start) error {
		runs <- s
		return nil
	}
	c.live.drained = map[string]bool{"b": true}
	return c, fc, runs
}

// ownedBy counts the subtasks placement puts on node, over every job.
func ownedBy(p map[string]map[actors.TaskKey]string, node string) int {
	n := 0
	for _, job := range p {
		for _, at := range job {
			if at == node {
				n++
			}
		}
	}
	return n
}

// An undrain clears the drained mark, so that the placement gives the
// node its subtasks again, and queues a join for it behind the
// rebalance gate: the join waits for the settle delay like any join, the
// caller gets the outcome of the rebalance it ran, and the membership
// loop does not queue the node a second time.
func TestUndrainQueuesJoin(t *testing.T) {
	c, fc, runs := undrainNode(t)
	before, err := c.room(nil)
	if err != nil {
		t.Fatal(err)
	}
	if n := ownedBy(before, "b"); n != 0 {
		t.Fatalf("drained b placed %d subtasks", n)
	}
	done := undrainQueued(t, c, "b")
	c.live.mu.Lock()
	drained, joining := c.live.drained["b"], c.live.joining["b"]
	c.live.mu.Unlock()
	if drained || !joining {
		t.Fatalf("after the undrain: drained %v, joining %v", drained, joining)
	}
	// follow sees b placed and not deployed: it is joining already.
	c.live.mu.Lock()
	c.live.deployed = []string{"a", "c"}
	c.live.mu.Unlock()
	c.live.follow([]string{"a", "b", "c"}, c.executions)
	// Before the settle delay, nothing runs.
	fc.Advance(time.Second)
	if c.rb.step(context.Background()) {
		t.Fatal("the join ran before the settle delay")
	}
	fc.Advance(cluster.DefaultGateConfig().Settle)
	if !c.rb.step(context.Background()) {
		t.Fatal("the join did not run after the settle delay")
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	s := <-runs
	if triggerOf(s) != cluster.TriggerJoin || len(s.Drain) != 0 || len(s.Triggers) != 1 {
		t.Fatalf("ran %+v, want one join", s)
	}
	select {
	case s := <-runs:
		t.Fatalf("a second rebalance ran: %+v", s)
	default:
	}
	after, err := c.room(nil)
	if err != nil {
		t.Fatal(err)
	}
	if n := ownedBy(after, "b"); n != 4 {
		t.Fatalf("undrained b placed %d subtasks, want its 4 (2 jobs x source and window)", n)
	}
}

// An undrain of a node the cluster does not know, of one not drained, or
// asked of a node that does not run the job masters is refused at once
// and queues nothing.
func TestUndrainRefused(t *testing.T) {
	c, _, _ := undrainNode(t)
	ctx := context.Background()
	if err := c.Undrain(ctx, "x"); !errors.Is(err, cluster.ErrUnknownNode) || clusterStatusOf(err) != http.StatusNotFound {
		t.Fatalf("undrain of x: %v", err)
	}
	if err := c.Undrain(ctx, "c"); !errors.Is(err, ErrNotDrained) || clusterStatusOf(err) != http.StatusConflict {
		t.Fatalf("undrain of c: %v", err)
	}
	c.master = false
	if err := c.Undrain(ctx, "b"); !errors.Is(err, cluster.ErrRefused) {
		t.Fatalf("undrain asked of a worker: %v", err)
	}
	c.rb.gateMu.Lock()
	n := len(c.rb.waiters)
	c.rb.gateMu.Unlock()
	c.live.mu.Lock()
	drained := c.live.drained["b"]
	c.live.mu.Unlock()
	if n != 0 || !drained {
		t.Fatalf("refused undrains queued %d requests; b drained %v", n, drained)
	}
}

// A drained worker left; rejoining puts it back (here without gossip: it
// only takes deployments again), once; it can then be drained and leave
// again.
func TestRejoinAfterLeave(t *testing.T) {
	c := testClusterNode(t, nil)
	c.master = false
	if was, err := c.Rejoin(); was || err != nil {
		t.Fatalf("rejoin of a node that never left: %v %v", was, err)
	}
	c.leave()
	if !c.live.out {
		t.Fatal("the node did not leave")
	}
	if c.live.markOut() {
		t.Fatal("a second leave left again")
	}
	if was, err := c.Rejoin(); !was || err != nil || c.live.out {
		t.Fatalf("rejoin: %v %v, out %v", was, err, c.live.out)
	}
	c.leave()
	if !c.live.out {
		t.Fatal("the rejoined node did not leave on its second drain")
	}
	if !slices.Equal(c.live.alive(), []string{"a", "b", "c"}) {
		t.Fatalf("alive %v", c.live.alive())
	}
}

// An undrain asked right after a rebalance is not damped: the undrained
// node's source splits hold their jobs' watermarks until its join moves
// it in, so a damped undrain stalled every window of those jobs for the
// damping gap (10 s, doubling up to 5 min with each drain and undrain).
// It still waits the settle delay.
func TestUndrainIsNotDamped(t *testing.T) {
	c, fc, runs := undrainNode(t)
	manual := make(chan error, 1)
	go func() { manual <- c.rb.ask(context.Background(), cluster.TriggerManual, "") }()
	testutil.Eventually(t, 10*time.Second, "the manual rebalance is queued", func() bool {
		c.rb.gateMu.Lock()
		defer c.rb.gateMu.Unlock()
		return len(c.rb.waiters) == 1
	})
	if !c.rb.step(context.Background()) {
		t.Fatal("the manual rebalance did not run")
	}
	if err := <-manual; err != nil {
		t.Fatal(err)
	}
	<-runs
	done := undrainQueued(t, c, "b")
	fc.Advance(time.Second)
	if c.rb.step(context.Background()) {
		t.Fatal("the undrain's join ran before the settle delay")
	}
	fc.Advance(cluster.DefaultGateConfig().Settle)
	if c.rb.gate.Interval() <= cluster.DefaultGateConfig().Settle+time.Second {
		t.Fatalf("damping interval %v: the test needs it longer than the settle delay", c.rb.gate.Interval())
	}
	if !c.rb.step(context.Background()) {
		c.rb.gateMu.Lock()
		why := c.rb.waiting
		c.rb.gateMu.Unlock()
		t.Fatalf("the undrain's join did not run after the settle delay (%s)", why)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if s := <-runs; triggerOf(s) != cluster.TriggerJoin {
		t.Fatalf("ran %+v, want a join", s)
	}
}

// undrainQueued starts an undrain of node in the background and waits
// until its join is queued at the rebalance gate; the undrain's outcome
// comes on the returned channel.
func undrainQueued(t *testing.T, c *clusterNode, node string) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- c.Undrain(context.Background(), node) }()
	testutil.Eventually(t, 10*time.Second, "the undrain's join is queued", func() bool {
		c.rb.gateMu.Lock()
		defer c.rb.gateMu.Unlock()
		return len(c.rb.waiters) == 1
	})
	return done
}

// An undrain of b asked while b's drain runs waits for that drain to end
// and then undrains b: it rejoins and is moved in by a join. Before, the
// undrain cleared the drained mark and asked b to rejoin at once (b had
// not left yet, so that did nothing) and queued its join; the drain then
// made b leave, the join found nothing to move, and the undrain answered
// done while b stayed out of the cluster, taking no work and refusing
// readings (seen with `edged cluster undrain b` right after an `edged
// cluster drain b` whose --timeout ended).
func TestUndrainWhileItsDrainRunsWaitsForIt(t *testing.T) {
	c, fc, runs := undrainNode(t)
	c.live.drained = map[string]bool{}
	running, release := make(chan struct{}), make(chan struct{})
	c.rb.exec = func(_ context.Context, s cluster.Start) error {
		if len(s.Drain) > 0 {
			c.live.mu.Lock()
			for _, id := range s.Drain {
				c.live.drained[id] = true
			}
			c.live.mu.Unlock()
			close(running)
			<-release
			c.recordRebalance(cluster.Rebalance{At: time.Now(), Trigger: cluster.TriggerDrain, Outcome: cluster.RebalanceDone,
				MovedKeyGroups: 42, PauseMS: map[string]float64{}})
			return nil
		}
		runs <- s
		return nil
	}
	drained := make(chan error, 1)
	go func() { drained <- c.Drain(context.Background(), "b") }()
	testutil.Eventually(t, 10*time.Second, "b's drain is queued", func() bool {
		c.rb.gateMu.Lock()
		defer c.rb.gateMu.Unlock()
		return len(c.rb.waiters) == 1
	})
	stepped := make(chan bool, 1)
	go func() { stepped <- c.rb.step(context.Background()) }()
	<-running
	undrained := make(chan error, 1)
	go func() { undrained <- c.Undrain(context.Background(), "b") }()
	// The undrain either went ahead at once (the fault: b's mark
	// cleared, a join queued, or an answer) or waits for the drain.
	testutil.Eventually(t, 10*time.Second, "the undrain went ahead or waits", func() bool {
		if len(undrained) > 0 {
			return true
		}
		c.rb.gateMu.Lock()
		defer c.rb.gateMu.Unlock()
		return len(c.rb.joined) == 1 || len(c.rb.waiters) > 0 || !c.live.drained["b"]
	})
	c.rb.gateMu.Lock()
	joined, waiters, mark := len(c.rb.joined), len(c.rb.waiters), c.live.drained["b"]
	c.rb.gateMu.Unlock()
	if joined != 1 || waiters != 0 || !mark || len(undrained) > 0 {
		t.Fatalf("while b's drain runs, the undrain waits for it %v, queued %d requests, b drained %v, answered %v",
			joined == 1, waiters, mark, len(undrained) > 0)
	}
	close(release)
	if !<-stepped {
		t.Fatal("the drain did not run")
	}
	if err := <-drained; err != nil {
		t.Fatal(err)
	}
	// Once the drain ended, the undrain goes ahead: b's mark is cleared
	// and its join queued, which runs after the settle delay.
	testutil.Eventually(t, 10*time.Second, "the undrain queued b's join", func() bool {
		c.rb.gateMu.Lock()
		defer c.rb.gateMu.Unlock()
		return len(c.rb.waiters) == 1
	})
	c.live.mu.Lock()
	mark = c.live.drained["b"]
	c.live.mu.Unlock()
	if mark {
		t.Fatal("b still drained after the undrain went ahead")
	}
	fc.Advance(cluster.DefaultGateConfig().MaxSettle)
	testutil.Eventually(t, 10*time.Second, "the join ran", func() bool { return c.rb.step(context.Background()) })
	if err := <-undrained; err != nil {
		t.Fatal(err)
	}
	if s := <-runs; triggerOf(s) != cluster.TriggerJoin || len(s.Drain) != 0 {
		t.Fatalf("ran %+v, want b's join", s)
	}
}

// An undrain of b asked while b's drain is queued (held by a checkpoint
// in progress) waits for that drain to run and then undrains b. Before,
// it answered "node not drained: node "b" takes subtasks already" (409)
// and the queued drain then made b leave.
func TestUndrainWhileItsDrainIsQueuedWaitsForIt(t *testing.T) {
	c, fc, runs := undrainNode(t)
	c.live.drained = map[string]bool{}
	var held atomic.Bool
	held.Store(true)
	c.rb.checkpointing = func(time.Time) bool { return held.Load() }
	c.rb.exec = func(_ context.Context, s cluster.Start) error {
		if len(s.Drain) > 0 {
			c.live.mu.Lock()
			for _, id := range s.Drain {
				c.live.drained[id] = true
			}
			c.live.mu.Unlock()
			c.recordRebalance(cluster.Rebalance{At: time.Now(), Trigger: cluster.TriggerDrain, Outcome: cluster.RebalanceDone,
				MovedKeyGroups: 42, PauseMS: map[string]float64{}})
			return nil
		}
		runs <- s
		return nil
	}
	drained := make(chan error, 1)
	go func() { drained <- c.Drain(context.Background(), "b") }()
	testutil.Eventually(t, 10*time.Second, "b's drain is queued", func() bool {
		c.rb.gateMu.Lock()
		defer c.rb.gateMu.Unlock()
		return len(c.rb.waiters) == 1
	})
	fc.Advance(time.Second)
	if c.rb.step(context.Background()) {
		t.Fatal("the drain ran while a checkpoint was in progress")
	}
	undrained := make(chan error, 1)
	go func() { undrained <- c.Undrain(context.Background(), "b") }()
	testutil.Eventually(t, 10*time.Second, "the undrain answered or waits", func() bool {
		if len(undrained) > 0 {
			return true
		}
		c.rb.gateMu.Lock()
		defer c.rb.gateMu.Unlock()
		return len(c.rb.waiters) == 2
	})
	select {
	case err := <-undrained:
		t.Fatalf("the undrain of b answered (%v) while b's drain was queued", err)
	default:
	}
	held.Store(false)
	if !c.rb.step(context.Background()) {
		t.Fatal("the drain did not run once the checkpoint ended")
	}
	if err := <-drained; err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "the undrain queued b's join", func() bool {
		c.rb.gateMu.Lock()
		defer c.rb.gateMu.Unlock()
		return len(c.rb.waiters) == 1
	})
	fc.Advance(cluster.DefaultGateConfig().MaxSettle)
	testutil.Eventually(t, 10*time.Second, "the join ran", func() bool { return c.rb.step(context.Background()) })
	if err := <-undrained; err != nil {
		t.Fatal(err)
	}
	if s := <-runs; triggerOf(s) != cluster.TriggerJoin || len(s.Drain) != 0 {
		t.Fatalf("ran %+v, want b's join", s)
	}
	c.live.mu.Lock()
	mark := c.live.drained["b"]
	c.live.mu.Unlock()
	if mark {
		t.Fatal("b still drained after the undrain")
	}
}

// A drained worker that left the membership says so in its own status:
// itself left and drained, seeing no majority (it runs nothing), as the
// leader shows it; undrained, it is alive again. Before, its stopped
// gossip run still listed every member alive, itself included, and its
// status read "3 of 3 members alive" with MAJORITY yes
// (edged_cluster_members{state="alive"} 3, edged_cluster_sees_majority 1)
// while the leader showed it "left (drained)".
func TestStatusOfALeftNodeSaysItLeft(t *testing.T) {
	c := testClusterNode(t, nil)
	c.master = false
	self := func() cluster.MemberStatus {
		t.Helper()
		m, ok := c.Status().Member("a")
		if !ok {
			t.Fatal("no member a in its own status")
		}
		return m
	}
	if m := self(); m.State != cluster.StateAlive || m.Drained || !m.SeesMajority {
		t.Fatalf("before its drain: %+v", m)
	}
	c.leave()
	if m := self(); m.State != cluster.StateLeft || !m.Drained || m.SeesMajority {
		t.Fatalf("after it left: %+v, want left, drained, no majority", m)
	}
	if _, err := c.Rejoin(); err != nil {
		t.Fatal(err)
	}
	if m := self(); m.State != cluster.StateAlive || m.Drained || !m.SeesMajority {
		t.Fatalf("after it rejoined: %+v", m)
	}
}

// A failover that began and is not done (its jobs do not run again yet:
// with two nodes of three dead they wait for a majority) is shown in the
// status as in progress. Before, the status said "0 since the node
// started" and listed no failover while the nodes were dead and the
// jobs down, and a rebalance asked meanwhile waited, queued, for that
// failover, which nothing but the log named.
func TestStatusShowsAFailoverInProgress(t *testing.T) {
	c := testClusterNode(t, nil)
	at := time.Date(2026, 12, 7, 8, 52, 45, 0, time.UTC)
	c.live.mu.Lock()
	c.live.pending = []*pendingChange{{at: at, dead: "b,c", detectionMS: 1200}}
	c.live.mu.Unlock()
	s := c.Status()
	if len(s.FailoversInProgress) != 1 || s.FailoversInProgress[0].DeadNode != "b,c" || !s.FailoversInProgress[0].At.Equal(at) ||
		s.FailoversInProgress[0].DetectionMS != 1200 || s.FailoversTotal != 0 || len(s.Failovers) != 0 {
		t.Fatalf("status during the failover: in progress %+v, done %+v (%d)", s.FailoversInProgress, s.Failovers, s.FailoversTotal)
	}
	c.live.mu.Lock()
	c.live.pending = nil
	c.live.mu.Unlock()
	if s := c.Status(); len(s.FailoversInProgress) != 0 {
		t.Fatalf("in progress after it ended: %+v", s.FailoversInProgress)
	}
}
