package stream_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/stream"
)

const benchRecords = 1_000_000

// loopCountSum is the baseline: one goroutine, a plain map, the same
// generated records and the same count+sum per sensor.
func loopCountSum(n int64, keys int) map[string]countSum {
	g := operators.SensorGenerator(operators.GeneratorConfig{Count: n, Keys: keys})
	m := make(map[string]countSum, keys)
	col := operators.CollectorFunc[operators.SensorReading](func(r operators.SensorReading) {
		cs := m[r.ID]
		cs.ID = r.ID
		cs.Count++
		cs.Sum += centi(r.Temperature)
		m[r.ID] = cs
	})
	if err := g.Open(&operators.Context{Parallelism: 1}); err != nil {
		panic(err)
	}
	for {
		st, _ := g.Poll(col, 4096)
		if st == operators.EndOfInput {
			return m
		}
	}
}

func runBench(b *testing.B, env *stream.Environment) {
	b.Helper()
	if err := env.Execute(context.Background()); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkKeyedRolling is a keyed rolling count+sum over 1000 sensors,
// against the hand-written loop over the same records in the same run.
func BenchmarkKeyedRolling(b *testing.B) {
	for _, p := range []int{1, 2} {
		b.Run(fmt.Sprintf("p=%d", p), func(b *testing.B) {
			b.ReportAllocs()
			var engine, loop time.Duration
			for b.Loop() {
				start := time.Now()
				loopCountSum(benchRecords, 1000)
				loop += time.Since(start)

				env := stream.NewEnvironment("bench", stream.WithParallelism(p))
				readings := stream.FromSource(env, "generator", generator(benchRecords, 1000))
				stream.Aggregate(stream.KeyBy(readings, bySensor), "count-sum", countSumAgg{}).UID("count-sum").
					ForEach("discard", func(countSum) error { return nil })
				start = time.Now()
				runBench(b, env)
				engine += time.Since(start)
			}
			reportRatio(b, engine, loop)
		})
	}
}

func reportRatio(b *testing.B, engine, loop time.Duration) {
	n := float64(b.N) * benchRecords
	b.ReportMetric(n/engine.Seconds(), "records/s")
	b.ReportMetric(n/loop.Seconds(), "loop-records/s")
	b.ReportMetric(loop.Seconds()/engine.Seconds(), "engine/loop")
}

// BenchmarkChainedMapFilter measures a chained generator -> map -> filter ->
// sink path; allocs/record should stay under 1.
func BenchmarkChainedMapFilter(b *testing.B) {
	var ms0, ms1 runtime.MemStats
	var engine time.Duration
	var mallocs uint64
	for b.Loop() {
		env := stream.NewEnvironment("chain")
		src := stream.FromSource(env, "generator", generator(benchRecords, 1000))
		m := stream.Map(src, "map", func(r operators.SensorReading) (float64, error) { return r.Temperature, nil })
		m.Filter("filter", func(t float64) bool { return t > 25 }).ForEach("discard", func(float64) error { return nil })
		runtime.ReadMemStats(&ms0)
		start := time.Now()
		runBench(b, env)
		engine += time.Since(start)
		runtime.ReadMemStats(&ms1)
		mallocs += ms1.Mallocs - ms0.Mallocs
	}
	n := float64(b.N) * benchRecords
	b.ReportMetric(n/engine.Seconds(), "records/s")
	b.ReportMetric(float64(mallocs)/n, "allocs/record")
}

// BenchmarkKeyByEdge moves records through one key-by edge, with and
// without encoding them on the way.
func BenchmarkKeyByEdge(b *testing.B) {
	for _, ser := range []bool{false, true} {
		b.Run(fmt.Sprintf("serialized=%v", ser), func(b *testing.B) {
			b.ReportAllocs()
			var engine time.Duration
			for b.Loop() {
				env := stream.NewEnvironment("edge", stream.WithParallelism(2), stream.WithSerializedKeyBy(ser))
				src := stream.FromSource(env, "generator", generator(benchRecords, 1000))
				stream.KeyBy(src, bySensor).Stream().ForEach("discard", func(operators.SensorReading) error { return nil })
				start := time.Now()
				runBench(b, env)
				engine += time.Since(start)
			}
			b.ReportMetric(float64(b.N)*benchRecords/engine.Seconds(), "records/s")
		})
	}
}
