package stream_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/stream"
	"github.com/edgedio/edged/watermark"
)

// everyMinute sets an event-time timer a minute after its record, and
// each timer the next one a minute later, counting the timers fired.
type everyMinute struct {
	operators.KeyedProcessBase[string, string]
	fired *atomic.Int64
}

func (f *everyMinute) ProcessElement(e keyedTime, ctx *operators.KeyedContext[string, string]) error {
	ctx.Timers().RegisterEventTimeTimer(e.TS + 60_000)
	return nil
}

func (f *everyMinute) OnTimer(ts int64, ctx *operators.KeyedContext[string, string]) error {
	f.fired.Add(1)
	ctx.Timers().RegisterEventTimeTimer(ts + 60_000)
	return nil
}

// A periodic event-time timer at the end of a bounded input fires
// without end: the final watermark (math.MaxInt64) fires every timer at
// or before it, the ones the timers register included, as in Flink. A
// cancel of the job stops that run of timers, and every goroutine of the
// job ends. Before, the task went on firing timers after the cancel: the
// job's Execute returned after the 10 s it waits for a task that does
// not stop, and the task's goroutine spun on for ever.
func TestCancelStopsTimersFiringWithoutEnd(t *testing.T) {
	var fired, read atomic.Int64
	l := newGate()
	l.allow(1)
	env := stream.NewEnvironment("every-minute", stream.WithParallelism(1))
	src := stream.FromSource(env, "src", func() operators.Source[keyedTime] {
		return &gatedSource[keyedTime]{all: []keyedTime{{K: "k", TS: 0}}, gate: l, read: &read}
	}).AssignTimestampsAndWatermarks("time", watermark.ForMonotonous(func(e keyedTime) int64 { return e.TS }))
	stream.KeyedProcess(stream.KeyBy(src, func(e keyedTime) string { return e.K }), "every-minute",
		func() operators.KeyedProcessFunction[string, keyedTime, string] { return &everyMinute{fired: &fired} }).UID("every-minute").
		ForEach("discard", func(string) error { return nil })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	job, err := env.ExecuteAsync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, "the timers firing at the final watermark", func() bool { return fired.Load() > 10_000 })
	cancel()
	if err := job.Wait(); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait after the cancel: %v, want context.Canceled", err)
	}
	goleak.VerifyNone(t)
}
