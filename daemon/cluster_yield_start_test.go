package daemon

import (
	"context"
	"sync"
	"testing"

	"github.com/edgedio/edged/pipeline"
)

// A node that started as the leader and yielded to another leader before
// it started its jobs (its gossip runs before the start: two nodes killed
// at once and started again, the other one taking over first) starts
// none: it follows the leader it yielded to. Deciding on the leadership
// it started with, it started them in a newer term than that leader's,
// refused that leader's deployments as a stale master's and had its own
// refused, and the cluster ran no job until every node was restarted.
func TestNodeThatYieldedBeforeItsStartStartsNoJob(t *testing.T) {
	fc := newFailoverCluster(t, foOptions{})
	a := fc.nodes["a"]
	pc := a.pc
	pc.Name = "yielded"
	// The job the harness started ends first: the yield below finds
	// none, as at a node's start.
	j := fc.job("a")
	j.cancel()
	<-j.run.Done()
	a.c.stepDown("b") // what a yield does (under startMu)
	var watchers sync.WaitGroup
	if err := a.n.startJobs(context.Background(), []pipeline.PipelineConfig{pc}, &watchers); err != nil {
		t.Fatal(err)
	}
	if j, err := a.n.job(context.Background(), pc.Name); err == nil {
		j.cancel()
		t.Errorf("node a started job %q after it yielded to b", pc.Name)
	}
	watchers.Wait()
}
