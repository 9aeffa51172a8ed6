package operators_test

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/jonboulle/clockwork"

	"github.com/edgedio/edged/operators"
)

// Part files earlier runs left uncommitted (in progress, or pending for a
// checkpoint that never completed) are removed once the restore has
// committed what the restored checkpoint holds: by their subtask, and by
// subtask 0 for subtasks the job no longer has. Other subtasks' files and
// committed parts stay.
func TestFileSinkRemovesStaleParts(t *testing.T) {
	dir := t.TempDir()
	// An earlier run with parallelism 3 left checkpoint 1 of subtask 0
	// pending, completed elsewhere; restoring it must commit it.
	old := operators.NewFileSink(dir, func(v string) string { return v })
	if err := old.Open(&operators.Context{Subtask: 0, Parallelism: 3, Clock: clockwork.NewFakeClock()}); err != nil {
		t.Fatal(err)
	}
	old.Collect("a")
	st, err := old.SnapshotState(1)
	if err != nil {
		t.Fatal(err)
	}
	stale := []string{".part-0-1-7.pending", ".part-0-1-8.inprogress", ".part-2-1-1.pending", ".part-2-1-2.inprogress"}
	keep := []string{".part-1-1-1.pending", ".part-1-1-2.inprogress", "part-0-1-1", "part-2-1-1", ".other.pending"}
	for _, n := range append(slices.Clone(stale), keep...) {
		if err := os.WriteFile(filepath.Join(dir, n), []byte("x\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// The new run has parallelism 2.
	s := operators.NewFileSink(dir, func(v string) string { return v })
	if err := s.Open(&operators.Context{Subtask: 0, Parallelism: 2, Clock: clockwork.NewFakeClock(), FinalCheckpoint: true}); err != nil {
		t.Fatal(err)
	}
	if err := s.RestoreState([][]byte{st}, 1); err != nil {
		t.Fatal(err)
	}
	s.Collect("b")
	if _, err := s.SnapshotState(2); err != nil {
		t.Fatal(err)
	}
	for _, n := range stale {
		if _, err := os.Stat(filepath.Join(dir, n)); !os.IsNotExist(err) {
			t.Errorf("stale %s: %v", n, err)
		}
	}
	for _, n := range keep {
		if _, err := os.Stat(filepath.Join(dir, n)); err != nil {
			t.Errorf("%s: %v", n, err)
		}
	}
	if err := s.NotifyCheckpointComplete(2); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if got := readCommitted(t, dir); !slices.Equal(got, []string{"a", "b", "x", "x"}) {
		t.Fatalf("committed %v", got)
	}
	left, _ := filepath.Glob(filepath.Join(dir, ".part-0-*"))
	if len(left) != 0 {
		t.Fatalf("left %v", left)
	}
}
