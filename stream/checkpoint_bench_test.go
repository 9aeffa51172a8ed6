package stream_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/stream"
)

// runFor runs an unbounded keyed rolling count+sum over 1000 sensors at
// parallelism 2 for d and returns the records it processed and the
// checkpoint statistics.
func runFor(b *testing.B, d time.Duration, opts ...stream.Option) (int64, []snapshot.Stats) {
	var n atomic.Int64
	env := stream.NewEnvironment("overhead", append([]stream.Option{stream.WithParallelism(2)}, opts...)...)
	readings := stream.FromSource(env, "generator", generator(0, 1000)).UID("generator")
	stream.Aggregate(stream.KeyBy(readings, bySensor), "count-sum", countSumAgg{}).UID("count-sum").
		ForEach("count", func(countSum) error { n.Add(1); return nil })
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	job, err := env.ExecuteAsync(ctx)
	if err != nil {
		b.Fatal(err)
	}
	var hist []snapshot.Stats
	for {
		select {
		case <-job.Done():
			if err := job.Wait(); err != nil && !errors.Is(err, context.DeadlineExceeded) {
				b.Fatal(err)
			}
			return n.Load(), hist
		case <-time.After(50 * time.Millisecond):
			if h := job.History(); h != nil {
				hist = h
			}
		}
	}
}

// BenchmarkCheckpointOverhead compares throughput with exactly-once
// checkpoints every second (memory backend) against no checkpoints, in the
// same run, over 4 s each.
func BenchmarkCheckpointOverhead(b *testing.B) {
	const d = 4 * time.Second
	var with, without int64
	var hist []snapshot.Stats
	for b.Loop() {
		n, _ := runFor(b, d)
		without += n
		cfg := snapshot.DefaultConfig()
		cfg.Dir = b.TempDir()
		cfg.Interval = time.Second
		n, h := runFor(b, d, stream.WithCheckpointing(cfg))
		with += n
		hist = append(hist, h...)
	}
	secs := float64(b.N) * d.Seconds()
	b.ReportMetric(float64(with)/secs, "records/s")
	b.ReportMetric(float64(without)/secs, "no-checkpoint-records/s")
	b.ReportMetric(float64(with)/float64(without), "with/without")
	var done int
	var dur, align time.Duration
	var size int64
	for _, s := range hist {
		if s.Status == snapshot.Completed {
			done++
			dur += s.Duration
			align += s.Alignment
			size += s.Size
		}
	}
	if done > 0 {
		b.ReportMetric(float64(done)/float64(b.N), "checkpoints/op")
		b.ReportMetric(float64(dur.Milliseconds())/float64(done), "ms/checkpoint")
		b.ReportMetric(float64(align.Microseconds())/float64(done), "µs-alignment/checkpoint")
		b.ReportMetric(float64(size)/float64(done), "bytes/checkpoint")
	}
}

// BenchmarkStateBackend runs the keyed rolling count+sum over 1000 sensors
// at parallelism 2 on the bbolt backend and on the memory backend, same
// run.
func BenchmarkStateBackend(b *testing.B) {
	var mem, bolt time.Duration
	job := func(opts ...stream.Option) *stream.Environment {
		env := stream.NewEnvironment("backend", append([]stream.Option{stream.WithParallelism(2)}, opts...)...)
		readings := stream.FromSource(env, "generator", generator(benchRecords, 1000))
		stream.Aggregate(stream.KeyBy(readings, bySensor), "count-sum", countSumAgg{}).UID("count-sum").
			ForEach("discard", func(countSum) error { return nil })
		return env
	}
	for b.Loop() {
		env := job()
		start := time.Now()
		runBench(b, env)
		mem += time.Since(start)
		env = job(stream.WithBoltStateBackend(b.TempDir()))
		start = time.Now()
		runBench(b, env)
		bolt += time.Since(start)
	}
	n := float64(b.N) * benchRecords
	b.ReportMetric(n/bolt.Seconds(), "records/s")
	b.ReportMetric(n/mem.Seconds(), "memory-records/s")
	b.ReportMetric(mem.Seconds()/bolt.Seconds(), "bolt/memory")
}
