package stream_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/stream"
	"github.com/edgedio/edged/watermark"
)

// timerPerRecord registers an event-time timer 10 ms after each keyed
// record and emits "key@ts" when it fires.
type timerPerRecord struct{}

func (timerPerRecord) Open(*operators.BroadcastRuntime[string]) error { return nil }

func (timerPerRecord) ProcessElement(v ev, ctx *operators.KeyedContext[string, string]) error {
	ctx.Timers().RegisterEventTimeTimer(v.TS + 10)
	return nil
}

func (timerPerRecord) ProcessBroadcastElement(string, *operators.BroadcastContext[string]) error {
	return nil
}

func (timerPerRecord) OnTimer(ts int64, ctx *operators.KeyedContext[string, string]) error {
	ctx.Emit(fmt.Sprintf("%s@%d", ctx.CurrentKey(), ts))
	return nil
}

// endOfTime is the watermark generator README gives for a broadcast input
// whose records carry no event time: its watermark is the largest short
// of the end of input, so it never holds back the keyed input it is
// connected to.
type endOfTime struct{}

func (endOfTime) OnEvent(int64)                 {}
func (endOfTime) OnPeriodicEmit() (int64, bool) { return watermark.MaxWatermark - 1, true }

// A bounded keyed input connected to a broadcast input that runs on (rules
// that may come at any time): with the broadcast input's watermark at the
// end of time, every timer of the keyed side fires once the keyed input
// ended, while the job still runs for the rules. The README's workaround
// for an input that ended not taking the operator past one that is only
// idle.
func TestBroadcastInputAtTheEndOfTimeLetsAnEndedKeyedInputFire(t *testing.T) {
	var recs []ev
	var want []string
	for i := range int64(50) {
		recs = append(recs, ev{Key: fmt.Sprint(i % 3), TS: i * 100, V: i})
		want = append(want, fmt.Sprintf("%d@%d", i%3, i*100+10))
	}
	env := stream.NewEnvironment("bc-time", stream.WithParallelism(2))
	readings := stream.FromSource(env, "readings", newUserSlice(recs)).SetParallelism(1).UID("readings").
		AssignTimestampsAndWatermarks("ts", watermark.ForMonotonous(evTime).WithPerEventEmit()).UID("ts")
	rules := stream.FromSource(env, "rules", func() operators.Source[string] {
		return &userSliceSource[string]{recs: []string{"r1"}, hold: true}
	}).SetParallelism(1).UID("rules").
		AssignTimestampsAndWatermarks("rules-time", watermark.ForGenerator(func(string) int64 { return 0 },
			func() watermark.Generator { return endOfTime{} }).WithPerEventEmit()).UID("rules-time")
	out := stream.ConnectBroadcast(stream.KeyBy(readings, evKey), rules, "timers",
		func() operators.KeyedBroadcastProcessFunction[string, ev, string, string] { return timerPerRecord{} }).UID("timers")
	sink := operators.NewCollectSink[string]()
	out.To("out", func() operators.Sink[string] { return sink.Subtask() })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	job, err := env.ExecuteAsync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 0, "every timer of the ended keyed input fired", func() bool {
		return len(sink.Values()) >= len(want)
	})
	cancel()
	job.Wait()
	got := sink.Values()
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("fired %v, want %v", got, want)
	}
}
