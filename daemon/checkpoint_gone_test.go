package daemon

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/edgedio/edged/snapshot"
)

// A completed checkpoint whose metadata is no longer on disk (its
// directory removed, or discarded by retention) is listed as gone, never
// as a plain completed checkpoint; a failed one is not marked.
func TestCheckpointInfoMarksFilesGone(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "chk-3")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "_metadata"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	s := snapshot.Stats{Checkpoint: 3, Kind: snapshot.KindCheckpoint, Status: snapshot.Completed, Path: dir}
	if ci := checkpointInfo(s); ci.Gone || ci.Status != "completed" {
		t.Fatalf("on disk: %+v", ci)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if ci := checkpointInfo(s); !ci.Gone || ci.Status != "completed" {
		t.Fatalf("removed: %+v, want gone", ci)
	}
	s.Status = snapshot.Failed
	if ci := checkpointInfo(s); ci.Gone {
		t.Fatalf("failed: %+v, marked gone", ci)
	}
}
