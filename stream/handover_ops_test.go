package stream_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/cluster"
	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/keygroup"
	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/stream"
)

// The tests in this file ask for an operation of the user (a savepoint,
// a stop with a savepoint, a rescale from it, a cancel, a redeployment)
// while a handover is held mid-way: the moved subtask is retired on its
// old node and not yet restored on its new one. The operation must wait
// for the handover and then succeed, or end with an error that names the
// handover; no record is lost or counted twice, and the job never hangs.

// handoverHold holds a handover at its restore step on the new node
// until released; failing makes that step fail once released.
type handoverHold struct {
	reached chan struct{}
	release chan struct{}
	once    sync.Once
	failing atomic.Bool
	to      atomic.Pointer[string]
}

func newHandoverHold(t *testing.T) *handoverHold {
	h := &handoverHold{reached: make(chan struct{}), release: make(chan struct{})}
	t.Cleanup(h.free)
	return h
}

// hook is the cluster's handover hook.
func (h *handoverHold) hook(step actors.HandoverStep, node string) error {
	if to := h.to.Load(); step != actors.HandoverRestore || to == nil || node != *to {
		return nil
	}
	h.once.Do(func() { close(h.reached) })
	<-h.release
	if h.failing.Load() {
		return errors.New("new owner died while it restored the moved subtask")
	}
	return nil
}

func (h *handoverHold) free() {
	select {
	case <-h.release:
	default:
		close(h.release)
	}
}

type moveOutcome struct {
	res actors.MoveResult
	err error
}

type savepointOutcome struct {
	path string
	err  error
}

// startHeldMove starts a handover job on three in-memory nodes, asks for
// count-sum[0] to move and returns once the handover is held at its
// restore step.
func startHeldMove(t *testing.T, n int64, keys int, cp snapshot.Config) (*handoverRun, *handoverHold, <-chan moveOutcome) {
	t.Helper()
	h := newHandoverHold(t)
	run := startHandoverRun(t, n, keys, 100_000, nil, cp, h.hook)
	h.to.Store(&run.to)
	mv := make(chan moveOutcome, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		res, err := run.job.Execution().Move(ctx, []actors.Move{{UID: "count-sum", Subtask: 0, To: run.to}})
		mv <- moveOutcome{res, err}
	}()
	select {
	case <-h.reached:
	case m := <-mv:
		t.Fatalf("the move ended before its restore step: %+v %v", m.res, m.err)
	}
	return run, h, mv
}

// savepointDuringHandover starts a job whose handover is held (no
// periodic checkpoint), asks for a savepoint (stop: and the job's end),
// frees the handover, and checks that the move completed and that the
// savepoint succeeded after it; it returns the run and the savepoint's
// path.
func savepointDuringHandover(t *testing.T, n int64, keys int, stop bool) (*handoverRun, string) {
	t.Helper()
	cp := handoverCheckpoints(t)
	cp.Interval = time.Hour
	run, h, mv := startHeldMove(t, n, keys, cp)
	sp := savepointAsync(t, run.job, stop)
	h.free()
	m := <-mv
	checkMoved(t, run, m)
	s := <-sp
	if s.err != nil {
		t.Fatalf("savepoint (stop %v) after the handover: %v", stop, s.err)
	}
	checkNewerSavepoint(t, s.path, m.res.Savepoint)
	return run, s.path
}

// checkNewerSavepoint fails t unless the savepoint at path loads and is
// newer than the handover's savepoint (0: the handover took none).
func checkNewerSavepoint(t *testing.T, path string, handover snapshot.ID) {
	t.Helper()
	md, err := snapshot.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if handover != 0 && md.Checkpoint <= handover {
		t.Fatalf("the savepoint %d is not newer than the handover's %d", md.Checkpoint, handover)
	}
}

// savepointAsync asks for a savepoint (stop: and the job's end) and
// returns once the request waits in the job master.
func savepointAsync(t *testing.T, job *stream.Job, stop bool) <-chan savepointOutcome {
	t.Helper()
	return testutil.CallUntilWaiting(t, "actors.(*Runner).TriggerSavepoint", func() savepointOutcome {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if stop {
			p, err := job.StopWithSavepoint(ctx, "")
			return savepointOutcome{p, err}
		}
		p, err := job.TriggerSavepoint(ctx, "")
		return savepointOutcome{p, err}
	})
}

// restartFrom runs the handover job again from the savepoint at path on
// three fresh in-memory nodes, with opts, to the end of its input, and
// checks that its sink's output, with what the first run committed,
// equals want.
func restartFrom(t *testing.T, run *handoverRun, n int64, keys int, path string, want []string, opts ...stream.Option) {
	t.Helper()
	c := memoryCluster(t, 3, 2, cluster.Faults{})
	var seen atomic.Int64
	env := handoverJob(n, keys, 0, run.out, &seen, nil, append([]stream.Option{
		stream.WithCheckpointing(handoverCheckpoints(t)),
		stream.WithCluster(c.Cluster),
		stream.WithSavepoint(path, false)}, opts...)...)
	c.spread(t, env)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	job, err := env.ExecuteAsync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	finishMoved(t, job, run.out, want)
}

// checkMoved fails the test unless the move succeeded and moved
// count-sum[0] to run.to.
func checkMoved(t *testing.T, run *handoverRun, m moveOutcome) {
	t.Helper()
	if m.err != nil {
		t.Fatalf("move: %v", m.err)
	}
	if len(m.res.Moved) != 1 || m.res.Moved[0].To != run.to {
		t.Fatalf("moved %+v, want count-sum[0] to %s", m.res.Moved, run.to)
	}
}

