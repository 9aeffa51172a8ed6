package pipeline

import (
	"fmt"
	"math"
	"strings"

	"github.com/edgedio/edged/operators"
)

// aggAcc is the accumulator of one aggregate: the number of values, the
// running value (sum, min, max, first or last) and, for first and last,
// the timestamp of that value.
type aggAcc struct {
	N int64
	V float64
	T int64
}

// WindowAcc is the accumulator of a window's aggregates. It is exported
// only so that the runtime's codec can encode it.
type WindowAcc struct {
	A [maxAggregates]aggAcc
}

// windowAgg folds rows into a WindowAcc, per the plan's aggregates. It
// implements operators.AggregateFunction and operators.Merger.
type windowAgg struct {
	pl *plan
}

var (
	_ operators.AggregateFunction[Row, WindowAcc, WindowAcc] = windowAgg{}
	_ operators.Merger[WindowAcc]                            = windowAgg{}
)

func (windowAgg) CreateAccumulator() WindowAcc { return WindowAcc{} }

// ts is the record's order for first and last: its event time, or 0 (then
// arrival order decides). With event time, readings of one time are
// ordered by value (see before), not by arrival.
func (a windowAgg) ts(r *Row) int64 {
	if a.pl.eventTime {
		return r.Int(a.pl.ts.Slot)
	}
	return 0
}

func (a windowAgg) Add(r Row, acc WindowAcc) WindowAcc {
	t := a.ts(&r)
	for i := range a.pl.aggs {
		s := &a.pl.aggs[i]
		x := &acc.A[i]
		if s.fn == "count" {
			x.N++
			continue
		}
		v := r.Number(s.field)
		x.add(s.fn, v, t, a.pl.eventTime)
	}
	return acc
}

// before reports whether value a comes before b among readings of one
// event time for first and last: the lower value first, -0 before 0. The
// readings of a key reach the window over one channel per decoding
// subtask, interleaved differently in every run and in a replay, so their
// arrival order must not choose among readings of one time (a device
// stamping in whole seconds).
func before(a, b float64) bool {
	return a < b || (a == b && math.Signbit(a) && !math.Signbit(b))
}

// add folds in value v of time t. byValue (event time) orders readings of
// one time by value; without it (processing time, t is 0) arrival order
// decides.
func (x *aggAcc) add(fn string, v float64, t int64, byValue bool) {
	switch fn {
	case "sum", "avg":
		x.V += v
	case "min":
		// math.Min, as Merge: -0 is below 0 whichever comes first.
		if x.N == 0 {
			x.V = v
		} else {
			x.V = math.Min(x.V, v)
		}
	case "max":
		if x.N == 0 {
			x.V = v
		} else {
			x.V = math.Max(x.V, v)
		}
	case "first":
		if x.N == 0 || t < x.T || (byValue && t == x.T && before(v, x.V)) {
			x.V, x.T = v, t
		}
	case "last":
		if x.N == 0 || t > x.T || (t == x.T && (!byValue || before(x.V, v))) {
			x.V, x.T = v, t
		}
	}
	x.N++
}

func (a windowAgg) Merge(l, r WindowAcc) WindowAcc {
	for i := range a.pl.aggs {
		x, y := &l.A[i], r.A[i]
		if y.N == 0 {
			continue
		}
		if x.N == 0 {
			*x = y
			continue
		}
		byValue := a.pl.eventTime
		switch a.pl.aggs[i].fn {
		case "count":
			x.N += y.N
			continue
		case "first":
			if y.T < x.T || (byValue && y.T == x.T && before(y.V, x.V)) {
				x.V, x.T = y.V, y.T
			}
		case "last":
			if y.T > x.T || (y.T == x.T && (!byValue || before(x.V, y.V))) {
				x.V, x.T = y.V, y.T
			}
		case "sum", "avg":
			x.V += y.V
		case "min":
			x.V = math.Min(x.V, y.V)
		case "max":
			x.V = math.Max(x.V, y.V)
		}
		x.N += y.N
	}
	return l
}

func (windowAgg) Result(acc WindowAcc) WindowAcc { return acc }

// row turns a window result into a result row of pl.winSchema.
func (pl *plan) windowRow(w operators.WindowResult[string, WindowAcc]) Row {
	var r Row
	r.SetStr(pl.winKey.Slot, w.Key)
	r.SetInt(pl.winStart.Slot, w.Window.Start)
	r.SetInt(pl.winEnd.Slot, w.Window.End)
	for i := range pl.aggs {
		s, x := &pl.aggs[i], w.Value.A[i]
		switch s.fn {
		case "count":
			r.SetInt(s.out.Slot, x.N)
		case "avg":
			r.SetFloat(s.out.Slot, x.V/float64(x.N))
		default:
			r.SetFloat(s.out.Slot, x.V)
		}
	}
	return r
}

// aggregatesDigest is the window operator's state settings
// (stream.StateSettings): its accumulator keeps one slot per aggregate,
// by position, so a snapshot restores only into the same functions of
// the same fields in the same order (the output names may change).
func aggregatesDigest(aggs []AggregateConfig) string {
	var b strings.Builder
	b.WriteString("aggregates")
	for _, a := range aggs {
		field := a.Field
		if a.Fn == "count" {
			field = ""
		}
		fmt.Fprintf(&b, " %s(%s)", a.Fn, field)
	}
	return b.String()
}
