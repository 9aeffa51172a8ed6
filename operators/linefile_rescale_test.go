package operators

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// A process killed while a subtask's buffer went out leaves part
// of a line at the end of that subtask's file (TestLineFileSinkRestoredAppends);
// the restored subtask cuts it. Restored at a lower parallelism (kill -9,
// then a restore from the checkpoint with fewer subtasks, or a rescale
// from it), the file of a subtask the job no longer has is opened by no
// one: the torn line stays in the output for good, a fragment of a record
// that the replay writes again whole into another part file.
func TestLineFileSinkRestoredAtLowerParallelismCutsPartialLines(t *testing.T) {
	dir := t.TempDir()
	// What a run at parallelism 2 left when it was killed.
	if err := os.WriteFile(PartFile(dir, 0), []byte("1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(PartFile(dir, 1), []byte("2\n12345678"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Restored at parallelism 1.
	ctx := subtaskContext(0, 1)
	ctx.Restored = true
	sink := NewLineFileSink(dir, strconv.Itoa)
	if err := sink.Open(ctx); err != nil {
		t.Fatal(err)
	}
	sink.Collect(123456789) // the record of the torn line, replayed
	if err := sink.Finish(); err != nil {
		t.Fatal(err)
	}
	for sub, want := range []string{"1\n123456789\n", "2\n"} {
		got, err := os.ReadFile(PartFile(dir, sub))
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != want {
			t.Errorf("part-%d = %q, want %q", sub, got, want)
		}
	}
}

// At a fresh start the sink truncates its part files, and subtask 0
// removes those of subtasks the job does not have: a job run anew at a
// lower parallelism into the same directory keeps no line of the earlier
// run beside its own (every record of theirs would be there a second time,
// or a stale one).
func TestLineFileSinkFreshStartAtLowerParallelismRemovesOldParts(t *testing.T) {
	dir := t.TempDir()
	for s := range 3 { // an earlier run at parallelism 3
		sink := NewLineFileSink(dir, strconv.Itoa)
		if err := sink.Open(subtaskContext(s, 3)); err != nil {
			t.Fatal(err)
		}
		sink.Collect(10 + s)
		if err := sink.Finish(); err != nil {
			t.Fatal(err)
		}
	}
	// Files the sink never writes stay.
	for _, name := range []string{"part-x", "part-01", "notes"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("keep\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Run anew (no snapshot) at parallelism 1 on the same input.
	sink := NewLineFileSink(dir, strconv.Itoa)
	if err := sink.Open(subtaskContext(0, 1)); err != nil {
		t.Fatal(err)
	}
	for v := range 3 {
		sink.Collect(10 + v)
	}
	if err := sink.Finish(); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(PartFile(dir, 0)); err != nil || string(b) != "10\n11\n12\n" {
		t.Errorf("part-0 = %q, %v; want the new run's three lines", b, err)
	}
	for _, sub := range []int{1, 2} {
		if b, err := os.ReadFile(PartFile(dir, sub)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("part-%d of the earlier run is still there after a fresh start at parallelism 1: %q, %v", sub, b, err)
		}
	}
	for _, name := range []string{"part-x", "part-01", "notes"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Errorf("%s, which the sink did not write, is gone: %v", name, err)
		}
	}
}
