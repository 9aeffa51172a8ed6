package stream_test

import (
	"context"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/stream"
	"github.com/edgedio/edged/watermark"
)

// idleSplitSource is a source of two subtasks. Subtask 1 emits readings
// at 0..999 ms in one poll and then marks its stream idle, as a split
// whose node died does. Subtask 0 emits readings of 60 s. Both then wait
// for release before their input ends.
type idleSplitSource struct {
	operators.Base
	ctx     *operators.Context
	release chan struct{}
	idleNow chan struct{} // closed by subtask 1 once its stream is idle
	done    bool
	idled   bool
}

func (s *idleSplitSource) Open(ctx *operators.Context) error {
	s.ctx = ctx
	return nil
}

func (s *idleSplitSource) Poll(out operators.Collector[operators.SensorReading], _ int) (operators.Status, error) {
	if s.ctx.Subtask == 1 {
		if !s.done {
			for ts := int64(0); ts < 1000; ts += 100 {
				out.Collect(operators.SensorReading{ID: "b", Timestamp: ts})
			}
			s.done = true
			return operators.MoreAvailable, nil
		}
		if !s.idled {
			s.ctx.EmitIdle(true)
			s.idled = true
			close(s.idleNow)
		}
	}
	if !s.done && s.ctx.Subtask == 0 {
		for ts := int64(0); ts < 60_000; ts += 100 {
			out.Collect(operators.SensorReading{ID: "a", Timestamp: ts})
		}
		s.done = true
		return operators.MoreAvailable, nil
	}
	select {
	case <-s.release:
		return operators.EndOfInput, nil
	default:
		return operators.NothingAvailable, nil
	}
}

func (s *idleSplitSource) Available() <-chan struct{} { return s.release }

// A split that emitted readings and then went idle for good must not hold
// the windows back: its timestamp assigner's next periodic watermark,
// which comes after the idle mark, is held while its output is idle
// instead of making the output active again, so the windows follow the
// other split's watermark. (The case of a dead cluster node's source
// split restored on a live node with readings its assigner had not yet
// turned into a watermark.)
func TestIdleSplitDoesNotHoldWindowsBack(t *testing.T) {
	clock := clockwork.NewFakeClock()
	release, idleNow := make(chan struct{}), make(chan struct{})
	sink := &resultSink{}
	env := stream.NewEnvironment("idle-split", stream.WithParallelism(2), stream.WithClock(clock))
	src := stream.FromSource(env, "readings", func() operators.Source[operators.SensorReading] {
		return &idleSplitSource{release: release, idleNow: idleNow}
	})
	timed := src.AssignTimestampsAndWatermarks("event-time", watermark.ForBoundedOutOfOrderness(0, func(r operators.SensorReading) int64 { return r.Timestamp }))
	w := stream.Window(stream.KeyBy(timed, bySensor), operators.TumblingEventTimeWindows(time.Second))
	stream.WindowAggregate(w, "count-sum", countSumMerge{}).UID("count-sum").ForEach("sink", sink.add)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	job, err := env.ExecuteAsync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The assigners emit on the processing-time clock, which has not
	// moved yet: the idle mark comes before subtask 1's first watermark.
	select {
	case <-idleNow:
	case <-ctx.Done():
		t.Fatal("subtask 1 did not go idle")
	}
	// Move the clock until sensor a's windows up to 50 s fired.
	fired := func() bool {
		n := 0
		for _, r := range sink.sorted() {
			if r.Key == "a" && r.Window.End <= 50_000 {
				n++
			}
		}
		return n == 50
	}
	ok := testutil.Within(20*time.Second, func() bool {
		clock.Advance(watermark.DefaultInterval)
		return fired()
	})
	if !ok {
		var last int64
		for _, r := range sink.sorted() {
			last = max(last, r.Window.End)
		}
		t.Fatalf("the windows are held back by the idle split: the last window fired ends at %d ms, want 50000 or more", last)
	}
	close(release)
	if err := job.Wait(); err != nil {
		t.Fatal(err)
	}
	var a, b int64
	for _, r := range sink.sorted() {
		switch r.Key {
		case "a":
			a += r.Value.Count
		case "b":
			b += r.Value.Count
		}
	}
	if a != 600 || b != 10 {
		t.Fatalf("counted %d readings of a and %d of b, want 600 and 10", a, b)
	}
}
