package operators_test

import (
	"cmp"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/operators/operatorstest"
	"github.com/edgedio/edged/watermark"
)

// windowSeed replaces the fixed seeds of the randomised window tests.
var windowSeed = flag.Uint64("window.seed", 0, "seed of the randomised window-vs-model tests (0: the fixed seeds 1..20)")

// ev is the record of the window tests: a key, its event timestamp in
// milliseconds (also passed to the harness as the record's timestamp) and
// a value.
type ev struct {
	Key string
	TS  int64
	V   int64
}

func evKey(e ev) string { return e.Key }

func (e ev) String() string { return fmt.Sprintf("%s@%d=%d", e.Key, e.TS, e.V) }

// cs is a count and a sum.
type cs struct{ Count, Sum int64 }

// csAgg counts and sums the values of a window; it has Merge, so sliding
// and session windows can use it.
type csAgg struct{}

func (csAgg) CreateAccumulator() cs { return cs{} }
func (csAgg) Add(e ev, a cs) cs     { return a.add(e) }
func (csAgg) Result(a cs) cs        { return a }
func (csAgg) Merge(a, b cs) cs      { return cs{a.Count + b.Count, a.Sum + b.Sum} }

// add is the independent computation of the tests: c with e counted.
func (c cs) add(e ev) cs { return cs{c.Count + 1, c.Sum + e.V} }

// sumOf returns the count and sum of es.
func sumOf(es ...ev) cs { return foldEvs(cs{}, es) }

func foldEvs(c cs, es []ev) cs {
	for _, e := range es {
		c = c.add(e)
	}
	return c
}

type result = operators.WindowResult[string, cs]

type windowHarness = operatorstest.Harness[ev, result]

// lateTag is the late-data side output of the window tests.
const lateTag = "late"

// windowName is the window operator's name, the prefix of its state.
const windowName = "w"

// stateNames are the keyed states the window operators keep (name is the
// operator's name): "/contents" holds the records or accumulators, the
// others index them (slices, sessions) or track timers.
var stateNames = []string{
	windowName + "/contents", windowName + "/contents/slices", windowName + "/contents/incremental", windowName + "/slices",
	windowName + "/sessions", windowName + "/next",
}

// windowBuild says how a test builds its window operator.
type windowBuild int

const (
	// viaAggregate uses NewWindowAggregate with csAgg.
	viaAggregate windowBuild = iota
	// viaProcess uses NewWindowProcess with a function that counts and
	// sums all the elements it gets.
	viaProcess
)

func (b windowBuild) String() string {
	if b == viaProcess {
		return "process"
	}
	return "aggregate"
}

