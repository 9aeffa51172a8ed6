package stream_test

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/stream"
	"github.com/edgedio/edged/watermark"
)

// The window jobs here run through the actor runtime at parallelism 2 over
// generated sensor readings delivered out of order, at most e2eDisorder
// behind the largest event time before them. The timestamp assigner's
// bounded out-of-orderness is that bound, so no reading is ever late,
// whenever the periodic watermarks (on the real clock) happen to come:
// every window fires, at the latest with the final watermark at the end of
// the input, and the results must equal a plain computation over the same
// readings.

// e2eDisorder is how far, in event time, a reading may arrive behind the
// largest timestamp before it.
const e2eDisorder = 5 * time.Second

// countSumMerge is the count+sum of helpers_test.go with a Merge, which
// sliding and session windows need.
type countSumMerge struct{ countSumAgg }

func (countSumMerge) Merge(a, b countSum) countSum {
	return countSum{ID: cmp.Or(a.ID, b.ID), Count: a.Count + b.Count, Sum: a.Sum + b.Sum}
}

type windowResult = operators.WindowResult[string, countSum]

// outOfOrderReadings returns the first count readings of the sensor
// generator over keys sensors, those for which keep holds (nil: all), in
// an arrival order that depends on seed only: each reading arrives at most
// e2eDisorder behind the largest timestamp before it.
func outOfOrderReadings(count int64, keys int, seed uint64, keep func(operators.SensorReading) bool) []operators.SensorReading {
	g := operators.SensorGenerator(operators.GeneratorConfig{Count: count, Keys: keys})
	var all []operators.SensorReading
	col := operators.CollectorFunc[operators.SensorReading](func(r operators.SensorReading) {
		if keep == nil || keep(r) {
			all = append(all, r)
		}
	})
	if err := g.Open(&operators.Context{Parallelism: 1}); err != nil {
		panic(err)
	}
	for {
		st, err := g.Poll(col, 4096)
		if err != nil {
			panic(err)
		}
		if st == operators.EndOfInput {
			break
		}
	}
	// Sort by timestamp plus a random delay of at most the bound: a
	// reading arriving before r has ts' <= ts' + delay' <= ts + delay, so
	// it is at most the bound ahead of r.
	rng := rand.New(rand.NewPCG(seed, 7))
	bound := int64(e2eDisorder / time.Millisecond)
	type arrival struct {
		at int64
		r  operators.SensorReading
	}
	arrivals := make([]arrival, len(all))
	for i, r := range all {
		arrivals[i] = arrival{at: eventTimeMs(r) + rng.Int64N(bound+1), r: r}
	}
	slices.SortStableFunc(arrivals, func(a, b arrival) int { return cmp.Compare(a.at, b.at) })
	late := 0
	for i, a := range arrivals {
		all[i] = a.r
		if i > 0 && a.r.Timestamp < all[i-1].Timestamp {
			late++
		}
	}
	if late < len(all)/10 {
		panic(fmt.Sprintf("only %d of %d readings arrive out of order", late, len(all)))
	}
	return all
}

func eventTimeMs(r operators.SensorReading) int64 { return r.Timestamp * 1000 }

// readingSource emits its subtask's share of readings (the indices i ≡
// subtask mod parallelism), in order.
type readingSource struct {
	operators.Base
	all        []operators.SensorReading
	next, step int
}

func (s *readingSource) Open(ctx *operators.Context) error {
	s.next, s.step = ctx.Subtask, ctx.Parallelism
	return nil
}

func (s *readingSource) Poll(out operators.Collector[operators.SensorReading], max int) (operators.Status, error) {
	for k := 0; k < max && s.next < len(s.all); k++ {
		out.Collect(s.all[s.next])
		s.next += s.step
	}
	if s.next >= len(s.all) {
		return operators.EndOfInput, nil
	}
	return operators.MoreAvailable, nil
}

func (s *readingSource) Available() <-chan struct{} { return nil }

// resultSink collects window results from every sink subtask.
type resultSink struct {
	mu  sync.Mutex // guards got
	got []windowResult
}

func (s *resultSink) add(r windowResult) error {
	s.mu.Lock()
	s.got = append(s.got, r)
	s.mu.Unlock()
	return nil
}

