package daemon

import (
	"errors"
	"github.com/edgedio/edged/pipeline"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/snapshot"
)

// Two jobs of one master. The first is redeployed three times, so its
// epochs run ahead of the second's, and every node sees them. The
// second's checkpoints still complete, their metadata taken by every
// node, and its own redeployment is placed at once. Before, the nodes
// kept the highest epoch of any job and refused the second job's
// metadata as a stale master's: its checkpoints failed until its
// attempts caught up.
func TestClusterJobThatRestartedLessOftenIsNotAStaleMaster(t *testing.T) {
	fc := newFailoverCluster(t, foOptions{second: true, count: 200_000})
	fc.waitCheckpoint("a", 0)
	before := fc.waitCheckpointOf("a", foJob2, 0)
	first := fc.job("a").run.Execution()
	for range 3 {
		old, _ := first.Runner()
		first.Redeploy("the test redeploys the first job")
		testutil.Eventually(t, time.Minute, "the first job runs its next attempt", func() bool {
			r, _ := first.Runner()
			return r != nil && r != old && started(r)
		})
	}
	r1, _ := first.Runner()
	second := fc.jobNamed("a", foJob2).run.Execution()
	r2, _ := second.Runner()
	if r2.Epoch() >= r1.Epoch() {
		t.Fatalf("the second job's epoch %d is not behind the first's %d", r2.Epoch(), r1.Epoch())
	}
	after := fc.waitCheckpointOf("a", foJob2, before)
	for _, s := range fc.jobNamed("a", foJob2).run.History() {
		if s.Checkpoint > before && s.Status == snapshot.Failed {
			t.Errorf("checkpoint %d of the second job failed: %v", s.Checkpoint, s.Err)
		}
	}
	// Its own redeployment is placed on every node and completes
	// checkpoints.
	second.Redeploy("the test redeploys the second job")
	testutil.Eventually(t, time.Minute, "the second job runs its next attempt", func() bool {
		r, _ := second.Runner()
		return r != nil && r != r2 && started(r)
	})
	fc.waitCheckpointOf("a", foJob2, after)
}

// started reports whether attempt r has started.
func started(r *actors.Runner) bool {
	select {
	case <-r.Started():
		return true
	default:
		return false
	}
}

// A takeover that started the first job and failed to start the second
// is tried again: the second starts in the first one's term, with an
// epoch above every one its earlier run used. The checkpoints of the
// first job go on completing. Before, each attempt started a new term:
// once the second job deployed in it, every peer refused the first
// job's checkpoint metadata as a stale master's, until the leadership
// changed.
func TestClusterTakeoverRetriedKeepsTheTermOfTheJobsItStarted(t *testing.T) {
	fc := newFailoverCluster(t, foOptions{second: true, count: 200_000})
	fc.waitCheckpoint("a", 0)
	before2 := fc.waitCheckpointOf("a", foJob2, 0)
	a := fc.nodes["a"]
	// The first attempt of the takeover left the second job not running.
	old2 := fc.jobNamed("a", foJob2)
	oldRunner, _ := old2.run.Execution().Runner()
	old2.cancel()
	<-old2.run.Done()
	a.c.lead.mu.Lock()
	a.c.lead.took, a.c.lead.id = true, "a"
	a.c.lead.mu.Unlock()
	r1, _ := fc.job("a").run.Execution().Runner()
	before1 := fc.waitCheckpoint("a", 0)

	if err := a.n.takeOver("a", []pipeline.PipelineConfig{a.pc, a.pc2}); err != nil {
		t.Fatalf("the takeover tried again: %v", err)
	}
	second := fc.jobNamed("a", foJob2)
	if second == old2 {
		t.Fatal("the takeover did not start the second job again")
	}
	var r2 *actors.Runner
	testutil.Eventually(t, time.Minute, "the second job to start", func() bool {
		r2, _ = second.run.Execution().Runner()
		return r2 != nil && started(r2)
	})
	if r2.Epoch()>>32 != r1.Epoch()>>32 || r2.Epoch() <= oldRunner.Epoch() {
		t.Fatalf("the second job runs epoch %#x; want the first job's term (epoch %#x) and above its earlier run's %#x",
			r2.Epoch(), r1.Epoch(), oldRunner.Epoch())
	}
	fc.waitCheckpointOf("a", foJob2, before2)
	// The first job's checkpoints since: none failed, and one completed
	// after the second job's.
	after := fc.waitCheckpoint("a", before1)
	for _, s := range fc.job("a").run.History() {
		if s.Checkpoint > before1 && s.Checkpoint <= after && s.Status == snapshot.Failed {
			t.Errorf("checkpoint %d of the first job failed: %v", s.Checkpoint, s.Err)
		}
	}
}

// The leader dies, and b's takeover starts the first job but fails for
// the second: b tries again after resume_backoff (a fake clock), and the
// second job runs, in the first one's term; both complete checkpoints.
// Before, a takeover that failed was not tried again: the second job
// stayed down until the leadership changed.
func TestClusterTakeoverThatFailedForAJobIsRetried(t *testing.T) {
	fc := newFailoverCluster(t, foOptions{second: true, count: 200_000})
	fc.waitCheckpoint("a", 0)
	fc.waitCheckpointOf("a", foJob2, 0)
	b := fc.nodes["b"]
	var calls atomic.Int32
	b.c.takeover = func(dead string) error {
		if calls.Add(1) == 1 {
			if err := b.n.takeOver(dead, []pipeline.PipelineConfig{b.pc}); err != nil {
				return err
			}
			return errors.New("the test fails the start of the second job")
		}
		return b.n.takeOver(dead, []pipeline.PipelineConfig{b.pc, b.pc2})
	}
	fc.kill("a")
	b.c.live.maybeTakeOver(fc.declareDead("a"))
	testutil.Eventually(t, time.Minute, "b to start the first job", func() bool {
		j := fc.job("b")
		return j != nil && j.snapshot().Status == StatusRunning
	})
	if fc.jobNamed("b", foJob2) != nil {
		t.Fatal("b started the second job in the failed attempt")
	}
	blockUntil(t, fc.clock, 1)
	fc.clock.Advance(b.c.hb.cfg.ResumeBackoff)
	fc.waitCheckpointOf("b", foJob2, 0)
	if n := calls.Load(); n != 2 {
		t.Fatalf("%d takeover attempts, want 2", n)
	}
	r1, _ := fc.job("b").run.Execution().Runner()
	r2, _ := fc.jobNamed("b", foJob2).run.Execution().Runner()
	if r1.Epoch()>>32 != r2.Epoch()>>32 {
		t.Fatalf("the jobs run in different terms: epochs %#x and %#x", r1.Epoch(), r2.Epoch())
	}
	fc.waitCheckpoint("b", fc.waitCheckpoint("b", 0))
}
