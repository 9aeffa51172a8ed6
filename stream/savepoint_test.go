package stream_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"go.uber.org/goleak"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/stream"
	"github.com/edgedio/edged/watermark"
)

// rescaleJob is generator (rate-limited, parallelism 1) -> timestamps ->
// counting map -> key by sensor -> 10 s tumbling count+sum (parallelism
// p) -> exactly-once file sink (parallelism p).
func rescaleJob(n int64, keys, p int, rate float64, dir string, seen *atomic.Int64, opts ...stream.Option) *stream.Environment {
	env := stream.NewEnvironment("rescale", append([]stream.Option{stream.WithParallelism(p)}, opts...)...)
	src := stream.FromSource(env, "generator", func() operators.Source[operators.SensorReading] {
		return operators.SensorGenerator(operators.GeneratorConfig{Count: n, Keys: keys, Rate: rate})
	}).SetParallelism(1).UID("generator").
		AssignTimestampsAndWatermarks("timestamps", watermark.ForMonotonous(eventTime))
	counted := stream.Map(src, "count", func(r operators.SensorReading) (operators.SensorReading, error) {
		seen.Add(1)
		return r, nil
	})
	w := stream.Window(stream.KeyBy(counted, bySensor), operators.TumblingEventTimeWindows(10*time.Second))
	stream.WindowAggregate(w, "count-sum", countSumWin{}).UID("count-sum").
		To("files", func() operators.Sink[operators.WindowResult[string, countSum]] {
			return operators.NewFileSink(dir, windowLine)
		}).UID("files")
	return env
}

