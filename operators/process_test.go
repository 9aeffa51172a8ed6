package operators_test

import (
	"bytes"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/operators/operatorstest"
	"github.com/edgedio/edged/state"
	"github.com/edgedio/edged/watermark"
)

// timerCmd is the record of the timer tests: for Key, register (or, with
// Delete, delete) a timer at At in Domain; Proc makes At relative to the
// current processing time.
type timerCmd struct {
	Key    string
	At     int64
	Delete bool
	Proc   bool
}

// fired is what timerFunc emits when a timer fires: what the context said.
type fired struct {
	Key       string
	At        int64 // OnTimer's ts
	Timestamp int64 // ctx.Timestamp()
	Domain    operators.TimeDomain
	Watermark int64
	Count     int64 // records of the key so far (keyed Value state)
}

// timerFunc counts the records of each key in Value state and registers
// and deletes timers as its records say. OnTimer reports each timer and
// runs then, if set for that timer, to register more.
type timerFunc struct {
	count state.Value[int64]
	then  func(f fired, ctx *operators.KeyedContext[string, fired])
}

func (f *timerFunc) Open(rt *operators.KeyedRuntime[string]) error {
	c, err := state.NewValue[string, int64](rt.Backend(), rt.Keys(), state.ValueDescriptor[int64]{Name: "count"})
	f.count = c
	return err
}

func (f *timerFunc) ProcessElement(c timerCmd, ctx *operators.KeyedContext[string, fired]) error {
	if ctx.CurrentKey() != c.Key {
		return fmt.Errorf("current key %q for a record of %q", ctx.CurrentKey(), c.Key)
	}
	n, _ := f.count.Get()
	f.count.Update(n + 1)
	ts := ctx.Timers()
	switch {
	case c.Proc && c.Delete:
		ts.DeleteProcessingTimeTimer(ctx.CurrentProcessingTime() + c.At)
	case c.Proc:
		ts.RegisterProcessingTimeTimer(ctx.CurrentProcessingTime() + c.At)
	case c.Delete:
		ts.DeleteEventTimeTimer(c.At)
	default:
		ts.RegisterEventTimeTimer(c.At)
	}
	return nil
}

func (f *timerFunc) OnTimer(at int64, ctx *operators.KeyedContext[string, fired]) error {
	n, _ := f.count.Get()
	r := fired{Key: ctx.CurrentKey(), At: at, Timestamp: ctx.Timestamp(), Domain: ctx.TimeDomain(), Watermark: ctx.CurrentWatermark(), Count: n}
	ctx.Emit(r)
	if f.then != nil {
		f.then(r, ctx)
	}
	return nil
}

