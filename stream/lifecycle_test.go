package stream_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/keygroup"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/stream"
	"github.com/edgedio/edged/watermark"
)

// boundedWant runs the bounded exactly-once job once without checkpoints
// and returns what it committed.
func boundedWant(t *testing.T, n int64, keys int) []string {
	t.Helper()
	dir := t.TempDir()
	if err := execute(t, eoJob(n, keys, dir, nil, stream.WithParallelism(2))); err != nil {
		t.Fatal(err)
	}
	lines := committedLines(t, dir)
	if len(lines) == 0 {
		t.Fatal("the run without checkpoints committed nothing")
	}
	return lines
}

// sameLines fails the test when got is not exactly want.
func sameLines(t *testing.T, what string, got, want []string) {
	t.Helper()
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("%s: committed %d lines, want %d\n%s", what, len(got), len(want), diffLines(got, want))
	}
}

// finalCheckpoint returns the final checkpoint the job left in dir, failing
// the test when there is none.
func finalCheckpoint(t *testing.T, dir, job string) *snapshot.Metadata {
	t.Helper()
	md, err := actors.FinishedCheckpoint(dir, job, keygroup.DefaultMaxParallelism, nil)
	if err != nil {
		t.Fatal(err)
	}
	if md == nil {
		t.Fatalf("no final checkpoint in %s", dir)
	}
	return md
}

// leftovers lists the part files of dir still in progress or pending.
func leftovers(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			out = append(out, e.Name())
		}
	}
	return out
}

// A bounded job with frequent checkpoints and the two-phase-commit file
// sink ends cleanly under CPU contention, its committed output exactly the
// expected result: no barrier reaches a sink after its last commit, and a
// final checkpoint commits the tail.
func TestBoundedJobWithCheckpointsEndsCleanly(t *testing.T) {
	const n, keys = 20_000, 50
	want := boundedWant(t, n, keys)
	testutil.Burn(t, 2)
	for i := range 10 {
		cfg := checkpointConfig(t, snapshot.ExactlyOnce)
		cfg.TolerableFailures = 0
		got := t.TempDir()
		env := eoJob(n, keys, got, nil, stream.WithParallelism(2), stream.WithCheckpointing(cfg))
		if err := execute(t, env); err != nil {
			t.Fatalf("run %d: %v", i, err)
		}
		sameLines(t, fmt.Sprintf("run %d", i), committedLines(t, got), want)
		if l := leftovers(t, got); len(l) > 0 {
			t.Fatalf("run %d left %v", i, l)
		}
		finalCheckpoint(t, cfg.Dir, "exactly-once")
	}
}

