package operatorstest_test

import (
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/operators/operatorstest"
	"github.com/edgedio/edged/watermark"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// probe is an operator that exercises its Context: each record is a
// command.
type probe struct {
	operators.Base
	ctx *operators.Context
	out operators.Collector[string]
	log *[]string
}

func (p *probe) Open(ctx *operators.Context) error {
	p.ctx = ctx
	return nil
}

func (p *probe) Collect(cmd string) {
	name, arg, _ := strings.Cut(cmd, " ")
	switch name {
	case "emit":
		p.out.Collect(arg)
	case "restamp":
		p.ctx.Time.Timestamp = 7
		p.out.Collect(arg)
	case "side":
		if c, ok := p.ctx.SideOutput("alerts").(operators.Collector[int]); ok {
			c.Collect(len(arg))
		} else {
			p.out.Collect("no side output")
		}
	case "fail":
		operators.Fail(errors.New(arg))
	case "panic":
		panic(arg)
	}
}

func newProbe(opts ...operatorstest.Option) *operatorstest.Harness[string, string] {
	return operatorstest.New(func(out operators.Collector[string]) operators.OneInput[string] {
		return &probe{out: out}
	}, opts...)
}

func TestRecordsCarryTheTimestampAtEmission(t *testing.T) {
	h := newProbe()
	if err := h.Open(); err != nil {
		t.Fatal(err)
	}
	h.Process("emit a", 100)
	h.Process("restamp b", 200)
	h.Process("emit c", operators.NoTimestamp)
	want := []operatorstest.Record[string]{{"a", 100}, {"b", 7}, {"c", operators.NoTimestamp}}
	if !slices.Equal(h.Out, want) {
		t.Fatalf("Out = %v, want %v", h.Out, want)
	}
	if got := h.Drain(); len(got) != 3 || h.Out != nil {
		t.Fatalf("Drain returned %d records and left %v", len(got), h.Out)
	}
}

// An operator that does not handle watermarks has them forwarded
// unchanged; one that does decides what goes out.
func TestWatermarkForwarding(t *testing.T) {
	h := newProbe()
	if err := h.Open(); err != nil {
		t.Fatal(err)
	}
	for _, wm := range []int64{5, 9} {
		if err := h.Watermark(wm); err != nil {
			t.Fatal(err)
		}
	}
	if !slices.Equal(h.Watermarks, []int64{5, 9}) {
		t.Fatalf("forwarded %v, want [5 9]", h.Watermarks)
	}

	// TimestampsAndWatermarks swallows upstream watermarks but the final one.
	s := watermark.ForMonotonous(func(v int64) int64 { return v })
	a := operatorstest.New(func(out operators.Collector[int64]) operators.OneInput[int64] {
		return operators.NewTimestampsAndWatermarks(s, out)
	})
	if err := a.Open(); err != nil {
		t.Fatal(err)
	}
	if err := a.Watermark(5); err != nil {
		t.Fatal(err)
	}
	if err := a.EndInput(); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(a.Watermarks, []int64{watermark.MaxWatermark}) {
		t.Fatalf("assigner forwarded %v, want only the final watermark", a.Watermarks)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestSideOutputs(t *testing.T) {
	h := newProbe(operatorstest.SideOutput[int]("alerts"))
	if err := h.Open(); err != nil {
		t.Fatal(err)
	}
	h.Process("side abc", 42)
	want := []operatorstest.Record[any]{{Value: 3, Timestamp: 42}}
	if got := h.Side["alerts"]; !slices.Equal(got, want) {
		t.Fatalf("Side[alerts] = %v, want %v", got, want)
	}
	if h.Ctx.SideOutput("other") != nil {
		t.Fatal("an unconnected side output is not nil")
	}

	// Without the option the side output is not connected.
	u := newProbe()
	if err := u.Open(); err != nil {
		t.Fatal(err)
	}
	u.Process("side abc", 42)
	if got := u.Values(); !slices.Equal(got, []string{"no side output"}) {
		t.Fatalf("got %v", got)
	}
}

func TestKeyedGivesAMemoryBackendOverAllKeyGroups(t *testing.T) {
	h := newProbe(operatorstest.Keyed(16))
	if h.Ctx.State == nil || h.Ctx.MaxParallelism != 16 {
		t.Fatalf("State %v, MaxParallelism %d", h.Ctx.State, h.Ctx.MaxParallelism)
	}
	if r := h.Ctx.State.KeyGroups(); r.Start != 0 || r.End != 16 || h.Ctx.KeyGroups != r {
		t.Fatalf("backend key groups %v, context %v, want [0,16)", r, h.Ctx.KeyGroups)
	}
	if n := newProbe(); n.Ctx.State != nil {
		t.Fatal("not keyed, yet State is set")
	}
}

// Callbacks run in order of due time, each with the clock at its due time;
// one registered by a callback runs in the same advance when it is due by
// its end; cancelled ones never run.
func TestAdvanceProcessingTime(t *testing.T) {
	h := newProbe(operatorstest.StartAt(time.UnixMilli(1000)))
	if err := h.Open(); err != nil {
		t.Fatal(err)
	}
	pt := h.Ctx.ProcessingTime
	var log []string
	record := func(name string) func(int64) error {
		return func(now int64) error {
			if h.Ctx.Time.Timestamp != operators.NoTimestamp {
				t.Errorf("%s: timestamp %d in a processing-time callback", name, h.Ctx.Time.Timestamp)
			}
			log = append(log, name+"@"+itoa(now))
			return nil
		}
	}
	pt.At(1300, record("c"))
	pt.At(1100, func(now int64) error {
		log = append(log, "a@"+itoa(now))
		pt.At(1150, record("a2"))   // due within this advance
		pt.At(now-50, record("a0")) // already due: runs at once, at now
		return nil
	})
	pt.At(1200, record("b"))
	cancel := pt.At(1250, record("cancelled"))
	pt.At(5000, record("later"))
	cancel()
	cancel() // twice is harmless
	h.Process("emit x", 1)

	if err := h.AdvanceProcessingTime(99 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if len(log) != 0 || h.Now() != 1099 {
		t.Fatalf("ran %v before due; now %d", log, h.Now())
	}
	if err := h.AdvanceProcessingTime(time.Second); err != nil {
		t.Fatal(err)
	}
	want := []string{"a@1100", "a0@1100", "a2@1150", "b@1200", "c@1300"}
	if !slices.Equal(log, want) {
		t.Fatalf("ran %v, want %v", log, want)
	}
	if h.Now() != 2099 {
		t.Fatalf("now %d, want 2099", h.Now())
	}
	if got := h.ProcessingTimers(); !slices.Equal(got, []int64{5000}) {
		t.Fatalf("pending %v, want [5000]", got)
	}
	if err := h.AdvanceProcessingTime(-time.Millisecond); err == nil {
		t.Fatal("going back in time was accepted")
	}
}

// A callback's error, or failure, stops the advance and is returned.
func TestAdvanceProcessingTimeReturnsErrors(t *testing.T) {
	h := newProbe()
	if err := h.Open(); err != nil {
		t.Fatal(err)
	}
	pt := h.Ctx.ProcessingTime
	boom := errors.New("boom")
	start := h.Now()
	ran := 0
	pt.At(start+10, func(int64) error { ran++; return boom })
	pt.At(start+20, func(int64) error { ran++; return nil })
	err := h.AdvanceProcessingTime(time.Second)
	if !errors.Is(err, boom) || ran != 1 || h.Now() != start+10 {
		t.Fatalf("err %v, ran %d, now %+d", err, ran, h.Now()-start)
	}
	pt.At(start+30, func(int64) error { operators.Fail(boom); return nil })
	err = h.AdvanceProcessingTime(time.Second)
	var f *operators.Failure
	if !errors.As(err, &f) || !errors.Is(err, boom) || ran != 2 {
		t.Fatalf("err %v, ran %d: want the failure, after the callback at +20", err, ran)
	}
}

func TestFailures(t *testing.T) {
	h := newProbe()
	if err := h.Open(); err != nil {
		t.Fatal(err)
	}
	err := h.TryProcess("fail bad record", 1)
	var f *operators.Failure
	if !errors.As(err, &f) || f.Err.Error() != "bad record" {
		t.Fatalf("TryProcess = %v, want the failure", err)
	}
	if err := h.TryProcess("emit ok", 1); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if r := recover(); r != "not a failure" {
			t.Fatalf("recovered %v, want the plain panic to go through", r)
		}
	}()
	_ = h.TryProcess("panic not a failure", 1)
	t.Fatal("plain panic swallowed")
}

func itoa(v int64) string { return strconv.FormatInt(v, 10) }