func newTimerHarness(t *testing.T, fn *timerFunc, opts ...operatorstest.Option) *operatorstest.Harness[timerCmd, fired] {
	t.Helper()
	h := operatorstest.New(func(out operators.Collector[fired]) operators.OneInput[timerCmd] {
		return operators.NewKeyedProcess(func(c timerCmd) string { return c.Key }, operators.KeyedProcessFunction[string, timerCmd, fired](fn), out)
	}, append([]operatorstest.Option{operatorstest.Keyed(128)}, opts...)...)
	if err := h.Open(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := h.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return h
}

func expectFired(t *testing.T, what string, got []operatorstest.Record[fired], want ...fired) {
	t.Helper()
	var vs []fired
	for _, r := range got {
		if r.Timestamp != r.Value.Timestamp {
			t.Errorf("%s: %+v emitted with timestamp %d, not ctx.Timestamp()", what, r.Value, r.Timestamp)
		}
		vs = append(vs, r.Value)
	}
	if !slices.Equal(vs, want) {
		t.Fatalf("%s: fired\n\t%+v\nwant\n\t%+v", what, vs, want)
	}
}

// Event-time timers fire when the watermark passes them, in timestamp
// order across keys, each with its key current and its timestamp as the
// context's; registering a timer twice fires it once; a deleted timer does
// not fire.
func TestKeyedProcessEventTimeTimers(t *testing.T) {
	h := newTimerHarness(t, &timerFunc{})
	for _, c := range []timerCmd{
		{Key: "a", At: 30}, {Key: "b", At: 10}, {Key: "a", At: 20}, {Key: "a", At: 30},
		{Key: "b", At: 25}, {Key: "c", At: 20}, {Key: "b", At: 25, Delete: true},
		{Key: "c", At: 99, Delete: true}, // never registered: nothing happens
	} {
		h.Process(c, 1)
	}
	if err := h.Watermark(9); err != nil {
		t.Fatal(err)
	}
	expectFired(t, "watermark 9", h.Drain())
	if err := h.Watermark(20); err != nil {
		t.Fatal(err)
	}
	et := operators.EventTime
	expectFired(t, "watermark 20", h.Drain(),
		fired{"b", 10, 10, et, 20, 3},
		fired{"a", 20, 20, et, 20, 3}, // registered before c's timer at 20
		fired{"c", 20, 20, et, 20, 2})
	if err := h.Watermark(math.MaxInt64); err != nil {
		t.Fatal(err)
	}
	expectFired(t, "final watermark", h.Drain(), fired{"a", 30, 30, et, math.MaxInt64, 3})
	if !slices.Equal(h.Watermarks, []int64{9, 20, math.MaxInt64}) {
		t.Fatalf("forwarded watermarks %v", h.Watermarks)
	}
	if n := h.StateLen("count"); n != 3 {
		t.Fatalf("count state has %d keys, want 3", n)
	}
}

// A timer registered in OnTimer at or before the watermark fires in the
// same watermark; later ones wait.
func TestKeyedProcessTimersRegisteredInOnTimer(t *testing.T) {
	fn := &timerFunc{}
	fn.then = func(f fired, ctx *operators.KeyedContext[string, fired]) {
		if f.Domain == operators.EventTime && f.At < 40 {
			ctx.Timers().RegisterEventTimeTimer(f.At + 10)
		}
	}
	h := newTimerHarness(t, fn)
	h.Process(timerCmd{Key: "a", At: 10}, 1)
	if err := h.Watermark(25); err != nil {
		t.Fatal(err)
	}
	et := operators.EventTime
	expectFired(t, "watermark 25", h.Drain(), fired{"a", 10, 10, et, 25, 1}, fired{"a", 20, 20, et, 25, 1})
	if err := h.Watermark(100); err != nil {
		t.Fatal(err)
	}
	expectFired(t, "watermark 100", h.Drain(), fired{"a", 30, 30, et, 100, 1}, fired{"a", 40, 40, et, 100, 1})
}

// Processing-time timers fire as the fake clock passes them, with no
// record timestamp; those registered in OnTimer that are already due fire
// in the same advance; duplicates fire once and deleted ones never.
func TestKeyedProcessProcessingTimeTimers(t *testing.T) {
	// Timers of key a register more timers when they fire.
	follow := map[int64][]int64{}
	fn := &timerFunc{}
	fn.then = func(f fired, ctx *operators.KeyedContext[string, fired]) {
		if f.Domain == operators.ProcessingTime {
			for _, at := range follow[f.At] {
				ctx.Timers().RegisterProcessingTimeTimer(at)
			}
		}
	}
	h := newTimerHarness(t, fn)
	t0 := h.Now()
	follow[t0+200] = []int64{t0 - 800, t0 + 300} // long due, and due within the advance
	follow[t0+300] = []int64{t0 + 400}           // due after it
	pt, wm := operators.ProcessingTime, int64(math.MinInt64)
	h.Process(timerCmd{Key: "a", At: 200, Proc: true}, 5)
	h.Process(timerCmd{Key: "b", At: 100, Proc: true}, 5)
	h.Process(timerCmd{Key: "b", At: 100, Proc: true}, 5) // the same timer
	h.Process(timerCmd{Key: "c", At: 150, Proc: true}, 5)
	h.Process(timerCmd{Key: "c", At: 150, Proc: true, Delete: true}, 5)
	if err := h.AdvanceProcessingTime(99 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	expectFired(t, "+99ms", h.Drain())
	if err := h.AdvanceProcessingTime(201 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	nt := operators.NoTimestamp
	expectFired(t, "+300ms", h.Drain(),
		fired{"b", t0 + 100, nt, pt, wm, 2},
		fired{"a", t0 + 200, nt, pt, wm, 1},
		fired{"a", t0 - 800, nt, pt, wm, 1}, // registered by the timer at +200, due
		fired{"a", t0 + 300, nt, pt, wm, 1}, // registered at +200, due by the end
	)
	if got := h.ProcessingTimers(); len(got) == 0 || got[0] > t0+400 {
		t.Fatalf("pending processing-time callbacks %v: want one for the timer at +400", got)
	}
	if err := h.AdvanceProcessingTime(100 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	expectFired(t, "+400ms", h.Drain(), fired{"a", t0 + 400, nt, pt, wm, 1})
	// Close cancels the callback of a pending timer.
	h.Process(timerCmd{Key: "b", At: 1000, Proc: true}, 5)
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	if got := h.ProcessingTimers(); len(got) != 0 {
		t.Fatalf("after Close, processing-time callbacks %v are pending", got)
	}
}

// Processing-time timers restored from a snapshot fire by the clock, as
// before the snapshot, with no new timer registered after the restore:
// one due later when the clock reaches it, one already overdue at once.
func TestKeyedProcessProcessingTimeTimersRestored(t *testing.T) {
	h := newTimerHarness(t, &timerFunc{})
	t0 := h.Now()
	h.Process(timerCmd{Key: "a", At: 200, Proc: true}, 5)
	h.Process(timerCmd{Key: "b", At: 5000, Proc: true}, 5)
	snap, err := state.Snapshot(h.Ctx.State)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := snap.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}

	// Restored 1 s later: a's timer is overdue, b's is due in 4 s.
	r := operatorstest.New(func(out operators.Collector[fired]) operators.OneInput[timerCmd] {
		return operators.NewKeyedProcess(func(c timerCmd) string { return c.Key }, operators.KeyedProcessFunction[string, timerCmd, fired](&timerFunc{}), out)
	}, operatorstest.Keyed(128), operatorstest.StartAt(operatorstest.DefaultStart.Add(time.Second)))
	if err := state.Restore(r.Ctx.State, bytes.NewReader(buf.Bytes()), snap.Offsets(), r.Ctx.KeyGroups); err != nil {
		t.Fatal(err)
	}
	if err := r.Open(); err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if got := r.ProcessingTimers(); !slices.Equal(got, []int64{t0 + 200}) {
		t.Fatalf("after the restore, processing-time callbacks %v: want one for the restored timer at +200", got)
	}
	pt, wm, nt := operators.ProcessingTime, int64(math.MinInt64), operators.NoTimestamp
	if err := r.AdvanceProcessingTime(0); err != nil {
		t.Fatal(err)
	}
	expectFired(t, "restored, overdue", r.Drain(), fired{"a", t0 + 200, nt, pt, wm, 1})
	if err := r.AdvanceProcessingTime(4 * time.Second); err != nil {
		t.Fatal(err)
	}
	expectFired(t, "restored, due 4 s later", r.Drain(), fired{"b", t0 + 5000, nt, pt, wm, 1})
}

// Side outputs from a keyed process function: tag.Emit sends to the side
// output in ProcessElement and OnTimer, with the current timestamp; with
// nothing connected the records are dropped.
func TestKeyedProcessSideOutput(t *testing.T) {
	tag := operators.NewOutputTag[string]("odd")
	build := func(out operators.Collector[int64]) operators.OneInput[int64] {
		fn := &sideFunc{tag: tag}
		return operators.NewKeyedProcess(func(v int64) int64 { return v % 2 }, operators.KeyedProcessFunction[int64, int64, int64](fn), out)
	}
	h := operatorstest.New(build, operatorstest.Keyed(8), operatorstest.SideOutput[string](tag.ID()))
	if err := h.Open(); err != nil {
		t.Fatal(err)
	}
	for _, v := range []int64{1, 2, 3, 4} {
		h.Process(v, 10*v)
	}
	if err := h.Watermark(100); err != nil {
		t.Fatal(err)
	}
	wantMain := []operatorstest.Record[int64]{{Value: 2, Timestamp: 20}, {Value: 4, Timestamp: 40}}
	if !slices.Equal(h.Out, wantMain) {
		t.Fatalf("main output %v, want %v", h.Out, wantMain)
	}
	wantSide := []operatorstest.Record[any]{
		{Value: "odd 1", Timestamp: 10}, {Value: "odd 3", Timestamp: 30}, {Value: "timer of key 1", Timestamp: 50},
	}
	if got := h.Side[tag.ID()]; !slices.Equal(got, wantSide) {
		t.Fatalf("side output %v, want %v", got, wantSide)
	}

	u := operatorstest.New(build, operatorstest.Keyed(8))
	if err := u.Open(); err != nil {
		t.Fatal(err)
	}
	u.Process(1, 10)
	u.Process(2, 20)
	if err := u.Watermark(100); err != nil {
		t.Fatal(err)
	}
	if len(u.Out) != 1 || len(u.Side) != 0 {
		t.Fatalf("unconnected side output: main %v, side %v", u.Out, u.Side)
	}
}

// sideFunc sends odd values to a side output and even ones to the main
// output; the first odd value sets a timer at 50 that reports to the side
// output too.
type sideFunc struct {
	operators.KeyedProcessBase[int64, int64]
	tag operators.OutputTag[string]
}

func (f *sideFunc) ProcessElement(v int64, ctx *operators.KeyedContext[int64, int64]) error {
	if v%2 == 0 {
		ctx.Emit(v)
		return nil
	}
	f.tag.Emit(ctx, fmt.Sprintf("odd %d", v))
	ctx.Timers().RegisterEventTimeTimer(50)
	return nil
}

func (f *sideFunc) OnTimer(ts int64, ctx *operators.KeyedContext[int64, int64]) error {
	f.tag.Emit(ctx, fmt.Sprintf("timer of key %d", ctx.CurrentKey()))
	return nil
}

// --- the classic example: rising temperature ---

// temp is a sensor reading: event time in milliseconds, temperature in
// tenths of a degree.
type temp struct {
	Sensor string
	TS     int64
	Tenths int64
}

// alert says that Sensor's temperature rose for 10 s of event time up to
// At.
type alert struct {
	Sensor string
	At     int64
}

// risingFunc alerts when a sensor's temperature rises without a drop for
// 10 s of event time: the first rise sets a timer 10 s later, a drop
// deletes it, the timer firing is the alert.
type risingFunc struct {
	last  state.Value[int64]
	timer state.Value[int64]
}

const riseFor = int64(10 * time.Second / time.Millisecond)

func (f *risingFunc) Open(rt *operators.KeyedRuntime[string]) error {
	var err error
	if f.last, err = state.NewValue[string, int64](rt.Backend(), rt.Keys(), state.ValueDescriptor[int64]{Name: "last"}); err != nil {
		return err
	}
	f.timer, err = state.NewValue[string, int64](rt.Backend(), rt.Keys(), state.ValueDescriptor[int64]{Name: "timer"})
	return err
}

func (f *risingFunc) ProcessElement(r temp, ctx *operators.KeyedContext[string, alert]) error {
	prev, seen := f.last.Get()
	f.last.Update(r.Tenths)
	timer, armed := f.timer.Get()
	switch {
	case !seen || r.Tenths < prev:
		if armed {
			ctx.Timers().DeleteEventTimeTimer(timer)
			f.timer.Clear()
		}
	case r.Tenths > prev && !armed:
		at := ctx.Timestamp() + riseFor
		ctx.Timers().RegisterEventTimeTimer(at)
		f.timer.Update(at)
	}
	return nil
}

func (f *risingFunc) OnTimer(ts int64, ctx *operators.KeyedContext[string, alert]) error {
	ctx.Emit(alert{Sensor: ctx.CurrentKey(), At: ts})
	f.timer.Clear()
	return nil
}

// The classic example: alert when a sensor's temperature rises for 10 s of
// event time without a drop. Alerts fire exactly when the watermark passes
// 10 s after the first rise, and never after a drop.
func TestRisingTemperatureAlerts(t *testing.T) {
	sec := func(s float64) int64 { return int64(s * 1000) }
	// One reading per second from 0 s, in tenths of a degree; s2's come
	// half a second later. After an alert the timer is gone, and the next
	// rise sets a new one.
	series := map[string][]int64{
		// rises from 1 s: alert at 11 s; rises on at 12 s: alert at 22 s
		"s1": {200, 201, 202, 203, 203, 204, 205, 206, 207, 208, 209, 210, 211, 212},
		// rise at 1.5 s, drop at 5.5 s, rise at 6.5 s, drop at 15.5 s,
		// rise at 16.5 s: alert at 26.5 s
		"s2": {300, 301, 302, 303, 304, 299, 300, 301, 302, 303, 304, 305, 306, 307, 308, 250, 251},
		// rises from 3 s (equal values do not break a rise): alert at
		// 13 s, which fires before the reading at 13 s; that reading rises
		// again: alert at 23 s
		"s3": {100, 100, 100, 101, 101, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110},
		// never rises
		"s4": {500, 499, 498, 497, 496, 495, 494, 493, 492, 491, 490, 489, 488, 487},
	}
	want := []alert{{"s1", sec(11)}, {"s3", sec(13)}, {"s1", sec(22)}, {"s3", sec(23)}, {"s2", sec(26.5)}}

	// Interleave the sensors by time, s2 half a second behind.
	var readings []temp
	for i := range 17 {
		for _, s := range []string{"s1", "s2", "s3", "s4"} {
			if i < len(series[s]) {
				ts := sec(float64(i))
				if s == "s2" {
					ts += sec(0.5)
				}
				readings = append(readings, temp{s, ts, series[s][i]})
			}
		}
	}
	h := operatorstest.New(func(out operators.Collector[alert]) operators.OneInput[temp] {
		return operators.NewKeyedProcess(func(r temp) string { return r.Sensor }, operators.KeyedProcessFunction[string, temp, alert](&risingFunc{}), out)
	}, operatorstest.Keyed(128))
	if err := h.Open(); err != nil {
		t.Fatal(err)
	}
	var got []alert
	wm := int64(math.MinInt64)
	for _, r := range readings {
		h.Process(r, r.TS)
		// The watermark of a monotonous assigner: max timestamp - 1.
		if r.TS-1 > wm {
			wm = r.TS - 1
			if err := h.Watermark(wm); err != nil {
				t.Fatal(err)
			}
		}
		for _, a := range h.Drain() {
			if a.Timestamp != a.Value.At || a.Value.At > wm || a.Value.At <= wm-1000 {
				t.Fatalf("alert %+v emitted at %d, with watermark %d", a.Value, a.Timestamp, wm)
			}
			got = append(got, a.Value)
		}
	}
	if err := h.EndInput(); err != nil {
		t.Fatal(err)
	}
	if got = append(got, h.Values()...); !slices.Equal(got, want) {
		t.Fatalf("alerts %+v, want %+v", got, want)
	}
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	if wm := h.Watermarks[len(h.Watermarks)-1]; wm != watermark.MaxWatermark {
		t.Fatalf("last watermark %d", wm)
	}
}
