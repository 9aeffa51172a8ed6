package stream_test

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/state"
	"github.com/edgedio/edged/stream"
	"github.com/edgedio/edged/watermark"
)

// keyedTime is the record of the rescale test: a key and an event time
// in milliseconds.
type keyedTime struct {
	K  string
	TS int64
}

// countKeyedTime counts records; it has Merge for session and sliding
// windows.
type countKeyedTime struct{}

func (countKeyedTime) CreateAccumulator() int64       { return 0 }
func (countKeyedTime) Add(_ keyedTime, a int64) int64 { return a + 1 }
func (countKeyedTime) Result(a int64) int64           { return a }
func (countKeyedTime) Merge(a, b int64) int64         { return a + b }

// timerAfter counts each key's records and sets an event-time timer 5 ms
// after each; a timer emits the count and the watermark it fired at.
type timerAfter struct {
	operators.KeyedProcessBase[string, string]
	count state.Value[int]
}

func (f *timerAfter) Open(rt *operators.KeyedRuntime[string]) error {
	var err error
	f.count, err = state.NewValue(rt.Backend(), rt.Keys(), state.ValueDescriptor[int]{Name: "count"})
	return err
}

func (f *timerAfter) ProcessElement(e keyedTime, ctx *operators.KeyedContext[string, string]) error {
	n, _ := f.count.Get()
	f.count.Update(n + 1)
	ctx.Timers().RegisterEventTimeTimer(e.TS + 5)
	return nil
}

func (f *timerAfter) OnTimer(ts int64, ctx *operators.KeyedContext[string, string]) error {
	n, _ := f.count.Get()
	ctx.Emit(fmt.Sprintf("timer %s %d count %d wm %d", ctx.CurrentKey(), ts, n, ctx.CurrentWatermark()))
	return nil
}

// windowsRescaleJob reads all from one limited source (per-event watermarks, 3 ms
// out of orderness) into session windows (gap 10 ms, lateness 4 ms),
// sliding windows (10 ms every 5 ms, lateness 2 ms), both with their late
// records on side outputs, and event-time timers; everything goes to an
// exactly-once file sink in out.
func windowsRescaleJob(all []keyedTime, l *gate, read *atomic.Int64, out string, opts ...stream.Option) *stream.Environment {
	env := stream.NewEnvironment("rescale-windows", opts...)
	src := stream.FromSource(env, "src", func() operators.Source[keyedTime] {
		return &gatedSource[keyedTime]{all: all, gate: l, read: read}
	}).SetParallelism(1).UID("src").
		AssignTimestampsAndWatermarks("wm", watermark.ForBoundedOutOfOrderness(3*time.Millisecond, func(e keyedTime) int64 { return e.TS }).WithPerEventEmit()).UID("wm")
	keyed := stream.KeyBy(src, func(e keyedTime) string { return e.K })
	lateS := operators.NewOutputTag[keyedTime]("late-sessions")
	lateW := operators.NewOutputTag[keyedTime]("late-sliding")
	sw := stream.Window(keyed, operators.EventTimeSessionWindows(10*time.Millisecond)).AllowedLateness(4 * time.Millisecond).SideOutputLateData(lateS)
	sessions := stream.WindowAggregate(sw, "sessions", countKeyedTime{}).UID("sessions")
	ww := stream.Window(keyed, operators.SlidingEventTimeWindows(10*time.Millisecond, 5*time.Millisecond)).AllowedLateness(2 * time.Millisecond).SideOutputLateData(lateW)
	sliding := stream.WindowAggregate(ww, "sliding", countKeyedTime{}).UID("sliding")
	timers := stream.KeyedProcess(keyed, "timers", func() operators.KeyedProcessFunction[string, keyedTime, string] { return &timerAfter{} }).UID("timers")
	line := func(what string) func(r operators.WindowResult[string, int64]) (string, error) {
		return func(r operators.WindowResult[string, int64]) (string, error) {
			return fmt.Sprintf("%s %s %v %d", what, r.Key, r.Window, r.Value), nil
		}
	}
	lateLine := func(what string) func(e keyedTime) (string, error) {
		return func(e keyedTime) (string, error) { return fmt.Sprintf("%s %s %d", what, e.K, e.TS), nil }
	}
	stream.Map(sessions, "session-lines", line("session")).Union(
		stream.Map(sliding, "sliding-lines", line("sliding")),
		stream.Map(stream.SideOutput(sessions, lateS), "late-session-lines", lateLine("late-session")),
		stream.Map(stream.SideOutput(sliding, lateW), "late-sliding-lines", lateLine("late-sliding")),
		timers,
	).To("out", func() operators.Sink[string] { return operators.NewFileSink(out, func(s string) string { return s }) }).UID("out")
	return env
}

