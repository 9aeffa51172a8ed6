package stream_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/cluster"
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
