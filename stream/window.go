package stream

import (
	"fmt"
	"time"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/operators"
)

// WindowedStream is a keyed stream cut into windows; finish it with
// Reduce, WindowAggregate or WindowProcess.
type WindowedStream[T any, K comparable] struct {
	k        *KeyedStream[T, K]
	assigner operators.WindowAssigner
	lateness time.Duration
	lateTag  string
	// errs are the problems of the assigner and the lateness, reported
	// with the name of the window operator that finishes the stream.
	errs []error
}

// Window cuts the keyed stream into windows by assigner. A bad assigner
// (a size, slide or gap under 1ms, a slide above the size) is refused by
// Plan and Execute with an error naming the window operator.
func Window[T any, K comparable](k *KeyedStream[T, K], assigner operators.WindowAssigner) *WindowedStream[T, K] {
	k.must("Window")
	w := &WindowedStream[T, K]{k: k, assigner: assigner}
	if err := assigner.Validate(); err != nil {
		w.errs = append(w.errs, err)
	}
	return w
}

// AllowedLateness keeps each event-time window's state for d after the
// watermark passed its end: records arriving in that time update the
// window and make it fire again. Records later than that go to the
// late-data side output (SideOutputLateData) or are dropped and counted.
// A negative d, or one that is not a whole number of milliseconds (window
// times are whole milliseconds), is refused by Plan and Execute.
func (w *WindowedStream[T, K]) AllowedLateness(d time.Duration) *WindowedStream[T, K] {
	w.must("AllowedLateness")
	switch {
	case d < 0:
		w.errs = append(w.errs, fmt.Errorf("window.allowed_lateness (%v) must not be negative", d))
	case d%time.Millisecond != 0:
		w.errs = append(w.errs, fmt.Errorf("window.allowed_lateness (%v) must be a whole number of milliseconds (window times are whole milliseconds)", d))
	}
	w.lateness = d
	return w
}

// SideOutputLateData sends records that came after their windows were
// cleaned up to tag; read them with SideOutput on the window's result. A
// tag with an empty id is refused by Plan and Execute.
func (w *WindowedStream[T, K]) SideOutputLateData(tag operators.OutputTag[T]) *WindowedStream[T, K] {
	w.must("SideOutputLateData")
	if tag.ID() == "" {
		// An empty lateTag means no side output: the late records would
		// be dropped while the job reads the tag.
		w.errs = append(w.errs, fmt.Errorf("SideOutputLateData: %w", errEmptyTag))
	}
	w.lateTag = tag.ID()
	return w
}

func windowOperator[T any, K comparable, O any](w *WindowedStream[T, K], name string, build func(out operators.Collector[O]) (operators.OneInput[T], error)) *Stream[O] {
	out := Transform(w.k.s, name, func(out operators.Collector[O]) operators.OneInput[T] {
		op, err := build(out)
		if err != nil {
			operators.Fail(err)
		}
		return op
	})
	// Build once now so that a bad combination is reported before Execute;
	// a bad assigner, which the build reports again, only once.
	errs := w.errs
	if _, err := build(nil); err != nil && len(errs) == 0 {
		errs = append(errs, err)
	}
	for _, err := range errs {
		w.k.s.env.addError(fmt.Errorf("stream: operator %q: %w", name, err))
	}
	out.env.keyedState(out.v, "window", actors.WindowStateSetting(w.assigner.StateDigest()))
	if w.lateTag != "" {
		SideOutput(out, operators.NewOutputTag[T](w.lateTag))
	}
	return out
}

// WindowAggregate folds each window's records per key with agg and emits
// one WindowResult per key and window when the window fires (and again for
// each late record within the allowed lateness). Sliding and session
// windows need agg to implement operators.Merger. The operator needs a UID.
func WindowAggregate[T any, K comparable, A, R any](w *WindowedStream[T, K], name string, agg operators.AggregateFunction[T, A, R]) *Stream[operators.WindowResult[K, R]] {
	w.must(called("WindowAggregate", name))
	if agg == nil {
		w.k.s.env.nilFunc(name, "the aggregate function")
	}
	return windowOperator(w, name, func(out operators.Collector[operators.WindowResult[K, R]]) (operators.OneInput[T], error) {
		return operators.NewWindowAggregate(name, w.k.key, w.assigner, w.lateness, w.lateTag, agg, out)
	})
}

// Reduce combines each window's records per key with fn.
func (w *WindowedStream[T, K]) Reduce(name string, fn func(a, b T) (T, error)) *Stream[operators.WindowResult[K, T]] {
	w.must(called("Reduce", name))
	if fn == nil {
		w.k.s.env.nilFunc(name, "the reduce function")
	}
	return WindowAggregate(w, name, operators.ReduceFunction(fn))
}

// WindowProcess keeps every record of a window and calls fn with all of
// them when it fires.
func WindowProcess[T any, K comparable, O any](w *WindowedStream[T, K], name string, fn operators.ProcessWindowFunction[K, T, O]) *Stream[O] {
	w.must(called("WindowProcess", name))
	if fn == nil {
		w.k.s.env.nilFunc(name, "the window function")
	}
	return windowOperator(w, name, func(out operators.Collector[O]) (operators.OneInput[T], error) {
		return operators.NewWindowProcess(name, w.k.key, w.assigner, w.lateness, w.lateTag, fn, out)
	})
}
