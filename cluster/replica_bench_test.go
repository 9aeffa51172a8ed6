package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
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
// rename), and returns its path, handle and key-group offsets.
func checkpointFile(store *snapshot.Store, be state.Backend, id snapshot.ID) (string, snapshot.Handle, state.KeyGroupOffsets, error) {
	if _, err := store.Begin(snapshot.Trigger{Checkpoint: id}); err != nil {
		return "", snapshot.Handle{}, nil, err
	}
	path, err := store.StatePath(id, "window", 0)
	if err != nil {
		return "", snapshot.Handle{}, nil, err
	}
	snap, err := state.Snapshot(be)
	if err != nil {
		return "", snapshot.Handle{}, nil, err
	}
	w, err := store.Create(id, "window", 0)
	if err != nil {
		return "", snapshot.Handle{}, nil, err
	}
	if _, err := snap.WriteTo(w); err != nil {
		return "", snapshot.Handle{}, nil, errors.Join(err, w.Abort())
	}
	h, err := w.Finish()
	return path, h, snap.Offsets(), err
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkReplicationOverhead measures a checkpoint's state file at
// 100,000 keys (a window aggregate per sensor, written by the snapshot
// writer and fsynced) without replication and with its copy to R=2 peers
// over the replica REST API on loopback (each peer writes and fsyncs it),
// alternating the two in one run. base_ms and replicated_ms are the mean
// wall times, added_ratio = replicated/base; cpu_ratio is the same for the
// process's CPU time (the peers' servers run in-process, so it is the
// whole cluster's CPU cost of the checkpoint).
//
// The three copies share one disk here; on devices each peer has its own.
func BenchmarkReplicationOverhead(b *testing.B) {
	const keys = 100_000
	be := windowState(b, keys)
	store, err := snapshot.OpenStore(b.TempDir(), "sensors", keygroup.DefaultMaxParallelism, nil)
	if err != nil {
		b.Fatal(err)
	}
	stores, client := replicaServers(b, "", "b", "c")
	ctx := context.Background()
	var base, repl, baseCPU, replCPU time.Duration
	var size int64
	id := snapshot.ID(0)
	runs := 0
	for b.Loop() {
		for _, replicate := range []bool{runs%2 == 0, runs%2 != 0} {
			id++
			start, startCPU := time.Now(), cpuTime(b)
			path, h, _, err := checkpointFile(store, be, id)
			if err != nil {
				b.Fatal(err)
			}
			if replicate {
				k := ReplicaKey{Node: "a", Job: "sensors", Checkpoint: int64(id), File: h.File}
				if err := Replicate(ctx, client, []string{"b", "c"}, k, path, h.Checksum); err != nil {
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
			for _, s := range stores {
				if err := s.Retain("sensors", nil); err != nil {
					b.Fatal(err)
				}
			}
		}
		runs++
	}
	n := float64(runs)
	b.ReportMetric(float64(size), "file_bytes")
	b.ReportMetric(ms(base)/n, "base_ms")
	b.ReportMetric(ms(repl)/n, "replicated_ms")
	b.ReportMetric(float64(repl)/float64(base), "added_ratio")
	b.ReportMetric(float64(replCPU)/float64(baseCPU), "cpu_ratio")
}

// replicaServers starts one REST replica server per peer on 127.0.0.1,
// each handler wrapped by wrap[id] if given.
func replicaServers(tb testing.TB, token string, ids ...string) (map[string]*ReplicaStore, *HTTPReplicaClient) {
	return replicaServersWrapped(tb, token, nil, ids...)
}

func replicaServersWrapped(tb testing.TB, token string, wrap map[string]func(http.Handler) http.Handler, ids ...string) (map[string]*ReplicaStore, *HTTPReplicaClient) {
	tb.Helper()
	stores, addrs := map[string]*ReplicaStore{}, map[string]string{}
	for _, id := range ids {
		s, err := OpenReplicaStore(tb.TempDir())
		if err != nil {
			tb.Fatal(err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatal(err)
		}
		h := ReplicaHandler(s, token)
		if w := wrap[id]; w != nil {
			h = w(h)
		}
		srv := &http.Server{Handler: h}
		go srv.Serve(ln)
		tb.Cleanup(func() { srv.Close() })
		stores[id], addrs[id] = s, ln.Addr().String()
	}
	c := &HTTPReplicaClient{Token: token, Client: &http.Client{Transport: &http.Transport{}}, Addr: func(p string) (string, error) {
		a, ok := addrs[p]
		if !ok {
			return "", fmt.Errorf("%w: %s", ErrUnknownNode, p)
		}
		return a, nil
	}}
	tb.Cleanup(c.Client.CloseIdleConnections)
	return stores, c
}

// flipInTransit serves what h serves with one bit of the body flipped (a
// holder whose copy is damaged between its disk check and the wire), and
// counts the bodies it damaged.
func flipInTransit(flipped *atomic.Int64) func(http.Handler) http.Handler {
	return func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, r)
			body := rec.Body.Bytes()
			if r.Method == http.MethodGet && rec.Code == http.StatusOK && len(body) > 0 {
				body[len(body)/2] ^= 0x10
				flipped.Add(1)
			}
			for k, v := range rec.Header() {
				w.Header()[k] = v
			}
			w.WriteHeader(rec.Code)
			_, _ = w.Write(body)
		})
	}
}