// A savepoint taken at parallelism 2 (stop with savepoint, mid-stream)
// resumes at parallelism 1 and 3 with exactly the final result of a run
// without a stop.
func TestSavepointRescale(t *testing.T) {
	const n, keys = 200_000, 100
	var seen atomic.Int64
	want := t.TempDir()
	if err := execute(t, rescaleJob(n, keys, 2, 0, want, &seen)); err != nil {
		t.Fatal(err)
	}
	wantLines := committedLines(t, want)
	if len(wantLines) == 0 {
		t.Fatal("reference run committed nothing")
	}
	for _, p := range []int{1, 3} {
		t.Run(fmt.Sprintf("resume-at-p=%d", p), func(t *testing.T) {
			out := t.TempDir()
			cfg := snapshot.DefaultConfig()
			cfg.Dir = t.TempDir()
			var seen atomic.Int64
			env := rescaleJob(n, keys, 2, 400_000, out, &seen, stream.WithCheckpointing(cfg))
			job, err := env.ExecuteAsync(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			testutil.Eventually(t, 0, "a quarter of the records read", func() bool { return seen.Load() >= n/4 })
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			path, err := job.StopWithSavepoint(ctx, "")
			if err != nil {
				t.Fatal(err)
			}
			if err := job.Wait(); err != nil {
				t.Fatal(err)
			}
			before := seen.Load()
			if before >= n {
				t.Fatalf("the job read all %d records before the stop: nothing left to resume", before)
			}
			t.Logf("stopped after %d records; savepoint %s", before, path)

			resumed := rescaleJob(n, keys, p, 0, out, &seen, stream.WithSavepoint(path, false), stream.WithCheckpointing(cfg))
			if err := execute(t, resumed); err != nil {
				t.Fatal(err)
			}
			got := committedLines(t, out)
			if strings.Join(got, "\n") != strings.Join(wantLines, "\n") {
				t.Fatalf("resumed at p=%d: %d lines vs %d\n%s", p, len(got), len(wantLines), diffLines(got, wantLines))
			}
		})
	}
}

// A savepoint of a job that has no operator with that uid any more fails
// to restore unless non-restored state is allowed.
func TestSavepointNonRestoredState(t *testing.T) {
	var seen atomic.Int64
	cfg := snapshot.DefaultConfig()
	cfg.Dir = t.TempDir()
	out := t.TempDir()
	env := rescaleJob(100_000, 10, 1, 100_000, out, &seen, stream.WithCheckpointing(cfg))
	job, err := env.ExecuteAsync(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 0, "the first record", func() bool { return seen.Load() > 0 })
	path, err := job.StopWithSavepoint(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	if err := job.Wait(); err != nil {
		t.Fatal(err)
	}
	// A job without the window operator.
	build := func(allow bool) *stream.Environment {
		env := stream.NewEnvironment("rescale", stream.WithSavepoint(path, allow))
		src := stream.FromSource(env, "generator", generator(10, 10)).UID("generator")
		src.ForEach("sink", func(operators.SensorReading) error { return nil })
		return env
	}
	if err := execute(t, build(false)); err == nil || !strings.Contains(err.Error(), "allow non-restored state") {
		t.Fatalf("got %v, want a refusal naming the missing operators", err)
	}
	if err := execute(t, build(true)); err != nil {
		t.Fatal(err)
	}
}

// waitUntil polls cond until it holds, failing the test after 30 s: a
// bounded wait on a condition of a job that runs on the real clock.

// A savepoint of a running job leaves it running; the savepoint is
// complete and loadable.
func TestTriggerSavepointKeepsRunning(t *testing.T) {
	var seen atomic.Int64
	cfg := snapshot.DefaultConfig()
	cfg.Dir = t.TempDir()
	env := rescaleJob(100_000, 10, 2, 200_000, t.TempDir(), &seen, stream.WithCheckpointing(cfg))
	job, err := env.ExecuteAsync(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 0, "the first records", func() bool { return seen.Load() > 1000 })
	path, err := job.TriggerSavepoint(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	if err := job.Wait(); err != nil {
		t.Fatal(err)
	}
	if seen.Load() != 100_000 {
		t.Fatalf("the job read %d records, want all 100000: it must go on after a savepoint", seen.Load())
	}
	md, err := snapshot.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if md.Kind != snapshot.KindSavepoint {
		t.Fatalf("loaded %v, want a savepoint", md.Kind)
	}
	if _, ok := md.Operator("count-sum"); !ok {
		t.Fatal("savepoint lacks the window operator's state")
	}
}

// A savepoint restored into a job it does not fit (here a generator,
// which cannot change its parallelism, restored at another) fails the job
// at once with the reason, whatever the restart strategy: every restart
// would restore the same snapshot and fail the same way. (It used to go
// through the strategy's attempts and delays first.)
func TestRestoreThatDoesNotFitFailsWithoutRestarts(t *testing.T) {
	t.Run("nodes=1", func(t *testing.T) { testRestoreThatDoesNotFit(t, 1) })
	// The restore fails on the node that is not the master's: the reason
	// crosses the transport and is still known.
	t.Run("nodes=2", func(t *testing.T) { testRestoreThatDoesNotFit(t, 2) })
}

func testRestoreThatDoesNotFit(t *testing.T, nodes int) {
	build := func(p int, opts ...stream.Option) *stream.Environment {
		if nodes > 1 {
			opts = append(opts, stream.WithCluster(overMemory(t, nodes).Cluster))
		}
		env := stream.NewEnvironment("misfit", append([]stream.Option{stream.WithParallelism(p)}, opts...)...)
		src := stream.FromSource(env, "generator", func() operators.Source[operators.SensorReading] {
			return operators.SensorGenerator(operators.GeneratorConfig{Count: 1_000_000, Keys: 10, Rate: 20_000})
		}).UID("generator")
		src.ForEach("sink", func(operators.SensorReading) error { return nil })
		return env
	}
	cfg := snapshot.DefaultConfig()
	cfg.Dir = t.TempDir()
	job, err := build(2, stream.WithCheckpointing(cfg)).ExecuteAsync(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	path, err := job.StopWithSavepoint(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	if err := job.Wait(); err != nil {
		t.Fatal(err)
	}
	// A restart an hour later on a clock that never moves: only a failure
	// without restarts lets the job end.
	ctx, cancel := context.WithTimeout(context.Background(), testutil.DefaultTimeout)
	defer cancel()
	resumed, err := build(3, stream.WithSavepoint(path, false), stream.WithClock(clockwork.NewFakeClock()),
		stream.WithRestartStrategy(&snapshot.FixedDelay{Attempts: 3, Delay: time.Hour})).ExecuteAsync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	err = resumed.Wait()
	if !errors.Is(err, operators.ErrRescaleSource) || ctx.Err() != nil {
		t.Fatalf("got %v (context: %v), want the restore's ErrRescaleSource at once", err, ctx.Err())
	}
	if !strings.Contains(err.Error(), "snapshotted at parallelism 2, restored at parallelism 3") {
		t.Errorf("the error %q does not name both parallelisms", err)
	}
	if n := resumed.Attempts(); n != 1 {
		t.Fatalf("%d attempts, want 1", n)
	}
	if nodes == 1 {
		// Every goroutine of the job ends with it: protoactor's
		// dead-letter throttle, which the teardown opens, within
		// milliseconds (it lived 1 s), so a user's goleak check right
		// after passes.
		goleak.VerifyNone(t)
	}
}

// A savepoint of a job without a checkpoint directory, to a path of the
// caller's or not, is refused with actors.ErrNoCheckpointStore, telling
// how to give the job one; the job goes on, and a stop without a savepoint
// (cancel) ends it.
func TestSavepointWithoutCheckpointDirSaysHowToConfigureOne(t *testing.T) {
	env := stream.NewEnvironment("no-dir")
	stream.FromSource(env, "generator", func() operators.Source[operators.SensorReading] {
		return operators.SensorGenerator(operators.GeneratorConfig{Rate: 100, Keys: 3})
	}).UID("generator").ForEach("drop", func(operators.SensorReading) error { return nil })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	job, err := env.ExecuteAsync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"", t.TempDir() + "/sp"} {
		_, err := job.TriggerSavepoint(context.Background(), path)
		if !errors.Is(err, actors.ErrNoCheckpointStore) || !strings.Contains(err.Error(), "stream.WithCheckpointing") || !strings.Contains(err.Error(), "Dir") {
			t.Errorf("TriggerSavepoint(%q) = %v; want actors.ErrNoCheckpointStore telling to set a Dir with stream.WithCheckpointing", path, err)
		}
		_, err = job.StopWithSavepoint(context.Background(), path)
		if !errors.Is(err, actors.ErrNoCheckpointStore) || !strings.Contains(err.Error(), "stream.WithCheckpointing") {
			t.Errorf("StopWithSavepoint(%q) = %v; want actors.ErrNoCheckpointStore telling to use stream.WithCheckpointing", path, err)
		}
	}
	select {
	case <-job.Done():
		t.Fatalf("the job ended after a refused savepoint: %v", job.Wait())
	default:
	}
	cancel()
	if err := job.Wait(); !errors.Is(err, context.Canceled) {
		t.Errorf("Wait = %v, want context.Canceled", err)
	}
}

// A job given a savepoint path that does not hold one (mistyped, or the
// checkpoint directory itself instead of one of its snapshots) is refused
// by Plan and Execute with an error naming WithSavepoint and the path.
func TestWithSavepointBadPathNamesTheOption(t *testing.T) {
	root := t.TempDir()
	if err := os.Mkdir(root+"/savepoints", 0o755); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{root + "/missing", root} {
		env := stream.NewEnvironment("bad-savepoint", stream.WithSavepoint(path, false))
		stream.FromSource(env, "generator", func() operators.Source[operators.SensorReading] {
			return operators.SensorGenerator(operators.GeneratorConfig{Count: 10})
		}).UID("generator").ForEach("drop", func(operators.SensorReading) error { return nil })
		_, planErr := env.Plan()
		err := env.Execute(context.Background())
		for _, e := range []error{planErr, err} {
			if e == nil || !strings.Contains(e.Error(), fmt.Sprintf("stream: WithSavepoint(%q)", path)) {
				t.Errorf("path %q: Plan, Execute = %v, %v; want an error naming stream.WithSavepoint and the path", path, planErr, err)
			}
			if path == root && (e == nil || !strings.Contains(e.Error(), "savepoints/sp-")) {
				t.Errorf("the checkpoint directory given as savepoint: %v; want a hint to give one of its snapshots", e)
			}
		}
	}
}

// A savepoint asked for while a stop-with-savepoint runs is refused, and
// the stop completes even when the refusal reaches a task before the
// stop's barrier does (the task before it is busy). Before, the task took
// the refusal's abort of the newer savepoint for the end of everything
// older and dropped the stop's barrier: the stop expired at the checkpoint
// timeout and the job ran on.
func TestSavepointRefusedDuringStopDoesNotDropTheStopsBarrier(t *testing.T) {
	events := numberedEvents(50, 3)
	cfg := snapshot.DefaultConfig()
	cfg.Dir = t.TempDir()
	cfg.Timeout = 5 * time.Second
	env := stream.NewEnvironment("stop-race", stream.WithCheckpointing(cfg))
	src := stream.FromSource(env, "events", func() operators.Source[ev] {
		return &userSliceSource[ev]{recs: events, hold: true}
	}).UID("events")
	// events -> slow (holds the last record until released) -> sink: the
	// stop's barrier waits behind the held record, in slow's mailbox.
	release := make(chan struct{})
	var holding atomic.Bool
	last := events[len(events)-1].V
	slow := stream.Map(stream.KeyBy(src, evKey).Stream(), "slow", func(e ev) (ev, error) {
		if e.V == last {
			holding.Store(true)
			<-release
		}
		return e, nil
	})
	slow.Rebalance().ForEach("sink", func(ev) error { return nil })
	job, err := env.ExecuteAsync(userCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 0, "slow holding the last record", holding.Load)
	stopped := make(chan error, 1)
	go func() {
		_, err := job.StopWithSavepoint(userCtx(t), "")
		stopped <- err
	}()
	testutil.Eventually(t, 0, "the stop's savepoint in progress", func() bool {
		for _, s := range job.History() {
			if s.Kind == snapshot.KindSavepoint && s.Status == snapshot.InProgress {
				return true
			}
		}
		return false
	})
	if _, err := job.TriggerSavepoint(userCtx(t), ""); !errors.Is(err, snapshot.ErrStopping) {
		t.Fatalf("TriggerSavepoint during the stop: %v, want snapshot.ErrStopping", err)
	}
	close(release)
	if err := testutil.Receive(t, 0, "the stop", stopped); err != nil {
		t.Fatalf("StopWithSavepoint: %v", err)
	}
	if err := job.Wait(); err != nil {
		t.Fatalf("Wait: %v", err)
	}
}
