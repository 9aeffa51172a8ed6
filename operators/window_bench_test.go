package operators_test

import (
	"fmt"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/operators/operatorstest"
)

// BenchmarkSlidingWindowOperator drives the window operator alone (no
// runtime): 1000 keys, perSecond records per key and second of event time,
// a watermark every second, a 60 s window sliding every 1 s against a 60 s
// tumbling window in the same run, the sliding window merging all slices
// of a window per result (the earlier way), and 1 s tumbling windows,
// which emit as many results as the sliding ones and merge nothing: the
// cost of firing a window, the floor of the sliding windows at one record
// per key and window. It reports the CPU time per record and the ratios to
// tumbling (cpu-sliding/tumbling is the target's) and to the floor.
func BenchmarkSlidingWindowOperator(b *testing.B) {
	const maxKeys = 1000
	ids := make([]string, maxKeys)
	for i := range ids {
		ids[i] = fmt.Sprintf("sensor_%d", i)
	}
	run := func(a operators.WindowAssigner, keys, seconds, perSecond int, mergeAll, stats bool) time.Duration {
		h := operatorstest.New(func(out operators.Collector[result]) operators.OneInput[ev] {
			if stats {
				return buildWindow(b, a, mergeAll, operators.AggregateFunction[ev, statsAcc, statsAcc](statsAgg{}), operators.CollectorFunc[operators.WindowResult[string, statsAcc]](func(operators.WindowResult[string, statsAcc]) {}))
			}
			return buildWindow(b, a, mergeAll, operators.AggregateFunction[ev, cs, cs](csAgg{}), out)
		}, operatorstest.Keyed(128))
		if err := h.Open(); err != nil {
			b.Fatal(err)
		}
		runtime.GC() // the garbage of the previous run is not this one's cost
		start := processCPU()
		for s := range int64(seconds) {
			for r := range perSecond {
				for _, id := range ids[:keys] {
					ts := s*1000 + int64(r)*1000/int64(perSecond)
					h.Process(ev{Key: id, TS: ts, V: s}, ts)
				}
			}
			if err := h.Watermark(s*1000 + 999); err != nil {
				b.Fatal(err)
			}
			h.Out = h.Out[:0]
		}
		d := processCPU() - start
		return d
	}
	for _, c := range []struct {
		per   int
		stats bool
		size  time.Duration
	}{{1, false, time.Minute}, {10, false, time.Minute}, {1, true, time.Minute}, {10, true, time.Minute}, {1, false, 10 * time.Minute}} {
		name := fmt.Sprintf("per-key-per-second=%d", c.per)
		if c.stats {
			name += "/agg=stats"
		}
		// 1000 keys over 200 s; 100 keys over 1000 s for 10 min windows.
		keys, seconds := maxKeys, 200
		if c.size != time.Minute {
			name += "/size=" + c.size.String()
			keys, seconds = 100, 1000
		}
		per := c.per
		b.Run(name, func(b *testing.B) {
			var sliding, tumbling, mergeAll, firing time.Duration
			slide := operators.SlidingEventTimeWindows(c.size, time.Second)
			for b.Loop() {
				mergeAll += run(slide, keys, seconds, per, true, c.stats)
				tumbling += run(operators.TumblingEventTimeWindows(c.size), keys, seconds, per, false, c.stats)
				sliding += run(slide, keys, seconds, per, false, c.stats)
				firing += run(operators.TumblingEventTimeWindows(time.Second), keys, seconds, per, false, c.stats)
			}
			n := float64(b.N * keys * seconds * per)
			b.ReportMetric(float64(sliding.Nanoseconds())/n, "cpu-ns/record")
			b.ReportMetric(float64(tumbling.Nanoseconds())/n, "tumbling-cpu-ns/record")
			b.ReportMetric(sliding.Seconds()/tumbling.Seconds(), "cpu-sliding/tumbling")
			b.ReportMetric(mergeAll.Seconds()/tumbling.Seconds(), "cpu-mergeall/tumbling")
			b.ReportMetric(sliding.Seconds()/firing.Seconds(), "cpu-sliding/tumbling-1s")
		})
	}
}

// processCPU returns the CPU time the process has used, user and system.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func buildWindow[A, R any](b *testing.B, a operators.WindowAssigner, mergeAll bool, agg operators.AggregateFunction[ev, A, R], out operators.Collector[operators.WindowResult[string, R]]) operators.OneInput[ev] {
	if mergeAll {
		return operators.NewMergeAllWindowAggregate("w", evKey, a, 0, "", agg, out)
	}
	op, err := operators.NewWindowAggregate("w", evKey, a, 0, "", agg, out)
	if err != nil {
		b.Fatal(err)
	}
	return op
}

// statsOps are the aggregates of statsAgg, like those of a declared
// pipeline: count, sum, min, max, avg, first, last.
var statsOps = []string{"count", "sum", "min", "max", "avg", "first", "last"}

// statsAcc is the accumulator of statsAgg, one entry per aggregate.
type statsAcc struct {
	A [8]struct{ N, V, T int64 }
}

// statsAgg computes several aggregates per window, by name, as a
// declared pipeline's windows do: its Merge costs more than a count's.
type statsAgg struct{}

func (statsAgg) CreateAccumulator() statsAcc   { return statsAcc{} }
func (statsAgg) Result(a statsAcc) statsAcc    { return a }
func (statsAgg) Add(e ev, a statsAcc) statsAcc { return statsAgg{}.Merge(a, statsOne(e)) }

func statsOne(e ev) statsAcc {
	var a statsAcc
	for i := range statsOps {
		a.A[i].N, a.A[i].V, a.A[i].T = 1, e.V, e.TS
	}
	return a
}

func (statsAgg) Merge(l, r statsAcc) statsAcc {
	for i, op := range statsOps {
		x, y := &l.A[i], r.A[i]
		if y.N == 0 {
			continue
		}
		if x.N == 0 {
			*x = y
			continue
		}
		switch op {
		case "sum", "avg":
			x.V += y.V
		case "min":
			x.V = min(x.V, y.V)
		case "max":
			x.V = max(x.V, y.V)
		case "first":
			if y.T < x.T {
				x.V, x.T = y.V, y.T
			}
		case "last":
			if y.T >= x.T {
				x.V, x.T = y.V, y.T
			}
		}
		x.N += y.N
	}
	return l
}
