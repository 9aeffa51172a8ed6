package stream_test

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/operators/operatorstest"
	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/stream"
	"github.com/edgedio/edged/watermark"
)

// failer injects failures into a job: each of the first n attempts of the
// job fails at the first record its failing operator sees after that
// attempt's second completed checkpoint, so every failure comes after
// checkpoints the restart can restore.
type failer struct {
	left  atomic.Int64 // failures still to inject
	fired atomic.Int64
}

func newFailer(n int64) *failer {
	f := &failer{}
	f.left.Store(n)
	return f
}

// take uses up one failure, if any is left.
func (f *failer) take() bool {
	for {
		n := f.left.Load()
		if n <= 0 {
			return false
		}
		if f.left.CompareAndSwap(n, n-1) {
			f.fired.Add(1)
			return true
		}
	}
}

// failOp passes records through and fails as its failer says; one
// instance per subtask per attempt.
type failOp struct {
	operators.Base
	f         *failer
	out       operators.Collector[operators.SensorReading]
	completed int
	subtask   int
}

func (o *failOp) Open(ctx *operators.Context) error {
	o.subtask = ctx.Subtask
	return nil
}

func (o *failOp) Collect(r operators.SensorReading) {
	// Only subtask 0 fails, so that an attempt fails once.
	if o.subtask == 0 && o.completed >= 2 && o.f.take() {
		panic(fmt.Sprintf("injected failure after %d checkpoints", o.completed))
	}
	o.out.Collect(r)
}

func (o *failOp) NotifyCheckpointComplete(int64) error { o.completed++; return nil }
func (o *failOp) NotifyCheckpointAborted(int64) error  { return nil }

// windowLine formats a window result as the sink writes it.
func windowLine(r operators.WindowResult[string, countSum]) string {
	return fmt.Sprintf("%s,%d,%d,%d", r.Key, r.Window.Start, r.Value.Count, r.Value.Sum)
}

type countSumWin struct{}

func (countSumWin) CreateAccumulator() countSum { return countSum{} }
func (countSumWin) Add(r operators.SensorReading, a countSum) countSum {
	return countSum{ID: r.ID, Count: a.Count + 1, Sum: a.Sum + centi(r.Temperature)}
}
func (countSumWin) Result(a countSum) countSum { return a }

// eoJob is generator -> timestamps -> failing map -> key by sensor -> 10 s
// tumbling count+sum -> exactly-once file sink.
func eoJob(n int64, keys int, dir string, fail *failer, opts ...stream.Option) *stream.Environment {
	return eoJobFrom(generator(n, keys), dir, fail, opts...)
}

// eoJobFrom is eoJob reading gen.
func eoJobFrom(gen func() operators.Source[operators.SensorReading], dir string, fail *failer, opts ...stream.Option) *stream.Environment {
	env := stream.NewEnvironment("exactly-once", opts...)
	src := stream.FromSource(env, "generator", gen).SetParallelism(1).UID("generator").
		AssignTimestampsAndWatermarks("timestamps", watermark.ForMonotonous(eventTime))
	if fail == nil {
		fail = newFailer(0)
	}
	mapped := stream.Transform(src.Rebalance(), "maybe-fail", func(out operators.Collector[operators.SensorReading]) operators.OneInput[operators.SensorReading] {
		return &failOp{f: fail, out: out}
	}).SetParallelism(2)
	w := stream.Window(stream.KeyBy(mapped, bySensor), operators.TumblingEventTimeWindows(10*time.Second))
	res := stream.WindowAggregate(w, "count-sum", countSumWin{}).UID("count-sum")
	res.To("files", func() operators.Sink[operators.WindowResult[string, countSum]] {
		return operators.NewFileSink(dir, windowLine)
	}).UID("files")
	return env
}

// committedLines reads every committed part file of dir, sorted.
func committedLines(t *testing.T, dir string) []string {
	t.Helper()
	lines, err := operatorstest.CommittedLines(dir)
	if err != nil {
		t.Fatal(err)
	}
	return lines
}

func checkpointConfig(t *testing.T, mode snapshot.Mode) snapshot.Config {
	cfg := snapshot.DefaultConfig()
	cfg.Dir = t.TempDir()
	cfg.Interval = 10 * time.Millisecond
	cfg.Mode = mode
	cfg.MaxConcurrent = 2
	cfg.Timeout = 30 * time.Second
	cfg.TolerableFailures = 100
	return cfg
}