// The same bounded job started twice on the same checkpoint directory
// commits its results once: the second run finds the final checkpoint,
// says the job finished (AlreadyFinished, as soon as ExecuteAsync
// returned) and runs nothing.
func TestFinishedJobDoesNotRunAgain(t *testing.T) {
	const n, keys = 20_000, 50
	want := boundedWant(t, n, keys)
	cfg := checkpointConfig(t, snapshot.ExactlyOnce)
	out := t.TempDir()
	for run := range 2 {
		env := eoJob(n, keys, out, nil, stream.WithParallelism(2), stream.WithCheckpointing(cfg))
		job, err := env.ExecuteAsync(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		// Known as soon as ExecuteAsync returned.
		early := job.AlreadyFinished()
		if err := job.Wait(); err != nil {
			t.Fatalf("run %d: %v", run, err)
		}
		md := finalCheckpoint(t, cfg.Dir, "exactly-once")
		if (early != nil) != (run == 1) || (early != nil && early.Checkpoint != md.Checkpoint) {
			t.Fatalf("run %d: AlreadyFinished right after ExecuteAsync = %v, the final checkpoint is %d", run, early, md.Checkpoint)
		}
		if fin := job.AlreadyFinished(); (fin != nil) != (run == 1) {
			t.Fatalf("run %d: AlreadyFinished = %v", run, fin)
		} else if fin != nil && fin.Checkpoint != md.Checkpoint {
			t.Fatalf("run %d: finished at %d, the final checkpoint is %d", run, fin.Checkpoint, md.Checkpoint)
		}
		sameLines(t, fmt.Sprintf("after run %d", run), committedLines(t, out), want)
	}
}

// A job whose process ended without a word (kill -9; here its context
// cancelled, which takes no savepoint) and that is started again on the
// same checkpoint directory goes on from the earlier run's latest
// checkpoint: what the two-phase-commit sink committed over both runs is
// the failure-free output exactly, nothing twice. Started from the
// beginning, the second run committed again every window the first one
// had. Each round cancels at another point of the run.
func TestJobStartedAgainResumesFromTheEarlierRun(t *testing.T) {
	const n, keys = 1_000_000, 1000
	want := boundedWant(t, n, keys)
	// The first run is paced (at least 10 s for all records) so that it
	// is cancelled midway however fast the machine; unpaced, it could end,
	// or commit everything, before the cancel.
	paced := func() operators.Source[operators.SensorReading] {
		return operators.SensorGenerator(operators.GeneratorConfig{Count: n, Keys: keys, Rate: n / 10})
	}
	for round := range 2 {
		cfg := checkpointConfig(t, snapshot.ExactlyOnce)
		out := t.TempDir()
		ctx, cancel := context.WithCancel(context.Background())
		env := eoJobFrom(paced, out, nil, stream.WithParallelism(2), stream.WithCheckpointing(cfg))
		job, err := env.ExecuteAsync(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// Cancel once the first run committed round+1 checkpoints' worth of
		// windows (the job has 1,000 keys: at least 1,000 lines a window).
		testutil.Eventually(t, testutil.DefaultTimeout, "the first run commits windows", func() bool {
			return len(committedLines(t, out)) >= (round+1)*keys
		})
		cancel()
		if err := job.Wait(); !errors.Is(err, context.Canceled) {
			t.Fatalf("round %d: first run ended with %v, want it cancelled", round, err)
		}
		first := len(committedLines(t, out))
		if first >= len(want) {
			t.Fatalf("round %d: the first run committed all %d lines before its cancel: the test did not stop it midway", round, first)
		}
		env = eoJob(n, keys, out, nil, stream.WithParallelism(2), stream.WithCheckpointing(cfg))
		if err := execute(t, env); err != nil {
			t.Fatalf("round %d: second run: %v", round, err)
		}
		t.Logf("round %d: the first run committed %d of %d lines", round, first, len(want))
		sameLines(t, fmt.Sprintf("round %d, after the second run", round), committedLines(t, out), want)
	}
}

// A job stopped with a savepoint written to a path of the user's, then
// started again on its checkpoint directory without naming the savepoint,
// goes on from that savepoint, not from the checkpoint before it: the
// committed output over both runs is the failure-free output exactly.
// Before the store linked such savepoints, the second run restored the
// older checkpoint and committed again what the savepoint had committed.
func TestJobStartedAgainAfterASavepointToItsOwnPath(t *testing.T) {
	const n, keys = 1_000_000, 1000
	want := boundedWant(t, n, keys)
	cfg := checkpointConfig(t, snapshot.ExactlyOnce)
	cfg.Interval = 50 * time.Millisecond
	out := t.TempDir()
	// The first run is paced (at least 10 s for all records) so that it
	// is stopped midway however fast the machine.
	paced := func() operators.Source[operators.SensorReading] {
		return operators.SensorGenerator(operators.GeneratorConfig{Count: n, Keys: keys, Rate: n / 10})
	}
	env := eoJobFrom(paced, out, nil, stream.WithParallelism(2), stream.WithCheckpointing(cfg))
	job, err := env.ExecuteAsync(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, testutil.DefaultTimeout, "the first run commits windows", func() bool {
		return len(committedLines(t, out)) >= keys
	})
	path := filepath.Join(t.TempDir(), "before-upgrade")
	if _, err := job.StopWithSavepoint(context.Background(), path); err != nil {
		t.Fatalf("stop with a savepoint to %s: %v", path, err)
	}
	if err := job.Wait(); err != nil {
		t.Fatal(err)
	}
	first := len(committedLines(t, out))
	if first >= len(want) {
		t.Fatalf("the first run committed all %d lines before its stop: the test did not stop it midway", first)
	}
	env = eoJob(n, keys, out, nil, stream.WithParallelism(2), stream.WithCheckpointing(cfg))
	if err := execute(t, env); err != nil {
		t.Fatalf("second run: %v", err)
	}
	t.Logf("the first run committed %d of %d lines", first, len(want))
	sameLines(t, "after the second run", committedLines(t, out), want)
}

// decliner passes records through; the snapshots of its subtask 0 fail
// while declines last (shared by every attempt).
type decliner struct {
	operators.Base
	out      operators.Collector[operators.SensorReading]
	declines *atomic.Int64
	declined *atomic.Int64
	subtask  int
}

func (d *decliner) Open(ctx *operators.Context) error {
	d.subtask = ctx.Subtask
	return nil
}

func (d *decliner) Collect(r operators.SensorReading) { d.out.Collect(r) }

func (d *decliner) SnapshotState(id int64) ([]byte, error) {
	if d.subtask == 0 && d.declines.Add(-1) >= 0 {
		d.declined.Add(1)
		return nil, fmt.Errorf("injected snapshot failure at checkpoint %d", id)
	}
	return nil, nil
}

// declineJob is generator -> declining map -> key by sensor -> 10 s
// tumbling count+sum -> exactly-once file sink.
func declineJob(n int64, keys int, dir string, d *decliner, opts ...stream.Option) *stream.Environment {
	return declineRateJob(n, keys, 0, dir, d, opts...)
}

// declineRateJob is declineJob with a generator limited to rate records
// per second (0: no limit).
func declineRateJob(n int64, keys int, rate float64, dir string, d *decliner, opts ...stream.Option) *stream.Environment {
	env := stream.NewEnvironment("exactly-once", opts...)
	src := stream.FromSource(env, "generator", func() operators.Source[operators.SensorReading] {
		return operators.SensorGenerator(operators.GeneratorConfig{Count: n, Keys: keys, Rate: rate})
	}).SetParallelism(1).UID("generator").
		AssignTimestampsAndWatermarks("timestamps", watermark.ForMonotonous(eventTime))
	mapped := stream.Transform(src.Rebalance(), "decline", func(out operators.Collector[operators.SensorReading]) operators.OneInput[operators.SensorReading] {
		return &decliner{out: out, declines: d.declines, declined: d.declined}
	}).SetParallelism(2).UID("decline")
	w := stream.Window(stream.KeyBy(mapped, bySensor), operators.TumblingEventTimeWindows(10*time.Second))
	res := stream.WindowAggregate(w, "count-sum", countSumWin{}).UID("count-sum")
	res.To("files", func() operators.Sink[operators.WindowResult[string, countSum]] {
		return operators.NewFileSink(dir, windowLine)
	}).UID("files")
	return env
}

// More failed checkpoints than tolerable fail the job over: the restart
// strategy restores and restarts it, and the output stays exact. Without a
// restart strategy the job ends with the checkpoint failure.
func TestCheckpointFailuresRestartTheJob(t *testing.T) {
	const n, keys = 20_000, 50
	want := boundedWant(t, n, keys)
	testutil.Burn(t, 2)
	for i := range 5 {
		d := &decliner{declines: new(atomic.Int64), declined: new(atomic.Int64)}
		d.declines.Store(2)
		cfg := checkpointConfig(t, snapshot.ExactlyOnce)
		cfg.TolerableFailures = 1
		got := t.TempDir()
		env := declineJob(n, keys, got, d, stream.WithParallelism(2), stream.WithCheckpointing(cfg),
			stream.WithRestartStrategy(&snapshot.FixedDelay{Attempts: 1}))
		job, err := env.ExecuteAsync(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if err := job.Wait(); err != nil {
			t.Fatalf("run %d: %v", i, err)
		}
		if d.declined.Load() != 2 || job.Attempts() != 2 || len(job.Restores()) != 1 {
			t.Fatalf("run %d: %d snapshots declined, %d attempts, restores %v; want 2 declined, 2 attempts, 1 restore",
				i, d.declined.Load(), job.Attempts(), job.Restores())
		}
		declinedHistory(t, fmt.Sprintf("run %d", i), job.History(), 2)
		sameLines(t, fmt.Sprintf("run %d", i), committedLines(t, got), want)
	}

	d := &decliner{declines: new(atomic.Int64), declined: new(atomic.Int64)}
	d.declines.Store(2)
	cfg := checkpointConfig(t, snapshot.ExactlyOnce)
	cfg.TolerableFailures = 1
	err := execute(t, declineJob(n, keys, t.TempDir(), d, stream.WithParallelism(2), stream.WithCheckpointing(cfg)))
	if !errors.Is(err, actors.ErrCheckpointFailure) || !errors.Is(err, snapshot.ErrTooManyFailures) {
		t.Fatalf("without restarts: %v, want the checkpoint failure", err)
	}
}

// declinedHistory fails t unless h, the history of a job whose attempts
// ended, names each checkpoint once, in id order, holds none still in
// progress, and keeps the declined checkpoints failed with their reason:
// the attempt after the one a decline ended takes ids of its own.
func declinedHistory(t *testing.T, name string, h []snapshot.Stats, declined int) {
	t.Helper()
	n := 0
	for i, s := range h {
		if i > 0 && s.Checkpoint <= h[i-1].Checkpoint {
			t.Fatalf("%s: history ids not increasing at %d after %d: %+v", name, s.Checkpoint, h[i-1].Checkpoint, h)
		}
		if s.Status == snapshot.InProgress {
			t.Fatalf("%s: checkpoint %d still in progress after the job ended: %+v", name, s.Checkpoint, h)
		}
		if s.Status == snapshot.Failed && s.Err != nil && strings.HasSuffix(s.Err.Error(), fmt.Sprintf("injected snapshot failure at checkpoint %d", s.Checkpoint)) {
			n++
		}
	}
	if n != declined {
		t.Fatalf("%s: %d failed checkpoints name the declined snapshot, want %d: %+v", name, n, declined, h)
	}
}

// rateJob is eoJob's pipeline over a generator limited to rate records per
// second.
func rateJob(n int64, keys int, rate float64, dir string, opts ...stream.Option) *stream.Environment {
	env := stream.NewEnvironment("exactly-once", opts...)
	src := stream.FromSource(env, "generator", func() operators.Source[operators.SensorReading] {
		return operators.SensorGenerator(operators.GeneratorConfig{Count: n, Keys: keys, Rate: rate})
	}).SetParallelism(1).UID("generator").
		AssignTimestampsAndWatermarks("timestamps", watermark.ForMonotonous(eventTime))
	w := stream.Window(stream.KeyBy(src.Rebalance(), bySensor), operators.TumblingEventTimeWindows(10*time.Second))
	res := stream.WindowAggregate(w, "count-sum", countSumWin{}).UID("count-sum")
	res.To("files", func() operators.Sink[operators.WindowResult[string, countSum]] {
		return operators.NewFileSink(dir, windowLine)
	}).UID("files")
	return env
}

// A stop with a savepoint commits what the savepoint covers: no pending or
// in-progress part file is left, and resuming from the savepoint completes
// the output exactly.
func TestStopWithSavepointCommits(t *testing.T) {
	const n, keys = 40_000, 50
	want := boundedWant(t, n, keys)
	testutil.Burn(t, 2)
	midway := 0
	for i := range 3 {
		cfg := checkpointConfig(t, snapshot.ExactlyOnce)
		cfg.TolerableFailures = 0
		out := t.TempDir()
		job, err := rateJob(n, keys, 10_000, out, stream.WithParallelism(2), stream.WithCheckpointing(cfg)).
			ExecuteAsync(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, time.Minute, "a checkpoint committed results", func() bool {
			parts, _ := operators.CommittedParts(out)
			for _, p := range parts {
				if fi, err := os.Stat(p); err == nil && fi.Size() > 0 {
					return true
				}
			}
			return false
		})
		sp, err := job.StopWithSavepoint(context.Background(), "")
		if err != nil {
			t.Fatalf("run %d: stop: %v", i, err)
		}
		if err := job.Wait(); err != nil {
			t.Fatalf("run %d: %v", i, err)
		}
		if l := leftovers(t, out); len(l) > 0 {
			t.Fatalf("run %d: the stop left %v", i, l)
		}
		before := committedLines(t, out)
		switch {
		case len(before) == 0:
			t.Fatalf("run %d: nothing committed at the stop", i)
		case len(before) < len(want):
			midway++
		default:
			// The input had ended before the stop's barrier: the
			// savepoint holds every task's final state.
			t.Logf("run %d: the input ended before the stop", i)
		}
		for _, l := range before {
			if _, ok := slices.BinarySearch(want, l); !ok {
				t.Fatalf("run %d: committed %q, which is not in the result", i, l)
			}
		}
		resume := rateJob(n, keys, 0, out, stream.WithParallelism(2), stream.WithCheckpointing(cfg),
			stream.WithSavepoint(sp, false))
		if err := execute(t, resume); err != nil {
			t.Fatalf("run %d: resume: %v", i, err)
		}
		sameLines(t, fmt.Sprintf("run %d after resuming", i), committedLines(t, out), want)
	}
	if midway == 0 {
		t.Fatal("no stop came before the end of the input")
	}
}

// failOnce fails at its first record while fails lasts.
type failOnce struct {
	operators.Base
	out   operators.Collector[operators.SensorReading]
	fails *atomic.Int64
}

func (f *failOnce) Collect(r operators.SensorReading) {
	if f.fails.Add(-1) >= 0 {
		panic("injected failure")
	}
	f.out.Collect(r)
}

// A restart without a checkpoint to restore counts in Restores, as 0.
func TestRestoresCountsRestartWithoutCheckpoint(t *testing.T) {
	fails := new(atomic.Int64)
	fails.Store(1)
	env := stream.NewEnvironment("restart")
	src := stream.FromSource(env, "generator", generator(100, 10)).UID("generator")
	mapped := stream.Transform(src, "fail", func(out operators.Collector[operators.SensorReading]) operators.OneInput[operators.SensorReading] {
		return &failOnce{out: out, fails: fails}
	}).UID("fail")
	mapped.To("discard", func() operators.Sink[operators.SensorReading] {
		return operators.NewSinkFunc(func(operators.SensorReading) error { return nil })
	}).UID("discard")
	stream.WithRestartStrategy(&snapshot.FixedDelay{Attempts: 1})(env)
	job, err := env.ExecuteAsync(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := job.Wait(); err != nil {
		t.Fatal(err)
	}
	if job.Attempts() != 2 || !slices.Equal(job.Restores(), []snapshot.ID{0}) {
		t.Fatalf("%d attempts, restores %v; want 2 attempts, restores [0]", job.Attempts(), job.Restores())
	}
}

// A chain ending in a sink counts the records its last operator passed to
// the sink as its output.
func TestWindowChainCountsRecordsOut(t *testing.T) {
	env := eoJob(2_000, 10, t.TempDir(), nil, stream.WithParallelism(2))
	if err := execute(t, env); err != nil {
		t.Fatal(err)
	}
	var chains, out int64
	for _, s := range env.Stats().Tasks {
		if strings.Contains(s.Chain, "count-sum") {
			chains++
			out += s.RecordsOut
		}
	}
	if chains == 0 || out == 0 {
		t.Fatalf("%d window chain tasks, %d records out; want some of each: %+v", chains, out, env.Stats().Tasks)
	}
}

// A stop with a savepoint that fails leaves the job running: its sources
// go on after the aborted barrier and the output is complete and exact.
func TestFailedStopKeepsRunning(t *testing.T) {
	const n, keys = 20_000, 50
	want := boundedWant(t, n, keys)
	d := &decliner{declines: new(atomic.Int64), declined: new(atomic.Int64)}
	d.declines.Store(1)
	cfg := checkpointConfig(t, snapshot.ExactlyOnce)
	cfg.Interval = 0 // savepoints and the final checkpoint only
	out := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	job, err := declineRateJob(n, keys, 20_000, out, d, stream.WithParallelism(2), stream.WithCheckpointing(cfg)).ExecuteAsync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, time.Minute, "the job processes records", func() bool {
		for _, m := range job.Metrics() {
			if m.RecordsIn > 0 {
				return true
			}
		}
		return false
	})
	if _, err := job.StopWithSavepoint(ctx, ""); !errors.Is(err, snapshot.ErrDeclined) {
		t.Fatalf("stop: %v, want it declined", err)
	}
	if err := job.Wait(); err != nil {
		t.Fatal(err)
	}
	if d.declined.Load() != 1 {
		t.Fatalf("%d snapshots declined, want 1", d.declined.Load())
	}
	sameLines(t, "after the failed stop", committedLines(t, out), want)
}

// A bounded job with checkpoints and a write-ahead sink publishes every
// record once, in the final checkpoint's completion at the latest.
func TestBoundedJobWriteAheadSinkPublishesOnce(t *testing.T) {
	const n, keys = 20_000, 50
	testutil.Burn(t, 2)
	for i := range 8 {
		// Runs 5 to 7 publish in the background (the MQTT sink's kind):
		// the job ends only once the final checkpoint's records are out.
		background := i >= 5
		var mu sync.Mutex
		seen := make(map[string]int)
		env := stream.NewEnvironment("write-ahead", stream.WithParallelism(2),
			stream.WithCheckpointing(checkpointConfig(t, snapshot.ExactlyOnce)))
		src := stream.FromSource(env, "generator", generator(n, keys)).SetParallelism(1).UID("generator")
		src.Rebalance().To("wal", func() operators.Sink[operators.SensorReading] {
			s := operators.NewWriteAheadSink(func(rs []operators.SensorReading, id func(int) string) error {
				mu.Lock()
				defer mu.Unlock()
				for j := range rs {
					seen[id(j)]++
				}
				return nil
			}, nil)
			if background {
				s = s.WithBackgroundPublish()
			}
			return s
		}).UID("wal")
		if err := execute(t, env); err != nil {
			t.Fatalf("run %d: %v", i, err)
		}
		total := 0
		for _, c := range seen {
			total += c
		}
		if len(seen) != n || total != n {
			t.Fatalf("run %d (background %v): %d ids published %d times, want %d once each", i, background, len(seen), total, n)
		}
	}
}

// A second Execute or ExecuteAsync of an Environment whose job is still
// running is refused (the two runs would share the checkpoint directory
// and the sinks); once the job has ended it may run again. With and
// without checkpoints (Execute takes another path without them).
func TestExecuteRefusedWhileRunning(t *testing.T) {
	for _, checkpoints := range []bool{false, true} {
		t.Run(fmt.Sprintf("checkpoints=%v", checkpoints), func(t *testing.T) {
			var opts []stream.Option
			if checkpoints {
				opts = append(opts, stream.WithCheckpointing(checkpointConfig(t, snapshot.ExactlyOnce)))
			}
			env := stream.NewEnvironment("running", opts...)
			g := newGate()
			stream.FromSource(env, "ts", func() operators.Source[int64] {
				return &gatedSource[int64]{all: []int64{1, 2}, gate: g}
			}).UID("ts").To("discard", func() operators.Sink[int64] {
				return operators.NewSinkFunc(func(int64) error { return nil })
			}).UID("discard")
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- env.Execute(ctx) }()
			testutil.Eventually(t, 30*time.Second, "the first run reads", g.polled.Load)
			if _, err := env.ExecuteAsync(ctx); !errors.Is(err, stream.ErrAlreadyRunning) {
				t.Fatalf("ExecuteAsync beside Execute: %v, want ErrAlreadyRunning", err)
			}
			if err := env.Execute(ctx); !errors.Is(err, stream.ErrAlreadyRunning) {
				t.Fatalf("a second Execute: %v, want ErrAlreadyRunning", err)
			}
			g.allow(2)
			if err := <-done; err != nil {
				t.Fatalf("first run: %v", err)
			}
			job, err := env.ExecuteAsync(context.Background())
			if err != nil {
				t.Fatalf("a run after the first ended: %v", err)
			}
			if err := job.Wait(); err != nil {
				t.Fatalf("a run after the first ended: %v", err)
			}
		})
	}
}

// A job without a restart strategy that fails says that it was not
// restarted for want of one; its error is still ErrRestartsExhausted.
func TestFailureWithoutRestartStrategySaysSo(t *testing.T) {
	env := stream.NewEnvironment("fails", stream.WithCheckpointing(checkpointConfig(t, snapshot.ExactlyOnce)))
	g := newGate()
	g.allow(2)
	src := stream.FromSource(env, "ts", func() operators.Source[int64] {
		return &gatedSource[int64]{all: []int64{1, 2}, gate: g}
	}).UID("ts")
	stream.Map(src, "boom", func(int64) (int64, error) { return 0, errors.New("boom") }).To("discard", func() operators.Sink[int64] {
		return operators.NewSinkFunc(func(int64) error { return nil })
	}).UID("discard")
	err := execute(t, env)
	if !errors.Is(err, actors.ErrRestartsExhausted) || !strings.Contains(err.Error(), "not restarted: the job has no restart strategy") || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("error %v", err)
	}
	// Every goroutine of the job ends with it (protoactor's dead-letter
	// throttle, opened by the teardown, within milliseconds).
	goleak.VerifyNone(t) // retries for about 0.4 s
}

// A job started again on a checkpoint directory whose every complete
// checkpoint is damaged does not start from the beginning (which would
// commit all its output again): it fails with snapshot.ErrAllDamaged,
// committing nothing more.
func TestJobStartedAgainOnDamagedCheckpointsFails(t *testing.T) {
	testJobStartedAgainOnDamagedCheckpoints(t, func(f string) error {
		b, err := os.ReadFile(f)
		if err != nil || len(b) == 0 {
			return err
		}
		b[len(b)/2] ^= 0xff
		return os.WriteFile(f, b, 0o644)
	})
}

// The same holds when the checkpoints' state files are missing: a job on
// one node has no replica to fetch them from, and before it started from
// the beginning and committed every window of the first run again.
func TestJobStartedAgainOnCheckpointsMissingFilesFails(t *testing.T) {
	testJobStartedAgainOnDamagedCheckpoints(t, os.Remove)
}

// testJobStartedAgainOnDamagedCheckpoints runs the job until it committed
// windows, cancels it, applies damage to every state file of its
// checkpoints and starts it again, which must fail with
// snapshot.ErrAllDamaged and commit nothing more.
func testJobStartedAgainOnDamagedCheckpoints(t *testing.T, damage func(file string) error) {
	const n, keys = 1_000_000, 1000
	cfg := checkpointConfig(t, snapshot.ExactlyOnce)
	out := t.TempDir()
	paced := func() operators.Source[operators.SensorReading] {
		return operators.SensorGenerator(operators.GeneratorConfig{Count: n, Keys: keys, Rate: n / 10})
	}
	ctx, cancel := context.WithCancel(context.Background())
	job, err := eoJobFrom(paced, out, nil, stream.WithParallelism(2), stream.WithCheckpointing(cfg)).ExecuteAsync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, testutil.DefaultTimeout, "the first run commits windows", func() bool {
		return len(committedLines(t, out)) >= keys
	})
	cancel()
	if err := job.Wait(); !errors.Is(err, context.Canceled) {
		t.Fatalf("first run ended with %v, want it cancelled", err)
	}
	files, err := filepath.Glob(filepath.Join(cfg.Dir, "*", "checkpoints", "chk-*", "*.state"))
	if err != nil || len(files) == 0 {
		files, err = filepath.Glob(filepath.Join(cfg.Dir, "checkpoints", "chk-*", "*.state"))
	}
	if err != nil || len(files) == 0 {
		t.Fatalf("no checkpoint state files under %s (%v)", cfg.Dir, err)
	}
	for _, f := range files {
		if err := damage(f); err != nil {
			t.Fatal(err)
		}
	}
	before := len(committedLines(t, out))
	err = execute(t, eoJobFrom(paced, out, nil, stream.WithParallelism(2), stream.WithCheckpointing(cfg)))
	if !errors.Is(err, snapshot.ErrAllDamaged) {
		t.Fatalf("second run on damaged checkpoints: %v, want snapshot.ErrAllDamaged", err)
	}
	if after := len(committedLines(t, out)); after != before {
		t.Fatalf("the second run committed %d lines more", after-before)
	}
}