// A stop with a savepoint asked while a handover is held waits for the
// handover, then stops the job at a savepoint taken after the
// handover's; the job rescaled from it (parallelism 3) commits, with
// what the first run committed, exactly the output of a run without a
// move.
func TestHandoverStopWithSavepointWaitsAndRescales(t *testing.T) {
	testutil.Burn(t, 1)
	const n, keys = 300_000, 100
	want := handoverReference(t, n, keys)
	run, path := savepointDuringHandover(t, n, keys, true)
	if err := run.job.Wait(); err != nil {
		t.Fatalf("the stopped job: %v", err)
	}
	if run.job.Attempts() != 1 {
		t.Fatalf("%d attempts", run.job.Attempts())
	}
	restartFrom(t, run, n, keys, path, want, stream.WithParallelism(3))
}

// A savepoint asked while a handover is held waits for it, is taken after
// it, and the job runs on in the same attempt to an exact output.
func TestHandoverSavepointWaitsForHandover(t *testing.T) {
	testutil.Burn(t, 1)
	const n, keys = 300_000, 100
	want := handoverReference(t, n, keys)
	run, _ := savepointDuringHandover(t, n, keys, false)
	run.finish(t, want)
	if run.job.Attempts() != 1 {
		t.Fatalf("%d attempts", run.job.Attempts())
	}
}

// A stop with a savepoint asked while a handover is held, whose handover
// then fails (the job restarts from the handover's savepoint with the
// old placement): the stop is not lost with the failed attempt, it stops
// the restarted one; the job restarted from the stop's savepoint commits
// exactly the output of a run without a move.
func TestHandoverStopWithSavepointOutlivesAFailedHandover(t *testing.T) {
	testutil.Burn(t, 1)
	const n, keys = 300_000, 100
	want := handoverReference(t, n, keys)
	cp := handoverCheckpoints(t)
	cp.Interval = time.Hour
	run, h, mv := startHeldMove(t, n, keys, cp)
	stop := savepointAsync(t, run.job, true)
	h.failing.Store(true)
	h.free()
	m := <-mv
	if !errors.Is(m.err, actors.ErrHandover) {
		t.Fatalf("move: %v, want ErrHandover", m.err)
	}
	s := <-stop
	if s.err != nil {
		t.Fatalf("stop with a savepoint after a failed handover: %v", s.err)
	}
	if err := run.job.Wait(); err != nil {
		t.Fatalf("the stopped job: %v", err)
	}
	if run.job.Attempts() != 2 {
		t.Fatalf("%d attempts, want 2 (the handover's fallback)", run.job.Attempts())
	}
	checkNewerSavepoint(t, s.path, m.res.Savepoint)
	restartFrom(t, run, n, keys, s.path, want)
}

// A cancel while a handover is held ends the job at once (the handover
// gives up with it); the job started again from its latest checkpoint or
// savepoint commits exactly the output of a run without a move.
func TestHandoverCancelEndsTheJob(t *testing.T) {
	testutil.Burn(t, 1)
	const n, keys = 300_000, 100
	want := handoverReference(t, n, keys)
	h := newHandoverHold(t)
	var seen atomic.Int64
	out := t.TempDir()
	c := memoryCluster(t, 3, 1, cluster.Faults{})
	c.HandoverHook = h.hook
	cp := handoverCheckpoints(t)
	env := handoverJob(n, keys, 100_000, out, &seen, nil, stream.WithCheckpointing(cp), stream.WithCluster(c.Cluster))
	c.spread(t, env)
	to := c.thirdNode("count-sum")
	h.to.Store(&to)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	job, err := env.ExecuteAsync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 0, "a quarter of the records read", func() bool { return seen.Load() >= n/4 })
	mv := make(chan moveOutcome, 1)
	go func() {
		res, err := job.Execution().Move(context.Background(), []actors.Move{{UID: "count-sum", Subtask: 0, To: to}})
		mv <- moveOutcome{res, err}
	}()
	<-h.reached
	cancel()
	h.free()
	if err := job.Wait(); !errors.Is(err, context.Canceled) {
		t.Fatalf("the cancelled job: %v", err)
	}
	if m := <-mv; m.err == nil {
		t.Fatalf("the move succeeded after the job was cancelled: %+v", m.res)
	}
	store, err := snapshot.OpenStore(cp.Dir, "handover", keygroup.DefaultMaxParallelism, nil)
	if err != nil {
		t.Fatal(err)
	}
	md, err := store.RecoveryPoint(false)
	if err != nil {
		t.Fatal(err)
	}
	run := &handoverRun{out: out}
	restartFrom(t, run, n, keys, md.Dir, want)
}

// A redeployment (the cluster restarts the job on a new placement) while
// a handover is held fails the handover with an error naming it, and the
// job restarts and runs to an exact output.
func TestHandoverRedeployFallsBack(t *testing.T) {
	testutil.Burn(t, 1)
	const n, keys = 300_000, 100
	want := handoverReference(t, n, keys)
	run, h, mv := startHeldMove(t, n, keys, handoverCheckpoints(t))
	run.job.Execution().Redeploy("rescaled by the test")
	h.free()
	m := <-mv
	if !errors.Is(m.err, actors.ErrHandover) {
		t.Fatalf("move: %v, want ErrHandover", m.err)
	}
	run.finish(t, want)
	if run.job.Attempts() < 2 {
		t.Fatalf("%d attempts: the job did not redeploy", run.job.Attempts())
	}
}