// The job fails at several random records and restarts from its
// checkpoints; what the two-phase-commit file sink committed equals the
// failure-free run exactly: nothing lost, nothing twice.
func TestExactlyOnceUnderFailures(t *testing.T) {
	t.Run("backend=memory", func(t *testing.T) { testExactlyOnce(t, 1_000_000, 1000) })
	t.Run("backend=bolt", func(t *testing.T) {
		testExactlyOnce(t, 300_000, 1000, stream.WithBoltStateBackend(t.TempDir()))
	})
}

func testExactlyOnce(t *testing.T, n int64, keys int, opts ...stream.Option) {
	want := t.TempDir()
	if err := execute(t, eoJob(n, keys, want, nil, stream.WithParallelism(2))); err != nil {
		t.Fatal(err)
	}
	wantLines := committedLines(t, want)
	first := operators.DefaultGeneratorStart / 10
	last := (operators.DefaultGeneratorStart + n/int64(keys) - 1) / 10
	if want := keys * int(last-first+1); len(wantLines) != want {
		t.Fatalf("failure-free run committed %d windows, want %d", len(wantLines), want)
	}

	fail := newFailer(4)
	got := t.TempDir()
	env := eoJob(n, keys, got, fail, append([]stream.Option{
		stream.WithParallelism(2),
		stream.WithCheckpointing(checkpointConfig(t, snapshot.ExactlyOnce)),
		stream.WithRestartStrategy(&snapshot.FixedDelay{Attempts: 10})}, opts...)...)
	job, err := env.ExecuteAsync(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := job.Wait(); err != nil {
		t.Fatal(err)
	}
	// Each failure comes after two checkpoints of its attempt completed,
	// so each restart restores one; a short last attempt may end before
	// its failure is due.
	fired := int(fail.fired.Load())
	if fired < 2 || job.Attempts() != fired+1 || len(job.Restores()) != fired {
		t.Fatalf("%d failures, %d attempts, restores %v: want at least 2 failures, each followed by a restore", fired, job.Attempts(), job.Restores())
	}
	t.Logf("%d failures; restored checkpoints %v", fired, job.Restores())
	gotLines := committedLines(t, got)
	if strings.Join(gotLines, "\n") != strings.Join(wantLines, "\n") {
		t.Fatalf("committed output differs from the failure-free run: %d lines vs %d\n%s", len(gotLines), len(wantLines), diffLines(gotLines, wantLines))
	}
}

// At-least-once checkpoints lose nothing under failures: every window of
// the failure-free run is there with at least its count.
func TestAtLeastOnceLosesNothing(t *testing.T) {
	const n, keys = 300_000, 100
	want := t.TempDir()
	if err := execute(t, eoJob(n, keys, want, nil, stream.WithParallelism(2))); err != nil {
		t.Fatal(err)
	}
	got := t.TempDir()
	env := eoJob(n, keys, got, newFailer(3),
		stream.WithParallelism(2),
		stream.WithCheckpointing(checkpointConfig(t, snapshot.AtLeastOnce)),
		stream.WithRestartStrategy(&snapshot.FixedDelay{Attempts: 10}))
	if err := execute(t, env); err != nil {
		t.Fatal(err)
	}
	have := map[string]int64{}
	for _, l := range committedLines(t, got) {
		f := strings.Split(l, ",")
		c, _ := strconv.ParseInt(f[2], 10, 64)
		have[f[0]+","+f[1]] = max(have[f[0]+","+f[1]], c)
	}
	for _, l := range committedLines(t, want) {
		f := strings.Split(l, ",")
		c, _ := strconv.ParseInt(f[2], 10, 64)
		if have[f[0]+","+f[1]] < c {
			t.Fatalf("window %s,%s: count %d, want at least %d", f[0], f[1], have[f[0]+","+f[1]], c)
		}
	}
}

func diffLines(got, want []string) string {
	g := map[string]int{}
	for _, l := range got {
		g[l]++
	}
	for _, l := range want {
		g[l]--
	}
	var out []string
	for l, c := range g {
		if c != 0 {
			out = append(out, fmt.Sprintf("%+d %s", c, l))
		}
	}
	sort.Strings(out)
	if len(out) > 20 {
		out = append(out[:20], "...")
	}
	return strings.Join(out, "\n")
}