// newWindow returns an opened harness around a window operator on ev keyed
// by Key, with the late-data side output connected.
func newWindow(t *testing.T, a operators.WindowAssigner, lateness time.Duration, how windowBuild, opts ...operatorstest.Option) *windowHarness {
	t.Helper()
	var buildErr error
	h := operatorstest.New(func(out operators.Collector[result]) operators.OneInput[ev] {
		var op operators.OneInput[ev]
		switch how {
		case viaAggregate:
			op, buildErr = operators.NewWindowAggregate(windowName, evKey, a, lateness, lateTag, operators.AggregateFunction[ev, cs, cs](csAgg{}), out)
		case viaProcess:
			fn := operators.ProcessWindowFunc[string, ev, result](func(key string, w operators.Window, elems []ev, out operators.Collector[result]) error {
				for _, e := range elems {
					if e.Key != key || !(w.Start <= e.TS && e.TS < w.End) {
						return fmt.Errorf("window %s of %s got %v", w, key, e)
					}
				}
				out.Collect(result{Key: key, Window: w, Value: foldEvs(cs{}, elems)})
				return nil
			})
			op, buildErr = operators.NewWindowProcess(windowName, evKey, a, lateness, lateTag, operators.ProcessWindowFunction[string, ev, result](fn), out)
		}
		return op
	}, append([]operatorstest.Option{operatorstest.Keyed(128), operatorstest.SideOutput[ev](lateTag)}, opts...)...)
	if buildErr != nil {
		t.Fatal(buildErr)
	}
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

func feed(h *windowHarness, es ...ev) {
	for _, e := range es {
		h.Process(e, e.TS)
	}
}

func advance(t *testing.T, h *windowHarness, wm int64) {
	t.Helper()
	if err := h.Watermark(wm); err != nil {
		t.Fatalf("watermark %d: %v", wm, err)
	}
}

// res is the record of the result of key's window [start,end): it carries
// the window's last instant as its timestamp.
func res(key string, start, end int64, c cs) operatorstest.Record[result] {
	return operatorstest.Record[result]{
		Value:     result{Key: key, Window: operators.Window{Start: start, End: end}, Value: c},
		Timestamp: end - 1,
	}
}

func fmtRecs(rs []operatorstest.Record[result]) string {
	var b strings.Builder
	for _, r := range rs {
		fmt.Fprintf(&b, "\n\t%s %s %+v @%d", r.Value.Key, r.Value.Window, r.Value.Value, r.Timestamp)
	}
	if b.Len() == 0 {
		return " (none)"
	}
	return b.String()
}

// expectOut checks that h emitted exactly want, in order, since the last
// check, and forgets it.
func expectOut(t *testing.T, h *windowHarness, what string, want ...operatorstest.Record[result]) {
	t.Helper()
	got := h.Drain()
	if !slices.Equal(got, want) {
		t.Fatalf("%s: emitted%s\nwant%s", what, fmtRecs(got), fmtRecs(want))
	}
}

func sortRecs(rs []operatorstest.Record[result]) []operatorstest.Record[result] {
	rs = slices.Clone(rs)
	slices.SortFunc(rs, func(a, b operatorstest.Record[result]) int {
		return cmp.Or(cmp.Compare(a.Timestamp, b.Timestamp), cmp.Compare(a.Value.Key, b.Value.Key),
			cmp.Compare(a.Value.Window.Start, b.Value.Window.Start))
	})
	return rs
}

// expectSorted is expectOut ignoring the order.
func expectSorted(t *testing.T, h *windowHarness, what string, want ...operatorstest.Record[result]) {
	t.Helper()
	got := sortRecs(h.Drain())
	want = sortRecs(want)
	if !slices.Equal(got, want) {
		t.Fatalf("%s: emitted%s\nwant%s", what, fmtRecs(got), fmtRecs(want))
	}
}

// windowState returns the number of entries of every window state.
func windowState(h *windowHarness) (total int, detail string) {
	for _, name := range stateNames {
		if n := h.StateLen(name); n > 0 {
			total += n
			detail += fmt.Sprintf(" %s=%d", name, n)
		}
	}
	return total, detail
}

// expectStateEmpty checks that the window operator keeps no state.
func expectStateEmpty(t *testing.T, h *windowHarness, what string) {
	t.Helper()
	if n, detail := windowState(h); n != 0 {
		t.Fatalf("%s: the window keeps state:%s", what, detail)
	}
}

// expectStateHeld checks that the window operator still holds contents.
func expectStateHeld(t *testing.T, h *windowHarness, what string) {
	t.Helper()
	if h.StateLen(windowName+"/contents") == 0 {
		t.Fatalf("%s: the window holds no contents", what)
	}
}

// expectSessions checks that a session window keeps the contents of n
// sessions (one namespace per session): merged sessions leave no state
// behind.
func expectSessions(t *testing.T, h *windowHarness, what string, n int) {
	t.Helper()
	if got := h.StateLen(windowName + "/contents"); got != n {
		t.Fatalf("%s: contents of %d sessions, want %d", what, got, n)
	}
}

func lateRecords(t *testing.T, h *windowHarness) int64 {
	t.Helper()
	lr, ok := h.Op.(interface{ LateRecords() int64 })
	if !ok {
		t.Fatalf("%T has no LateRecords", h.Op)
	}
	return lr.LateRecords()
}

func expectLate(t *testing.T, h *windowHarness, want ...ev) {
	t.Helper()
	var got []ev
	for _, r := range h.Side[lateTag] {
		e := r.Value.(ev)
		if r.Timestamp != e.TS {
			t.Errorf("late record %v carries timestamp %d", e, r.Timestamp)
		}
		got = append(got, e)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("late side output %v, want %v", got, want)
	}
	if n := lateRecords(t, h); n != int64(len(want)) {
		t.Fatalf("LateRecords = %d, want %d", n, len(want))
	}
}

func ms(n int64) time.Duration { return time.Duration(n) * time.Millisecond }

// Tumbling event-time windows fire when the watermark reaches End-1, not
// before, with every record of the window whatever its arrival order, and
// their results carry End-1.
func TestTumblingEventTimeWindows(t *testing.T) {
	for _, how := range []windowBuild{viaAggregate, viaProcess} {
		t.Run(how.String(), func(t *testing.T) {
			h := newWindow(t, operators.TumblingEventTimeWindows(ms(10)), 0, how)
			a3, b5, a12, a1, b17, a9, b11 := ev{"a", 3, 1}, ev{"b", 5, 10}, ev{"a", 12, 2}, ev{"a", 1, 4}, ev{"b", 17, 20}, ev{"a", 9, 8}, ev{"b", 11, 40}
			feed(h, a3, b5, a12, a1, b17, a9, b11)
			expectStateHeld(t, h, "after 7 records")
			advance(t, h, 8)
			expectOut(t, h, "watermark 8")
			advance(t, h, 9)
			expectSorted(t, h, "watermark 9", res("a", 0, 10, sumOf(a3, a1, a9)), res("b", 0, 10, sumOf(b5)))
			expectStateHeld(t, h, "after [0,10) fired")

			a15 := ev{"a", 15, 100}
			feed(h, a15)
			advance(t, h, 18)
			expectOut(t, h, "watermark 18")
			advance(t, h, 19)
			expectSorted(t, h, "watermark 19", res("a", 10, 20, sumOf(a12, a15)), res("b", 10, 20, sumOf(b17, b11)))
			expectStateEmpty(t, h, "after all fired")

			// Without allowed lateness, a record for a window that fired
			// is late.
			a5 := ev{"a", 5, 1000}
			feed(h, a5)
			expectOut(t, h, "late record")
			expectLate(t, h, a5)
			expectStateEmpty(t, h, "after the late record")
			if !slices.Equal(h.Watermarks, []int64{8, 9, 18, 19}) {
				t.Fatalf("forwarded watermarks %v", h.Watermarks)
			}
		})
	}
}

// Sliding windows: a record counts in size/slide windows; a watermark jump
// fires every window it passes, in order of their end.
func TestSlidingEventTimeWindows(t *testing.T) {
	for _, how := range []windowBuild{viaAggregate, viaProcess} {
		t.Run(how.String(), func(t *testing.T) {
			h := newWindow(t, operators.SlidingEventTimeWindows(ms(30), ms(10)), 0, how)
			a25, a5, a33, a14 := ev{"a", 25, 2}, ev{"a", 5, 1}, ev{"a", 33, 8}, ev{"a", 14, 4}
			feed(h, a25, a5, a33, a14)
			advance(t, h, 8)
			expectOut(t, h, "watermark 8")
			advance(t, h, 9)
			expectOut(t, h, "watermark 9", res("a", -20, 10, sumOf(a5)))
			advance(t, h, 100)
			expectOut(t, h, "watermark 100",
				res("a", -10, 20, sumOf(a5, a14)),
				res("a", 0, 30, sumOf(a5, a14, a25)),
				res("a", 10, 40, sumOf(a14, a25, a33)),
				res("a", 20, 50, sumOf(a25, a33)),
				res("a", 30, 60, sumOf(a33)))
			expectStateEmpty(t, h, "after all fired")
		})
	}
}

// Every window of a key fires, also when windows without records of the
// key lie between them: a key's timers must not assume that the next
// window after one that fired has records.
func TestWindowsFireAcrossGaps(t *testing.T) {
	for _, how := range []windowBuild{viaAggregate, viaProcess} {
		t.Run("tumbling/"+how.String(), func(t *testing.T) {
			h := newWindow(t, operators.TumblingEventTimeWindows(ms(10)), 0, how)
			a45, a65 := ev{"a", 45, 1}, ev{"a", 65, 2}
			feed(h, a45, a65)
			advance(t, h, 49)
			expectOut(t, h, "watermark 49", res("a", 40, 50, sumOf(a45)))
			advance(t, h, 100)
			expectOut(t, h, "watermark 100", res("a", 60, 70, sumOf(a65)))
			expectStateEmpty(t, h, "after all fired")
		})
		t.Run("sliding/"+how.String(), func(t *testing.T) {
			h := newWindow(t, operators.SlidingEventTimeWindows(ms(20), ms(10)), 0, how)
			a5, a55 := ev{"a", 5, 1}, ev{"a", 55, 2}
			feed(h, a5, a55)
			advance(t, h, watermark.MaxWatermark)
			expectOut(t, h, "final watermark",
				res("a", -10, 10, sumOf(a5)), res("a", 0, 20, sumOf(a5)),
				res("a", 40, 60, sumOf(a55)), res("a", 50, 70, sumOf(a55)))
			expectStateEmpty(t, h, "after all fired")
		})
	}
}

// Sliding windows whose size is not a multiple of the slide, shifted by an
// offset.
func TestSlidingWindowsWithOffset(t *testing.T) {
	h := newWindow(t, operators.SlidingEventTimeWindows(ms(25), ms(10)).WithOffset(ms(3)), 0, viaAggregate)
	// Windows start at 3+10k and last 25ms: 7 is in [-17,8), [-7,18), [3,28).
	e7, e20 := ev{"k", 7, 1}, ev{"k", 20, 2}
	feed(h, e20, e7)
	advance(t, h, 7)
	expectOut(t, h, "watermark 7", res("k", -17, 8, sumOf(e7)))
	advance(t, h, math.MaxInt64)
	expectOut(t, h, "final watermark",
		res("k", -7, 18, sumOf(e7)),
		res("k", 3, 28, sumOf(e7, e20)),
		res("k", 13, 38, sumOf(e20)))
	expectStateEmpty(t, h, "after all fired")
}

// Session windows: records closer than the gap share a session; a record
// bridging two sessions merges them, and the merged session fires once,
// at its own end, with all their records.
func TestSessionWindowsMerge(t *testing.T) {
	for _, how := range []windowBuild{viaAggregate, viaProcess} {
		t.Run(how.String(), func(t *testing.T) {
			h := newWindow(t, operators.EventTimeSessionWindows(ms(10)), 0, how)
			a0, a5, a30, b3 := ev{"a", 0, 1}, ev{"a", 5, 2}, ev{"a", 30, 4}, ev{"b", 3, 100}
			feed(h, a0, a5, a30, b3) // a: [0,15) and [30,40); b: [3,13)
			expectSessions(t, h, "two sessions of a, one of b", 3)
			advance(t, h, 12)
			expectOut(t, h, "watermark 12", res("b", 3, 13, sumOf(b3)))

			a12 := ev{"a", 12, 8} // [0,15) grows to [0,22)
			feed(h, a12)
			advance(t, h, 14)
			expectOut(t, h, "watermark 14: [0,15) became [0,22)")

			a25 := ev{"a", 25, 16} // [30,40) grows to [25,40)
			a20 := ev{"a", 20, 32} // [20,30) bridges [0,22) and [25,40)
			feed(h, a25, a20)
			expectSessions(t, h, "after the bridge", 1)
			advance(t, h, 38)
			expectOut(t, h, "watermark 38")
			advance(t, h, 39)
			expectOut(t, h, "watermark 39", res("a", 0, 40, sumOf(a0, a5, a30, a12, a25, a20)))
			expectStateEmpty(t, h, "after all fired")

			// Touching sessions merge: [40,50) touches [50,60).
			a40, a50 := ev{"a", 40, 1}, ev{"a", 50, 2}
			feed(h, a40, a50)
			advance(t, h, watermark.MaxWatermark)
			expectOut(t, h, "final watermark", res("a", 40, 60, sumOf(a40, a50)))
			expectStateEmpty(t, h, "at the end")
		})
	}
}

// Allowed lateness on tumbling windows: a record for a window that fired
// but whose lateness has not passed updates it and fires it again at once;
// the state is dropped when the lateness has passed, after which records
// go to the late side output.
func TestTumblingAllowedLateness(t *testing.T) {
	for _, how := range []windowBuild{viaAggregate, viaProcess} {
		t.Run(how.String(), func(t *testing.T) {
			h := newWindow(t, operators.TumblingEventTimeWindows(ms(10)), ms(20), how)
			a3, a7, a1, a2 := ev{"a", 3, 1}, ev{"a", 7, 2}, ev{"a", 1, 4}, ev{"a", 2, 8}
			feed(h, a3)
			advance(t, h, 9)
			expectOut(t, h, "watermark 9", res("a", 0, 10, sumOf(a3)))
			feed(h, a7)
			expectOut(t, h, "late record within lateness", res("a", 0, 10, sumOf(a3, a7)))
			advance(t, h, 28)
			expectOut(t, h, "watermark 28")
			expectStateHeld(t, h, "before cleanup")
			feed(h, a1) // 9+20 > 28: still allowed
			expectOut(t, h, "last allowed record", res("a", 0, 10, sumOf(a3, a7, a1)))
			advance(t, h, 29)
			expectOut(t, h, "watermark 29 (cleanup)")
			expectStateEmpty(t, h, "after cleanup")
			feed(h, a2)
			expectOut(t, h, "record after cleanup")
			expectLate(t, h, a2)
			expectStateEmpty(t, h, "after the late record")
		})
	}
}

// Allowed lateness on sliding windows: a late record fires again only the
// windows whose lateness has not passed.
func TestSlidingAllowedLateness(t *testing.T) {
	for _, how := range []windowBuild{viaAggregate, viaProcess} {
		t.Run(how.String(), func(t *testing.T) {
			h := newWindow(t, operators.SlidingEventTimeWindows(ms(30), ms(10)), ms(15), how)
			// 5 is in [-20,10), [-10,20) and [0,30): cleaned at 24, 34, 44.
			a5, a6, a7, a8 := ev{"a", 5, 1}, ev{"a", 6, 2}, ev{"a", 7, 4}, ev{"a", 8, 8}
			feed(h, a5)
			advance(t, h, 30)
			expectOut(t, h, "watermark 30",
				res("a", -20, 10, sumOf(a5)), res("a", -10, 20, sumOf(a5)), res("a", 0, 30, sumOf(a5)))
			feed(h, a6)
			expectOut(t, h, "a6 at watermark 30",
				res("a", -10, 20, sumOf(a5, a6)), res("a", 0, 30, sumOf(a5, a6)))
			advance(t, h, 34)
			feed(h, a7)
			expectOut(t, h, "a7 at watermark 34", res("a", 0, 30, sumOf(a5, a6, a7)))
			expectStateHeld(t, h, "before cleanup")
			advance(t, h, 44)
			expectOut(t, h, "watermark 44")
			expectStateEmpty(t, h, "after cleanup")
			feed(h, a8)
			expectOut(t, h, "a8 after cleanup")
			expectLate(t, h, a8)
		})
	}
}

// Allowed lateness on session windows: a late record joining a session
// that fired fires the (possibly grown) session again.
func TestSessionAllowedLateness(t *testing.T) {
	for _, how := range []windowBuild{viaAggregate, viaProcess} {
		t.Run(how.String(), func(t *testing.T) {
			h := newWindow(t, operators.EventTimeSessionWindows(ms(10)), ms(20), how)
			a0, a5, a3, a4 := ev{"a", 0, 1}, ev{"a", 5, 2}, ev{"a", 3, 4}, ev{"a", 4, 8}
			feed(h, a0)
			advance(t, h, 9)
			expectOut(t, h, "watermark 9", res("a", 0, 10, sumOf(a0)))
			feed(h, a5) // [0,10) grows to [0,15), which has not fired
			expectOut(t, h, "a5 at watermark 9")
			advance(t, h, 14)
			expectOut(t, h, "watermark 14", res("a", 0, 15, sumOf(a0, a5)))
			advance(t, h, 20)
			feed(h, a3) // inside [0,15), fired, lateness not passed (14+20 > 20)
			expectOut(t, h, "a3 at watermark 20", res("a", 0, 15, sumOf(a0, a5, a3)))
			advance(t, h, 33)
			expectStateHeld(t, h, "before cleanup")
			advance(t, h, 34)
			expectOut(t, h, "watermark 34")
			expectStateEmpty(t, h, "after cleanup")
			feed(h, a4) // [4,14) alone: 13+20 <= 34
			expectOut(t, h, "a4 after cleanup")
			expectLate(t, h, a4)
		})
	}
}

// A record that comes after a session was cleaned up (its lateness
// passed) but within gap of its last record is not late when its own
// window [ts, ts+gap) is not: it opens a session of its own, which
// overlaps the old session's bounds and fires at once when the watermark
// passed its end, as in Flink, whose merging window set no longer holds
// the old session either.
func TestSessionAfterCleanupOverlapsTheOldOne(t *testing.T) {
	for _, how := range []windowBuild{viaAggregate, viaProcess} {
		t.Run(how.String(), func(t *testing.T) {
			h := newWindow(t, operators.EventTimeSessionWindows(ms(10)), ms(5), how)
			a0, a5 := ev{"a", 0, 1}, ev{"a", 5, 2}
			feed(h, a0)
			advance(t, h, 9)
			expectOut(t, h, "watermark 9", res("a", 0, 10, sumOf(a0)))
			advance(t, h, 14) // [0,10) cleaned up: 9+5 <= 14
			expectStateEmpty(t, h, "after cleanup")
			feed(h, a5) // [5,15): 14+5 > 14, not late; 14 <= 14, fires at once
			expectOut(t, h, "a5 after cleanup", res("a", 5, 15, sumOf(a5)))
			if n := lateRecords(t, h); n != 0 {
				t.Errorf("%d late records, want 0", n)
			}
			advance(t, h, 19)
			expectOut(t, h, "watermark 19")
			expectStateEmpty(t, h, "after the second cleanup")
		})
	}
}

// A session merge must not cancel a timer that another session of the key
// still needs. Timers are kept per key and timestamp only, so the cleanup
// timer of session x (x.End-1+lateness) and the firing timer of session y
// (y.End-1) are one timer when they coincide; merging x into a larger
// session deletes x's timers, and with them y's.
func TestSessionMergeKeepsTimersOfOtherSessions(t *testing.T) {
	h := newWindow(t, operators.EventTimeSessionWindows(ms(5)), ms(10), viaAggregate)
	a0, a10, a3 := ev{"a", 0, 1}, ev{"a", 10, 2}, ev{"a", 3, 4}
	feed(h, a0, a10) // x = [0,5) fires at 4, cleaned at 14; y = [10,15) fires at 14
	advance(t, h, 5)
	expectOut(t, h, "watermark 5", res("a", 0, 5, sumOf(a0)))
	feed(h, a3) // x grows to [0,8), which has not fired: x's timers at 4 and 14 go
	advance(t, h, 7)
	expectOut(t, h, "watermark 7", res("a", 0, 8, sumOf(a0, a3)))
	advance(t, h, watermark.MaxWatermark)
	expectOut(t, h, "final watermark", res("a", 10, 15, sumOf(a10)))
	expectStateEmpty(t, h, "at the end")
}

// A key that keeps sending within the gap has one session that never
// closes: each record moves its end on, and the timer of the end before
// must go with it. Otherwise the operator keeps a timer per record of the
// session (rate × session length, without bound for a sensor that never
// pauses), in memory and in every checkpoint, until the watermark passes
// them. Timers that another session of the key still needs stay (see
// TestSessionMergeKeepsTimersOfOtherSessions).
func TestSessionThatNeverClosesKeepsOneTimer(t *testing.T) {
	for _, lateness := range []time.Duration{0, ms(500)} {
		t.Run(fmt.Sprintf("lateness=%v", lateness), func(t *testing.T) {
			h := newWindow(t, operators.EventTimeSessionWindows(ms(1000)), lateness, viaAggregate)
			b0 := ev{"b", 0, 7} // another key: a session of its own that fires
			feed(h, b0)
			var all []ev
			for ts := int64(0); ts < 20_000; ts++ {
				e := ev{"a", ts, ts % 5}
				all = append(all, e)
				feed(h, e)
				if ts%100 == 99 {
					advance(t, h, ts-200)
				}
				if ev, _ := operators.PendingTimers(h.Op); ev > 3 {
					t.Fatalf("at %d: %d event-time timers queued, want at most 3 (the session's end, b's and b's cleanup)", ts, ev)
				}
			}
			expectOut(t, h, "the open session", res("b", 0, 1000, sumOf(b0)))
			advance(t, h, watermark.MaxWatermark)
			expectOut(t, h, "final watermark", res("a", 0, 20_999, sumOf(all...)))
			expectStateEmpty(t, h, "at the end")
		})
	}
}

// The same for processing-time sessions: a key that keeps sending within
// the gap keeps one processing-time timer, not one per millisecond it
// sent in.
func TestProcessingTimeSessionThatNeverClosesKeepsOneTimer(t *testing.T) {
	start := operatorstest.DefaultStart.UnixMilli()
	h := newWindow(t, operators.ProcessingTimeSessionWindows(ms(1000)), 0, viaAggregate)
	var all []ev
	for i := range int64(5000) {
		e := ev{"a", 0, i % 3}
		all = append(all, e)
		h.Process(e, operators.NoTimestamp)
		if _, pt := operators.PendingTimers(h.Op); pt > 1 {
			t.Fatalf("after %d records: %d processing-time timers queued, want 1", i+1, pt)
		}
		if err := h.AdvanceProcessingTime(time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	expectOut(t, h, "the open session")
	if err := h.AdvanceProcessingTime(time.Second); err != nil {
		t.Fatal(err)
	}
	expectOut(t, h, "after the gap", res("a", start, start+4999+1000, sumOf(all...)))
	expectStateEmpty(t, h, "at the end")
}

// Processing-time tumbling windows fire when the fake clock reaches End-1;
// Finish fires the windows still open at the end of the input.
func TestTumblingProcessingTimeWindows(t *testing.T) {
	start := operatorstest.DefaultStart.UnixMilli() // a whole second
	h := newWindow(t, operators.TumblingProcessingTimeWindows(time.Second), 0, viaAggregate)
	a1, b2, a4, a8 := ev{"a", 0, 1}, ev{"b", 0, 2}, ev{"a", 0, 4}, ev{"a", 0, 8}
	h.Process(a1, operators.NoTimestamp)
	h.Process(b2, operators.NoTimestamp)
	if err := h.AdvanceProcessingTime(500 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	h.Process(a4, operators.NoTimestamp)
	if err := h.AdvanceProcessingTime(498 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	expectOut(t, h, "at +998ms")
	if err := h.AdvanceProcessingTime(time.Millisecond); err != nil {
		t.Fatal(err)
	}
	expectSorted(t, h, "at +999ms", res("a", start, start+1000, sumOf(a1, a4)), res("b", start, start+1000, sumOf(b2)))
	if err := h.AdvanceProcessingTime(time.Millisecond); err != nil {
		t.Fatal(err)
	}
	h.Process(a8, operators.NoTimestamp) // at +1000ms: the next window
	if err := h.AdvanceProcessingTime(300 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	expectOut(t, h, "at +1300ms")
	// Watermarks do not fire processing-time windows.
	advance(t, h, math.MaxInt64)
	expectOut(t, h, "final watermark")
	if err := h.Finish(); err != nil {
		t.Fatal(err)
	}
	expectOut(t, h, "Finish", res("a", start+1000, start+2000, sumOf(a8)))
	expectStateEmpty(t, h, "after Finish")
}

// The example of the seeds: hourly tumbling windows over readings with a
// watermark 5 minutes behind the largest timestamp (what the bounded
// out-of-orderness assigner emits). The window [3:00,4:00) fires only when
// a reading at or after 4:05 pushes the watermark to 3:59:59.999, and its
// result is the count and sum of every reading in that hour, including
// those that arrived out of order behind the watermark.
func TestHourlyWindowsWithBoundedOutOfOrderness(t *testing.T) {
	hour := func(h, m, s int) int64 {
		return time.Date(2024, 3, 10, h, m, s, 0, time.UTC).UnixMilli()
	}
	const delay = int64(5 * time.Minute / time.Millisecond)
	// Readings every 2.5 minutes from 3:00 to 4:10 for two sensors, the
	// second sensor 40 s later; then some moved later in arrival order,
	// each by less than 5 minutes of event time.
	var readings []ev
	for i := 0; i <= 28; i++ {
		ts := hour(3, 0, 0) + int64(i)*150_000
		readings = append(readings, ev{"s1", ts, int64(2000 + 37*i%500)}, ev{"s2", ts + 40_000, int64(2500 - 13*i%300)})
	}
	moveLater := func(ts int64, by int) { // moves the reading at ts by positions
		i := slices.IndexFunc(readings, func(e ev) bool { return e.TS == ts })
		r := readings[i]
		readings = slices.Insert(slices.Delete(readings, i, i+1), i+by, r)
	}
	moveLater(hour(3, 57, 30), 3) // arrives after 4:00:40
	moveLater(hour(3, 58, 10), 4) // arrives after 4:02:30
	moveLater(hour(3, 55, 0), 4)  // arrives after 3:58:10, behind the watermark
	moveLater(hour(4, 2, 30), 2)  // out of order in the next window
	moveLater(hour(3, 20, 40), 2) // out of order early on
	for i := 1; i < len(readings); i++ {
		if readings[i].TS < readings[i-1].TS-delay {
			t.Fatalf("reading %v is more than 5 minutes out of order", readings[i])
		}
	}

	// The independent computation: a plain loop over the readings.
	want := map[string]cs{}
	for _, r := range readings {
		if r.TS >= hour(3, 0, 0) && r.TS < hour(4, 0, 0) {
			want[r.Key] = want[r.Key].add(r)
		}
	}

	h := newWindow(t, operators.TumblingEventTimeWindows(time.Hour), 0, viaAggregate)
	maxTs, wm := int64(math.MinInt64), int64(math.MinInt64)
	fired := false
	for _, r := range readings {
		feed(h, r)
		maxTs = max(maxTs, r.TS)
		if w := maxTs - delay - 1; w > wm {
			wm = w
			advance(t, h, wm)
		}
		got := h.Drain()
		shouldFire := !fired && maxTs >= hour(4, 5, 0)
		if !shouldFire {
			if len(got) > 0 {
				t.Fatalf("after %v (watermark %s): emitted%s", r, time.UnixMilli(wm).UTC().Format(time.TimeOnly), fmtRecs(got))
			}
			continue
		}
		fired = true
		if wm != hour(3, 59, 59)+999 {
			t.Fatalf("fired at watermark %d", wm)
		}
		wantRecs := []operatorstest.Record[result]{
			res("s1", hour(3, 0, 0), hour(4, 0, 0), want["s1"]),
			res("s2", hour(3, 0, 0), hour(4, 0, 0), want["s2"]),
		}
		if got, wantRecs := sortRecs(got), sortRecs(wantRecs); !slices.Equal(got, wantRecs) {
			t.Fatalf("after %v: emitted%s\nwant%s", r, fmtRecs(got), fmtRecs(wantRecs))
		}
		if want["s1"].Count != 24 || want["s2"].Count != 24 {
			t.Fatalf("the hour has %+v readings, want 24 per sensor", want)
		}
	}
	if !fired {
		t.Fatal("[3:00,4:00) never fired")
	}
	expectLate(t, h)
}

// --- randomised comparison with a naive model ---

// step is one input of a randomised test: a record, or a watermark when
// rec is nil.
type step struct {
	rec *ev
	wm  int64
}

func (s step) String() string {
	if s.rec != nil {
		return "record " + s.rec.String()
	}
	return fmt.Sprintf("watermark %d", s.wm)
}

// randomSteps returns n out-of-order records over keys, interleaved with
// watermarks that sometimes overtake records, then the final watermark.
func randomSteps(rng *rand.Rand, n int) []step {
	keys := []string{"a", "b", "c"}
	var steps []step
	t, wm := int64(0), int64(math.MinInt64)
	for range n {
		t += rng.Int64N(5)
		if rng.IntN(30) == 0 {
			t += 40 // a pause: sessions close
		}
		disorder := int64(25)
		if rng.IntN(8) == 0 {
			disorder = 80 // now and then a straggler
		}
		e := ev{Key: keys[rng.IntN(len(keys))], TS: t - rng.Int64N(disorder), V: rng.Int64N(1000)}
		steps = append(steps, step{rec: &e})
		if rng.IntN(4) == 0 {
			if w := t - rng.Int64N(15); w > wm {
				wm = w
				steps = append(steps, step{wm: w})
			}
		}
	}
	return append(steps, step{wm: watermark.MaxWatermark})
}

// windowModel computes, per step, what a window operator emits: the
// results (in any order) and the late records.
type windowModel interface {
	record(e ev, wm int64) (out []operatorstest.Record[result], late bool)
	advance(from, to int64) []operatorstest.Record[result]
}

type keyWin struct {
	key string
	w   operators.Window
}

// naiveFloor is the largest t' <= t with t' ≡ offset (mod step).
func naiveFloor(t, offset, step int64) int64 {
	r := ((t-offset)%step + step) % step
	return t - r
}

// slidingModel is the model of tumbling (slide == size) and sliding
// windows: every window keeps the records that arrived while it was not
// yet cleaned up (watermark < End-1+lateness).
type slidingModel struct {
	size, slide, offset, lateness int64
	wins                          map[keyWin]cs
}

func (m *slidingModel) windows(ts int64) []operators.Window {
	var ws []operators.Window
	for s := naiveFloor(ts, m.offset, m.slide); s > ts-m.size; s -= m.slide {
		ws = append(ws, operators.Window{Start: s, End: s + m.size})
	}
	slices.Reverse(ws)
	return ws
}

func (m *slidingModel) record(e ev, wm int64) (out []operatorstest.Record[result], late bool) {
	late = true
	for _, w := range m.windows(e.TS) {
		if w.End-1+m.lateness <= wm {
			continue // cleaned up
		}
		late = false
		k := keyWin{e.Key, w}
		m.wins[k] = m.wins[k].add(e)
		if w.End-1 <= wm { // fired already: fires again
			out = append(out, res(e.Key, w.Start, w.End, m.wins[k]))
		}
	}
	return out, late
}

func (m *slidingModel) advance(from, to int64) (out []operatorstest.Record[result]) {
	for k, c := range m.wins {
		if end := k.w.End - 1; end > from && end <= to {
			out = append(out, res(k.key, k.w.Start, k.w.End, c))
		}
	}
	for k := range m.wins {
		if k.w.End-1+m.lateness <= to {
			delete(m.wins, k)
		}
	}
	return out
}

// sessionModel is the model of session windows.
type sessionModel struct {
	gap, lateness int64
	sessions      map[string]map[operators.Window]cs
}

func (m *sessionModel) record(e ev, wm int64) (out []operatorstest.Record[result], late bool) {
	ss := m.sessions[e.Key]
	merged := operators.Window{Start: e.TS, End: e.TS + m.gap}
	acc := cs{}.add(e)
	var absorbed []operators.Window
	for changed := true; changed; {
		changed = false
		for w := range ss {
			if !slices.Contains(absorbed, w) && w.Start <= merged.End && merged.Start <= w.End {
				absorbed = append(absorbed, w)
				merged = operators.Window{Start: min(merged.Start, w.Start), End: max(merged.End, w.End)}
				changed = true
			}
		}
	}
	if merged.End-1+m.lateness <= wm {
		return nil, true
	}
	for _, w := range absorbed {
		acc = csAgg{}.Merge(acc, ss[w])
		delete(ss, w)
	}
	if ss == nil {
		ss = map[operators.Window]cs{}
		m.sessions[e.Key] = ss
	}
	ss[merged] = acc
	if merged.End-1 <= wm {
		out = append(out, res(e.Key, merged.Start, merged.End, acc))
	}
	return out, false
}

func (m *sessionModel) advance(from, to int64) (out []operatorstest.Record[result]) {
	for key, ss := range m.sessions {
		for w, c := range ss {
			if end := w.End - 1; end > from && end <= to {
				out = append(out, res(key, w.Start, w.End, c))
			}
			if w.End-1+m.lateness <= to {
				delete(ss, w)
			}
		}
	}
	return out
}

// TestWindowsMatchModel runs every window kind over random out-of-order
// input with random watermarks and compares each step's output with the
// naive model's. Run with -window.seed=N to try another seed.
func TestWindowsMatchModel(t *testing.T) {
	seeds := []uint64{*windowSeed}
	if *windowSeed == 0 {
		seeds = nil
		for s := uint64(1); s <= 20; s++ {
			seeds = append(seeds, s)
		}
	}
	type kind struct {
		name     string
		assigner operators.WindowAssigner
		lateness int64
		model    func() windowModel
	}
	sliding := func(size, slide, offset, lateness int64) func() windowModel {
		return func() windowModel {
			return &slidingModel{size: size, slide: slide, offset: offset, lateness: lateness, wins: map[keyWin]cs{}}
		}
	}
	session := func(gap, lateness int64) func() windowModel {
		return func() windowModel {
			return &sessionModel{gap: gap, lateness: lateness, sessions: map[string]map[operators.Window]cs{}}
		}
	}
	kinds := []kind{
		{"tumbling", operators.TumblingEventTimeWindows(ms(10)), 0, sliding(10, 10, 0, 0)},
		{"tumbling-lateness", operators.TumblingEventTimeWindows(ms(10)), 7, sliding(10, 10, 0, 7)},
		{"sliding", operators.SlidingEventTimeWindows(ms(30), ms(10)), 0, sliding(30, 10, 0, 0)},
		{"sliding-lateness", operators.SlidingEventTimeWindows(ms(30), ms(10)), 13, sliding(30, 10, 0, 13)},
		{"sliding-offset-lateness", operators.SlidingEventTimeWindows(ms(25), ms(10)).WithOffset(ms(4)), 20, sliding(25, 10, 4, 20)},
		{"session", operators.EventTimeSessionWindows(ms(8)), 0, session(8, 0)},
		{"session-lateness", operators.EventTimeSessionWindows(ms(8)), 12, session(8, 12)},
	}
	for _, k := range kinds {
		for _, how := range []windowBuild{viaAggregate, viaProcess} {
			t.Run(k.name+"/"+how.String(), func(t *testing.T) {
				var total schedule
				for _, seed := range seeds {
					s, ok := runWindowModel(t, seed, k.assigner, ms(k.lateness), how, k.model())
					if !ok {
						return // one failing seed is enough
					}
					total.late += s.late
					total.refired += s.refired
					total.fired += s.fired
				}
				t.Logf("seeds %v: %d late records, %d results fired by records within the lateness, %d by watermarks", seeds, total.late, total.refired, total.fired)
				// The schedules must exercise every path.
				if total.late == 0 || total.fired == 0 || (k.lateness > 0 && total.refired == 0) {
					t.Fatalf("poor schedules: %+v", total)
				}
			})
		}
	}
}

// schedule counts what a randomised run exercised: late records, results
// fired again by a record within the lateness, results fired by a
// watermark.
type schedule struct{ late, refired, fired int }

// runWindowModel runs one seed and reports what it exercised and whether
// it passed.
func runWindowModel(t *testing.T, seed uint64, a operators.WindowAssigner, lateness time.Duration, how windowBuild, m windowModel) (sched schedule, ok bool) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	steps := randomSteps(rng, 400)
	h := newWindow(t, a, lateness, how)
	wm := int64(math.MinInt64)
	var wantLate []ev
	var lateSeen int
	var records int
	for i, s := range steps {
		var want []operatorstest.Record[result]
		if s.rec != nil {
			records++
			out, late := m.record(*s.rec, wm)
			want = out
			if late {
				wantLate = append(wantLate, *s.rec)
			}
			h.Process(*s.rec, s.rec.TS)
		} else {
			want = m.advance(wm, s.wm)
			wm = s.wm
			if err := h.Watermark(s.wm); err != nil {
				t.Errorf("seed %d step %d (%v): %v", seed, i, s, err)
				return sched, false
			}
		}
		got := h.Drain()
		if s.rec != nil {
			sched.refired += len(got)
		} else {
			sched.fired += len(got)
		}
		for j := 1; j < len(got); j++ {
			if got[j].Timestamp < got[j-1].Timestamp {
				t.Errorf("seed %d step %d (%v): results out of timestamp order:%s", seed, i, s, fmtRecs(got))
				return sched, false
			}
		}
		if got, want := sortRecs(got), sortRecs(want); !slices.Equal(got, want) {
			t.Errorf("seed %d step %d (%v): emitted%s\nwant%s", seed, i, s, fmtRecs(got), fmtRecs(want))
			return sched, false
		}
		side := h.Side[lateTag]
		if len(side) != len(wantLate) {
			t.Errorf("seed %d step %d (%v): %d late records, want %d", seed, i, s, len(side), len(wantLate))
			return sched, false
		}
		for ; lateSeen < len(side); lateSeen++ {
			if got := side[lateSeen].Value.(ev); got != wantLate[lateSeen] {
				t.Errorf("seed %d step %d: late record %v, want %v", seed, i, got, wantLate[lateSeen])
				return sched, false
			}
		}
	}
	if n := lateRecords(t, h); n != int64(len(wantLate)) {
		t.Errorf("seed %d: LateRecords %d, want %d", seed, n, len(wantLate))
		return sched, false
	}
	if n, detail := windowState(h); n != 0 {
		t.Errorf("seed %d: state left after the final watermark:%s", seed, detail)
		return sched, false
	}
	if len(wantLate) == records {
		t.Errorf("seed %d: all %d records late", seed, records)
		return sched, false
	}
	sched.late = len(wantLate)
	return sched, true
}

// A record whose timestamp is at the int64 extremes has no window that
// int64 can hold (its start or end would overflow): it goes to the
// late-data side output, counted, and the other records' windows are
// exact. (math.MinInt64 itself is NoTimestamp.)
func TestWindowTimestampExtremes(t *testing.T) {
	for _, a := range []operators.WindowAssigner{
		operators.TumblingEventTimeWindows(10 * time.Second),
		operators.SlidingEventTimeWindows(10*time.Second, 5*time.Second),
		operators.EventTimeSessionWindows(10 * time.Second),
	} {
		for _, how := range []windowBuild{viaAggregate, viaProcess} {
			t.Run(fmt.Sprintf("%s/%s", a, how), func(t *testing.T) {
				h := newWindow(t, a, ms(1000), how)
				good := ev{"a", 1000, 1}
				low, high := ev{"a", math.MinInt64 + 1, 2}, ev{"b", math.MaxInt64, 3}
				feed(h, low, good, high, ev{"a", math.MinInt64 + 2, 4}, ev{"c", math.MaxInt64 - 1, 5})
				advance(t, h, 100_000)
				var got []result
				for _, r := range h.Drain() {
					got = append(got, r.Value)
				}
				if len(got) == 0 || got[0].Key != "a" || got[0].Value != sumOf(good) {
					t.Fatalf("results %v, want only windows of %v", got, good)
				}
				for _, r := range got {
					if r.Key != "a" || r.Value != sumOf(good) || r.Window.Start > 1000 || r.Window.End <= 1000 {
						t.Fatalf("result %+v, want only windows of %v", r, good)
					}
				}
				expectLate(t, h, low, high, ev{"a", math.MinInt64 + 2, 4}, ev{"c", math.MaxInt64 - 1, 5})
			})
		}
	}
}

// A record that arrives at the very millisecond whose timer already fired
// its window goes to the next window: it is neither lost in a slice no
// timer fires nor a second firing of the closed window.
func TestProcessingTimeRecordAfterItsWindowFired(t *testing.T) {
	start := operatorstest.DefaultStart.UnixMilli()
	h := newWindow(t, operators.TumblingProcessingTimeWindows(time.Second), 0, viaAggregate)
	a1, a2 := ev{"a", 0, 1}, ev{"a", 0, 2}
	h.Process(a1, operators.NoTimestamp)
	if err := h.AdvanceProcessingTime(999 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	expectOut(t, h, "at +999ms", res("a", start, start+1000, sumOf(a1)))
	h.Process(a2, operators.NoTimestamp) // still at +999ms: the window fired
	if err := h.AdvanceProcessingTime(time.Second); err != nil {
		t.Fatal(err)
	}
	expectOut(t, h, "at +1999ms", res("a", start+1000, start+2000, sumOf(a2)))
	if err := h.Finish(); err != nil {
		t.Fatal(err)
	}
	expectOut(t, h, "Finish")
	expectStateEmpty(t, h, "after Finish")
}

// A negative offset shifts the windows the other way, as in Flink
// (TumblingEventTimeWindows.of(1 day, -8 hours) for UTC+8): it cuts the
// windows of the positive offset that is one slide more, and its digest
// is that offset's; an offset of a whole slide or more, either way, is
// refused.
func TestWindowNegativeOffset(t *testing.T) {
	neg := operators.TumblingEventTimeWindows(24 * time.Hour).WithOffset(-8 * time.Hour)
	pos := operators.TumblingEventTimeWindows(24 * time.Hour).WithOffset(16 * time.Hour)
	if err := neg.Validate(); err != nil {
		t.Fatalf("offset -8h of 24h windows: %v", err)
	}
	if neg != pos || neg.StateDigest() != pos.StateDigest() {
		t.Fatalf("offset -8h: %v (%s), want the windows of 16h: %v", neg, neg.StateDigest(), pos)
	}
	h := newWindow(t, operators.SlidingEventTimeWindows(ms(25), ms(10)).WithOffset(ms(-7)), 0, viaAggregate)
	// As WithOffset(3): 7 is in [-17,8), [-7,18), [3,28).
	e7 := ev{"k", 7, 1}
	feed(h, e7)
	advance(t, h, math.MaxInt64)
	expectOut(t, h, "final watermark", res("k", -17, 8, sumOf(e7)), res("k", -7, 18, sumOf(e7)), res("k", 3, 28, sumOf(e7)))
	for _, off := range []time.Duration{-24 * time.Hour, 24 * time.Hour, -25 * time.Hour} {
		err := operators.TumblingEventTimeWindows(24 * time.Hour).WithOffset(off).Validate()
		if err == nil || !strings.Contains(err.Error(), "window.offset") || !strings.Contains(err.Error(), "shorter than the slide") {
			t.Errorf("offset %v of 24h windows: %v, want it refused", off, err)
		}
	}
}

// A tumbling window of no size reports one error, about its size: a
// tumbling window has no slide of its own to blame.
func TestTumblingWindowOfNoSizeReportsTheSize(t *testing.T) {
	for _, d := range []time.Duration{0, time.Nanosecond, -time.Second} {
		err := operators.TumblingEventTimeWindows(d).Validate()
		if err == nil || !strings.Contains(err.Error(), "window.size") || strings.Contains(err.Error(), "window.slide") {
			t.Errorf("size %v: %v, want one error about window.size", d, err)
		}
	}
	if err := operators.SlidingEventTimeWindows(time.Second, 0).Validate(); err == nil || !strings.Contains(err.Error(), "window.slide") {
		t.Errorf("sliding with slide 0: %v, want an error about window.slide", err)
	}
}

// An offset given to session windows is refused by Validate, naming it:
// a session starts at its first record, so there is nothing to shift.
// Before, it was accepted and ignored without a word (a session of a
// record at 7 with gap 10 and offset 3 was [7,17), as without it).
func TestSessionWindowOffsetIsRefused(t *testing.T) {
	for _, a := range []operators.WindowAssigner{
		operators.EventTimeSessionWindows(ms(10)).WithOffset(ms(3)),
		operators.ProcessingTimeSessionWindows(ms(10)).WithOffset(-ms(3)),
	} {
		err := a.Validate()
		if err == nil || !strings.Contains(err.Error(), "window.offset (") || !strings.Contains(err.Error(), "session windows start at their first record") {
			t.Errorf("%v with an offset: %v, want it refused", a, err)
		}
	}
	if err := operators.EventTimeSessionWindows(ms(10)).WithOffset(0).Validate(); err != nil {
		t.Errorf("session windows with offset 0: %v", err)
	}
}

// A window duration that is not a whole number of milliseconds is
// refused by Validate, naming the setting and the duration as given, as a
// declared pipeline's is. Before, it was cut to the milliseconds below it
// without a word: 1.5ms tumbling windows were 1ms windows, a 2.5ms gap a
// 2ms gap, an offset of 0.5ms no offset, and a 0.5ms size was refused as
// "window.size (0ms)".
func TestWindowAssignerRefusesFractionsOfAMillisecond(t *testing.T) {
	us := time.Microsecond
	for _, c := range []struct {
		a    operators.WindowAssigner
		want string
	}{
		{operators.TumblingEventTimeWindows(1500 * us), "window.size (1.5ms) must be a whole number of milliseconds"},
		{operators.TumblingProcessingTimeWindows(500 * us), "window.size (500µs) must be a whole number of milliseconds"},
		{operators.SlidingEventTimeWindows(ms(3), 1500*us), "window.slide (1.5ms) must be a whole number of milliseconds"},
		{operators.SlidingProcessingTimeWindows(2500*us, ms(1)), "window.size (2.5ms) must be a whole number of milliseconds"},
		{operators.EventTimeSessionWindows(2500 * us), "window.gap (2.5ms) must be a whole number of milliseconds"},
		{operators.TumblingEventTimeWindows(ms(2)).WithOffset(500 * us), "window.offset (500µs) must be a whole number of milliseconds"},
		{operators.SlidingEventTimeWindows(ms(4), ms(2)).WithOffset(-1500 * us), "window.offset (-1.5ms) must be a whole number of milliseconds"},
		{operators.ProcessingTimeSessionWindows(ms(10)).WithOffset(500 * us), "window.offset (500µs) is for tumbling and sliding windows"},
	} {
		err := c.a.Validate()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.a, err, c.want)
		}
		if err != nil && strings.Count(err.Error(), "\n") > 0 {
			t.Errorf("%v: %q, want one error", c.a, err)
		}
	}
	for _, a := range []operators.WindowAssigner{
		operators.TumblingEventTimeWindows(time.Hour).WithOffset(-8 * time.Hour / 10),
		operators.SlidingEventTimeWindows(ms(3), ms(1)),
		operators.EventTimeSessionWindows(ms(1)),
	} {
		if err := a.Validate(); err != nil {
			t.Errorf("%v: %v, want it valid", a, err)
		}
	}
}

// A record read in the last millisecond of its processing-time window,
// before the timer service has fired that millisecond's timers, is
// counted in that window: its key's timer at the window's end is still to
// fire (it was not, so the record's slice was left with no timer and
// dropped unfired by the key's next window). A session of a gap of one
// millisecond is not fired at once either, so a second record of the same
// millisecond joins it instead of firing it again.
func TestProcessingTimeRecordInTheLastMillisecond(t *testing.T) {
	start := operatorstest.DefaultStart.UnixMilli()
	for _, c := range []struct {
		name string
		a    operators.WindowAssigner
		want func(a1, a2, a3 ev) []operatorstest.Record[result]
	}{
		{"tumbling", operators.TumblingProcessingTimeWindows(time.Second), func(a1, a2, a3 ev) []operatorstest.Record[result] {
			return []operatorstest.Record[result]{res("a", start, start+1000, sumOf(a1, a2)), res("a", start+1000, start+2000, sumOf(a3))}
		}},
		{"sliding", operators.SlidingProcessingTimeWindows(2*time.Second, time.Second), func(a1, a2, a3 ev) []operatorstest.Record[result] {
			return []operatorstest.Record[result]{res("a", start-1000, start+1000, sumOf(a1, a2)), res("a", start, start+2000, sumOf(a1, a2, a3)),
				res("a", start+1000, start+3000, sumOf(a3))}
		}},
		{"session", operators.ProcessingTimeSessionWindows(time.Millisecond), func(a1, a2, a3 ev) []operatorstest.Record[result] {
			return []operatorstest.Record[result]{res("a", start+999, start+1000, sumOf(a1, a2)), res("a", start+1500, start+1501, sumOf(a3))}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, how := range []windowBuild{viaAggregate, viaProcess} {
				h := newWindow(t, c.a, 0, how)
				// The processing times they are read at, for the
				// process function's check.
				a1, a2, a3 := ev{"a", start + 999, 1}, ev{"a", start + 999, 2}, ev{"a", start + 1500, 4}
				h.Clock.Advance(999 * time.Millisecond) // no timer fired yet
				h.Process(a1, operators.NoTimestamp)
				h.Process(a2, operators.NoTimestamp)
				got := h.Drain()
				if err := h.AdvanceProcessingTime(501 * time.Millisecond); err != nil {
					t.Fatal(err)
				}
				h.Process(a3, operators.NoTimestamp) // at +1500ms
				if err := h.AdvanceProcessingTime(5 * time.Second); err != nil {
					t.Fatal(err)
				}
				if err := h.Finish(); err != nil {
					t.Fatal(err)
				}
				got = sortRecs(append(got, h.Drain()...))
				if want := sortRecs(c.want(a1, a2, a3)); !slices.Equal(got, want) {
					t.Fatalf("build %v: emitted%s\nwant%s", how, fmtRecs(got), fmtRecs(want))
				}
				expectStateEmpty(t, h, "after Finish")
			}
		})
	}
}
