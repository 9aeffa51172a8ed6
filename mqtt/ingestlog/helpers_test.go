package ingestlog

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/edgedio/edged/internal/testutil"
)

// testOptions returns small segments, no bound and no group commit delay.
func testOptions(segmentBytes int64) Options {
	return Options{SegmentBytes: segmentBytes}
}

// openLog opens dir and closes the log when the test ends.
func openLog(t testing.TB, dir string, opts Options, logger *slog.Logger) *Log {
	t.Helper()
	l, err := Open(dir, opts, logger)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// msg is the i-th test message: its payload names i so that a record read
// back can be checked.
func msg(i int) Message {
	return Message{
		Topic:    fmt.Sprintf("sensors/%d/temp", i%7),
		Payload:  fmt.Appendf(nil, `{"id":"s%d","seq":%d,"v":21.5}`, i%7, i),
		QoS:      byte(i % 3),
		Retain:   i%5 == 0,
		Received: time.Unix(1_700_000_000, int64(i)),
	}
}

func appendN(t testing.TB, l *Log, from, n int) {
	t.Helper()
	for i := from; i < from+n; i++ {
		off, err := l.Append(context.Background(), msg(i))
		if err != nil {
			t.Fatalf("Append %d: %v", i, err)
		}
		if off != uint64(i) {
			t.Fatalf("Append %d returned offset %d", i, off)
		}
	}
}

// readAll reads every durable record from offset from.
func readAll(t testing.TB, l *Log, from uint64) []Record {
	t.Helper()
	r, err := l.Reader(from)
	if err != nil {
		t.Fatalf("Reader(%d): %v", from, err)
	}
	defer r.Close()
	var recs []Record
	for {
		rec, ok, err := r.TryNext()
		if err != nil {
			t.Fatalf("TryNext at %d: %v", r.Offset(), err)
		}
		if !ok {
			return recs
		}
		recs = append(recs, rec)
	}
}

// checkRecords checks that recs are msg(from), msg(from+1), ... n of them.
func checkRecords(t testing.TB, recs []Record, from, n int) {
	t.Helper()
	if len(recs) != n {
		t.Fatalf("read %d records, want %d", len(recs), n)
	}
	for k, rec := range recs {
		i := from + k
		if rec.Offset != uint64(i) {
			t.Fatalf("record %d has offset %d", i, rec.Offset)
		}
		if !sameMessage(rec.Message, msg(i)) {
			t.Fatalf("record %d = %+v, want %+v", i, rec.Message, msg(i))
		}
	}
}

func sameMessage(a, b Message) bool {
	return a.Topic == b.Topic && bytes.Equal(a.Payload, b.Payload) && a.QoS == b.QoS &&
		a.Retain == b.Retain && a.Received.Equal(b.Received)
}

// segmentFiles lists the segment files of dir, sorted.
func segmentFiles(t testing.TB, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		if _, ok := parseSegmentName(e.Name()); ok {
			names = append(names, e.Name())
		}
	}
	slices.Sort(names)
	return names
}

func lastSegment(t testing.TB, dir string) string {
	t.Helper()
	names := segmentFiles(t, dir)
	return filepath.Join(dir, names[len(names)-1])
}

// frameStarts returns the byte positions of the records of a segment file.
func frameStarts(t testing.TB, path string) []int64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var starts []int64
	for pos := int64(headerSize); pos < int64(len(b)); {
		_, n, err := decodeFrame(b[pos:])
		if err != nil {
			t.Fatalf("%s at byte %d: %v", path, pos, err)
		}
		starts = append(starts, pos)
		pos += n
	}
	return starts
}

// flipByte inverts one byte of a file.
func flipByte(t testing.TB, path string, pos int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var b [1]byte
	if _, err := f.ReadAt(b[:], pos); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0xff
	if _, err := f.WriteAt(b[:], pos); err != nil {
		t.Fatal(err)
	}
}

func newLogger() (*slog.Logger, *testutil.Buffer) {
	b := &testutil.Buffer{}
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug})), b
}

// copyDir copies the regular files of src into a new directory, the way a
// crash would find them (in the page cache, here).
func copyDir(t testing.TB, src string) string {
	t.Helper()
	dst := t.TempDir()
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

// frameSizes returns the size on disk of every record in the segments of
// dir, by offset: the frame appendFrame made plus any commit mark.
func frameSizes(t testing.TB, dir string) map[uint64]int64 {
	t.Helper()
	sizes := make(map[uint64]int64)
	for _, name := range segmentFiles(t, dir) {
		path := filepath.Join(dir, name)
		base, _ := parseSegmentName(name)
		starts := frameStarts(t, path)
		end := fileSizeOf(t, path)
		for k, pos := range starts {
			next := end
			if k+1 < len(starts) {
				next = starts[k+1]
			}
			sizes[base+uint64(k)] = next - pos
		}
	}
	return sizes
}

func fileSizeOf(t testing.TB, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}
