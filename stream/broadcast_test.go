package stream_test

import (
	"fmt"
	"math"
	"sort"
	"sync"
	"testing"

	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/state"
	"github.com/edgedio/edged/stream"
)

// threshold is a broadcast rule: readings of Sensor above Max alert.
type threshold struct {
	Sensor string
	Max    float64
}

// thresholdCheck keeps each sensor's readings and, once every input has
// ended (the final watermark fires its timer), reports the readings above
// the sensor's threshold. Broadcast state is complete by then, so the
// result does not depend on how the two inputs interleaved.
type thresholdCheck struct {
	operators.KeyedProcessBase[string, string]
	rules    state.Broadcast[string, float64]
	view     state.ReadOnlyBroadcast[string, float64]
	readings state.List[float64]
	seen     *sync.Map // subtask -> rules seen, to check every subtask got all
	subtask  int
}

func (f *thresholdCheck) Open(rt *operators.BroadcastRuntime[string]) error {
	var err error
	if f.rules, err = state.BroadcastState[string, float64](rt.Store(), "thresholds"); err != nil {
		return err
	}
	if f.view, err = state.ReadOnlyBroadcastState[string, float64](rt.Store(), "thresholds"); err != nil {
		return err
	}
	f.subtask = rt.Context.Subtask
	f.readings, err = state.NewList(rt.Backend(), rt.Keys(), state.ListDescriptor[float64]{Name: "readings"})
	return err
}

func (f *thresholdCheck) ProcessElement(r operators.SensorReading, ctx *operators.KeyedContext[string, string]) error {
	f.readings.Add(r.Temperature)
	ctx.Timers().RegisterEventTimeTimer(math.MaxInt64 - 1)
	return nil
}

func (f *thresholdCheck) ProcessBroadcastElement(t threshold, ctx *operators.BroadcastContext[string]) error {
	f.rules.Put(t.Sensor, t.Max)
	n, _ := f.seen.LoadOrStore(f.subtask, new(int))
	*n.(*int)++
	return nil
}

func (f *thresholdCheck) OnTimer(ts int64, ctx *operators.KeyedContext[string, string]) error {
	max, ok := f.view.Get(ctx.CurrentKey())
	if !ok {
		return nil
	}
	n := 0
	for t := range f.readings.All() {
		if t > max {
			n++
		}
	}
	ctx.Emit(fmt.Sprintf("%s:%d", ctx.CurrentKey(), n))
	return nil
}

type ruleSource struct {
	operators.Base
	rules []threshold
	done  bool
}

func (s *ruleSource) Poll(out operators.Collector[threshold], _ int) (operators.Status, error) {
	if !s.done {
		for _, r := range s.rules {
			out.Collect(r)
		}
		s.done = true
	}
	return operators.EndOfInput, nil
}

func (s *ruleSource) Available() <-chan struct{} { return nil }

func TestBroadcastStatePattern(t *testing.T) {
	const n, keys = 20_000, 20
	rules := []threshold{{"sensor_1", 30}, {"sensor_2", 35}, {"sensor_7", 25}}
	env := stream.NewEnvironment("thresholds", stream.WithParallelism(2))
	readings := stream.FromSource(env, "readings", generator(n, keys))
	rulesStream := stream.FromSource(env, "rules", func() operators.Source[threshold] { return &ruleSource{rules: rules} }).SetParallelism(1)
	var seen sync.Map
	alerts := stream.ConnectBroadcast(stream.KeyBy(readings, bySensor), rulesStream, "check",
		func() operators.KeyedBroadcastProcessFunction[string, operators.SensorReading, threshold, string] {
			return &thresholdCheck{seen: &seen}
		}).UID("check")
	sink := operators.NewCollectSink[string]()
	alerts.To("alerts", sink.Subtask)
	if err := execute(t, env); err != nil {
		t.Fatal(err)
	}
	// Every subtask saw every rule.
	for sub := range 2 {
		c, ok := seen.Load(sub)
		if !ok || *c.(*int) != len(rules) {
			t.Fatalf("subtask %d saw %v rules, want %d", sub, c, len(rules))
		}
	}
	// Independent computation.
	want := map[string]int{}
	for _, r := range readingsOf(n, keys) {
		for _, rule := range rules {
			if r.ID == rule.Sensor && r.Temperature > rule.Max {
				want[r.ID]++
			}
		}
	}
	var wantLines []string
	for _, rule := range rules {
		wantLines = append(wantLines, fmt.Sprintf("%s:%d", rule.Sensor, want[rule.Sensor]))
	}
	got := sink.Values()
	sort.Strings(got)
	sort.Strings(wantLines)
	if fmt.Sprint(got) != fmt.Sprint(wantLines) {
		t.Fatalf("alerts %v, want %v", got, wantLines)
	}
}

// readingsOf returns the first n generated readings.
func readingsOf(n int64, keys int) []operators.SensorReading {
	g := operators.SensorGenerator(operators.GeneratorConfig{Count: n, Keys: keys})
	var all []operators.SensorReading
	col := operators.CollectorFunc[operators.SensorReading](func(r operators.SensorReading) { all = append(all, r) })
	if err := g.Open(&operators.Context{Parallelism: 1}); err != nil {
		panic(err)
	}
	for {
		if st, _ := g.Poll(col, 4096); st == operators.EndOfInput {
			return all
		}
	}
}
