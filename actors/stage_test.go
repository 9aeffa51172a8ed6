package actors

import (
	"bytes"
	"errors"
	"log/slog"
	"testing"

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
