package stream_test

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/stream"
	"github.com/edgedio/edged/watermark"
)

// countAvg is a window's count and sum of temperatures (hundredths).
type countAvg struct {
	Count int64
	Sum   int64
}

type countAvgAgg struct{}

func (countAvgAgg) CreateAccumulator() countAvg { return countAvg{} }
func (countAvgAgg) Add(r operators.SensorReading, a countAvg) countAvg {
	return countAvg{Count: a.Count + 1, Sum: a.Sum + centi(r.Temperature)}
}
func (countAvgAgg) Result(a countAvg) countAvg { return a }
func (countAvgAgg) Merge(a, b countAvg) countAvg {
	return countAvg{Count: a.Count + b.Count, Sum: a.Sum + b.Sum}
}

func eventTime(r operators.SensorReading) int64 { return r.Timestamp * 1000 }

// loopTumbling is the baseline: one goroutine computing the same tumbling
// window count+sum per sensor over the same records, emitting a window when
// the stream passes its end (the records are in time order).
func loopTumbling(n int64, keys int, size int64) int {
	g := operators.SensorGenerator(operators.GeneratorConfig{Count: n, Keys: keys})
	type wk struct {
		id    string
		start int64
	}
	open := make(map[wk]countAvg, keys)
	emitted := 0
	var current int64 = -1
	col := operators.CollectorFunc[operators.SensorReading](func(r operators.SensorReading) {
		ts := eventTime(r)
		start := ts - ts%size
		if start != current {
			// every window of the previous period is complete
			for k := range open {
				if k.start < start {
					delete(open, k)
					emitted++
				}
			}
			current = start
		}
		k := wk{r.ID, start}
		a := open[k]
		open[k] = countAvg{Count: a.Count + 1, Sum: a.Sum + centi(r.Temperature)}
	})
	if err := g.Open(&operators.Context{Parallelism: 1}); err != nil {
		panic(err)
	}
	for {
		if st, _ := g.Poll(col, 4096); st == operators.EndOfInput {
			return emitted + len(open)
		}
	}
}

// denseGenerator is like the sensor generator but gives each key perSecond
// readings per second of event time.
func denseGenerator(count int64, keys, perSecond int) func() operators.Source[operators.SensorReading] {
	ids := make([]string, keys)
	for k := range ids {
		ids[k] = fmt.Sprintf("sensor_%d", k)
	}
	return func() operators.Source[operators.SensorReading] {
		return operators.NewGenerator(operators.GeneratorConfig{Count: count}, func(i int64) operators.SensorReading {
			return operators.SensorReading{
				ID:          ids[i%int64(keys)],
				Timestamp:   operators.DefaultGeneratorStart + i/int64(keys*perSecond),
				Temperature: float64(2000+i%2000) / 100,
			}
		})
	}
}

func windowJob(p, keys, perSecond int, a operators.WindowAssigner) *stream.Environment {
	env := stream.NewEnvironment("window-bench", stream.WithParallelism(p))
	readings := stream.FromSource(env, "generator", denseGenerator(benchRecords, keys, perSecond)).
		AssignTimestampsAndWatermarks("timestamps", watermark.ForMonotonous(eventTime))
	w := stream.Window(stream.KeyBy(readings, bySensor), a)
	stream.WindowAggregate(w, "count-avg", countAvgAgg{}).UID("count-avg").
		ForEach("discard", func(operators.WindowResult[string, countAvg]) error { return nil })
	return env
}

// BenchmarkTumblingWindow is a keyed 10 s tumbling-window count+avg over
// 1000 sensors against the hand-written loop over the same records.
func BenchmarkTumblingWindow(b *testing.B) {
	for _, p := range []int{1, 2} {
		b.Run(fmt.Sprintf("p=%d", p), func(b *testing.B) {
			b.ReportAllocs()
			var engine, loop time.Duration
			for b.Loop() {
				start := time.Now()
				loopTumbling(benchRecords, 1000, 10_000)
				loop += time.Since(start)
				env := windowJob(p, 1000, 1, operators.TumblingEventTimeWindows(10*time.Second))
				start = time.Now()
				runBench(b, env)
				engine += time.Since(start)
			}
			reportRatio(b, engine, loop)
		})
	}
}

// BenchmarkSlidingWindow compares a 60 s window sliding every 1 s with a
// 60 s tumbling window over the same records of 1000 keys, same run: the
// cost per record of sliding relative to tumbling, by wall-clock time
// (sliding/tumbling) and by the process's CPU time (cpu-sliding/tumbling,
// which contention on a shared machine distorts far less). Each record is
// stored once, in its 1 s slice, and each result comes from an
// incrementally maintained window aggregate. With one reading per key per
// second, sliding emits one result per record, 60 times the results of
// tumbling; with 10 readings per key per second, one per 10 records.
func BenchmarkSlidingWindow(b *testing.B) {
	for _, per := range []int{1, 10} {
		b.Run(fmt.Sprintf("per-key-per-second=%d", per), func(b *testing.B) {
			var sliding, tumbling, slidingCPU, tumblingCPU time.Duration
			for b.Loop() {
				env := windowJob(1, 1000, per, operators.TumblingEventTimeWindows(60*time.Second))
				start, cpu := time.Now(), processCPU()
				runBench(b, env)
				tumbling += time.Since(start)
				tumblingCPU += processCPU() - cpu
				env = windowJob(1, 1000, per, operators.SlidingEventTimeWindows(60*time.Second, time.Second))
				start, cpu = time.Now(), processCPU()
				runBench(b, env)
				sliding += time.Since(start)
				slidingCPU += processCPU() - cpu
			}
			n := float64(b.N) * benchRecords
			b.ReportMetric(n/sliding.Seconds(), "records/s")
			b.ReportMetric(n/tumbling.Seconds(), "tumbling-records/s")
			b.ReportMetric(sliding.Seconds()/tumbling.Seconds(), "sliding/tumbling")
			b.ReportMetric(float64(slidingCPU.Nanoseconds())/n, "cpu-ns/record")
			b.ReportMetric(float64(tumblingCPU.Nanoseconds())/n, "tumbling-cpu-ns/record")
			b.ReportMetric(slidingCPU.Seconds()/tumblingCPU.Seconds(), "cpu-sliding/tumbling")
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
