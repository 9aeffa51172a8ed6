package operators

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"
)

// The file at a file source's path may not be the one its position was
// taken in: log rotation renames it and puts a new file at the path, a
// truncation (": > data.log") empties it in place. A position restored
// into such a file must not skip the new file's first bytes.

const rotateOld = "a1\na2\na3\na4\n"

var rotateOldLines = []string{"a1", "a2", "a3", "a4"}

func identityLine(s string) (string, error) { return s, nil }

// readLines opens a source of path on subtask 0, polls n lines one at a
// time and returns them with the source's checkpointed state; the source
// is closed.
func readLines(t *testing.T, path string, n int) ([]string, []byte) {
	t.Helper()
	src := NewLineFileSource(path, identityLine)
	if err := src.Open(subtaskContext(0, 1)); err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	var got []string
	out := CollectorFunc[string](func(s string) { got = append(got, s) })
	for range n {
		if st, err := src.Poll(out, 1); err != nil || st != MoreAvailable {
			t.Fatalf("Poll = %v, %v", st, err)
		}
	}
	state, err := src.SnapshotState(1)
	if err != nil {
		t.Fatal(err)
	}
	return got, state
}

// restored is what a restored source read and reported.
type restored struct {
	lines  []string
	resets []FileReset
	logs   string
	src    *LineFileSource[string]
}

// restoreLines restores a new source of path from state the way the
// runtime does (Open, then RestoreState) and reads it to its end.
func restoreLines(t *testing.T, path string, state []byte) restored {
	t.Helper()
	var r restored
	var logs bytes.Buffer
	ctx := subtaskContext(0, 1)
	ctx.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	r.src = NewLineFileSource(path, identityLine).WithResets(func(ev FileReset) { r.resets = append(r.resets, ev) })
	if err := r.src.Open(ctx); err != nil {
		t.Fatal(err)
	}
	defer r.src.Close()
	if err := r.src.RestoreState([][]byte{state}, 1); err != nil {
		t.Fatal(err)
	}
	got, err := pollToEnd(t, Source[string](r.src), 10)
	if err != nil {
		t.Fatal(err)
	}
	r.lines, r.logs = got, logs.String()
	return r
}

