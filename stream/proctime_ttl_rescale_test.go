package stream_test

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/state"
	"github.com/edgedio/edged/stream"
)

// procTimerTTL counts each key's records in a Value with a TTL of 10 s
// and registers a processing-time timer 5 s after each record; a record
// emits its count and the processing time, a timer the count it finds.
type procTimerTTL struct {
	operators.KeyedProcessBase[string, string]
	t0    int64
	count state.Value[int]
	fired *atomic.Int64
	elems *atomic.Int64
}

func (f *procTimerTTL) Open(rt *operators.KeyedRuntime[string]) error {
	var err error
	f.count, err = state.NewValue(rt.Backend(), rt.Keys(), state.ValueDescriptor[int]{Name: "count", TTL: state.TTLConfig{TTL: 10 * time.Second}})
	return err
}

func (f *procTimerTTL) ProcessElement(k string, ctx *operators.KeyedContext[string, string]) error {
	n, _ := f.count.Get()
	f.count.Update(n + 1)
	ctx.Timers().RegisterProcessingTimeTimer(ctx.CurrentProcessingTime() + 5000)
	ctx.Emit(fmt.Sprintf("elem %s count %d at %d", k, n+1, ctx.CurrentProcessingTime()-f.t0))
	f.elems.Add(1)
	return nil
}

func (f *procTimerTTL) OnTimer(ts int64, ctx *operators.KeyedContext[string, string]) error {
	n, _ := f.count.Get()
	ctx.Emit(fmt.Sprintf("timer %s %d count %d", ctx.CurrentKey(), ts-f.t0, n))
	f.fired.Add(1)
	return nil
}

// procTimerJob is a gated source (one subtask) -> key by the record ->
// procTimerTTL (uid "proc") -> exactly-once file sink in out.
func procTimerJob(all []string, g *gate, t0 int64, fired, elems *atomic.Int64, out string, opts ...stream.Option) *stream.Environment {
	env := stream.NewEnvironment("pt-timers", opts...)
	src := stream.FromSource(env, "src", func() operators.Source[string] {
		return &gatedSource[string]{all: all, gate: g}
	}).SetParallelism(1).UID("src")
	stream.KeyedProcess(stream.KeyBy(src, func(s string) string { return s }), "proc", func() operators.KeyedProcessFunction[string, string, string] {
		return &procTimerTTL{t0: t0, fired: fired, elems: elems}
	}).UID("proc").
		To("out", func() operators.Sink[string] { return operators.NewFileSink(out, func(s string) string { return s }) }).UID("out")
	return env
}

// Processing-time timers pending at a stop with a savepoint fire once
// after the restore at another parallelism, on both backends: those due
// while the job runs when the clock reaches them, those that fell due
// while it was stopped at once (before the restored job takes input); and
// a TTL restored with the state expires by the restored job's clock (the
// timer due at 6 s, run at 20 s, finds the count written at 1 s gone).
// The clock is fake: phase one at 0 s, two at 1 s (advanced to 5 s),
// three at 20 s; parallelism 2 -> 3 -> 1, 1 -> 2 -> 3, 3 -> 1 -> 2.
func TestProcessingTimersAndTTLAcrossRescales(t *testing.T) {
	const keys = 50
	var all []string
	for range 3 {
		for k := range keys {
			all = append(all, fmt.Sprintf("k%d", k))
		}
	}
	var want []string
	for k := range keys {
		want = append(want,
			fmt.Sprintf("elem k%d count 1 at 0", k),
			fmt.Sprintf("elem k%d count 2 at 1000", k),
			fmt.Sprintf("timer k%d 5000 count 2", k),
			fmt.Sprintf("timer k%d 6000 count 0", k),
			fmt.Sprintf("elem k%d count 1 at 20000", k),
		)
	}
	slices.Sort(want)
	for _, bolt := range []bool{false, true} {
		for _, pars := range [][]int{{2, 3, 1}, {1, 2, 3}, {3, 1, 2}} {
			t.Run(fmt.Sprintf("bolt=%v/%v", bolt, pars), func(t *testing.T) {
				base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
				t0 := base.UnixMilli()
				out := t.TempDir()
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				sp := ""
				cfg := checkpointConfig(t, snapshot.ExactlyOnce)
				cfg.Interval = time.Hour
				for i, p := range pars {
					var fired, elems atomic.Int64
					g := newGate()
					var clk *clockwork.FakeClock
					switch i {
					case 0:
						clk = clockwork.NewFakeClockAt(base)
					case 1:
						clk = clockwork.NewFakeClockAt(base.Add(time.Second))
					case 2:
						clk = clockwork.NewFakeClockAt(base.Add(20 * time.Second))
					}
					cfg.Dir = t.TempDir()
					opts := []stream.Option{stream.WithParallelism(p), stream.WithCheckpointing(cfg), stream.WithClock(clk)}
					if bolt {
						opts = append(opts, stream.WithBoltStateBackend(t.TempDir()))
					}
					if sp != "" {
						opts = append(opts, stream.WithSavepoint(sp, false))
					}
					job, err := procTimerJob(all, g, t0, &fired, &elems, out, opts...).ExecuteAsync(ctx)
					if err != nil {
						t.Fatal(err)
					}
					switch i {
					case 0:
						g.allow(keys)
						testutil.Eventually(t, 30*time.Second, "phase 0 elems", func() bool { return elems.Load() == keys })
					case 1:
						g.allow(2 * keys)
						testutil.Eventually(t, 30*time.Second, "phase 1 elems", func() bool { return elems.Load() == keys })
						clk.Advance(4 * time.Second)
						testutil.Eventually(t, 30*time.Second, "phase 1 timers", func() bool { return fired.Load() == keys })
					case 2:
						testutil.Eventually(t, 30*time.Second, "phase 2 timers", func() bool { return fired.Load() == keys })
						g.allow(3 * keys)
						if err := job.Wait(); err != nil {
							t.Fatal(err)
						}
					}
					if i == 2 {
						break
					}
					if sp, err = job.StopWithSavepoint(ctx, ""); err != nil {
						t.Fatal(err)
					}
					if err := job.Wait(); err != nil {
						t.Fatal(err)
					}
					if n := fired.Load(); (i == 0 && n != 0) || (i == 1 && n != keys) {
						t.Errorf("phase %d: %d timers fired", i, n)
					}
				}
				got := committedLines(t, out)
				slices.Sort(got)
				if !slices.Equal(got, want) {
					t.Errorf("%d lines, want %d:\n%s", len(got), len(want), diffLines(got, want))
				}
			})
		}
	}
}