// sorted returns the results sorted by key and window.
func (s *resultSink) sorted() []windowResult {
	s.mu.Lock()
	defer s.mu.Unlock()
	return sortResults(slices.Clone(s.got))
}

func sortResults(rs []windowResult) []windowResult {
	slices.SortFunc(rs, func(a, b windowResult) int {
		return cmp.Or(cmp.Compare(a.Key, b.Key), cmp.Compare(a.Window.Start, b.Window.Start), cmp.Compare(a.Window.End, b.Window.End))
	})
	return rs
}

// windowE2EJob builds readings -> timestamps and bounded out-of-orderness
// watermarks -> key by sensor -> windows by a -> count+sum -> sink, at
// parallelism 2.
func windowE2EJob(readings []operators.SensorReading, a operators.WindowAssigner, sink *resultSink, opts ...stream.Option) *stream.Environment {
	env := stream.NewEnvironment("window-e2e", append([]stream.Option{stream.WithParallelism(2)}, opts...)...)
	src := stream.FromSource(env, "readings", func() operators.Source[operators.SensorReading] {
		return &readingSource{all: readings}
	})
	timed := src.AssignTimestampsAndWatermarks("event-time", watermark.ForBoundedOutOfOrderness(e2eDisorder, eventTimeMs))
	w := stream.Window(stream.KeyBy(timed, bySensor), a)
	stream.WindowAggregate(w, "count-sum", countSumMerge{}).UID("count-sum").ForEach("sink", sink.add)
	return env
}

func runWindowJob(t *testing.T, readings []operators.SensorReading, a operators.WindowAssigner, opts ...stream.Option) []windowResult {
	t.Helper()
	sink := &resultSink{}
	if err := execute(t, windowE2EJob(readings, a, sink, opts...)); err != nil {
		t.Fatal(err)
	}
	return sink.sorted()
}

// naiveWindows computes the count+sum of every window of every sensor
// with a plain loop: windows(ts) lists the windows a timestamp falls in.
func naiveWindows(readings []operators.SensorReading, windows func(ts int64) []operators.Window) []windowResult {
	type kw struct {
		key string
		w   operators.Window
	}
	m := map[kw]countSum{}
	for _, r := range readings {
		for _, w := range windows(eventTimeMs(r)) {
			k := kw{r.ID, w}
			c := m[k]
			m[k] = countSum{ID: r.ID, Count: c.Count + 1, Sum: c.Sum + centi(r.Temperature)}
		}
	}
	var out []windowResult
	for k, c := range m {
		out = append(out, windowResult{Key: k.key, Window: k.w, Value: c})
	}
	return sortResults(out)
}

// naiveSessions computes the sessions of every sensor with a plain loop
// over its sorted timestamps: a reading within gap of the previous one
// (window [ts, ts+gap) touching the session) extends the session.
func naiveSessions(readings []operators.SensorReading, gap int64) []windowResult {
	byKey := map[string][]operators.SensorReading{}
	for _, r := range readings {
		byKey[r.ID] = append(byKey[r.ID], r)
	}
	var out []windowResult
	for key, rs := range byKey {
		slices.SortStableFunc(rs, func(a, b operators.SensorReading) int { return cmp.Compare(a.Timestamp, b.Timestamp) })
		var cur windowResult
		last := int64(0)
		for i, r := range rs {
			ts := eventTimeMs(r)
			if i > 0 && ts > last+gap {
				out = append(out, cur)
			}
			if i == 0 || ts > last+gap {
				cur = windowResult{Key: key, Window: operators.Window{Start: ts}, Value: countSum{ID: key}}
			}
			cur.Value.Count++
			cur.Value.Sum += centi(r.Temperature)
			last = ts
			cur.Window.End = ts + gap
		}
		out = append(out, cur)
	}
	return sortResults(out)
}

func compareResults(t *testing.T, what string, got, want []windowResult) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: %d results, want %d", what, len(got), len(want))
	}
	for i := range min(len(got), len(want)) {
		if got[i] != want[i] {
			t.Fatalf("%s: result %d is %+v, want %+v", what, i, got[i], want[i])
		}
	}
	if len(got) != len(want) {
		t.FailNow()
	}
}

