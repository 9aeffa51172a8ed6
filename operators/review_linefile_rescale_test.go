package operators

import (
	"os"
	"strconv"
	"testing"
)

// Review: a process killed while a subtask's buffer went out leaves part
// of a line at the end of that subtask's file (TestLineFileSinkRestoredAppends);
// the restored subtask cuts it. Restored at a lower parallelism (kill -9,
// then a restore from the checkpoint with fewer subtasks, or a rescale
// from it), the file of a subtask the job no longer has is opened by no
// one: the torn line stays in the output for good, a fragment of a record
// that the replay writes again whole into another part file.
func TestReviewLineFileSinkRestoredAtLowerParallelismCutsPartialLines(t *testing.T) {
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
