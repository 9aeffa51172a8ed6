package daemon

import (
	"slices"
	"testing"
	"time"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/cluster"
	"github.com/edgedio/edged/internal/testutil"
)

// A member whose config declares other pipelines (here another window
// size, which its worker would refuse to run the job's plan under) gets
// no subtasks: the job runs on the two others without a single failed
// attempt, commits every window result once, and the status marks the
// member. Before, the master placed c's home subtasks on it, each
// deployment failed on c's refusal, and the job stopped everywhere.
func TestClusterMemberWithOtherPipelinesGetsNoSubtasks(t *testing.T) {
	fc := newFailoverCluster(t, foOptions{other: "c"})
	e := fc.job("a").run.Execution()
	var r *actors.Runner
	testutil.Eventually(t, time.Minute, "the job deployed", func() bool { r, _ = e.Runner(); return r != nil })
	where, _ := placement(r)
	fc.finish("a")
	fc.checkTotals()
	if n := e.Attempts(); n != 1 {
		t.Errorf("the job ran %d attempts, want 1: a deployment failed", n)
	}
	on := map[string]int{}
	for _, node := range where {
		on[node]++
	}
	if on["c"] != 0 || on["a"] == 0 || on["b"] == 0 {
		t.Errorf("subtasks per node %v: want none on c, some on a and b", on)
	}
	if jobs := fc.nodes["c"].c.worker.Jobs(); len(jobs) != 0 {
		t.Errorf("c hosts %v", jobs)
	}

	st := fc.nodes["a"].c.Status()
	for _, m := range st.Members {
		if m.OtherPipelines != (m.ID == "c") {
			t.Errorf("member %s: other_pipelines %v", m.ID, m.OtherPipelines)
		}
		if m.State != cluster.StateAlive {
			t.Errorf("member %s: state %s, want alive (it counts for the majority)", m.ID, m.State)
		}
	}
	// The drain and rebalance placement leaves it out as well.
	placements, err := fc.nodes["a"].c.room(nil)
	if err != nil {
		t.Fatal(err)
	}
	for job, p := range placements {
		for k, node := range p {
			if node == "c" {
				t.Errorf("job %s: a rebalance would put %v on c", job, k)
			}
		}
	}
}

// A member running other pipelines is not asked of the rebalance gate as
// a join; once it runs the same pipelines (it restarted with a matching
// config) it is, as a node that comes back.
func TestMemberWithMatchingPipelinesAgainJoins(t *testing.T) {
	c := testClusterNode(t, nil)
	v := c.live
	alive := []string{"a", "b", "c"}
	others := map[string]bool{"c": true}
	v.aliveFn = func() []string { return alive }
	v.othersFn = func() map[string]bool { return others }
	v.deployed = v.placed(alive)
	if !slices.Equal(v.deployed, []string{"a", "b"}) {
		t.Fatalf("placed %v, want a and b", v.deployed)
	}
	jobs := func() []*actors.Execution { return nil }
	v.follow(alive, jobs)
	v.mu.Lock()
	joining := v.joining["c"]
	v.mu.Unlock()
	if joining {
		t.Fatal("c, running other pipelines, asked as a join")
	}
	others = nil
	v.follow(alive, jobs)
	v.mu.Lock()
	joining = v.joining["c"]
	v.mu.Unlock()
	if !joining {
		t.Fatal("c, running the same pipelines now, not asked as a join")
	}
}

// A member whose config names none of the job's pipelines keeps no
// replicas of the job's checkpoints: the others leave it out of the
// replica targets and of the metadata's spread. Before, a's and b's state
// files went to c as well, c refused them (no pipeline of its config
// takes checkpoints under that name), every checkpoint was declined and
// the job restarted without end.
func TestClusterMemberWithOtherPipelineNameKeepsNoReplicas(t *testing.T) {
	fc := newFailoverCluster(t, foOptions{other: "c", otherName: true})
	e := fc.job("a").run.Execution()
	testutil.Eventually(t, time.Minute, "the job deployed", func() bool { r, _ := e.Runner(); return r != nil })
	fc.finish("a")
	fc.checkTotals()
	if n := e.Attempts(); n != 1 {
		t.Errorf("the job ran %d attempts, want 1: a checkpoint was declined", n)
	}
	if got := fc.nodes["a"].c.live.alike(); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("a keeps replicas on %v, want [a b]", got)
	}
}
