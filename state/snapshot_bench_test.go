package state

import (
	"bytes"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/edgedio/edged/keygroup"
)

// benchGroups are the key groups of the snapshot benchmarks: one subtask
// owning all of the default 128.
var benchGroups = keygroup.Range{Start: 0, End: keygroup.DefaultMaxParallelism}

// fillBench registers a Value[int] keyed by string on b and writes n keys.
func fillBench(tb testing.TB, b Backend, n int) {
	var kc KeyContext[string]
	v, err := NewValue(b, &kc, ValueDescriptor[int]{Name: "count"})
	if err != nil {
		tb.Fatal(err)
	}
	for i := range n {
		k := fmt.Sprintf("sensor-%07d", i)
		kc.Set(k, keygroup.Of(keygroup.HashString(k), keygroup.DefaultMaxParallelism))
		v.Update(i)
	}
	if bb, ok := b.(*BoltBackend); ok {
		if err := bb.Flush(); err != nil {
			tb.Fatal(err)
		}
	}
}

// newBenchBackend returns a backend of kind impl over benchGroups.
func newBenchBackend(tb testing.TB, impl string) Backend {
	if impl == "memory" {
		return NewMemoryBackend(benchGroups, nil)
	}
	return newTestBolt(tb, benchGroups, nil, 0)
}

// counter counts what is written to it.
type counter int64

func (c *counter) Write(p []byte) (int, error) {
	*c += counter(len(p))
	return len(p), nil
}

// BenchmarkSnapshot measures a snapshot of a Value state of keys entries:
// the synchronous part (Snapshot: the memory backend copies its entries,
// the bolt backend commits and opens a read transaction) as sync-ms, and
// writing the stream (WriteTo, to a counter) as write-ms, with the
// stream's size.
func BenchmarkSnapshot(b *testing.B) {
	for _, n := range []int{100_000, 1_000_000} {
		for _, impl := range []string{"memory", "bolt"} {
			b.Run(fmt.Sprintf("impl=%s/keys=%d", impl, n), func(b *testing.B) {
				be := newBenchBackend(b, impl)
				fillBench(b, be, n)
				var sync, write time.Duration
				var size counter
				for b.Loop() {
					start := time.Now()
					s, err := Snapshot(be)
					if err != nil {
						b.Fatal(err)
					}
					mid := time.Now()
					size = 0
					if _, err := s.WriteTo(&size); err != nil {
						b.Fatal(err)
					}
					sync += mid.Sub(start)
					write += time.Since(mid)
				}
				b.SetBytes(int64(size))
				b.ReportMetric(float64(sync.Milliseconds())/float64(b.N), "sync-ms")
				b.ReportMetric(float64(write.Milliseconds())/float64(b.N), "write-ms")
				b.ReportMetric(float64(size), "bytes")
			})
		}
	}
}

// BenchmarkRestore measures restoring a snapshot of a Value state of keys
// entries into an empty backend, and registering the state (the memory
// backend decodes it then; the bolt backend checks every entry).
func BenchmarkRestore(b *testing.B) {
	for _, n := range []int{100_000, 1_000_000} {
		src := NewMemoryBackend(benchGroups, nil)
		fillBench(b, src, n)
		data, offs := writeSnapshot(b, src)
		for _, impl := range []string{"memory", "bolt"} {
			b.Run(fmt.Sprintf("impl=%s/keys=%d", impl, n), func(b *testing.B) {
				b.SetBytes(int64(len(data)))
				for b.Loop() {
					be := newBenchBackend(b, impl)
					if err := Restore(be, bytes.NewReader(data), offs, benchGroups); err != nil {
						b.Fatal(err)
					}
					var kc KeyContext[string]
					if _, err := NewValue(be, &kc, ValueDescriptor[int]{Name: "count"}); err != nil {
						b.Fatal(err)
					}
					if Len(be, "count") != n {
						b.Fatalf("restored %d entries", Len(be, "count"))
					}
					if bb, ok := be.(*BoltBackend); ok {
						bb.Close()
					}
				}
			})
		}
	}
}

var _ io.Writer = (*counter)(nil)
