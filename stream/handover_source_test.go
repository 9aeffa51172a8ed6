package stream_test

import (
	"context"
	"errors"
	"fmt"
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

// splitJob is the handover job with a generator of two splits: generator
// (paced) -> timestamps -> rebalance -> gate -> key by sensor -> 10 s
// tumbling count+sum -> exactly-once file sink, at parallelism 2.
func splitJob(n int64, keys int, rate float64, dir string, seen *atomic.Int64, opts ...stream.Option) *stream.Environment {
	return splitJobHeld(n, keys, rate, dir, seen, nil, opts...)
}

// gateHold, once armed, stops every gate subtask at its next record until
// released: what else the subtask's actor would do waits behind it.
type gateHold struct {
	armed   atomic.Bool
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

func newGateHold(t *testing.T) *gateHold {
	h := &gateHold{entered: make(chan struct{}), release: make(chan struct{})}
	t.Cleanup(h.free)
	return h
}

func (h *gateHold) wait() {
	if h == nil || !h.armed.Load() {
		return
	}
	h.once.Do(func() { close(h.entered) })
	<-h.release
}

// free releases the held gates, once.
func (h *gateHold) free() {
	select {
	case <-h.release:
	default:
		close(h.release)
	}
}

// splitJobHeld is splitJob whose gate subtasks stop at hold once armed.
func splitJobHeld(n int64, keys int, rate float64, dir string, seen *atomic.Int64, hold *gateHold, opts ...stream.Option) *stream.Environment {
	env := stream.NewEnvironment("handover", append([]stream.Option{stream.WithParallelism(2)}, opts...)...)
	src := stream.FromSource(env, "generator", func() operators.Source[operators.SensorReading] {
		return operators.SensorGenerator(operators.GeneratorConfig{Count: n, Keys: keys, Rate: rate})
	}).UID("generator").
		AssignTimestampsAndWatermarks("timestamps", watermark.ForMonotonous(eventTime))
	gated := stream.Transform(src.Rebalance(), "gate", func(out operators.Collector[operators.SensorReading]) operators.OneInput[operators.SensorReading] {
		return &gateOp{out: operators.CollectorFunc[operators.SensorReading](func(r operators.SensorReading) {
			hold.wait()
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

// splitReference returns what a run of splitJob without a move commits.
func splitReference(t *testing.T, n int64, keys int) []string {
	t.Helper()
	dir := t.TempDir()
	var seen atomic.Int64
	if err := execute(t, splitJob(n, keys, 0, dir, &seen)); err != nil {
		t.Fatal(err)
	}
	lines := committedLines(t, dir)
	if len(lines) == 0 {
		t.Fatal("reference run committed nothing")
	}
	return lines
}

// thirdNode returns the node that runs neither subtask of vertex uid
// (of parallelism 2, spread over three nodes).
func (c *testCluster) thirdNode(uid string) string {
	to := ""
	for _, nd := range c.Nodes {
		if nd.ID != c.Placement[actors.TaskKey{UID: uid, Subtask: 0}] && nd.ID != c.Placement[actors.TaskKey{UID: uid, Subtask: 1}] {
			to = nd.ID
		}
	}
	return to
}

// completedAfter reports whether a checkpoint newer than id completed in
// r's attempt.
func completedAfter(r *actors.Runner, id snapshot.ID) bool {
	for _, s := range r.History() {
		if s.Checkpoint > id && s.Status == snapshot.Completed {
			return true
		}
	}
	return false
}

// chainMetrics returns the metrics of subtask sub of the chain headed by
// head.
func chainMetrics(ms []actors.TaskMetrics, head string, sub int) (actors.TaskMetrics, bool) {
	for _, m := range ms {
		if len(m.Operators) > 0 && m.Operators[0] == head && m.Subtask == sub {
			return m, true
		}
	}
	return actors.TaskMetrics{}, false
}

// A source split moves to another node while the job runs: the old
// instance snapshots its position at the handover's barrier and emits
// nothing after it, the new one goes on from that position, and the
// readers take its new channels after the old ones' barrier. The other
// split and every other subtask keep running (the same attempt: no
// restart), and the committed output equals a run without a move: no
// record lost, none read twice.
func TestHandoverMovesASourceSplit(t *testing.T) {
	testutil.Burn(t, 1)
	const n, keys = 400_000, 100
	want := splitReference(t, n, keys)

	c := memoryCluster(t, 3, 1, cluster.Faults{})
	out := t.TempDir()
	var seen atomic.Int64
	var job *stream.Job
	var during atomic.Int64 // what generator[1] emitted while generator[0] was handed over
	reached := false
	c.HandoverHook = func(step actors.HandoverStep, node string) error {
		if step != actors.HandoverRestore {
			return nil
		}
		reached = true
		r, _ := job.Execution().Runner()
		if _, ok := chainMetrics(r.Metrics(), "generator", 0); ok {
			return errors.New("generator[0] still runs after it was retired")
		}
		before, ok := chainMetrics(r.Metrics(), "generator", 1)
		if !ok {
			return errors.New("generator[1] is gone")
		}
		// 10,000 records of generator[1] take several checkpoint
		// intervals: no checkpoint may start meanwhile, for generator[0]
		// would send no barrier of it.
		testutil.Eventually(t, 0, "generator[1] emits while generator[0] is handed over", func() bool {
			now, _ := chainMetrics(r.Metrics(), "generator", 1)
			during.Store(now.RecordsOut - before.RecordsOut)
			return during.Load() >= 10_000 || seen.Load() >= n || job.Attempts() > 1
		})
		if job.Attempts() > 1 {
			return errors.New("the job restarted during the handover")
		}
		return nil
	}
	cp := handoverCheckpoints(t)
	// A checkpoint begun while the split moves would get no barrier from
	// it and expire: the job restarts, which the hook sees, before its
	// wait for generator[1] (testutil.DefaultTimeout) gives up. The
	// handover's own savepoint must not expire on a loaded machine, with
	// the race detector and a burner beside it (5 s did not suffice).
	cp.Timeout = testutil.DefaultTimeout / 2
	env := splitJob(n, keys, 100_000, out, &seen,
		stream.WithCheckpointing(cp),
		stream.WithRestartStrategy(&snapshot.FixedDelay{Attempts: 5}),
		stream.WithCluster(c.Cluster))
	c.spread(t, env)
	from, to := c.Placement[actors.TaskKey{UID: "generator", Subtask: 0}], c.thirdNode("generator")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var err error
	if job, err = env.ExecuteAsync(ctx); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 0, "a quarter of the records read", func() bool { return seen.Load() >= n/4 })
	r0, _ := job.Execution().Runner()
	res, err := job.Execution().Move(ctx, []actors.Move{{UID: "generator", Subtask: 0, To: to}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("moved %+v; savepoint %d, took %v; generator[1] emitted %d records meanwhile", res.Moved, res.Savepoint, res.Took, during.Load())
	if !reached {
		t.Fatal("the handover never reached its restore step")
	}
	if len(res.Moved) != 1 || res.Moved[0].From != from || res.Moved[0].To != to || res.Moved[0].Inputs != 0 {
		t.Fatalf("moved %+v, want generator[0] from %s to %s", res.Moved, from, to)
	}
	r1, _ := job.Execution().Runner()
	if r1 != r0 || job.Attempts() != 1 {
		t.Fatalf("the job restarted: attempts %d", job.Attempts())
	}
	if got := r1.NodeOf("generator", 0); got != to {
		t.Fatalf("generator[0] runs on %q, want %q", got, to)
	}
	if h := r1.Handovers(); h != 2 {
		t.Fatalf("%d subtasks retired or taken over, want 2", h)
	}
	if during.Load() < 10_000 && seen.Load() < n {
		t.Fatalf("generator[1] emitted %d records while generator[0] was handed over", during.Load())
	}
	testutil.Eventually(t, 0, "a checkpoint after the move completes", func() bool {
		return completedAfter(r1, res.Savepoint) || seen.Load() >= n
	})
	// The new instance emits: what it read after the move reaches the
	// sink (the output check below needs every record).
	testutil.Eventually(t, 0, "generator[0] emits on its new node", func() bool {
		m, ok := chainMetrics(r1.Metrics(), "generator", 0)
		return ok && m.RecordsOut > 0
	})
	finishMoved(t, job, out, want)
	if job.Attempts() != 1 {
		t.Fatalf("%d attempts", job.Attempts())
	}
	c.checkCrossed(t)
}

// A node drained by handovers leaves the running deployment: every
// subtask of node-2 moves away (the window subtask after the gate
// subtasks that send to it: subtasks joined by an edge move in
// successive handovers), the node is released, and then cut off from
// the others — as a drained node that stops. The job runs on in the same
// attempt (no failure, no restart) and its output is exact. A node that
// still runs subtasks, or the job master's, is refused.
//
// The gate subtasks are held from the last move's re-pointing until the
// cut was announced: they still have the channels to the old window
// subtask open (a task closes a replaced channel when it next runs), and
// the failure of those channels, replaced by the handover, is not the
// job's.
func TestHandoverReleaseLetsADrainedNodeLeave(t *testing.T) {
	testutil.Burn(t, 1)
	const n, keys = 600_000, 100
	want := splitReference(t, n, keys)

	c := memoryCluster(t, 3, 1, cluster.Faults{})
	c.ControlTimeout = 3 * time.Second
	out := t.TempDir()
	var seen atomic.Int64
	hold := newGateHold(t)
	var lastWave atomic.Bool
	c.HandoverHook = func(step actors.HandoverStep, node string) error {
		if step != actors.HandoverRepoint || !lastWave.Load() || hold.armed.Swap(true) {
			return nil
		}
		if !testutil.Within(0, func() bool {
			select {
			case <-hold.entered:
				return true
			default:
				return false
			}
		}) {
			return errors.New("no gate subtask stopped at the hold")
		}
		return nil
	}
	env := splitJobHeld(n, keys, 100_000, out, &seen, hold,
		stream.WithCheckpointing(handoverCheckpoints(t)),
		stream.WithRestartStrategy(&snapshot.FixedDelay{Attempts: 5}),
		stream.WithCredits(256),
		stream.WithCluster(c.Cluster))
	c.spread(t, env)
	plan, err := env.Plan()
	if err != nil {
		t.Fatal(err)
	}
	const drained = "node-2"
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	job, err := env.ExecuteAsync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 0, "a quarter of the records read", func() bool { return seen.Load() >= n/4 })
	r0, _ := job.Execution().Runner()
	if err := job.Execution().Release(ctx, drained); !errors.Is(err, actors.ErrMoveUnsupported) {
		t.Fatalf("release of a node that runs subtasks: %v, want ErrMoveUnsupported", err)
	}
	if err := job.Execution().Release(ctx, "node-0"); !errors.Is(err, actors.ErrMoveUnsupported) {
		t.Fatalf("release of the job master's node: %v, want ErrMoveUnsupported", err)
	}
	// The moves, by chain order: upstream first.
	var waves [][]actors.Move
	for _, ch := range plan.Chains {
		var wave []actors.Move
		for sub := range ch.Head().Parallelism {
			if r0.NodeOf(ch.Head().UID, sub) == drained {
				wave = append(wave, actors.Move{UID: ch.Head().UID, Subtask: sub, To: []string{"node-0", "node-1"}[sub%2]})
			}
		}
		if len(wave) > 0 {
			waves = append(waves, wave)
		}
	}
	if len(waves) < 2 {
		t.Fatalf("node-2 runs %v: want subtasks of two chains joined by an edge", waves)
	}
	for i, w := range waves {
		lastWave.Store(i == len(waves)-1)
		res, err := job.Execution().Move(ctx, w)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("moved %+v", res.Moved)
	}
	if err := job.Execution().Release(ctx, drained); err != nil {
		t.Fatal(err)
	}
	// The drained node stops: its links go down. Nothing of the job
	// runs on it or waits for it.
	c.mem.Cut(drained, "node-0")
	c.mem.Cut(drained, "node-1")
	if err := job.Execution().Release(ctx, drained); !errors.Is(err, actors.ErrMoveUnsupported) {
		t.Fatalf("second release: %v, want ErrMoveUnsupported", err)
	}
	// The cut is announced at the next step; the held gates then run on.
	cutAt := c.mem.Tick()
	testutil.Eventually(t, 0, "the cut announced", func() bool { return c.mem.Tick() >= cutAt+2 })
	select {
	case <-hold.entered:
	default:
		t.Fatal("the gates were not held across the cut")
	}
	hold.free()
	testutil.Eventually(t, 0, "half the records read after the node left", func() bool { return seen.Load() >= n/2 || job.Attempts() > 1 })
	if r1, _ := job.Execution().Runner(); r1 != r0 {
		t.Fatalf("the job restarted after the node left: %d attempts", job.Attempts())
	}
	finishMoved(t, job, out, want)
	if job.Attempts() != 1 {
		t.Fatalf("the job restarted: %d attempts", job.Attempts())
	}
	// A release of an attempt that ended says so (the daemon then takes
	// the node as released: no later attempt places anything on it).
	if err := r0.Release(ctx, drained); !errors.Is(err, actors.ErrJobEnded) {
		t.Fatalf("release after the job ended: %v, want ErrJobEnded", err)
	}
}

// While a keyed subtask is handed over no other checkpoint starts: a
// checkpoint triggered right behind the handover's savepoint crossed the
// channels the handover parks and replaces, and was seen to stall at the
// moved subtask's new instance until it expired (and every later one
// behind it). Checkpoints go on after the handover, and the output is
// exact in one attempt.
func TestHandoverHoldsCheckpointsWhileAKeyedSubtaskMoves(t *testing.T) {
	testutil.Burn(t, 1)
	const n, keys = 300_000, 100
	want := splitReference(t, n, keys)

	c := memoryCluster(t, 3, 1, cluster.Faults{})
	out := t.TempDir()
	var seen atomic.Int64
	var job *stream.Job
	reached := false
	c.HandoverHook = func(step actors.HandoverStep, node string) error {
		if step != actors.HandoverRestore {
			return nil
		}
		reached = true
		r, _ := job.Execution().Runner()
		sp := snapshot.ID(0)
		for _, s := range r.History() {
			if s.Kind == snapshot.KindSavepoint {
				sp = max(sp, s.Checkpoint)
			}
		}
		if sp == 0 {
			return errors.New("no savepoint in the history during the handover")
		}
		// 10,000 records through gate[1] take several checkpoint
		// intervals: none may start meanwhile.
		before := seen.Load()
		testutil.Eventually(t, 0, "gate[1] forwards while gate[0] is handed over", func() bool {
			return seen.Load()-before >= 10_000 || seen.Load() >= n || job.Attempts() > 1
		})
		for _, s := range r.History() {
			if s.Checkpoint > sp {
				return fmt.Errorf("checkpoint %d started during the handover of savepoint %d", s.Checkpoint, sp)
			}
		}
		return nil
	}
	env := splitJob(n, keys, 100_000, out, &seen,
		stream.WithCheckpointing(handoverCheckpoints(t)),
		stream.WithRestartStrategy(&snapshot.FixedDelay{Attempts: 5}),
		stream.WithCluster(c.Cluster))
	c.spread(t, env)
	to := c.thirdNode("gate")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var err error
	if job, err = env.ExecuteAsync(ctx); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 0, "a quarter of the records read", func() bool { return seen.Load() >= n/4 })
	res, err := job.Execution().Move(ctx, []actors.Move{{UID: "gate", Subtask: 0, To: to}})
	if err != nil {
		t.Fatal(err)
	}
	if !reached {
		t.Fatal("the handover hook never ran at the restore step")
	}
	r1, _ := job.Execution().Runner()
	testutil.Eventually(t, 0, "a checkpoint after the move completes", func() bool {
		return completedAfter(r1, res.Savepoint)
	})
	finishMoved(t, job, out, want)
	if job.Attempts() != 1 {
		t.Fatalf("%d attempts", job.Attempts())
	}
}

// A source split moves from the job master's node to a node in another
// process, and back: the new node restores it from the savepoint's files
// it fetches, it goes on emitting, later checkpoints complete (its
// barriers reach every task downstream), and the committed output equals
// a run without a move, in one attempt.
func TestHandoverMovesASourceSplitAcrossProcesses(t *testing.T) {
	testutil.Burn(t, 1)
	const n, keys = 800_000, 100
	want := handoverReference(t, n, keys)
	hr := startWorkerHandover(t, n, keys, "node-1", "node-2", nil, nil)
	r, _ := hr.job.Execution().Runner()
	from := r.NodeOf("generator", 0)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, to := range []string{"node-2", from} {
		res, err := hr.job.Execution().Move(ctx, []actors.Move{{UID: "generator", Subtask: 0, To: to}})
		if err != nil {
			t.Fatalf("move to %s: %v (job: %v)", to, err, hr.job.Wait())
		}
		t.Logf("moved %+v", res.Moved)
		testutil.Eventually(t, 0, "a checkpoint after the move completes", func() bool {
			return completedAfter(r, res.Savepoint) || hr.seen.Load() >= n
		})
	}
	hr.finish(t, want)
	if hr.job.Attempts() != 1 {
		t.Fatalf("%d attempts", hr.job.Attempts())
	}
}
