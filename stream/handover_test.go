package stream_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/cluster"
	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/stream"
	"github.com/edgedio/edged/watermark"
)

// gateOp passes records through; while its gate is armed, its snapshot
// blocks until the gate is released, so that a checkpoint stays in
// progress as long as a test needs.
type gateOp struct {
	operators.Base
	g   *snapshotGate
	out operators.Collector[operators.SensorReading]
}

type snapshotGate struct {
	armed atomic.Bool
	// decline makes the next snapshot fail.
	decline atomic.Bool
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

func newSnapshotGate() *snapshotGate {
	return &snapshotGate{entered: make(chan struct{}), release: make(chan struct{})}
}

func (o *gateOp) Collect(r operators.SensorReading) { o.out.Collect(r) }

func (o *gateOp) SnapshotState(id int64) ([]byte, error) {
	if o.g != nil && o.g.decline.CompareAndSwap(true, false) {
		return nil, fmt.Errorf("snapshot %d declined by the test", id)
	}
	if o.g != nil && o.g.armed.Load() {
		o.g.once.Do(func() { close(o.g.entered) })
		<-o.g.release
	}
	return nil, nil
}

// handoverJob is generator (paced) -> gate -> key by sensor -> 10 s
// tumbling count+sum -> exactly-once file sink, at parallelism 2.
func handoverJob(n int64, keys int, rate float64, dir string, seen *atomic.Int64, g *snapshotGate, opts ...stream.Option) *stream.Environment {
	env := stream.NewEnvironment("handover", append([]stream.Option{stream.WithParallelism(2)}, opts...)...)
	src := stream.FromSource(env, "generator", func() operators.Source[operators.SensorReading] {
		return operators.SensorGenerator(operators.GeneratorConfig{Count: n, Keys: keys, Rate: rate})
	}).SetParallelism(1).UID("generator").
		AssignTimestampsAndWatermarks("timestamps", watermark.ForMonotonous(eventTime))
	gated := stream.Transform(src.Rebalance(), "gate", func(out operators.Collector[operators.SensorReading]) operators.OneInput[operators.SensorReading] {
		return &gateOp{g: g, out: operators.CollectorFunc[operators.SensorReading](func(r operators.SensorReading) {
			seen.Add(1)
			out.Collect(r)
		})}
	}).UID("gate")
	w := stream.Window(stream.KeyBy(gated, bySensor), operators.TumblingEventTimeWindows(10*time.Second))
	stream.WindowAggregate(w, "count-sum", countSumWin{}).UID("count-sum").
		To("files", func() operators.Sink[operators.WindowResult[string, countSum]] {
			return operators.NewFileSink(dir, windowLine)
		}).UID("files")
	return env
}

// handoverReference returns the committed lines of a run in one process
// without a move.
func handoverReference(t *testing.T, n int64, keys int) []string {
	t.Helper()
	dir := t.TempDir()
	var seen atomic.Int64
	if err := execute(t, handoverJob(n, keys, 0, dir, &seen, nil)); err != nil {
		t.Fatal(err)
	}
	lines := committedLines(t, dir)
	if len(lines) == 0 {
		t.Fatal("reference run committed nothing")
	}
	return lines
}

// handoverRun is a job on a 3-node in-memory cluster, started.
type handoverRun struct {
	c    *testCluster
	job  *stream.Job
	out  string
	seen *atomic.Int64
	from string // the node count-sum[0] runs on
	to   string // another node
}

func startHandoverRun(t *testing.T, n int64, keys int, rate float64, g *snapshotGate, cp snapshot.Config, hook func(actors.HandoverStep, string) error, opts ...stream.Option) *handoverRun {
	t.Helper()
	c := memoryCluster(t, 3, 1, cluster.Faults{})
	c.HandoverHook = hook
	hr := &handoverRun{c: c, out: t.TempDir(), seen: &atomic.Int64{}}
	env := handoverJob(n, keys, rate, hr.out, hr.seen, g, append([]stream.Option{
		stream.WithCheckpointing(cp),
		stream.WithRestartStrategy(&snapshot.FixedDelay{Attempts: 5}),
		stream.WithCluster(c.Cluster)}, opts...)...)
	c.spread(t, env)
	hr.from = c.Placement[actors.TaskKey{UID: "count-sum", Subtask: 0}]
	for _, nd := range c.Nodes {
		if nd.ID != hr.from && nd.ID != c.Placement[actors.TaskKey{UID: "count-sum", Subtask: 1}] {
			hr.to = nd.ID
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	job, err := env.ExecuteAsync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hr.job = job
	testutil.Eventually(t, 0, "a quarter of the records read", func() bool { return hr.seen.Load() >= n/4 })
	return hr
}

// recordsIn returns the records-in counter of subtask sub of the chain
// headed by count-sum.
func recordsIn(ms []actors.TaskMetrics, sub int) (int64, bool) {
	for _, m := range ms {
		if len(m.Operators) > 0 && m.Operators[0] == "count-sum" && m.Subtask == sub {
			return m.RecordsIn, true
		}
	}
	return 0, false
}

func (hr *handoverRun) finish(t *testing.T, want []string) {
	t.Helper()
	finishMoved(t, hr.job, hr.out, want)
}

// finishMoved waits for job to end and compares what its sink committed
// in out with want, the output of the same job without a move.
func finishMoved(t *testing.T, job *stream.Job, out string, want []string) {
	t.Helper()
	if err := job.Wait(); err != nil {
		t.Fatal(err)
	}
	got := committedLines(t, out)
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("committed output differs from the run without a move: %d lines vs %d\n%s", len(got), len(want), diffLines(got, want))
	}
}

func handoverCheckpoints(t *testing.T) snapshot.Config {
	cp := checkpointConfig(t, snapshot.ExactlyOnce)
	cp.Interval = 50 * time.Millisecond
	return cp
}

// A keyed subtask moves to another node while the job runs: only it
// pauses (the other subtask of its operator keeps processing records
// while the moved one is stopped, with no restart: the same attempt, its
// records-in counter never reset), its key groups' state arrives on the
// new node, and the committed output equals a run without a move.
func TestHandoverMovesOnlyTheMovedSubtask(t *testing.T) {
	testutil.Burn(t, 1)
	const n, keys = 400_000, 100
	want := handoverReference(t, n, keys)

	var during atomic.Int64 // what count-sum[1] processed while [0] was stopped
	var run *handoverRun
	hook := func(step actors.HandoverStep, node string) error {
		if step != actors.HandoverRestore {
			return nil
		}
		// The moved subtask is retired, its replacement not built yet:
		// the other subtask goes on.
		r, _ := run.job.Execution().Runner()
		before, ok := recordsIn(r.Metrics(), 1)
		if !ok {
			return errors.New("count-sum[1] is gone")
		}
		if _, ok := recordsIn(r.Metrics(), 0); ok {
			return errors.New("count-sum[0] still runs after it was retired")
		}
		testutil.Eventually(t, 0, "count-sum[1] processes records while count-sum[0] is handed over", func() bool {
			now, _ := recordsIn(r.Metrics(), 1)
			during.Store(now - before)
			return now-before >= 1000 || run.seen.Load() >= n
		})
		return nil
	}
	// Records for the moved subtask wait in its parked channels, bounded
	// by their credits: with 256 credits of 512 records they hold all that
	// is left to read, so the other subtask never waits for the handover.
	run = startHandoverRun(t, n, keys, 100_000, nil, handoverCheckpoints(t), hook, stream.WithCredits(256))
	r0, _ := run.job.Execution().Runner()

	// count-sum[1]'s records-in counter is sampled all along: it must
	// never go back (a restart would reset it).
	stop := make(chan struct{})
	var sampler sync.WaitGroup
	var went atomic.Value
	sampler.Add(1)
	go func() {
		defer sampler.Done()
		last := int64(-1)
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
			r, _ := run.job.Execution().Runner()
			if r == nil {
				continue
			}
			v, ok := recordsIn(r.Metrics(), 1)
			if !ok {
				continue
			}
			if v < last {
				went.Store(fmt.Sprintf("count-sum[1] records-in went from %d to %d", last, v))
			}
			last = v
		}
	}()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := run.job.Execution().Move(ctx, []actors.Move{{UID: "count-sum", Subtask: 0, To: run.to}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("moved %+v; savepoint %d, took %v; count-sum[1] processed %d records meanwhile", res.Moved, res.Savepoint, res.Took, during.Load())
	if len(res.Moved) != 1 || res.Moved[0].From != run.from || res.Moved[0].To != run.to || res.Moved[0].Inputs != 2 {
		t.Fatalf("moved %+v, want count-sum[0] from %s to %s with its 2 inputs re-pointed", res.Moved, run.from, run.to)
	}
	r1, _ := run.job.Execution().Runner()
	if r1 != r0 || run.job.Attempts() != 1 {
		t.Fatalf("the job restarted: attempts %d", run.job.Attempts())
	}
	if got := r1.NodeOf("count-sum", 0); got != run.to {
		t.Fatalf("count-sum[0] runs on %q, want %q", got, run.to)
	}
	if got := r1.NodeOf("count-sum", 1); got == run.to && got != run.c.Placement[actors.TaskKey{UID: "count-sum", Subtask: 1}] {
		t.Fatalf("count-sum[1] moved to %q", got)
	}
	if h := r1.Handovers(); h != 2 {
		t.Fatalf("%d subtasks retired or taken over, want 2", h)
	}
	if during.Load() < 1000 && run.seen.Load() < n {
		t.Fatalf("count-sum[1] processed %d records while count-sum[0] was handed over", during.Load())
	}
	run.finish(t, want)
	close(stop)
	sampler.Wait()
	if v := went.Load(); v != nil {
		t.Fatal(v)
	}
	if run.job.Attempts() != 1 {
		t.Fatalf("%d attempts", run.job.Attempts())
	}
	run.c.checkCrossed(t)
}

// testHandoverFallback fails a handover at step (on the node it runs on)
// and checks that the job restarts from its latest checkpoint or
// savepoint with the placement from before the handover, with exactly the
// output of a run without a move.
func testHandoverFallback(t *testing.T, fail func(hr **handoverRun) (func(actors.HandoverStep, string) error, *snapshotGate), cp func(t *testing.T) snapshot.Config) {
	testutil.Burn(t, 1)
	const n, keys = 300_000, 100
	want := handoverReference(t, n, keys)
	var run *handoverRun
	hook, g := fail(&run)
	run = startHandoverRun(t, n, keys, 100_000, g, cp(t), hook)
	if g != nil {
		g.decline.Store(true)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := run.job.Execution().Move(ctx, []actors.Move{{UID: "count-sum", Subtask: 0, To: run.to}})
	if !errors.Is(err, actors.ErrHandover) {
		t.Fatalf("move: %v, want ErrHandover", err)
	}
	t.Log(err)
	testutil.Eventually(t, 0, "the job restarted", func() bool { return run.job.Attempts() >= 2 })
	r, changed := run.job.Execution().Runner()
	for r == nil {
		<-changed
		r, changed = run.job.Execution().Runner()
	}
	if got := r.NodeOf("count-sum", 0); got != run.from {
		t.Fatalf("after the fallback count-sum[0] runs on %q, want %q (the placement before the handover)", got, run.from)
	}
	run.finish(t, want)
	t.Logf("attempts %d, restores %v", run.job.Attempts(), run.job.Restores())
	if len(run.job.Restores()) < 1 {
		t.Fatal("no restart")
	}
}

// The old owner fails after it snapshotted at the barrier, before it
// hands over: the whole job restarts from the handover's savepoint with
// the old placement, and the output is exact.
func TestHandoverOldOwnerFailsFallsBack(t *testing.T) {
	testHandoverFallback(t, func(hr **handoverRun) (func(actors.HandoverStep, string) error, *snapshotGate) {
		return func(step actors.HandoverStep, node string) error {
			if step == actors.HandoverRetire && node == (*hr).from {
				return errors.New("old owner died")
			}
			return nil
		}, nil
	}, handoverCheckpoints)
}

// The new owner fails while it restores the moved subtask (the old one
// is already retired): the whole job restarts from the handover's
// savepoint with the old placement, and the output is exact.
func TestHandoverNewOwnerFailsMidRestoreFallsBack(t *testing.T) {
	testHandoverFallback(t, func(hr **handoverRun) (func(actors.HandoverStep, string) error, *snapshotGate) {
		return func(step actors.HandoverStep, node string) error {
			if step == actors.HandoverRestore && node == (*hr).to {
				return errors.New("new owner died")
			}
			return nil
		}, nil
	}, handoverCheckpoints)
}

// The handover's savepoint fails after the moved subtask stopped at its
// barrier: the job restarts (here from the beginning: no checkpoint
// completed before) and the output is exact.
func TestHandoverSavepointFailsFallsBack(t *testing.T) {
	testHandoverFallback(t, func(**handoverRun) (func(actors.HandoverStep, string) error, *snapshotGate) {
		return nil, newSnapshotGate()
	}, func(t *testing.T) snapshot.Config {
		cp := handoverCheckpoints(t)
		cp.Interval = time.Hour
		return cp
	})
}

// A handover asked while a checkpoint is in progress waits for it, then
// takes its own savepoint and moves the subtask.
func TestHandoverWaitsForCheckpointInProgress(t *testing.T) {
	testutil.Burn(t, 1)
	const n, keys = 300_000, 100
	want := handoverReference(t, n, keys)
	g := newSnapshotGate()
	cp := handoverCheckpoints(t)
	cp.Interval = time.Hour
	run := startHandoverRun(t, n, keys, 100_000, g, cp, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	g.armed.Store(true)
	type spRes struct {
		path string
		err  error
	}
	sp := make(chan spRes, 1)
	go func() {
		p, err := run.job.TriggerSavepoint(ctx, "")
		sp <- spRes{p, err}
	}()
	<-g.entered
	r, _ := run.job.Execution().Runner()
	type mvRes struct {
		res actors.MoveResult
		err error
	}
	mv := make(chan mvRes, 1)
	go func() {
		res, err := run.job.Execution().Move(ctx, []actors.Move{{UID: "count-sum", Subtask: 0, To: run.to}})
		mv <- mvRes{res, err}
	}()
	testutil.Eventually(t, 0, "the move waits for the checkpoint in progress", func() bool { return r.PendingMoves() == 1 })
	select {
	case m := <-mv:
		t.Fatalf("the move ended while a checkpoint was in progress: %+v %v", m.res, m.err)
	default:
	}
	g.armed.Store(false)
	close(g.release)
	s := <-sp
	if s.err != nil {
		t.Fatal(s.err)
	}
	m := <-mv
	if m.err != nil {
		t.Fatal(m.err)
	}
	md, err := snapshot.Load(s.path)
	if err != nil {
		t.Fatal(err)
	}
	if !m.res.Waited || m.res.Savepoint <= snapshot.ID(md.Checkpoint) {
		t.Fatalf("move %+v after savepoint %d: it did not wait", m.res, md.Checkpoint)
	}
	if got := r.NodeOf("count-sum", 0); got != run.to {
		t.Fatalf("count-sum[0] runs on %q, want %q", got, run.to)
	}
	run.finish(t, want)
	if run.job.Attempts() != 1 {
		t.Fatalf("%d attempts", run.job.Attempts())
	}
}
