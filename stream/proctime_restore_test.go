package stream_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/stream"
)

// A processing-time window that fired before a savepoint does not fire
// again after the restore, even when the restored job's clock is at the
// millisecond of that firing or behind it (a restore or handover onto a
// node whose clock is a few milliseconds behind): a restored task's
// processing time starts one millisecond after the latest of the snapshot
// it restores, so the record read after the restore goes to the next
// window, as it does without a restore. Tumbling windows of 1 s; the
// first record at +0, the window [0, 1 s) fired at +999 ms, then a stop
// with a savepoint; the restored job reads the second record with its
// clock at +999 ms, and 5 ms behind that.
func TestProcessingTimeRestoredClockBehindTheFiredWindow(t *testing.T) {
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	t0 := base.UnixMilli()
	all := []operators.SensorReading{{ID: "a", Temperature: 1}, {ID: "a", Temperature: 2}}
	for _, behind := range []time.Duration{0, 5 * time.Millisecond} {
		t.Run(fmt.Sprintf("behind=%v", behind), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			sink := operators.NewCollectSink[operators.WindowResult[string, countSum]]()
			job := func(clk clockwork.Clock, g *gate, opts ...stream.Option) *stream.Environment {
				cfg := checkpointConfig(t, snapshot.ExactlyOnce)
				cfg.Interval = time.Hour
				env := stream.NewEnvironment("pt-restore", append([]stream.Option{stream.WithParallelism(1), stream.WithCheckpointing(cfg), stream.WithClock(clk)}, opts...)...)
				src := stream.FromSource(env, "src", func() operators.Source[operators.SensorReading] {
					return &gatedSource[operators.SensorReading]{all: all, gate: g}
				}).UID("src")
				w := stream.Window(stream.KeyBy(src, bySensor), operators.TumblingProcessingTimeWindows(time.Second))
				stream.WindowAggregate(w, "count", operators.AggregateFunction[operators.SensorReading, countSum, countSum](countSumAgg{})).UID("count").
					To("out", func() operators.Sink[operators.WindowResult[string, countSum]] { return sink.Subtask() }).UID("out")
				return env
			}
			clk := clockwork.NewFakeClockAt(base)
			g := newGate()
			run, err := job(clk, g).ExecuteAsync(ctx)
			if err != nil {
				t.Fatal(err)
			}
			g.allow(1)
			// Read at +0 or at +999 ms, the record is in [0, 1 s), whose
			// timer at +999 ms fires.
			clk.Advance(999 * time.Millisecond)
			testutil.Eventually(t, 30*time.Second, "the first window fired", func() bool { return sink.Len() == 1 })
			sp, err := run.StopWithSavepoint(ctx, "")
			if err != nil {
				t.Fatal(err)
			}
			if err := run.Wait(); err != nil {
				t.Fatal(err)
			}
			clk = clockwork.NewFakeClockAt(base.Add(999*time.Millisecond - behind))
			g = newGate()
			run, err = job(clk, g, stream.WithSavepoint(sp, false)).ExecuteAsync(ctx)
			if err != nil {
				t.Fatal(err)
			}
			g.allow(2)
			if err := run.Wait(); err != nil { // the end of input fires the open window
				t.Fatal(err)
			}
			got := sink.Values()
			want := []operators.WindowResult[string, countSum]{
				{Key: "a", Window: operators.Window{Start: t0, End: t0 + 1000}, Value: countSum{ID: "a", Count: 1, Sum: 100}},
				{Key: "a", Window: operators.Window{Start: t0 + 1000, End: t0 + 2000}, Value: countSum{ID: "a", Count: 1, Sum: 200}},
			}
			if !slices.Equal(got, want) {
				t.Fatalf("results %v\nwant    %v", got, want)
			}
		})
	}
}
