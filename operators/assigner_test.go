package operators_test

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/operators/operatorstest"
	"github.com/edgedio/edged/watermark"
)

// stamped is the record of the assigner tests; its event time is TS.
type stamped struct {
	Name string
	TS   int64
}

func stampedTime(s stamped) int64 { return s.TS }

func newAssigner(t *testing.T, s watermark.Strategy[stamped]) *operatorstest.Harness[stamped, stamped] {
	t.Helper()
	h := operatorstest.New(func(out operators.Collector[stamped]) operators.OneInput[stamped] {
		return operators.NewTimestampsAndWatermarks(s, out)
	})
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

func advanceBy(t *testing.T, h *operatorstest.Harness[stamped, stamped], d time.Duration) {
	t.Helper()
	if err := h.AdvanceProcessingTime(d); err != nil {
		t.Fatal(err)
	}
}

func expectWatermarks(t *testing.T, h *operatorstest.Harness[stamped, stamped], what string, want ...int64) {
	t.Helper()
	if !slices.Equal(h.Watermarks, want) {
		t.Fatalf("%s: watermarks %v, want %v", what, h.Watermarks, want)
	}
}

// The assigner stamps each record with its event time and, every 200 ms of
// processing time, emits the bounded out-of-orderness watermark (largest
// timestamp - bound - 1) when it advanced.
func TestAssignerPeriodicWatermarks(t *testing.T) {
	h := newAssigner(t, watermark.ForBoundedOutOfOrderness(time.Second, stampedTime))
	if got := h.ProcessingTimers(); !slices.Equal(got, []int64{h.Now() + 200}) {
		t.Fatalf("after Open, callbacks at %v, want one 200ms later", got)
	}
	advanceBy(t, h, time.Second)
	expectWatermarks(t, h, "no record yet")

	for _, r := range []stamped{{"a", 10_000}, {"b", 12_000}, {"c", 11_000}} {
		h.Process(r, operators.NoTimestamp)
	}
	want := []operatorstest.Record[stamped]{
		{Value: stamped{"a", 10_000}, Timestamp: 10_000},
		{Value: stamped{"b", 12_000}, Timestamp: 12_000},
		{Value: stamped{"c", 11_000}, Timestamp: 11_000},
	}
	if !slices.Equal(h.Out, want) {
		t.Fatalf("emitted %v, want %v", h.Out, want)
	}
	advanceBy(t, h, 199*time.Millisecond)
	expectWatermarks(t, h, "199ms after the records")
	advanceBy(t, h, time.Millisecond)
	expectWatermarks(t, h, "200ms after", 10_999)

	h.Process(stamped{"d", 11_500}, operators.NoTimestamp) // behind the largest
	advanceBy(t, h, 200*time.Millisecond)
	expectWatermarks(t, h, "no advance", 10_999)
	h.Process(stamped{"e", 15_000}, operators.NoTimestamp)
	h.Process(stamped{"f", 14_000}, operators.NoTimestamp)
	advanceBy(t, h, time.Second) // 5 periods, one advance
	expectWatermarks(t, h, "after e", 10_999, 13_999)
}

// The interval is the strategy's, 200ms when it is 0.
func TestAssignerInterval(t *testing.T) {
	h := newAssigner(t, watermark.ForMonotonous(stampedTime).WithInterval(0))
	h.Process(stamped{"a", 100}, operators.NoTimestamp)
	advanceBy(t, h, 199*time.Millisecond)
	expectWatermarks(t, h, "at 199ms")
	advanceBy(t, h, time.Millisecond)
	expectWatermarks(t, h, "at 200ms", 99)

	f := newAssigner(t, watermark.ForMonotonous(stampedTime).WithInterval(50*time.Millisecond))
	for i := range int64(4) {
		f.Process(stamped{"a", 100 * (i + 1)}, operators.NoTimestamp)
		advanceBy(t, f, 50*time.Millisecond)
	}
	expectWatermarks(t, f, "every 50ms", 99, 199, 299, 399)
}

// With an idle timeout the output is marked idle once no record came for
// that long (checked every period), and active again at the next record,
// which is forwarded at once.
func TestAssignerIdleness(t *testing.T) {
	const timeout = 500 * time.Millisecond
	h := newAssigner(t, watermark.ForMonotonous(stampedTime).WithIdleness(timeout))
	expectIdle := func(what string, want ...bool) {
		t.Helper()
		if !slices.Equal(h.Idle, want) {
			t.Fatalf("%s: status changes %v, want %v", what, h.Idle, want)
		}
	}
	start := h.Now()
	advanceBy(t, h, timeout-time.Millisecond)
	expectIdle("just before the timeout")
	advanceBy(t, h, 200*time.Millisecond) // the next period
	expectIdle("a period after the timeout", true)
	advanceBy(t, h, time.Second)
	expectIdle("still idle", true)

	h.Process(stamped{"a", 5}, operators.NoTimestamp)
	expectIdle("at the next record", true, false)
	if len(h.Out) != 1 {
		t.Fatalf("the record was not forwarded: %v", h.Out)
	}
	last := h.Now()
	// Records keep it active.
	for range 5 {
		advanceBy(t, h, 300*time.Millisecond)
		h.Process(stamped{"b", 6}, operators.NoTimestamp)
		last = h.Now()
	}
	expectIdle("with a record every 300ms", true, false)
	// Idle again once the timeout passed without records, at a period's
	// check: not before the timeout, and at most one period after.
	for h.Now() < last+timeout.Milliseconds()-1 {
		advanceBy(t, h, time.Millisecond)
		expectIdle("within the timeout", true, false)
	}
	advanceBy(t, h, (timeout + 200*time.Millisecond))
	expectIdle("a period after the timeout", true, false, true)
	if h.Now() <= start {
		t.Fatal("time did not pass")
	}
}

// Upstream watermarks are swallowed, but the final one: before it, the
// generator's last watermark goes out if it advanced.
func TestAssignerFinalWatermark(t *testing.T) {
	h := newAssigner(t, watermark.ForBoundedOutOfOrderness(10*time.Millisecond, stampedTime))
	h.Process(stamped{"a", 1000}, operators.NoTimestamp)
	if err := h.Watermark(5000); err != nil {
		t.Fatal(err)
	}
	expectWatermarks(t, h, "upstream watermark")
	advanceBy(t, h, 200*time.Millisecond)
	expectWatermarks(t, h, "periodic", 989)
	h.Process(stamped{"b", 2000}, operators.NoTimestamp)
	if err := h.EndInput(); err != nil {
		t.Fatal(err)
	}
	expectWatermarks(t, h, "end of input", 989, 1989, watermark.MaxWatermark)

	// Nothing new since the last periodic watermark: only the final one.
	g := newAssigner(t, watermark.ForBoundedOutOfOrderness(10*time.Millisecond, stampedTime))
	g.Process(stamped{"a", 1000}, operators.NoTimestamp)
	advanceBy(t, g, 200*time.Millisecond)
	if err := g.Watermark(watermark.MaxWatermark); err != nil {
		t.Fatal(err)
	}
	expectWatermarks(t, g, "end of input", 989, watermark.MaxWatermark)
}

// Close cancels the periodic callback.
func TestAssignerCloseCancelsPeriodicEmit(t *testing.T) {
	h := operatorstest.New(func(out operators.Collector[stamped]) operators.OneInput[stamped] {
		return operators.NewTimestampsAndWatermarks(watermark.ForMonotonous(stampedTime), out)
	})
	if err := h.Open(); err != nil {
		t.Fatal(err)
	}
	advanceBy(t, h, time.Second)
	if len(h.ProcessingTimers()) != 1 {
		t.Fatalf("callbacks %v, want the next periodic emit", h.ProcessingTimers())
	}
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	if got := h.ProcessingTimers(); len(got) != 0 {
		t.Fatalf("after Close, callbacks at %v", got)
	}
}

// An invalid strategy fails Open.
func TestAssignerInvalidStrategy(t *testing.T) {
	h := operatorstest.New(func(out operators.Collector[stamped]) operators.OneInput[stamped] {
		return operators.NewTimestampsAndWatermarks(watermark.ForBoundedOutOfOrderness(-time.Second, stampedTime), out)
	})
	if err := h.Open(); err == nil {
		t.Fatal("Open accepted a negative out-of-orderness")
	}
}

// With per-event emission a watermark follows every event that advances
// it, without any processing time passing.
func TestAssignerPerEventEmit(t *testing.T) {
	s := watermark.ForBoundedOutOfOrderness(10*time.Millisecond, func(v int64) int64 { return v }).WithPerEventEmit()
	h := operatorstest.New(func(out operators.Collector[int64]) operators.OneInput[int64] {
		return operators.NewTimestampsAndWatermarks(s, out)
	})
	if err := h.Open(); err != nil {
		t.Fatal(err)
	}
	for _, ts := range []int64{100, 90, 120, 120, 130} {
		h.Process(ts, operators.NoTimestamp)
	}
	want := []int64{89, 109, 119}
	if !slices.Equal(h.Watermarks, want) {
		t.Fatalf("watermarks %v, want %v", h.Watermarks, want)
	}
}

// An assigner restored from a snapshot taken while its output was idle
// starts active, as the task restores its output and the downstream
// channels (stream status is not restored): with no record after the
// restore it says it is idle again once the timeout passed. Before, it
// took the idle mark back, never said so again, and its restored
// watermark held the windows downstream until its next record.
func TestAssignerRestoredIdleSaysSoAgain(t *testing.T) {
	const timeout = 2 * time.Second
	s := watermark.ForBoundedOutOfOrderness(time.Second, stampedTime).WithIdleness(timeout)
	h := newAssigner(t, s)
	h.Process(stamped{"a", 10_000}, operators.NoTimestamp)
	advanceBy(t, h, timeout+400*time.Millisecond)
	if !slices.Equal(h.Idle, []bool{true}) {
		t.Fatalf("before the snapshot: status changes %v, want idle", h.Idle)
	}
	snap, err := h.Op.(operators.Snapshotter).SnapshotState(1)
	if err != nil {
		t.Fatal(err)
	}

	r := newAssigner(t, s)
	if err := r.Op.(operators.Restorer).RestoreState([][]byte{snap}, 1); err != nil {
		t.Fatal(err)
	}
	advanceBy(t, r, timeout-time.Millisecond)
	if len(r.Idle) != 0 {
		t.Fatalf("restored: status changes %v before the timeout", r.Idle)
	}
	advanceBy(t, r, 200*time.Millisecond)
	if !slices.Equal(r.Idle, []bool{true}) {
		t.Fatalf("restored, a period after the timeout: status changes %v, want idle", r.Idle)
	}
	// Its generator's state came back: no watermark before a new record,
	// then the next one from the restored largest timestamp.
	r.Process(stamped{"b", 9_000}, operators.NoTimestamp)
	advanceBy(t, r, 200*time.Millisecond)
	if !slices.Equal(r.Idle, []bool{true, false}) || len(r.Watermarks) != 0 {
		t.Fatalf("after a record behind the restored one: status changes %v, watermarks %v", r.Idle, r.Watermarks)
	}
}

// A timestamp function that returns math.MinInt64 (hostile input such as
// "-9223372036854775808") gets the record stamped math.MinInt64+1, not
// NoTimestamp: the record keeps the earliest timestamp int64 allows, which
// a window sends to its late-data output. Before, it went on stamped
// NoTimestamp and the first event-time window failed the job with "got a
// record without a timestamp: assign timestamps and watermarks first".
func TestAssignerMinInt64TimestampIsStamped(t *testing.T) {
	h := newAssigner(t, watermark.ForBoundedOutOfOrderness(time.Second, stampedTime).WithPerEventEmit())
	h.Process(stamped{"min", math.MinInt64}, operators.NoTimestamp)
	h.Process(stamped{"next", math.MinInt64 + 1}, operators.NoTimestamp)
	h.Process(stamped{"good", 5000}, operators.NoTimestamp)
	got := h.Drain()
	want := []int64{math.MinInt64 + 1, math.MinInt64 + 1, 5000}
	if len(got) != len(want) {
		t.Fatalf("got %d records, want %d", len(got), len(want))
	}
	for i, r := range got {
		if r.Timestamp != want[i] {
			t.Errorf("record %v stamped %d, want %d", r.Value, r.Timestamp, want[i])
		}
	}
}

// A strategy whose generator factory returns nil fails Open with an error
// that says so. Before, the first record (or the first periodic emit)
// failed the task with a nil pointer dereference.
func TestAssignerNilGeneratorFailsOpen(t *testing.T) {
	s := watermark.ForGenerator(stampedTime, func() watermark.Generator { return nil })
	h := operatorstest.New(func(out operators.Collector[stamped]) operators.OneInput[stamped] {
		return operators.NewTimestampsAndWatermarks(s, out)
	})
	err := h.Open()
	if err == nil || !strings.Contains(err.Error(), "generator factory returned nil") {
		t.Fatalf("Open: %v, want the nil generator named", err)
	}
}
