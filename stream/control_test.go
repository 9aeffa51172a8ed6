package stream_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/cluster"
	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/stream"
)

// restartLog records the failures an execution restarted after.
type restartLog struct {
	mu   sync.Mutex
	errs []error
}

func (l *restartLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *restartLog) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *restartLog) WithGroup(string) slog.Handler            { return l }

func (l *restartLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "job failed; restarting" {
		return nil
	}
	r.Attrs(func(a slog.Attr) bool {
		if err, ok := a.Value.Any().(error); ok && a.Key == "err" {
			l.mu.Lock()
			l.errs = append(l.errs, err)
			l.mu.Unlock()
		}
		return true
	})
	return nil
}

func (l *restartLog) failures() []error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]error(nil), l.errs...)
}

// dropControl returns a DropIf that loses the control message with
// sequence number seq on node's control channel (up: to the master,
// else from it) in epoch 1, and the count of frames it dropped.
func dropControl(node int, up bool, seq uint64) (func(from, to string, frame []byte) bool, *atomic.Int64) {
	var dropped atomic.Int64
	return func(_, _ string, frame []byte) bool {
		f, err := cluster.DecodeFrame(frame)
		if err != nil || f.Kind != cluster.KindBatch || f.Channel.Epoch != 1 || f.Seq != seq {
			return false
		}
		id := f.Channel
		hit := up && id.Edge == actors.ControlEdgeUp && id.From == node ||
			!up && id.Edge == actors.ControlEdgeDown && id.To == node
		if hit {
			dropped.Add(1)
		}
		return hit
	}, &dropped
}

// A control message lost between the job master and a task host (either
// way) fails the deployment loudly with actors.ErrControlFailed; the
// restart strategy restores the latest checkpoint in a new epoch on every
// node, and what the sinks committed equals the failure-free run.
func TestMultiNodeControlLossFailsLoudlyAndRestores(t *testing.T) {
	for _, up := range []bool{true, false} {
		t.Run(fmt.Sprintf("to_master=%v", up), func(t *testing.T) {
			// Past the registration and deployment: a checkpoint message.
			drop, dropped := dropControl(1, up, 5)
			c := memoryCluster(t, 2, 1, cluster.Faults{DropIf: drop})
			log := &restartLog{}
			testMultiNodeExactlyOnce(t, c, 0, 200_000, 500, stream.WithLogger(slog.New(log)))
			if dropped.Load() != 1 {
				t.Fatalf("%d control messages dropped, want 1: the path under test was not reached", dropped.Load())
			}
			fs := log.failures()
			if len(fs) == 0 || !errors.Is(fs[0], actors.ErrControlFailed) {
				t.Fatalf("restarts after %v, want a first one after actors.ErrControlFailed", fs)
			}
			t.Logf("restarted after: %v", fs[0])
		})
	}
}

// A lost "deployed" message leaves the master waiting for a host that
// will say nothing more: the handshake step times out after
// Cluster.ControlTimeout with actors.ErrControlTimeout (the job never
// hangs), and the restart gives the exact result.
func TestMultiNodeControlHandshakeTimeoutRestarts(t *testing.T) {
	drop, dropped := dropControl(1, true, 2) // register is 1, deployed 2
	c := memoryCluster(t, 2, 1, cluster.Faults{DropIf: drop})
	c.ControlTimeout = 2 * time.Second
	log := &restartLog{}
	testMultiNodeExactlyOnce(t, c, 0, 100_000, 500, stream.WithLogger(slog.New(log)))
	if dropped.Load() != 1 {
		t.Fatalf("%d control messages dropped, want 1: the path under test was not reached", dropped.Load())
	}
	fs := log.failures()
	if len(fs) == 0 || !errors.Is(fs[0], actors.ErrControlTimeout) {
		t.Fatalf("restarts after %v, want a first one after actors.ErrControlTimeout", fs)
	}
	t.Logf("restarted after: %v", fs[0])
}

// Each node's host runs the job graph its node built, with its own
// operator instances and sinks, and shares nothing with the job master
// but the transport (and, for now, the checkpoint store): a keyed rolling
// aggregate is exact on 2 and 3 nodes, and the master's own graph runs no
// operator.
func TestMultiNodeSeparateJobGraphsKeyedRollingIsExact(t *testing.T) {
	testSeparateJobGraphsRolling(t, overMemory)
}

