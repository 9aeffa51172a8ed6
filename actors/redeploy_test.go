package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/snapshot"
)

// A deployment that fails while its master publishes a completed
// checkpoint's metadata to the cluster (Cluster.Publish, which waits on
// unreachable peers for up to the control timeout) gives the publication
// up at once: a leader cut off from the majority stops its tasks when it
// is told to (Execution.Redeploy), not when the publication times out.
func TestFailGivesUpAPublicationInFlight(t *testing.T) {
	var emitted atomic.Int64
	job := endlessJob(&emitted)
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
	testutil.Receive(t, 0, "a checkpoint's publication to start", entered)
	cause := errors.New("no majority")
	r.fail(cause)
	runErr := testutil.Receive(t, 0, "the attempt to end while its publication waits", errc)
	if !errors.Is(runErr, cause) {
		t.Fatalf("Run returned %v, want the failure %v", runErr, cause)
	}
}

// Redeployments (the cluster changed) and tries that find no deployment
// (Cluster.Update fails: no majority) do not use up the restart
// strategy: with a budget of one restart, the job is redeployed three
// times and refused three deployments, and still runs to its end. The
// refused tries are not attempts and restore nothing.
func TestRedeploysDoNotUseUpTheRestartBudget(t *testing.T) {
	var consumed atomic.Int64
	// The attempts are held by their source, not their sink: a sink
	// blocked on a record cannot be stopped (protoactor gives its stop
	// up after 10 s), and a source that ran in a redeployed attempt
	// would leave the next ones nothing to read.
	gate, open := make(chan struct{}), make(chan struct{})
	close(open)
	job := twoStageJob(&gatedSource{gate: gate, n: 1000}, &gateSink{gate: open, count: &consumed})
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
		if !testutil.Within(0, func() bool {
			r, _ := exec.Runner()
			return r != nil && exec.Attempts() == i+1
		}) {
			r, _ := exec.Runner()
			t.Fatalf("attempt %d does not run: %d attempts, %d tries not placed, running %v, restores %v",
				i+1, exec.Attempts(), exec.NotPlaced(), r != nil, exec.Restores())
		}
		refuse.Store(1)
		exec.Redeploy("test")
	}
	testutil.Eventually(t, 0, "the last attempt to run", func() bool {
		r, _ := exec.Runner()
		return r != nil && exec.Attempts() == 4
	})
	close(gate)
	err := testutil.Receive(t, 0, "the execution to end", errc)
	if err != nil {
		t.Fatalf("the job ended with %v after redeployments and refused deployments", err)
	}
	if exec.Attempts() != 4 || exec.NotPlaced() != 3 {
		t.Fatalf("%d attempts and %d tries not placed, want 4 and 3", exec.Attempts(), exec.NotPlaced())
	}
	if r := exec.Restores(); len(r) != 3 {
		t.Fatalf("restores %v: want one per restart (3), none per try not placed", r)
	}
	if n := consumed.Load(); n != 1000 {
		t.Fatalf("the last attempt consumed %d records, want 1000", n)
	}
}

// gatedSource emits 0..n-1 once gate is closed, and nothing before (its
// task waits on Available, which the runtime gives up when it stops the
// task): an attempt that runs before has no record in flight, and the
// attempts after it find every record.
type gatedSource struct {
	operators.Base
	gate    <-chan struct{}
	n, next int64
}

func (s *gatedSource) Poll(out operators.Collector[int64], max int) (operators.Status, error) {
	select {
	case <-s.gate:
	default:
		return operators.NothingAvailable, nil
	}
	for k := 0; k < max && s.next < s.n; k++ {
		out.Collect(s.next)
		s.next++
	}
	if s.next == s.n {
		return operators.EndOfInput, nil
	}
	return operators.MoreAvailable, nil
}

func (s *gatedSource) Available() <-chan struct{} { return s.gate }

// A redeployment that lands once every host has reported its tasks
// deployed, before the job master starts them (here: as the master logs
// that the job starts, on its own goroutine), ends the attempt unstarted:
// no start command goes out, no source polls, the hosts are told that
// the deployment is over, and the attempt ends with the redeployment.
// A deployment started after its failure ran its sources for an attempt
// already given up.
func TestRedeployAfterTheHandshakeStartsNothing(t *testing.T) {
	var emitted atomic.Int64
	job := endlessJob(&emitted)
	ln := newLoopNet()
	var starts, cancels atomic.Int64
	ln.onSend = func(_ ChannelKey, body []byte) {
		m, err := decodeControl(body)
		if err != nil {
			return
		}
		switch m.Kind {
		case ctlStart:
			starts.Add(1)
		case ctlCancel:
			cancels.Add(1)
		}
	}
	cfg := DefaultConfig()
	cfg.Cluster = loopCluster(ln)
	cause := fmt.Errorf("%w: %w: job %q epoch 1: redeploying: test", ErrRedeployed, ErrControlFailed, job.Name)
	var r *Runner
	var landed atomic.Int64
	cfg.Logger = slog.New(onLog{msg: "job starting", do: func() {
		landed.Add(1)
		r.fail(cause)
	}})
	r, err := newRunner(job, cfg, 1)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- r.Run(context.Background()) }()
	runErr := testutil.Receive(t, 0, "the attempt to end", errc)
	if n := landed.Load(); n != 1 {
		t.Fatalf("the redeployment landed %d times between the handshake and the start, want once", n)
	}
	if !errors.Is(runErr, ErrRedeployed) {
		t.Fatalf("Run returned %v, want the redeployment %v", runErr, cause)
	}
	if n := starts.Load(); n != 0 {
		t.Fatalf("%d start commands sent for a deployment redeployed before its start, want none", n)
	}
	select {
	case <-r.Started():
		t.Fatal("Started closed for a deployment redeployed before its start")
	default:
	}
	if n := emitted.Load(); n != 0 {
		t.Fatalf("the source emitted %d records for a deployment redeployed before its start", n)
	}
	if n := cancels.Load(); n != 2 {
		t.Fatalf("%d cancel commands sent, want one per host (2)", n)
	}
}

