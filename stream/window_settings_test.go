package stream_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/state"
	"github.com/edgedio/edged/stream"
	"github.com/edgedio/edged/watermark"
)

// countAgg counts a window's records; it merges, for sliding windows.
type countAgg struct{}

func (countAgg) CreateAccumulator() int64   { return 0 }
func (countAgg) Add(_ int64, n int64) int64 { return n + 1 }
func (countAgg) Result(n int64) int64       { return n }
func (countAgg) Merge(a, b int64) int64     { return a + b }
func windowSettingsKey(int64) string        { return "k" }
func windowSettingsTime(ts int64) int64     { return ts }

// windowSettingsJob is a gated source of timestamps -> per-event
// watermarks -> one key -> a window of assigner (uid "win") -> discard.
func windowSettingsJob(g *gate, assigner operators.WindowAssigner, opts ...stream.Option) *stream.Environment {
	env := stream.NewEnvironment("window-settings", append([]stream.Option{stream.WithParallelism(1)}, opts...)...)
	src := stream.FromSource(env, "ts", func() operators.Source[int64] {
		return &gatedSource[int64]{all: []int64{1_000, 2_000, 3_000, 60_000}, gate: g}
	}).UID("ts").
		AssignTimestampsAndWatermarks("wm", watermark.ForBoundedOutOfOrderness(0, windowSettingsTime).WithPerEventEmit())
	w := stream.Window(stream.KeyBy(src, windowSettingsKey), assigner)
	stream.WindowAggregate(w, "win", operators.AggregateFunction[int64, int64, int64](countAgg{})).UID("win").
		To("discard", func() operators.Sink[operators.WindowResult[string, int64]] {
			return operators.NewSinkFunc(func(operators.WindowResult[string, int64]) error { return nil })
		}).UID("discard")
	return env
}

// A window operator declares its assigner with its state: its slices are
// cut by size, slide and offset. A savepoint of tumbling windows restored
// into sliding ones, or into tumbling ones of another size, under the
// same uid is refused at once (state.ErrIncompatibleState) instead of
// reading the old slices as the new ones, and so is one into a keyed
// process; the same assigner restores, and so does a session window with
// another gap.
func TestRestoreRefusesAnotherWindowAssigner(t *testing.T) {
	savepoint := func(t *testing.T, assigner operators.WindowAssigner) string {
		t.Helper()
		cfg := checkpointConfig(t, snapshot.ExactlyOnce)
		cfg.Interval = time.Hour
		g := newGate()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		job, err := windowSettingsJob(g, assigner, stream.WithCheckpointing(cfg)).ExecuteAsync(ctx)
		if err != nil {
			t.Fatal(err)
		}
		g.allow(2)
		testutil.Eventually(t, 30*time.Second, "the source reads", g.polled.Load)
		path, err := job.StopWithSavepoint(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		if err := job.Wait(); err != nil {
			t.Fatal(err)
		}
		return path
	}
	restore := func(t *testing.T, path string, assigner operators.WindowAssigner) error {
		t.Helper()
		cfg := checkpointConfig(t, snapshot.ExactlyOnce)
		g := newGate()
		g.allow(4)
		return execute(t, windowSettingsJob(g, assigner, stream.WithCheckpointing(cfg), stream.WithSavepoint(path, false)))
	}
	tumbling := operators.TumblingEventTimeWindows(10 * time.Second)
	sp := savepoint(t, tumbling)
	for _, c := range []struct {
		name     string
		assigner operators.WindowAssigner
	}{
		{"sliding", operators.SlidingEventTimeWindows(10*time.Second, 5*time.Second)},
		{"tumbling of another size", operators.TumblingEventTimeWindows(20 * time.Second)},
		{"tumbling with an offset", tumbling.WithOffset(time.Second)},
		{"tumbling on processing time", operators.TumblingProcessingTimeWindows(10 * time.Second)},
	} {
		err := restore(t, sp, c.assigner)
		if !errors.Is(err, state.ErrIncompatibleState) || !strings.Contains(err.Error(), `"win"`) || !strings.Contains(err.Error(), "size=10000ms") {
			t.Errorf("%s: %v, want state.ErrIncompatibleState naming the operator and the old assigner", c.name, err)
		}
	}
	if err := restore(t, sp, tumbling); err != nil {
		t.Errorf("the same assigner: %v", err)
	}
	// A keyed process given the window's uid would read its timers as
	// its own: refused too.
	cfg := checkpointConfig(t, snapshot.ExactlyOnce)
	env := stream.NewEnvironment("window-settings", stream.WithParallelism(1), stream.WithCheckpointing(cfg), stream.WithSavepoint(sp, true))
	g := newGate()
	g.allow(4)
	src := stream.FromSource(env, "ts", func() operators.Source[int64] {
		return &gatedSource[int64]{all: []int64{1_000, 2_000, 3_000, 60_000}, gate: g}
	}).UID("ts")
	stream.KeyedProcess(stream.KeyBy(src, windowSettingsKey), "win", func() operators.KeyedProcessFunction[string, int64, string] { return &countTimers{} }).UID("win").
		To("discard", func() operators.Sink[string] {
			return operators.NewSinkFunc(func(string) error { return nil })
		}).UID("discard")
	if err := execute(t, env); !errors.Is(err, state.ErrIncompatibleState) || !strings.Contains(err.Error(), "operator=window") || !strings.Contains(err.Error(), "operator=keyed-process") {
		t.Errorf("a keyed process with the window's uid: %v, want state.ErrIncompatibleState naming both kinds", err)
	}

	session := savepoint(t, operators.EventTimeSessionWindows(time.Second))
	if err := restore(t, session, operators.EventTimeSessionWindows(5*time.Second)); err != nil {
		t.Errorf("session windows with another gap: %v", err)
	}
}
