package state

import (
	"bytes"
	"fmt"
	"io"
	"syscall"
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

// windowAcc and windowEntry are shaped like a window operator's keyed
// state: per key, the next firing and its slices of aggregates.
type windowAcc struct {
	A [8]int64
	N int64
}

type windowSlice struct {
	Start int64
	Acc   windowAcc
}

type windowEntry struct {
	Next   int64
	Slices []windowSlice
}

// BenchmarkRestoreWindow measures restoring what a window operator with
// keys keys checkpoints, one window open per key: a Value of its slices
// and an event-time timer per key; restoring means the state's restore,
// registering the Value and the timer queue (which decode them), as a
// window operator's Open does. cpu-ms/op is the process's CPU time per
// restore (steadier than the wall time on a loaded machine).
func BenchmarkRestoreWindow(b *testing.B) {
	const n = 100_000
	src := NewMemoryBackend(benchGroups, nil)
	var kc KeyContext[string]
	v, err := NewValue(src, &kc, ValueDescriptor[windowEntry]{Name: "window"})
	if err != nil {
		b.Fatal(err)
	}
	q := NewTimerQueue[string, struct{}]()
	if err := RegisterTimerQueue(src, "event", q, nil, nil); err != nil {
		b.Fatal(err)
	}
	for i := range n {
		k := fmt.Sprintf("sensor-%07d", i)
		g := keygroup.Of(keygroup.HashString(k), keygroup.DefaultMaxParallelism)
		kc.Set(k, g)
		v.Update(windowEntry{Next: 3_600_000, Slices: []windowSlice{{Start: 0, Acc: windowAcc{N: int64(i)}}}})
		q.Register(3_600_000-1, k, g, struct{}{})
	}
	data, offs := writeSnapshot(b, src)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	cpu0 := cpuTime(b)
	for b.Loop() {
		be := NewMemoryBackend(benchGroups, nil)
		if err := Restore(be, bytes.NewReader(data), offs, benchGroups); err != nil {
			b.Fatal(err)
		}
		var kc KeyContext[string]
		if _, err := NewValue(be, &kc, ValueDescriptor[windowEntry]{Name: "window"}); err != nil {
			b.Fatal(err)
		}
		q := NewTimerQueue[string, struct{}]()
		if err := RegisterTimerQueue(be, "event", q, nil, nil); err != nil {
			b.Fatal(err)
		}
		if Len(be, "window") != n || q.Len() != n {
			b.Fatalf("restored %d entries and %d timers", Len(be, "window"), q.Len())
		}
	}
	b.ReportMetric(float64((cpuTime(b)-cpu0).Microseconds())/1000/float64(b.N), "cpu-ms/op")
}

// cpuTime is the process's CPU time so far (user and system).
func cpuTime(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