// racingClock is a fake clock that advances by jump just before the first
// timer of duration d is registered with it: the test's Advance landing
// between a task's reading of the time and its registration of a timer.
type racingClock struct {
	*clockwork.FakeClock
	d, jump time.Duration
	raced   atomic.Bool
}

func (c *racingClock) AfterFunc(d time.Duration, f func()) clockwork.Timer {
	if d == c.d && c.raced.CompareAndSwap(false, true) {
		c.FakeClock.Advance(c.jump)
	}
	return c.FakeClock.AfterFunc(d, f)
}

// Processing-time timers restored from a savepoint, whose clock timer is
// registered (at the start command) after the clock moved past the time
// the task read, fire though the clock advances no further. Before, the
// clock timer was registered for that much later and the timers never
// fired: seen as TestProcessingTimersAndTTLAcrossRescales timing out
// waiting for "phase 1 timers" under the race detector and CPU load, its
// Advance overlapping the restored job's start.
func TestProcessingTimerArmedAcrossAnAdvanceFires(t *testing.T) {
	const keys = 20
	var all []string // twice over: the source has not finished at the savepoint
	for range 2 {
		for k := range keys {
			all = append(all, fmt.Sprintf("k%d", k))
		}
	}
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := checkpointConfig(t, snapshot.ExactlyOnce)
	cfg.Interval = time.Hour
	out := t.TempDir()

	// Every key's timer, due at 5 s, pending in the savepoint.
	var fired, elems atomic.Int64
	g := newGate()
	cfg.Dir = t.TempDir()
	job, err := procTimerJob(all, g, base.UnixMilli(), &fired, &elems, out,
		stream.WithCheckpointing(cfg), stream.WithClock(clockwork.NewFakeClockAt(base))).ExecuteAsync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	g.allow(keys)
	testutil.Eventually(t, 30*time.Second, "every key's element", func() bool { return elems.Load() == keys })
	sp, err := job.StopWithSavepoint(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := job.Wait(); err != nil {
		t.Fatal(err)
	}

	// Restored at 1 s: the clock timer of 4 s is registered after the
	// clock moved on to 5 s.
	clk := &racingClock{FakeClock: clockwork.NewFakeClockAt(base.Add(time.Second)), d: 4 * time.Second, jump: 4 * time.Second}
	fired.Store(0)
	g = newGate()
	cfg.Dir = t.TempDir()
	job, err = procTimerJob(all, g, base.UnixMilli(), &fired, &elems, out,
		stream.WithCheckpointing(cfg), stream.WithClock(clk), stream.WithSavepoint(sp, false)).ExecuteAsync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		cancel()
		_ = job.Wait()
	}()
	testutil.Eventually(t, 30*time.Second, "the restored timers' clock timer registered", clk.raced.Load)
	testutil.Eventually(t, 10*time.Second, "every key's timer fired", func() bool { return fired.Load() == keys })
}