// rescaleRecords gives keys records at times that are negative, at window
// bounds, out of order and late (for the windows and within their
// lateness), each key missing a third of them.
func rescaleRecords(keys int) []keyedTime {
	ts := []int64{-25, -20, -11, -10, -5, -1, 0, 4, 5, 9, 10, 14, 3, 2, 30, 19, 20, 26, 44, 40, 41, 60, 36, 55, 100, 97, 96, 95, 94, 93, 200}
	var all []keyedTime
	for i, t := range ts {
		for k := range keys {
			if (i+k)%3 != 0 {
				all = append(all, keyedTime{K: fmt.Sprintf("k%d", k), TS: t})
			}
		}
	}
	return all
}

// Session and sliding windows with allowed lateness and late-data side
// outputs, and event-time timers, stopped with a savepoint at parallelism
// 1, resumed at 3, stopped again and resumed at 2, commit what the run
// without the stops commits, wherever the stops fall: in the middle of
// sessions, of windows within their lateness, and with timers queued.
// (The run without stops was checked by hand against Flink's semantics
// for 7 keys.)
func TestWindowsAndTimersAcrossRescaleOneThreeTwo(t *testing.T) {
	windowsAcrossRescales(t, [3]int{1, 3, 2}, nil)
}

// windowsAcrossRescales runs the job of the windows' rescale tests
// without stops, then for each of four pairs of stops at the
// parallelisms pars: stopped with a savepoint at pars[0], resumed at
// pars[1], stopped again, resumed at pars[2]; each run commits what the
// run without stops commits. backend, if set, gives each run's state
// backend option.
func windowsAcrossRescales(t *testing.T, pars [3]int, backend func() stream.Option) {
	all := rescaleRecords(100)
	cfg := checkpointConfig(t, snapshot.ExactlyOnce)
	cfg.Interval = time.Hour // only the savepoints
	refOut := t.TempDir()
	l := newGate()
	l.allow(len(all))
	var read atomic.Int64
	if err := execute(t, windowsRescaleJob(all, l, &read, refOut, stream.WithParallelism(1), stream.WithCheckpointing(cfg))); err != nil {
		t.Fatal(err)
	}
	want := committedLines(t, refOut)
	slices.Sort(want)
	n := len(all)
	for _, stops := range [][2]int{{n / 5, n / 2}, {n / 3, n * 3 / 4}, {n / 2, n * 2 / 3}, {10, n - 5}} {
		out := t.TempDir()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		sp := ""
		for i, p := range pars {
			l := newGate()
			var read atomic.Int64
			cfg.Dir = t.TempDir()
			opts := []stream.Option{stream.WithParallelism(p), stream.WithCheckpointing(cfg)}
			if backend != nil {
				opts = append(opts, backend())
			}
			if sp != "" {
				opts = append(opts, stream.WithSavepoint(sp, false))
			}
			job, err := windowsRescaleJob(all, l, &read, out, opts...).ExecuteAsync(ctx)
			if err != nil {
				cancel()
				t.Fatal(err)
			}
			if i == 2 {
				l.allow(n)
				if err := job.Wait(); err != nil {
					t.Fatal(err)
				}
				break
			}
			l.allow(stops[i])
			testutil.Eventually(t, 30*time.Second, fmt.Sprintf("%d records read at parallelism %d", stops[i], p), func() bool { return read.Load() >= int64(stops[i]) })
			if sp, err = job.StopWithSavepoint(ctx, ""); err != nil {
				t.Fatal(err)
			}
			if err := job.Wait(); err != nil {
				t.Fatal(err)
			}
		}
		cancel()
		got := committedLines(t, out)
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("stopped after %v records, at parallelism %d then %d, resumed at %d:\n%s", stops, pars[0], pars[1], pars[2], diffLines(got, want))
		}
	}
}
