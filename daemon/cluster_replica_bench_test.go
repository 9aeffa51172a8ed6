package daemon

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/edgedio/edged/keygroup"
	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/state"
)

// windowAgg is a tumbling window's aggregate of one sensor's readings:
// the state of the window job whose 100,000-key checkpoint BENCHMARKS.md
// measures elsewhere.
type windowAgg struct {
	Sensor               string
	Count                int64
	Sum, Min, Max, Last  float64
	FirstTs, LastTs, End int64
}

var snapGroups = keygroup.Range{Start: 0, End: keygroup.DefaultMaxParallelism}

// windowState returns a memory backend holding keys sensors' window
// aggregates (one subtask owning every key group).
func windowState(tb testing.TB, keys int) *state.MemoryBackend {
	tb.Helper()
	be := state.NewMemoryBackend(snapGroups, nil)
	var kc state.KeyContext[string]
	v, err := state.NewValue(be, &kc, state.ValueDescriptor[windowAgg]{Name: "window"})
	if err != nil {
		tb.Fatal(err)
	}
	for i := range keys {
		k := fmt.Sprintf("sensor-%07d", i)
		kc.Set(k, keygroup.Of(keygroup.HashString(k), keygroup.DefaultMaxParallelism))
		f := float64(i%400) / 10
		v.Update(windowAgg{Sensor: k, Count: 60, Sum: 60 * f, Min: f - 1, Max: f + 1, Last: f,
			FirstTs: 1_764_547_200_000 + int64(i), LastTs: 1_764_550_740_000 + int64(i), End: 1_764_550_800_000})
	}
	return be
}

// checkpointFile writes be's snapshot as the state file of checkpoint id
// in store, as a task does (snapshot.Writer: buffered, CRC32C, fsync,
// rename), and returns its path and handle.
func checkpointFile(store *snapshot.Store, be state.Backend, id snapshot.ID) (string, snapshot.Handle, error) {
	if _, err := store.Begin(snapshot.Trigger{Checkpoint: id}); err != nil {
		return "", snapshot.Handle{}, err
	}
	path, err := store.StatePath(id, "window", 0)
	if err != nil {
		return "", snapshot.Handle{}, err
	}
	snap, err := state.Snapshot(be)
	if err != nil {
		return "", snapshot.Handle{}, err
	}
	w, err := store.Create(id, "window", 0)
	if err != nil {
		return "", snapshot.Handle{}, err
	}
	if _, err := snap.WriteTo(w); err != nil {
		return "", snapshot.Handle{}, errors.Join(err, w.Abort())
	}
	h, err := w.Finish()
	return path, h, err
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func msOf(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// BenchmarkReplicationOverhead measures a checkpoint's state file at
// 100,000 keys (a window aggregate per sensor, written by the snapshot
// writer and fsynced) without replication and with its copy to R=2 peers
// as the job master's node makes it before its acknowledgement (the
// replica routes of the node API on loopback; each peer writes, checks
// and fsyncs it), alternating the two in one run. base_ms and
// replicated_ms are the mean wall times, added_ratio =
// replicated/base; cpu_ratio is the same for the process's CPU time (the
// peers' servers run in-process, so it is the whole cluster's CPU cost
// of the checkpoint).
//
// The three copies share one disk here; on devices each peer has its own.
func BenchmarkReplicationOverhead(b *testing.B) {
	const keys = 100_000
	be := windowState(b, keys)
	nodes := replicaCluster(b)
	a := nodes["a"]
	store, err := snapshot.OpenStore(b.TempDir(), replicaJobName, keygroup.DefaultMaxParallelism, nil)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	var base, repl, baseCPU, replCPU time.Duration
	var size int64
	id := snapshot.ID(0)
	runs := 0
	for b.Loop() {
		for _, replicate := range []bool{runs%2 == 0, runs%2 != 0} {
			id++
			start, startCPU := time.Now(), cpuTime(b)
			path, h, err := checkpointFile(store, be, id)
			if err != nil {
				b.Fatal(err)
			}
			if replicate {
				if err := a.rep.push(ctx, "a", replicaJobName, 1, id, path, h); err != nil {
					b.Fatal(err)
				}
				repl, replCPU = repl+time.Since(start), replCPU+cpuTime(b)-startCPU
			} else {
				base, baseCPU = base+time.Since(start), baseCPU+cpuTime(b)-startCPU
			}
			size = h.Size
			if err := store.Discard(id); err != nil {
				b.Fatal(err)
			}
			for _, rn := range nodes {
				if err := os.RemoveAll(filepath.Join(rn.dir, "checkpoints", fmt.Sprintf("chk-%d", id))); err != nil {
					b.Fatal(err)
				}
			}
		}
		runs++
	}
	n := float64(runs)
	b.ReportMetric(float64(size), "file_bytes")
	b.ReportMetric(msOf(base)/n, "base_ms")
	b.ReportMetric(msOf(repl)/n, "replicated_ms")
	b.ReportMetric(float64(repl)/float64(base), "added_ratio")
	b.ReportMetric(float64(replCPU)/float64(baseCPU), "cpu_ratio")
}

// A state file is streamed to its replica peers, never held in memory:
// replicating 16 MiB to two peers (whose servers run in this process)
// allocates far less than the file's size.
func TestReplicasPushStreams(t *testing.T) {
	const size = 16 << 20
	nodes := replicaCluster(t)
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i * 7919 >> 8)
	}
	path := filepath.Join(t.TempDir(), "big.state")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	_, sum, err := snapshot.Checksum(path)
	if err != nil {
		t.Fatal(err)
	}
	h := snapshot.Handle{File: "big.state", Size: size, Checksum: sum}
	data = nil
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if err := nodes["a"].rep.push(context.Background(), "a", replicaJobName, 1, 1, path, h); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("replicating %d bytes to 2 peers allocated %d bytes", size, alloc)
	if alloc > size/4 {
		t.Fatalf("replicating %d bytes allocated %d bytes", size, alloc)
	}
	for _, id := range []string{"b", "c"} {
		if !nodes[id].holds(t, 1, h) {
			t.Fatalf("%s holds no intact copy", id)
		}
	}
}
