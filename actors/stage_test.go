package actors

import (
	"bytes"
	"errors"
	"log/slog"
	"testing"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/snapshot"
)

// A task on a node in another process may meet a checkpoint's barrier
// (from a task on another node) before the trigger reaches its host: the
// first of the two begins the checkpoint in the node's staging store,
// the other finds it begun; a checkpoint that ended is not begun again
// by a late barrier.
func TestStageBeginsOnceWhicheverComesFirst(t *testing.T) {
	var logs bytes.Buffer
	store, err := snapshot.OpenStore(t.TempDir(), "j", 128, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	h := &host{staging: true, store: store, log: slog.New(slog.NewTextHandler(&logs, nil))}
	// The barrier first (task.align), then the trigger (onControl).
	h.stage(7, true)
	w, err := store.Create(7, "op", 0)
	if err != nil {
		t.Fatalf("state file after the barrier began the checkpoint: %v", err)
	}
	w.Abort()
	h.stage(7, true)
	if logs.Len() > 0 {
		t.Fatalf("the trigger after the barrier: %s", logs.String())
	}
	// The checkpoint ends; a late barrier of it begins nothing.
	h.stage(7, false)
	h.stage(7, true)
	if _, err := store.Create(7, "op", 0); !errors.Is(err, snapshot.ErrUnknownCheckpoint) {
		t.Fatalf("state file of an ended checkpoint: %v", err)
	}
	h.stage(8, true)
	if w, err := store.Create(8, "op", 0); err != nil {
		t.Fatal(err)
	} else {
		w.Abort()
	}
	if logs.Len() > 0 {
		t.Fatal(logs.String())
	}
}

// With several checkpoints in progress, a newer checkpoint's barrier may
// begin it before an older one's trigger comes: the older one is still
// begun (it was taken as ended, and its tasks declined it for want of a
// staging directory). Past maxStaged checkpoints the oldest ended ones
// are forgotten, and still count as ended.
func TestStageBeginsAnOlderCheckpointAfterANewerOne(t *testing.T) {
	var logs bytes.Buffer
	store, err := snapshot.OpenStore(t.TempDir(), "j", 128, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	h := &host{staging: true, store: store, log: slog.New(slog.NewTextHandler(&logs, nil))}
	h.stage(9, true) // a barrier of 9
	h.stage(8, true) // the trigger of 8
	for _, id := range []snapshot.ID{8, 9} {
		w, err := store.Create(id, "op", 0)
		if err != nil {
			t.Fatalf("state file of checkpoint %d: %v", id, err)
		}
		w.Abort()
	}
	h.stage(8, false)
	h.stage(9, false)
	h.stage(7, true) // stays in progress while the floor rises past it
	for id := int64(10); id < 10+2*maxStaged; id++ {
		h.stage(id, true)
		h.stage(id, false)
	}
	if len(h.staged) > maxStaged {
		t.Fatalf("%d checkpoints remembered, want at most %d", len(h.staged), maxStaged)
	}
	if _, ok := h.staged[7]; !ok || h.stageFloor < 7 {
		t.Fatalf("checkpoint 7 forgotten while in progress, or the floor (%d) did not rise past it", h.stageFloor)
	}
	h.stage(7, false)
	if _, ok := h.staged[7]; ok {
		t.Fatal("checkpoint 7 still remembered after it ended below the floor")
	}
	for _, id := range []int64{8, 9, 20, 10 + 2*maxStaged - 1} {
		h.stage(id, true)
		if _, err := store.Create(snapshot.ID(id), "op", 0); !errors.Is(err, snapshot.ErrUnknownCheckpoint) {
			t.Fatalf("state file of ended checkpoint %d: %v", id, err)
		}
	}
	if logs.Len() > 0 {
		t.Fatal(logs.String())
	}
}

// A source task awaiting data that never comes (an idle split) is
// retired by a handover: the goroutine awaiting its data ends with it,
// not with the host.
func TestAwaitEndsWhenTheTaskIsRetired(t *testing.T) {
	h := &host{done: make(chan struct{})}
	defer close(h.done)
	tk := &task{run: h, gone: make(chan struct{})}
	h.await(make(chan struct{}), tk)
	close(tk.gone)
	ended := make(chan struct{})
	go func() {
		h.waiters.Wait()
		close(ended)
	}()
	if !testutil.Within(0, func() bool {
		select {
		case <-ended:
			return true
		default:
			return false
		}
	}) {
		t.Fatal("the awaiting goroutine outlived its retired task")
	}
}
