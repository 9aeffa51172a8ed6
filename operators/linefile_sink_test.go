package operators

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func TestLineFileSink(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "out", "nested")
	const p = 2
	for s := range p {
		sink := NewLineFileSink(dir, SensorReading.String)
		if err := sink.Open(subtaskContext(s, p)); err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			sink.Collect(SensorReading{"sensor_" + strconv.Itoa(s), int64(i), float64(s) + 0.5})
		}
		if err := sink.Finish(); err != nil {
			t.Fatal(err)
		}
		if err := sink.Close(); err != nil {
			t.Errorf("Close after Finish: %v", err)
		}
	}
	want := map[string]string{
		"part-0": "sensor_0,0,0.5\nsensor_0,1,0.5\nsensor_0,2,0.5\n",
		"part-1": "sensor_1,0,1.5\nsensor_1,1,1.5\nsensor_1,2,1.5\n",
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != len(want) {
		t.Errorf("%d files in %s, want %d", len(entries), dir, len(want))
	}
	for name, content := range want {
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != content {
			t.Errorf("%s = %q, want %q", name, got, content)
		}
	}
	if got, want := PartFile(dir, 1), filepath.Join(dir, "part-1"); got != want {
		t.Errorf("PartFile = %q, want %q", got, want)
	}
}

func TestLineFileSinkTruncatesAndFlushesOnClose(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(PartFile(dir, 0), []byte("old content that is long\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	sink := NewLineFileSink(dir, strconv.Itoa)
	if err := sink.Open(subtaskContext(0, 1)); err != nil {
		t.Fatal(err)
	}
	sink.Collect(7)
	if err := sink.Close(); err != nil { // no Finish: a failed task
		t.Fatal(err)
	}
	got, err := os.ReadFile(PartFile(dir, 0))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != "7\n" {
		t.Errorf("file = %q, want %q", got, "7\n")
	}
}

func TestLineFileSinkOpenError(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	sink := NewLineFileSink(filepath.Join(file, "dir"), strconv.Itoa) // a file in the way
	if err := sink.Open(subtaskContext(0, 1)); err == nil {
		t.Error("Open succeeded with a file where the directory should be")
	}
	if err := sink.Close(); err != nil {
		t.Errorf("Close after a failed Open: %v", err)
	}
}

// openWithTwoLines opens a line-file sink in dir as subtask 0 of 1 and
// collects 1 and 2; it is closed when the test ends.
func openWithTwoLines(t *testing.T, dir string) *LineFileSink[int] {
	t.Helper()
	sink := NewLineFileSink(dir, strconv.Itoa)
	if err := sink.Open(subtaskContext(0, 1)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sink.Close() })
	sink.Collect(1)
	sink.Collect(2)
	return sink
}

func TestLineFileSinkFlushWritesWhatItBuffered(t *testing.T) {
	dir := t.TempDir()
	sink := openWithTwoLines(t, dir)
	if got, _ := os.ReadFile(PartFile(dir, 0)); len(got) != 0 {
		t.Fatalf("file = %q before Flush, want the lines buffered", got)
	}
	if err := sink.Flush(); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(PartFile(dir, 0)); string(got) != "1\n2\n" {
		t.Errorf("file = %q after Flush, want %q", got, "1\n2\n")
	}
}

// A restored subtask (a restart, a start from a savepoint) appends to its
// part file: its lines of the records before the restored checkpoint are
// not emitted again by the replay. Before, Open truncated it at every
// attempt and those lines were lost.
//
// A process killed while its buffer went out can leave part of a line at
// the end of the file (a record after the checkpoint, which the replay
// emits again): the restored sink cuts it, so that its first line does
// not run on from it.
func TestLineFileSinkRestoredAppends(t *testing.T) {
	long := strings.Repeat("x", 10000) // over the 4 KiB the cut reads at a time
	for _, tc := range []struct{ name, before, want string }{
		{"whole lines", "before the checkpoint\n", "before the checkpoint\n8\n"},
		{"part of a line", "before the checkpoint\nafter it, cut sh", "before the checkpoint\n8\n"},
		{"a long part", "before\n" + long, "before\n8\n"},
		{"a long line and a part", long + "\n" + long, long + "\n8\n"},
		{"only a part", "cut sh", "8\n"},
		{"empty", "", "8\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(PartFile(dir, 1), []byte(tc.before), 0o644); err != nil {
				t.Fatal(err)
			}
			ctx := subtaskContext(1, 2)
			ctx.Restored = true
			sink := NewLineFileSink(dir, strconv.Itoa)
			if err := sink.Open(ctx); err != nil {
				t.Fatal(err)
			}
			sink.Collect(8)
			if err := sink.Close(); err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(PartFile(dir, 1))
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.want {
				t.Errorf("file = %q, want %q", clip(string(got)), clip(tc.want))
			}
		})
	}
}

// clip shortens s for a message.
func clip(s string) string {
	if len(s) > 80 {
		return s[:40] + "…" + s[len(s)-40:]
	}
	return s
}

// The lines of the records before a checkpoint barrier are in the file
// once the barrier passed the sink, without a Flush or Close: a restore
// from that checkpoint replays only the records after it.
func TestLineFileSinkFlushAtBarrierWritesItsLines(t *testing.T) {
	dir := t.TempDir()
	sink := openWithTwoLines(t, dir)
	if got, _ := os.ReadFile(PartFile(dir, 0)); len(got) != 0 {
		t.Fatalf("file = %q before the barrier, want the lines buffered", got)
	}
	if err := sink.FlushAtBarrier(1); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(PartFile(dir, 0)); string(got) != "1\n2\n" {
		t.Errorf("file = %q after the barrier, want %q", got, "1\n2\n")
	}
}