// The checkpoint directory removed (rm -rf) while a job runs: the next
// checkpoint fails, with the reason, in the job's checkpoint history
// (kept once the attempt ended); with no failed checkpoint tolerated the
// job fails, and its restart finds no checkpoint: it does not start from
// the beginning, which would commit every window again, but fails with
// snapshot.ErrCheckpointGone. No window is committed twice.
func TestCheckpointDirRemovedWhileRunning(t *testing.T) {
	const n, keys = 1_000_000, 1000
	cfg := checkpointConfig(t, snapshot.ExactlyOnce)
	cfg.TolerableFailures = 0
	out := t.TempDir()
	paced := func() operators.Source[operators.SensorReading] {
		return operators.SensorGenerator(operators.GeneratorConfig{Count: n, Keys: keys, Rate: n / 10})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	job, err := eoJobFrom(paced, out, nil, stream.WithParallelism(2), stream.WithCheckpointing(cfg),
		stream.WithRestartStrategy(&snapshot.FixedDelay{Attempts: 3})).ExecuteAsync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, testutil.DefaultTimeout, "the job commits windows", func() bool {
		return len(committedLines(t, out)) >= keys
	})
	// The directory vanishes at once (moved away, then removed): an
	// rm -rf that ran to its end. Removing it in place races with the
	// files being written into it, and with the restart opening the
	// store again, which makes the directory anew.
	gone := cfg.Dir + ".removed"
	if err := os.Rename(cfg.Dir, gone); err != nil {
		t.Fatal(err)
	}
	err = job.Wait()
	if rerr := os.RemoveAll(gone); rerr != nil {
		t.Fatal(rerr)
	}
	if !errors.Is(err, snapshot.ErrCheckpointGone) {
		t.Fatalf("the job ended with %v, want snapshot.ErrCheckpointGone", err)
	}
	t.Logf("job: %v", err)
	if a := job.Attempts(); a != 1 {
		t.Fatalf("%d attempts, want 1: the restart must not run", a)
	}
	// A checkpoint failed as the removal overtook it: a task could not
	// create its directory or state file, or the commit found one
	// missing.
	var failed *snapshot.Stats
	for _, s := range job.History() {
		if s.Status == snapshot.Failed && s.Err != nil && (errors.Is(s.Err, fs.ErrNotExist) || errors.Is(s.Err, snapshot.ErrMissing)) {
			failed = &s
			break
		}
	}
	if failed == nil {
		t.Fatalf("no failed checkpoint with its reason in the history: %+v", job.History())
	}
	t.Logf("checkpoint %d failed: %v", failed.Checkpoint, failed.Err)
	seen := map[string]bool{}
	for _, l := range committedLines(t, out) {
		if seen[l] {
			t.Fatalf("window committed twice: %s", l)
		}
		seen[l] = true
	}
}