// The same over protoactor remote on loopback.
func TestRemoteMultiNodeSeparateJobGraphsKeyedRollingIsExact(t *testing.T) {
	testSeparateJobGraphsRolling(t, remoteCluster)
}

func testSeparateJobGraphsRolling(t *testing.T, mk clusterMaker) {
	const n, keys = 200_000, 500
	want := expected(n, keys)
	for _, nodes := range []int{2, 3} {
		t.Run(fmt.Sprintf("nodes=%d", nodes), func(t *testing.T) {
			c := mk(t, nodes)
			master := newLastPerKey(func(c countSum) string { return c.ID }, false)
			env := rollingJob(n, keys, 3, master, stream.WithCluster(c.Cluster))
			c.spread(t, env)
			var sinks []*lastPerKey[countSum]
			for i := range c.Nodes {
				s := newLastPerKey(func(c countSum) string { return c.ID }, false)
				job, err := rollingJob(n, keys, 3, s).Graph()
				if err != nil {
					t.Fatal(err)
				}
				c.Nodes[i].Job = job
				sinks = append(sinks, s)
			}
			if err := execute(t, env); err != nil {
				t.Fatal(err)
			}
			c.checkCrossed(t)
			if len(master.last) != 0 {
				t.Fatalf("the master's own job graph emitted %d keys: a host used it", len(master.last))
			}
			got := make(map[string]countSum)
			for i, s := range sinks {
				for k, v := range s.last {
					if _, dup := got[k]; dup {
						t.Fatalf("key %s reached sinks on two nodes", k)
					}
					got[k] = v
				}
				t.Logf("node %d: %d keys", i, len(s.last))
			}
			if len(got) != keys {
				t.Fatalf("got %d keys, want %d", len(got), keys)
			}
			for k, w := range want {
				if got[k] != w {
					t.Fatalf("key %s: got %+v, want %+v", k, got[k], w)
				}
			}
		})
	}
}

// The exactly-once job with injected task failures, each node running its
// own job graph with its own failure injector and output directory: what
// the sinks of all nodes committed equals the failure-free run in one
// process.
func TestMultiNodeSeparateJobGraphsExactlyOnceUnderFailures(t *testing.T) {
	const n, keys = 400_000, 500
	testutil.Burn(t, 1)
	wantDir := t.TempDir()
	if err := execute(t, eoJob(n, keys, wantDir, nil, stream.WithParallelism(2))); err != nil {
		t.Fatal(err)
	}
	want := committedLines(t, wantDir)
	c := memoryCluster(t, 2, 1, cluster.Faults{})
	env := eoJob(n, keys, t.TempDir(), nil,
		stream.WithParallelism(2),
		stream.WithCheckpointing(checkpointConfig(t, snapshot.ExactlyOnce)),
		stream.WithRestartStrategy(&snapshot.FixedDelay{Attempts: 30}),
		stream.WithCluster(c.Cluster))
	c.spread(t, env)
	var dirs []string
	var fails []*failer
	for i := range c.Nodes {
		dir, f := t.TempDir(), newFailer(2)
		job, err := eoJob(n, keys, dir, f, stream.WithParallelism(2)).Graph()
		if err != nil {
			t.Fatal(err)
		}
		c.Nodes[i].Job = job
		dirs, fails = append(dirs, dir), append(fails, f)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	job, err := env.ExecuteAsync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := job.Wait(); err != nil {
		t.Fatal(err)
	}
	c.checkCrossed(t)
	var got []string
	fired := int64(0)
	for i, d := range dirs {
		got = append(got, committedLines(t, d)...)
		fired += fails[i].fired.Load()
	}
	slices.Sort(got)
	w := slices.Clone(want)
	slices.Sort(w)
	t.Logf("%d task failures; %d attempts; restored checkpoints %v", fired, job.Attempts(), job.Restores())
	if strings.Join(got, "\n") != strings.Join(w, "\n") {
		t.Fatalf("committed output differs from the failure-free run: %d lines vs %d\n%s", len(got), len(w), diffLines(got, w))
	}
	if fired < 1 || len(job.Restores()) < 1 {
		t.Fatalf("%d failures, restores %v: no failure was followed by a restore", fired, job.Restores())
	}
}
