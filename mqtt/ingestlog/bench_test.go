package ingestlog

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// benchPayload is a 45-byte JSON sensor reading, the size the edged
// pipeline benchmarks use.
var benchPayload = []byte(`{"id":"sensor_042","ts":1700000000,"v":21.53}`)

func benchMessage(i int) Message {
	return Message{Topic: fmt.Sprintf("sensors/%d", i%1000), Payload: benchPayload, QoS: 1}
}

// BenchmarkAppend measures durable appends with 1, 8 and 64 concurrent
// appenders (each waiting for its Append, like devices waiting for their
// PUBACK), with a 2 ms group commit window and without one. The baseline
// is one goroutine doing write+fsync per record on a bare file: what a log
// without group commit would get.
func BenchmarkAppend(b *testing.B) {
	if len(benchPayload) != 45 {
		b.Fatalf("payload of %d bytes", len(benchPayload))
	}
	b.Run("baseline=write+fsync", func(b *testing.B) {
		f, err := os.Create(filepath.Join(b.TempDir(), "bare"))
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		m := benchMessage(0)
		frame := appendFrame(nil, &m)
		b.ReportAllocs()
		for b.Loop() {
			if _, err := f.Write(frame); err != nil {
				b.Fatal(err)
			}
			if err := f.Sync(); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "appends/s")
		b.ReportMetric(1, "fsyncs/append")
	})
	for _, interval := range []time.Duration{2 * time.Millisecond, 0} {
		for _, appenders := range []int{1, 8, 64} {
			b.Run(fmt.Sprintf("sync=%s/appenders=%d", interval, appenders), func(b *testing.B) {
				benchAppend(b, interval, appenders)
			})
		}
	}
}

func benchAppend(b *testing.B, interval time.Duration, appenders int) {
	opts := DefaultOptions()
	opts.SyncInterval = interval
	opts.MaxBytes = 0
	l, err := Open(b.TempDir(), opts, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	msgs := make([]Message, 1000)
	for i := range msgs {
		msgs[i] = benchMessage(i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	// b.Loop cannot spread iterations over goroutines; the appenders take
	// b.N appends from a shared counter.
	var next atomic.Int64
	var wg sync.WaitGroup
	for range appenders {
		wg.Go(func() {
			for i := next.Add(1); i <= int64(b.N); i = next.Add(1) {
				if _, err := l.Append(context.Background(), msgs[i%1000]); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	st := l.Stats()
	sec := b.Elapsed().Seconds()
	b.ReportMetric(float64(b.N)/sec, "appends/s")
	b.ReportMetric(float64(st.Fsyncs)/float64(b.N), "fsyncs/append")
	b.ReportMetric(sec*float64(appenders)/float64(b.N)*1e6, "µs/append-latency")
}

// buildBenchLog writes n benchmark records into dir as segments of
// segmentBytes, directly (no fsync per record), and returns the bytes
// written.
func buildBenchLog(b *testing.B, dir string, n int, segmentBytes int64) int64 {
	b.Helper()
	var total int64
	var seg []byte
	base := 0
	flush := func(next int) {
		if len(seg) == 0 {
			return
		}
		if err := os.WriteFile(filepath.Join(dir, segmentName(uint64(base))), seg, 0o644); err != nil {
			b.Fatal(err)
		}
		total += int64(len(seg))
		seg, base = nil, next
	}
	for i := range n {
		m := benchMessage(i)
		if seg != nil && int64(len(seg))+frameSize(&m) > segmentBytes {
			flush(i)
		}
		if seg == nil {
			seg = encodeHeader(uint64(i))
		}
		seg = appendFrame(seg, &m)
	}
	flush(n)
	return total
}

// BenchmarkRead measures a Reader going through 200k records, against the
// baseline of reading the same segment files raw.
func BenchmarkRead(b *testing.B) {
	const n = 200_000
	dir := b.TempDir()
	total := buildBenchLog(b, dir, n, 8<<20)
	opts := DefaultOptions()
	l, err := Open(dir, opts, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()

	b.Run("baseline=raw-read", func(b *testing.B) {
		buf := make([]byte, readBufferSize)
		b.SetBytes(total)
		for b.Loop() {
			for _, name := range segmentFiles(b, dir) {
				f, err := os.Open(filepath.Join(dir, name))
				if err != nil {
					b.Fatal(err)
				}
				if _, err := io.CopyBuffer(io.Discard, onlyReader{f}, buf); err != nil {
					b.Fatal(err)
				}
				f.Close()
			}
		}
		b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "records/s")
	})
	b.Run("reader", func(b *testing.B) {
		b.SetBytes(total)
		b.ReportAllocs()
		for b.Loop() {
			r, err := l.Reader(0)
			if err != nil {
				b.Fatal(err)
			}
			count := 0
			for {
				_, ok, err := r.TryNext()
				if err != nil {
					b.Fatal(err)
				}
				if !ok {
					break
				}
				count++
			}
			r.Close()
			if count != n {
				b.Fatalf("read %d records", count)
			}
		}
		b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "records/s")
	})
}

// onlyReader hides WriterTo so io.CopyBuffer uses the buffer.
type onlyReader struct{ r io.Reader }

func (o onlyReader) Read(p []byte) (int, error) { return o.r.Read(p) }

// BenchmarkOpen measures recovery: reading and checking every record of a
// 200k-record log.
func BenchmarkOpen(b *testing.B) {
	const n = 200_000
	dir := b.TempDir()
	total := buildBenchLog(b, dir, n, 8<<20)
	b.SetBytes(total)
	for b.Loop() {
		l, err := Open(dir, DefaultOptions(), nil)
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Close(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "records/s")
}
