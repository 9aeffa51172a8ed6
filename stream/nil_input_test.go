package stream_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/stream"
	"github.com/edgedio/edged/watermark"
)

// panicOf runs f and returns the error it panicked with, nil if it did
// not panic.
func panicOf(t *testing.T, f func()) (err error) {
	t.Helper()
	defer func() {
		if r := recover(); r != nil {
			e, ok := r.(error)
			if !ok {
				e = fmt.Errorf("panic with a %T: %v", r, r)
			}
			err = e
		}
	}()
	f()
	return nil
}

// A builder given a nil (or zero) Environment, Stream, KeyedStream,
// WindowedStream or Sink has no Environment to report to: it panics at
// once with an error naming the builder, the operator and what is nil,
// not with a nil dereference inside the stream package. Plan, Graph,
// Execute and ExecuteAsync of a nil Environment return that error.
func TestNilInputPanicsNamingTheBuilder(t *testing.T) {
	var (
		s    *stream.Stream[int64]
		k    *stream.KeyedStream[int64, int64]
		w    *stream.WindowedStream[int64, int64]
		sink *stream.Sink
	)
	id := func(i int64) (int64, error) { return i, nil }
	key := func(i int64) int64 { return i }
	sum := func(a, b int64) (int64, error) { return a + b, nil }
	live := func() *stream.Stream[int64] { return stream.FromSource(stream.NewEnvironment("live"), "src", ints(1)) }
	const nilStream = "the input *Stream[int64] is nil (or a zero value)"
	const nilKeyed = "the input *KeyedStream[int64, int64] is nil (or a zero value)"
	const nilWindowed = "the input *WindowedStream[int64, int64] is nil (or a zero value)"
	cases := []struct {
		name  string
		build func()
		want  string
	}{
		{"FromSource nil env", func() { stream.FromSource(nil, "src", ints(1)) }, `stream: FromSource("src"): the *Environment is nil (or a zero value)`},
		{"FromSource zero env", func() { stream.FromSource(&stream.Environment{}, "src", ints(1)) }, `stream: FromSource("src"): the *Environment is nil`},
		{"Map", func() { stream.Map(s, "m", id) }, `stream: Map("m"): ` + nilStream},
		{"Map zero stream", func() { stream.Map(&stream.Stream[int64]{}, "m", id) }, `stream: Map("m"): ` + nilStream},
		{"FlatMap", func() {
			stream.FlatMap(s, "fm", func(i int64, out operators.Collector[int64]) error { return nil })
		}, `stream: FlatMap("fm"): ` + nilStream},
		{"Filter", func() { s.Filter("f", func(int64) bool { return true }) }, `stream: Filter("f"): ` + nilStream},
		{"Transform", func() {
			stream.Transform(s, "op", func(out operators.Collector[int64]) operators.OneInput[int64] { return nil })
		}, `stream: Transform("op"): ` + nilStream},
		{"Process", func() {
			stream.Process(s, "p", func() operators.ProcessFunction[int64, int64] { return nil })
		}, `stream: Process("p"): ` + nilStream},
		{"AssignTimestampsAndWatermarks", func() {
			s.AssignTimestampsAndWatermarks("ts", watermark.ForMonotonous(key))
		}, `stream: AssignTimestampsAndWatermarks("ts"): ` + nilStream},
		{"To", func() { s.To("sink", discard) }, `stream: To("sink"): ` + nilStream},
		{"ForEach", func() { s.ForEach("each", func(int64) error { return nil }) }, `stream: ForEach("each"): ` + nilStream},
		{"Union", func() { s.Union(live()) }, `stream: Union: ` + nilStream},
		{"UID", func() { s.UID("u") }, `stream: UID("u"): ` + nilStream},
		{"SetParallelism", func() { s.SetParallelism(2) }, `stream: SetParallelism: ` + nilStream},
		{"Rebalance", func() { s.Rebalance() }, `stream: Rebalance: ` + nilStream},
		{"SideOutput", func() { stream.SideOutput(s, operators.NewOutputTag[int64]("late")) }, `stream: SideOutput("late"): ` + nilStream},
		{"KeyBy", func() { stream.KeyBy(s, key) }, `stream: KeyBy: ` + nilStream},
		{"KeyedStream.Reduce", func() { k.Reduce("r", sum) }, `stream: Reduce("r"): ` + nilKeyed},
		{"Aggregate", func() {
			stream.Aggregate(k, "agg", operators.ReduceFunction(sum))
		}, `stream: Aggregate("agg"): ` + nilKeyed},
		{"KeyedProcess", func() {
			stream.KeyedProcess(k, "kp", func() operators.KeyedProcessFunction[int64, int64, int64] { return keyedNoop{} })
		}, `stream: KeyedProcess("kp"): ` + nilKeyed},
		{"ConnectBroadcast", func() {
			stream.ConnectBroadcast(k, live(), "cb", func() operators.KeyedBroadcastProcessFunction[int64, int64, int64, int64] { return nil })
		}, `stream: ConnectBroadcast("cb"): ` + nilKeyed},
		{"Window", func() { stream.Window(k, operators.TumblingEventTimeWindows(time.Second)) }, `stream: Window: ` + nilKeyed},
		{"Window zero keyed", func() {
			stream.Window(&stream.KeyedStream[int64, int64]{}, operators.TumblingEventTimeWindows(time.Second))
		}, `stream: Window: ` + nilKeyed},
		{"WindowedStream.Reduce", func() { w.Reduce("w", sum) }, `stream: Reduce("w"): ` + nilWindowed},
		{"WindowAggregate", func() {
			stream.WindowAggregate(w, "w", operators.ReduceFunction(sum))
		}, `stream: WindowAggregate("w"): ` + nilWindowed},
		{"WindowProcess zero", func() {
			stream.WindowProcess(&stream.WindowedStream[int64, int64]{}, "w",
				operators.ProcessWindowFunc[int64, int64, int64](func(int64, operators.Window, []int64, operators.Collector[int64]) error { return nil }))
		}, `stream: WindowProcess("w"): ` + nilWindowed},
		{"AllowedLateness", func() { w.AllowedLateness(time.Second) }, `stream: AllowedLateness: ` + nilWindowed},
		{"Sink.UID", func() { sink.UID("s") }, `stream: UID("s"): the *Sink is nil`},
		{"Sink.SetParallelism", func() { sink.SetParallelism(2) }, `stream: SetParallelism: the *Sink is nil`},
		{"MaxParallelism", func() { (*stream.Environment)(nil).MaxParallelism() }, `stream: MaxParallelism: the *Environment is nil`},
		{"Config", func() { (*stream.Environment)(nil).Config() }, `stream: Config: the *Environment is nil`},
		{"Stats", func() { (*stream.Environment)(nil).Stats() }, `stream: Stats: the *Environment is nil`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := panicOf(t, c.build)
			if err == nil {
				t.Fatalf("did not panic; want a panic saying %q", c.want)
			}
			if !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "nil pointer") {
				t.Fatalf("panicked with %q, want %q", err, c.want)
			}
		})
	}

	var env *stream.Environment
	for _, c := range []struct {
		call string
		run  func() error
	}{
		{"Plan", func() error { _, err := env.Plan(); return err }},
		{"Graph", func() error { _, err := env.Graph(); return err }},
		{"Execute", func() error { return env.Execute(context.Background()) }},
		{"ExecuteAsync", func() error { _, err := env.ExecuteAsync(context.Background()); return err }},
	} {
		var err error
		if p := panicOf(t, func() { err = c.run() }); p != nil {
			t.Fatalf("%s of a nil Environment panicked: %v", c.call, p)
		}
		want := "stream: " + c.call + ": the *Environment is nil (or a zero value): make it with NewEnvironment"
		if err == nil || err.Error() != want {
			t.Fatalf("%s of a nil Environment: %v, want %q", c.call, err, want)
		}
	}

	// A job built from live streams still runs.
	env = stream.NewEnvironment("ok")
	timed := stream.FromSource(env, "src", ints(10)).AssignTimestampsAndWatermarks("ts", watermark.ForMonotonous(key))
	stream.Window(stream.KeyBy(timed, key), operators.TumblingEventTimeWindows(time.Second)).
		Reduce("w", sum).UID("w").ForEach("out", func(operators.WindowResult[int64, int64]) error { return nil })
	if err := env.Execute(context.Background()); err != nil {
		t.Fatal(err)
	}
}