// A 10 s tumbling-window count+sum per sensor over out-of-order readings,
// at parallelism 2, equals the plain computation: every window fires once,
// with every reading; also when a sensor has no reading for whole windows.
func TestTumblingWindowJobIsExact(t *testing.T) {
	const size = int64(10_000)
	sparse := func(r operators.SensorReading) bool {
		var k int64
		fmt.Sscanf(r.ID, "sensor_%d", &k)
		return (r.Timestamp/10+k)%3 != 0 // each sensor skips every third window
	}
	for _, c := range []struct {
		name string
		keep func(operators.SensorReading) bool
	}{{"dense", nil}, {"sparse", sparse}} {
		t.Run(c.name, func(t *testing.T) {
			readings := outOfOrderReadings(20_000, 50, 1, c.keep)
			want := naiveWindows(readings, func(ts int64) []operators.Window {
				s := ts - ts%size
				return []operators.Window{{Start: s, End: s + size}}
			})
			got := runWindowJob(t, readings, operators.TumblingEventTimeWindows(10*time.Second))
			compareResults(t, "tumbling", got, want)
			var total int64
			for _, r := range got {
				total += r.Value.Count
			}
			if total != int64(len(readings)) {
				t.Fatalf("the windows hold %d readings, want %d", total, len(readings))
			}
		})
	}
}

// The same out-of-order input run twice, with other batch sizes, gives the
// same windows and results.
func TestWindowJobReplayGivesSameResults(t *testing.T) {
	readings := outOfOrderReadings(20_000, 40, 2, nil)
	a := operators.TumblingEventTimeWindows(10 * time.Second)
	first := runWindowJob(t, readings, a)
	second := runWindowJob(t, readings, a, stream.WithBatchSize(7))
	compareResults(t, "replay", second, first)
	if len(first) == 0 {
		t.Fatal("no results")
	}
}

// A sliding-window job (30 s every 10 s) equals the naive computation of
// every window.
func TestSlidingWindowJobIsExact(t *testing.T) {
	const size, slide = int64(30_000), int64(10_000)
	readings := outOfOrderReadings(15_000, 30, 3, nil)
	want := naiveWindows(readings, func(ts int64) []operators.Window {
		var ws []operators.Window
		for s := ts - ts%slide; s > ts-size; s -= slide {
			ws = append(ws, operators.Window{Start: s, End: s + size})
		}
		return ws
	})
	got := runWindowJob(t, readings, operators.SlidingEventTimeWindows(30*time.Second, 10*time.Second))
	compareResults(t, "sliding", got, want)
}

// A session-window job (gap 3 s) over readings with holes merges the
// readings of each sensor into exactly the sessions of the naive
// computation, although they arrive out of order.
func TestSessionWindowJobMerges(t *testing.T) {
	const gap = int64(3_000)
	// Each sensor reads every second, but not during 5 s out of every 20,
	// shifted per sensor: sessions of 15 readings, 6 s apart.
	keyOf := map[string]int64{}
	for k := range 20 {
		keyOf[fmt.Sprintf("sensor_%d", k)] = int64(k)
	}
	holes := func(r operators.SensorReading) bool { return (r.Timestamp+7*keyOf[r.ID])%20 >= 5 }
	readings := outOfOrderReadings(8_000, 20, 4, holes)
	want := naiveSessions(readings, gap)
	got := runWindowJob(t, readings, operators.EventTimeSessionWindows(3*time.Second))
	compareResults(t, "sessions", got, want)
	full := 0
	for _, r := range want {
		if r.Value.Count == 15 {
			full++
		}
	}
	if full < len(want)/2 {
		t.Fatalf("only %d of %d sessions have 15 readings: the holes do not make the sessions meant", full, len(want))
	}
}

