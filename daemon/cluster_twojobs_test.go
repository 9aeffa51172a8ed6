package daemon

import (
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