// A second job on a checkpoint directory that a running job holds (the
// program started twice, or two Environments given one directory) is
// refused with ErrCheckpointDirInUse, and the first job goes on
// unharmed; once it has ended the directory is free again. Before, both
// ran: each restored, wrote and discarded the other's checkpoints, and
// each file sink removed the other's uncommitted parts (two copies of a
// program on one directory both failed, committing nothing).
func TestCheckpointDirInUseIsRefused(t *testing.T) {
	cfg := checkpointConfig(t, snapshot.ExactlyOnce)
	build := func(g *gate) *stream.Environment {
		env := stream.NewEnvironment("twice", stream.WithCheckpointing(cfg))
		stream.FromSource(env, "ts", func() operators.Source[int64] {
			return &gatedSource[int64]{all: []int64{1, 2}, gate: g}
		}).UID("ts").To("discard", func() operators.Sink[int64] {
			return operators.NewSinkFunc(func(int64) error { return nil })
		}).UID("discard")
		return env
	}
	g1 := newGate()
	env1 := build(g1)
	job, err := env1.ExecuteAsync(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, "the first job reads", g1.polled.Load)
	g2 := newGate()
	g2.allow(2)
	env2 := build(g2)
	if err := execute(t, env2); !errors.Is(err, stream.ErrCheckpointDirInUse) {
		t.Fatalf("a second job on the directory: %v, want ErrCheckpointDirInUse", err)
	}
	if _, err := env2.ExecuteAsync(context.Background()); !errors.Is(err, stream.ErrCheckpointDirInUse) {
		t.Fatalf("ExecuteAsync of a second job on the directory: %v, want ErrCheckpointDirInUse", err)
	}
	g1.allow(2)
	if err := job.Wait(); err != nil {
		t.Fatalf("first job: %v", err)
	}
	if err := execute(t, env2); err != nil {
		t.Fatalf("the second job once the first ended: %v", err)
	}
}