// A timestamp function that returns math.MinInt64 (a reading whose time
// field holds "-9223372036854775808") does not fail the job: the record
// has no window, like any timestamp beyond ±2^61 ms, and goes to the late
// data side output while the other readings' windows are exact. Before,
// the assigner passed NoTimestamp on and the window failed the job with
// "got a record without a timestamp: assign timestamps and watermarks
// first", at every restart again.
func TestMinInt64TimestampGoesToLateData(t *testing.T) {
	readings := outOfOrderReadings(200, 4, 1, nil)
	hostile := operators.SensorReading{ID: "sensor_x", Timestamp: math.MinInt64, Temperature: 1}
	input := slices.Insert(slices.Clone(readings), 50, hostile)
	tag := operators.NewOutputTag[operators.SensorReading]("late")
	env := stream.NewEnvironment("min-ts", stream.WithParallelism(2))
	src := stream.FromSource(env, "readings", func() operators.Source[operators.SensorReading] {
		return &readingSource{all: input}
	}).SetParallelism(1).UID("readings").
		AssignTimestampsAndWatermarks("timestamps", watermark.ForBoundedOutOfOrderness(e2eDisorder, func(r operators.SensorReading) int64 {
			if r.Timestamp == math.MinInt64 {
				return math.MinInt64
			}
			return eventTimeMs(r)
		}))
	keyed := stream.KeyBy(src, bySensor)
	windows := stream.WindowAggregate(stream.Window(keyed, operators.TumblingEventTimeWindows(10*time.Second)).SideOutputLateData(tag), "windows", countSumMerge{}).UID("windows")
	sink := &resultSink{}
	windows.ForEach("results", sink.add)
	var mu sync.Mutex
	var late []operators.SensorReading
	stream.SideOutput(windows, tag).ForEach("late", func(r operators.SensorReading) error {
		mu.Lock()
		defer mu.Unlock()
		late = append(late, r)
		return nil
	})
	if err := execute(t, env); err != nil {
		t.Fatalf("job failed: %v", err)
	}
	want := naiveWindows(readings, func(ts int64) []operators.Window {
		start := ts - ts%10_000
		return []operators.Window{{Start: start, End: start + 10_000}}
	})
	compareResults(t, "tumbling windows", sink.sorted(), want)
	if len(late) != 1 || late[0] != hostile {
		t.Fatalf("late data %v, want only %v", late, hostile)
	}
}

// endTimers registers, for every record, an event-time timer after the last
// record's time and a processing-time timer an hour ahead of the clock.
type endTimers struct {
	operators.KeyedProcessBase[string, string]
}

func (endTimers) ProcessElement(r operators.SensorReading, ctx *operators.KeyedContext[string, string]) error {
	ctx.Timers().RegisterEventTimeTimer(math.MaxInt64 - 1)
	ctx.Timers().RegisterProcessingTimeTimer(ctx.CurrentProcessingTime() + time.Hour.Milliseconds())
	return nil
}

func (endTimers) OnTimer(ts int64, ctx *operators.KeyedContext[string, string]) error {
	ctx.Emit(fmt.Sprintf("%s %v", ctx.CurrentKey(), ctx.TimeDomain() == operators.EventTime))
	return nil
}

// At the end of a bounded input a keyed process function's event-time
// timers fire (the final watermark passes every one), once each, and its
// processing-time timers do not (as in Flink; processing-time windows, in
// contrast, fire at the end).
func TestKeyedProcessTimersAtEndOfInput(t *testing.T) {
	clock := clockwork.NewFakeClockAt(time.UnixMilli(1_700_000_000_000))
	env := stream.NewEnvironment("end-timers", stream.WithParallelism(2), stream.WithClock(clock))
	readings := stream.FromSource(env, "gen", func() operators.Source[operators.SensorReading] {
		return operators.SensorGenerator(operators.GeneratorConfig{Count: 300, Keys: 7})
	}).UID("gen").AssignTimestampsAndWatermarks("ts", watermark.ForMonotonous(func(r operators.SensorReading) int64 { return r.Timestamp * 1000 }))
	sink := operators.NewCollectSink[string]()
	stream.KeyedProcess(stream.KeyBy(readings, func(r operators.SensorReading) string { return r.ID }), "timers",
		func() operators.KeyedProcessFunction[string, operators.SensorReading, string] { return endTimers{} }).UID("timers").
		To("out", sink.Subtask)
	if err := env.Execute(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := sink.Values()
	slices.Sort(got)
	want := make([]string, 7)
	for i := range want {
		want[i] = fmt.Sprintf("sensor_%d true", i)
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("fired %q, want each key's event-time timer once and no processing-time timer: %q", got, want)
	}
}
