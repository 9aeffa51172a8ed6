package actors

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/snapshot"
)

// A deployment that fails while its master publishes a completed
// checkpoint's metadata to the cluster (Cluster.Publish, which waits on
// unreachable peers for up to the control timeout) gives the publication
// up at once: a leader cut off from the majority stops its tasks when it
// is told to (Execution.Redeploy), not when the publication times out.
func TestFailGivesUpAPublicationInFlight(t *testing.T) {
	var emitted, consumed atomic.Int64
	gate := make(chan struct{})
	close(gate)
	job := twoStageJob(&countingSource{n: 1 << 62, emitted: &emitted}, &gateSink{gate: gate, count: &consumed})
	cfg := DefaultConfig()
	cfg.Cluster = loopCluster(newLoopNet())
	cfg.Cluster.ControlTimeout = time.Hour
	entered := make(chan struct{})
	var once atomic.Bool
	cfg.Cluster.Publish = func(ctx context.Context, _ uint64, _ *snapshot.Metadata) error {
		if once.CompareAndSwap(false, true) {
			close(entered)
		}
		<-ctx.Done()
		return ctx.Err()
	}
	cfg.Checkpoint.Dir = t.TempDir()
	cfg.Checkpoint.Interval = 20 * time.Millisecond
	r, err := newRunner(job, cfg, 1)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- r.Run(context.Background()) }()
	testutil.Eventually(t, 0, "a checkpoint's publication to start", func() bool {
		select {
		case <-entered:
			return true
		default:
			return false
		}
	})
	cause := errors.New("no majority")
	r.fail(cause)
	var runErr error
	testutil.Eventually(t, 0, "the attempt to end while its publication waits", func() bool {
		select {
		case runErr = <-errc:
			return true
		default:
			return false
		}
	})
	if !errors.Is(runErr, cause) {
		t.Fatalf("Run returned %v, want the failure %v", runErr, cause)
	}
}

// Redeployments (the cluster changed) and tries that find no deployment
// (Cluster.Update fails: no majority) do not use up the restart
// strategy: with a budget of one restart, the job is redeployed three
// times and refused three deployments, and still runs to its end.
func TestRedeploysDoNotUseUpTheRestartBudget(t *testing.T) {
	var emitted, consumed atomic.Int64
	gate := make(chan struct{})
	job := twoStageJob(&countingSource{n: 1000, emitted: &emitted}, &gateSink{gate: gate, count: &consumed})
	cfg := DefaultConfig()
	cfg.Cluster = loopCluster(newLoopNet())
	cfg.Cluster.RetryInterval = time.Millisecond
	var refuse atomic.Int64
	nodes, placement := cfg.Cluster.Nodes, cfg.Cluster.Placement
	cfg.Cluster.Update = func() ([]Node, map[TaskKey]string, error) {
		if refuse.Load() > 0 {
			refuse.Add(-1)
			return nil, nil, errors.New("no majority")
		}
		return nodes, placement, nil
	}
	exec := NewExecution(job, cfg, &snapshot.FixedDelay{Attempts: 1})
	errc := make(chan error, 1)
	go func() { errc <- exec.Run(context.Background()) }()
	for i := range 3 {
		testutil.Eventually(t, 0, fmt.Sprintf("attempt %d to run", i+2), func() bool {
			r, _ := exec.Runner()
			return r != nil && exec.Attempts() == 2*i+1
		})
		refuse.Store(1)
		exec.Redeploy("test")
	}
	testutil.Eventually(t, 0, "the last attempt to run", func() bool {
		r, _ := exec.Runner()
		return r != nil && exec.Attempts() == 7
	})
	close(gate)
	var err error
	testutil.Eventually(t, 0, "the execution to end", func() bool {
		select {
		case err = <-errc:
			return true
		default:
			return false
		}
	})
	if err != nil {
		t.Fatalf("the job ended with %v after redeployments and refused deployments", err)
	}
	if exec.Attempts() != 7 {
		t.Fatalf("%d attempts, want 7 (4 deployed, 3 refused)", exec.Attempts())
	}
}