// stopSnapshotGate is a sink whose first SnapshotState waits until release
// is closed, holding the checkpoint it belongs to in progress.
type stopSnapshotGate struct {
	operators.Base
	entered, release chan struct{}
	once             *sync.Once
}

func (s *stopSnapshotGate) Collect(int64) {}

func (s *stopSnapshotGate) SnapshotState(int64) ([]byte, error) {
	s.once.Do(func() {
		close(s.entered)
		<-s.release
	})
	return nil, nil
}

// The context of StopWithSavepoint bounds the wait for it, not the stop:
// given up while the savepoint is under way, the call says that the stop
// goes on, and the job then ends with that savepoint, which its history
// lists.
func TestStopWithSavepointGivenUpByItsContextGoesOn(t *testing.T) {
	cfg := snapshot.DefaultConfig()
	cfg.Dir = t.TempDir()
	gate := &stopSnapshotGate{entered: make(chan struct{}), release: make(chan struct{}), once: &sync.Once{}}
	env := stream.NewEnvironment("stop-ctx", stream.WithCheckpointing(cfg))
	src := stream.FromSource(env, "src", func() operators.Source[int64] {
		return &gatedSource[int64]{all: []int64{1, 2, 3}, gate: newGate()}
	}).UID("src")
	src.To("gate", func() operators.Sink[int64] { return gate }).UID("gate")
	job, err := env.ExecuteAsync(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	go func() {
		_, err := job.StopWithSavepoint(ctx, "")
		stopped <- err
	}()
	<-gate.entered
	cancel()
	err = <-stopped
	if !errors.Is(err, context.Canceled) || !errors.Is(err, actors.ErrSavepointUnderWay) || !strings.Contains(err.Error(), "goes on") {
		t.Fatalf("StopWithSavepoint given up: %v; want an error wrapping context.Canceled and actors.ErrSavepointUnderWay that says the stop goes on", err)
	}
	close(gate.release)
	if err := job.Wait(); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	var stop *snapshot.Stats
	for _, s := range job.History() {
		if s.Stop {
			stop = &s
		}
	}
	if stop == nil || stop.Status != snapshot.Completed || stop.Path == "" {
		t.Fatalf("history %+v: want the stop's savepoint completed, with its path", job.History())
	}
}