// warnings collects the holders named by FetchReplica's warnings.
type warnings struct{ holders []string }

func (w *warnings) Enabled(context.Context, slog.Level) bool { return true }
func (w *warnings) Handle(_ context.Context, r slog.Record) error {
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "holder" {
			w.holders = append(w.holders, a.Value.String())
		}
		return true
	})
	return nil
}
func (w *warnings) WithAttrs([]slog.Attr) slog.Handler { return w }
func (w *warnings) WithGroup(string) slog.Handler      { return w }

// A real checkpoint's state file is replicated to four holders; one copy
// is truncated on disk, one is damaged on the wire, one holder lost its
// copy. The restore tries them in order, detects each problem, takes the
// intact copy of the fourth, and the state restored from it holds every
// key.
func TestFetchReplicaSkipsCorruptHolders(t *testing.T) {
	const keys = 5000
	be := windowState(t, keys)
	store, err := snapshot.OpenStore(t.TempDir(), "sensors", keygroup.DefaultMaxParallelism, nil)
	if err != nil {
		t.Fatal(err)
	}
	path, h, offs, err := checkpointFile(store, be, 3)
	if err != nil {
		t.Fatal(err)
	}
	var flipped atomic.Int64
	holders := []string{"trunc", "wire", "lost", "good"}
	stores, c := replicaServersWrapped(t, "tok", map[string]func(http.Handler) http.Handler{"wire": flipInTransit(&flipped)}, holders...)
	ctx := context.Background()
	k := ReplicaKey{Node: "a", Job: "sensors", Checkpoint: 3, File: h.File}
	if err := Replicate(ctx, c, holders, k, path, h.Checksum); err != nil {
		t.Fatal(err)
	}
	// trunc's copy loses its last byte on disk; lost's is gone.
	p := stores["trunc"].path(k)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, b[:len(b)-1], 0o644); err != nil {
		t.Fatal(err)
	}
	if err := stores["lost"].Retain("sensors", nil); err != nil {
		t.Fatal(err)
	}

	var warned warnings
	dst := path + ".restored"
	from, err := FetchReplica(ctx, c, holders, k, h.Checksum, h.Size, dst, slog.New(&warned))
	if err != nil || from != "good" {
		t.Fatalf("fetched from %q: %v", from, err)
	}
	if flipped.Load() != 1 {
		t.Fatalf("the wire holder damaged %d bodies, want 1", flipped.Load())
	}
	if got := strings.Join(warned.holders, ","); got != "trunc,wire,lost" {
		t.Fatalf("holders found unusable: %s", got)
	}
	data, err := os.ReadFile(dst)
	if err != nil {
		t.Fatal(err)
	}
	restored := state.NewMemoryBackend(snapGroups, nil)
	if err := state.Restore(restored, bytes.NewReader(data), offs, snapGroups); err != nil {
		t.Fatal(err)
	}
	var kc state.KeyContext[string]
	if _, err := state.NewValue(restored, &kc, state.ValueDescriptor[windowAgg]{Name: "window"}); err != nil {
		t.Fatal(err)
	}
	if n := state.Len(restored, "window"); n != keys {
		t.Fatalf("restored %d keys, want %d", n, keys)
	}

	// Without the intact holder, the error names each holder's problem.
	_, err = FetchReplica(ctx, c, holders[:3], k, h.Checksum, h.Size, dst, nil)
	if !errors.Is(err, ErrNoReplica) {
		t.Fatalf("no intact replica: %v", err)
	}
	for _, want := range []string{"trunc: ", "wire: ", "lost: ", "corrupt", "missing"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %q: %v", want, err)
		}
	}
}

// Replicate streams the file to its peers: replicating 16 MiB to two
// peers (whose servers run in this process) allocates far less than the
// file's size.
func TestReplicateStreams(t *testing.T) {
	const size = 16 << 20
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i * 7919 >> 8)
	}
	path := filepath.Join(t.TempDir(), "big.state")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	stores, c := replicaServers(t, "", "b", "c")
	k := ReplicaKey{Node: "a", Job: "j", Checkpoint: 1, File: "big.state"}
	sum := crc32.Checksum(data, castagnoli)
	data = nil
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if err := Replicate(context.Background(), c, []string{"b", "c"}, k, path, sum); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("replicating %d bytes to 2 peers allocated %d bytes", size, alloc)
	if alloc > size/4 {
		t.Fatalf("replicating %d bytes allocated %d bytes", size, alloc)
	}
	for id, s := range stores {
		if _, err := s.Open(k, sum, size); err != nil {
			t.Fatalf("%s: %v", id, err)
		}
	}
}