// checkReset checks that r read its file from the start once, for
// reason, with the warning that says so.
func checkReset(t *testing.T, r restored, path, reason string, offset, size int64) {
	t.Helper()
	want := FileReset{Path: path, Reason: reason, Offset: offset, Size: size}
	if len(r.resets) != 1 || r.resets[0] != want || r.src.Resets() != 1 {
		t.Errorf("resets %+v (Resets() = %d), want one %+v", r.resets, r.src.Resets(), want)
	}
	for _, s := range []string{"level=WARN", "reading it from its start", "path=" + path, "reason=" + reason,
		fmt.Sprintf("offset=%d", offset), fmt.Sprintf("size=%d", size)} {
		if !strings.Contains(r.logs, s) {
			t.Errorf("log lacks %q:\n%s", s, r.logs)
		}
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func appendFile(t *testing.T, path, content string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(content); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// rotate renames the file at path (mv data.log data.log.1) and writes a
// new file there.
func rotate(t *testing.T, path, content string) {
	t.Helper()
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	writeFile(t, path, content)
}

// truncate empties the file at path in place (": > data.log") and
// appends content to it, as a writer with O_APPEND goes on.
func truncate(t *testing.T, path, content string) {
	t.Helper()
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	appendFile(t, path, content)
}

func TestLineFileSourceRestoreRotatedFile(t *testing.T) {
	for _, tc := range []struct {
		name, content string
		want          []string
	}{
		// The new file ends before the old position: nothing was read.
		{"shorter", "b1\n", []string{"b1"}},
		// The new file goes past the old position: its first lines were
		// skipped and the read began in the middle of one.
		{"longer", "b1\nb2\nb3\nb4\nb5\nb6\n", []string{"b1", "b2", "b3", "b4", "b5", "b6"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := writeTempFile(t, rotateOld)
			before, state := readLines(t, path, 3)
			if !slices.Equal(before, rotateOldLines[:3]) {
				t.Fatalf("before the checkpoint: %q", before)
			}
			rotate(t, path, tc.content)
			r := restoreLines(t, path, state)
			if !slices.Equal(r.lines, tc.want) {
				t.Errorf("restored into the new file: %q, want %q (it read from the old offset)", r.lines, tc.want)
			}
			checkReset(t, r, path, FileReplaced, 9, int64(len(tc.content)))
		})
	}
}

func TestLineFileSourceRestoreTruncatedFile(t *testing.T) {
	for _, tc := range []struct {
		name, content, reason string
		want                  []string
	}{
		{"shorter", "b1\n", FileTruncated, []string{"b1"}},
		// Same file, not shorter than the position: only its first bytes
		// tell that it was rewritten.
		{"refilled", "b1\nb2\nb3\nb4\nb5\nb6\n", FileRewritten, []string{"b1", "b2", "b3", "b4", "b5", "b6"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := writeTempFile(t, rotateOld)
			_, state := readLines(t, path, 3)
			truncate(t, path, tc.content)
			r := restoreLines(t, path, state)
			if !slices.Equal(r.lines, tc.want) {
				t.Errorf("restored into the truncated file: %q, want %q (it read from the old offset)", r.lines, tc.want)
			}
			checkReset(t, r, path, tc.reason, 9, int64(len(tc.content)))
		})
	}
}

// The file untouched or only appended to: the restore goes on exactly
// after the checkpointed line.
func TestLineFileSourceRestoreSameFile(t *testing.T) {
	path := writeTempFile(t, rotateOld)
	before, state := readLines(t, path, 3)
	appendFile(t, path, "a5\n")
	r := restoreLines(t, path, state)
	if all := append(before, r.lines...); !slices.Equal(all, append(rotateOldLines, "a5")) {
		t.Errorf("before and after the restore: %q, want %q", all, append(rotateOldLines, "a5"))
	}
	if len(r.resets) != 0 || r.logs != "" {
		t.Errorf("resets %+v, logs %q; want none", r.resets, r.logs)
	}

	// A rename keeps the file: a source whose path follows it (the
	// file moved back) goes on exactly.
	moved := path + ".moved"
	if err := os.Rename(path, moved); err != nil {
		t.Fatal(err)
	}
	r = restoreLines(t, moved, state)
	if !slices.Equal(r.lines, []string{"a4", "a5"}) || len(r.resets) != 0 {
		t.Errorf("restored after a rename: %q, resets %+v; want [a4 a5], none", r.lines, r.resets)
	}
}

// A snapshot written before the source recorded its file's identity
// holds only the offset: it restores exactly into the same file, and
// from the start into a file shorter than the offset.
func TestLineFileSourceRestoreOldState(t *testing.T) {
	off := int64(len("a1\na2\na3\n"))
	old := binary.AppendVarint(nil, off)

	path := writeTempFile(t, rotateOld)
	r := restoreLines(t, path, old)
	if !slices.Equal(r.lines, []string{"a4"}) || len(r.resets) != 0 {
		t.Errorf("old state, same file: %q, resets %+v; want [a4], none", r.lines, r.resets)
	}
	rotate(t, path, "b1\n")
	r = restoreLines(t, path, old)
	if !slices.Equal(r.lines, []string{"b1"}) {
		t.Errorf("old state, shorter file: %q, want [b1]", r.lines)
	}
	checkReset(t, r, path, FileTruncated, off, 3)
}

// The runtime may checkpoint a restored source before its first Poll
// checks the file: that checkpoint keeps the identity restored, and so
// does a restore before Open.
func TestLineFileSourceCheckpointBeforeFirstPoll(t *testing.T) {
	path := writeTempFile(t, rotateOld)
	_, state := readLines(t, path, 3)

	src := NewLineFileSource(path, identityLine)
	if err := src.RestoreState([][]byte{state}, 1); err != nil { // before Open
		t.Fatal(err)
	}
	if err := src.Open(subtaskContext(0, 1)); err != nil {
		t.Fatal(err)
	}
	again, err := src.SnapshotState(2)
	src.Close()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again, state) {
		t.Fatalf("checkpoint before the first Poll %x, want the restored %x", again, state)
	}
	rotate(t, path, "b1\nb2\nb3\nb4\n")
	r := restoreLines(t, path, again)
	if !slices.Equal(r.lines, []string{"b1", "b2", "b3", "b4"}) {
		t.Errorf("restored into the new file: %q, want b1..b4", r.lines)
	}
	checkReset(t, r, path, FileReplaced, 9, 12)
}

// A checkpoint of a source that read past fingerprintSize covers the
// file's first fingerprintSize bytes; the file untouched restores
// exactly, rewritten in its first KiB from the start.
func TestLineFileSourceFingerprintBounded(t *testing.T) {
	var b strings.Builder
	for i := range 300 {
		fmt.Fprintf(&b, "line-%03d\n", i)
	}
	content := b.String()
	path := writeTempFile(t, content)
	_, state := readLines(t, path, 200)
	st, err := decodeFileState(state)
	if err != nil {
		t.Fatal(err)
	}
	if st.pos != 200*9 || st.head != fingerprintSize || st.fp != fingerprint([]byte(content[:fingerprintSize])) {
		t.Fatalf("state %+v, want offset %d and a fingerprint of the first %d bytes", st, 200*9, fingerprintSize)
	}
	if r := restoreLines(t, path, state); len(r.lines) != 100 || r.lines[0] != "line-200" || len(r.resets) != 0 {
		t.Errorf("restored %d lines from %q, resets %+v; want 100 from line-200, none", len(r.lines), r.lines[0], r.resets)
	}
	truncate(t, path, "X"+content[1:])
	r := restoreLines(t, path, state)
	if len(r.lines) != 300 || r.lines[0] != "Xine-000" {
		t.Errorf("restored %d lines, want the 300 of the rewritten file", len(r.lines))
	}
	checkReset(t, r, path, FileRewritten, 200*9, int64(len(content)))
}

// Only subtask 0 reads the file; restored at another parallelism it takes
// old subtask 0's state, identity included.
func TestLineFileSourceRestoreRescaled(t *testing.T) {
	path := writeTempFile(t, rotateOld)
	_, state := readLines(t, path, 3)
	other := NewLineFileSource(path, identityLine)
	if err := other.Open(subtaskContext(1, 2)); err != nil {
		t.Fatal(err)
	}
	idle, err := other.SnapshotState(1)
	other.Close()
	if err != nil {
		t.Fatal(err)
	}
	rotate(t, path, "b1\nb2\nb3\nb4\n")
	src := NewLineFileSource(path, identityLine)
	if err := src.Open(subtaskContext(0, 1)); err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	if err := src.RestoreState([][]byte{state, idle}, 2); err != nil {
		t.Fatal(err)
	}
	got, err := pollToEnd(t, Source[string](src), 10)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, []string{"b1", "b2", "b3", "b4"}) || src.Resets() != 1 {
		t.Errorf("restored from parallelism 2: %q, %d resets; want b1..b4, 1", got, src.Resets())
	}
}

// A file truncated while the source reads it: the lines written to it
// after the truncation are read from its start.
func TestLineFileSourceTruncatedWhileRead(t *testing.T) {
	path := writeTempFile(t, rotateOld)
	src := NewLineFileSource(path, identityLine)
	if err := src.Open(subtaskContext(0, 1)); err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	var got []string
	out := CollectorFunc[string](func(s string) { got = append(got, s) })
	for range 3 {
		if st, err := src.Poll(out, 1); err != nil || st != MoreAvailable {
			t.Fatalf("Poll = %v, %v", st, err)
		}
	}
	truncate(t, path, "b1\nb2\n")
	rest, err := pollToEnd(t, Source[string](src), 10)
	if err != nil {
		t.Fatal(err)
	}
	// The first read took the whole old file into the reader's buffer:
	// a4 was read before the truncation.
	if all, want := append(got, rest...), append(slices.Clone(rotateOldLines), "b1", "b2"); !slices.Equal(all, want) {
		t.Errorf("read %q, want %q", all, want)
	}
	if src.Resets() != 1 || src.Position() != 6 {
		t.Errorf("Resets() = %d, Position() = %d; want 1, 6", src.Resets(), src.Position())
	}
}

func TestDecodeFileState(t *testing.T) {
	for _, st := range []fileState{
		{pos: 0},
		{pos: 9, hasID: true, id: fileID{dev: 2049, ino: 1 << 40}, head: 9, fp: 0xdeadbeef},
		{pos: 5000, head: fingerprintSize, fp: 1},
	} {
		got, err := decodeFileState(st.encode(nil))
		if err != nil || got != st {
			t.Errorf("decode(encode(%+v)) = %+v, %v", st, got, err)
		}
	}
	for _, bad := range [][]byte{
		nil,
		binary.AppendVarint(nil, 9)[:0],
		append(binary.AppendVarint(nil, 9), 2, 0),                      // unknown format
		append(binary.AppendVarint(nil, 9), 1, 2),                      // unknown flag
		append(binary.AppendVarint(nil, 9), 1, 1, 0x80),                // cut device
		fileState{pos: 9, head: 9}.encode(nil)[:11],                    // cut fingerprint
		append(fileState{pos: 9, head: 9}.encode(nil), 0),              // trailing byte
		fileState{pos: 9, head: 10}.encode(nil),                        // head past the offset
		fileState{pos: 1 << 20, head: fingerprintSize + 1}.encode(nil), // head too long
	} {
		if st, err := decodeFileState(bad); err == nil {
			t.Errorf("decodeFileState(%x) = %+v, want an error", bad, st)
		}
	}
}

func FuzzDecodeFileState(f *testing.F) {
	f.Add(binary.AppendVarint(nil, 9))
	f.Add(fileState{pos: -25}.encode(nil)) // a negative offset (SetPosition takes it as 0)
	f.Add(fileState{pos: 9, hasID: true, id: fileID{dev: 1, ino: 2}, head: 9, fp: 3}.encode(nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		st, err := decodeFileState(b)
		if err != nil {
			return
		}
		again, err := decodeFileState(st.encode(nil))
		if err != nil || again != st {
			t.Fatalf("decode(encode(%+v)) = %+v, %v", st, again, err)
		}
	})
}