// onLog is a slog.Handler that calls do, on the logging goroutine, for
// each record whose message is msg, and drops every record.
type onLog struct {
	msg string
	do  func()
}

func (h onLog) Enabled(context.Context, slog.Level) bool { return true }

func (h onLog) Handle(_ context.Context, rec slog.Record) error {
	if rec.Message == h.msg {
		h.do()
	}
	return nil
}

func (h onLog) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h onLog) WithGroup(string) slog.Handler      { return h }

// A redeployment while the attempt still invites a node in another
// process (the invitation waits on a node it cannot reach) ends the
// attempt at once, as a redeployment: with no restart strategy, the job
// is deployed again instead of ending.
func TestRedeployDuringTheInvitationIsNotAFailure(t *testing.T) {
	var emitted atomic.Int64
	job := endlessJob(&emitted)
	cfg := DefaultConfig()
	c := loopCluster(newLoopNet())
	c.Nodes[1].Network = nil // in another process: invited
	c.ControlTimeout = time.Hour
	var invites atomic.Int64
	c.Invite = func(ctx context.Context, _ string, _ Deployment) error {
		invites.Add(1)
		<-ctx.Done()
		return ctx.Err()
	}
	nodes, placement := c.Nodes, c.Placement
	c.Update = func() ([]Node, map[TaskKey]string, error) { return nodes, placement, nil }
	cfg.Cluster = c
	exec := NewExecution(job, cfg, nil)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- exec.Run(ctx) }()
	testutil.Eventually(t, 0, "the first invitation", func() bool { return invites.Load() == 1 })
	exec.Redeploy("majority lost")
	testutil.Eventually(t, 0, "the job invited again after the redeployment", func() bool {
		select {
		case err := <-errc:
			t.Fatalf("the redeployment ended the job: %v", err)
		default:
		}
		return invites.Load() == 2
	})
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run returned %v after cancel", err)
	}
}

// endlessJob is source -> sink with a source that never ends and a sink
// that never blocks; emitted counts the records the source emitted.
func endlessJob(emitted *atomic.Int64) *Job {
	open := make(chan struct{})
	close(open)
	var consumed atomic.Int64
	return twoStageJob(&countingSource{n: 1 << 62, emitted: emitted}, &gateSink{gate: open, count: &consumed})
}

// A deployment that fails (Execution.Redeploy: a leader cut off from the
// majority, say) stops this node's tasks taking input at once, even while
// an operator call blocks: stopping that task's actor waits for the call
// (protoactor gives it up after 10 s), and Run returns only then, but no
// task of the attempt is listed as running meanwhile.
func TestFailStopsTheNodesTasksWhileAnOperatorCallBlocks(t *testing.T) {
	var emitted, consumed atomic.Int64
	gate := make(chan struct{})
	job := twoStageJob(&countingSource{n: 1 << 62, emitted: &emitted}, &gateSink{gate: gate, count: &consumed})
	cfg := DefaultConfig()
	cfg.Cluster = loopCluster(newLoopNet())
	cfg.Cluster.ControlTimeout = time.Hour
	r, err := newRunner(job, cfg, 1)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- r.Run(context.Background()) }()
	testutil.Eventually(t, 0, "the sink blocks on its first record", func() bool {
		return testutil.Waiting("actors.(*gateSink).Collect")
	})
	testutil.Eventually(t, 0, "both tasks listed", func() bool { return len(r.Metrics()) == 2 })
	cause := errors.New("no majority")
	r.fail(cause)
	// Well under the actor stop's 10 s.
	testutil.Eventually(t, 2*time.Second, "the attempt's tasks stop", func() bool {
		return len(r.Metrics()) == 0
	})
	for _, h := range r.hosts {
		if !h.stopping() {
			t.Fatalf("host %q takes input after the failure", h.node)
		}
	}
	// The path this test names: the attempt still waits for the sink's
	// call, and its tasks drop what reaches them.
	select {
	case err := <-errc:
		t.Fatalf("Run returned (%v) before the sink's call did: nothing held the stop", err)
	default:
	}
	if !testutil.Waiting("actors.(*gateSink).Collect") {
		t.Fatal("the sink's call returned before the check")
	}
	close(gate)
	if err := testutil.Receive(t, 0, "the attempt to end once the sink's call returns", errc); !errors.Is(err, cause) {
		t.Fatalf("Run returned %v, want the failure %v", err, cause)
	}
}
