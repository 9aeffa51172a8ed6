package ingestlog

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// buildLog writes n records into dir with small segments and closes it.
func buildLog(t *testing.T, n int) string {
	t.Helper()
	dir := t.TempDir()
	l, err := Open(dir, testOptions(400), nil)
	if err != nil {
		t.Fatal(err)
	}
	appendN(t, l, 0, n)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if len(segmentFiles(t, dir)) < 3 {
		t.Fatal("want at least 3 segments")
	}
	return dir
}

func truncateFile(t *testing.T, path string, size int64) {
	t.Helper()
	if err := os.Truncate(path, size); err != nil {
		t.Fatal(err)
	}
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

func TestTornTail(t *testing.T) {
	const n = 30
	tests := []struct {
		name string
		// damage damages the last segment, whose records start at the
		// given positions, and returns how many records survive.
		damage func(t *testing.T, path string, starts []int64) (lost int)
	}{
		{"cut mid-record", func(t *testing.T, path string, starts []int64) int {
			truncateFile(t, path, starts[len(starts)-1]+11)
			return 1
		}},
		{"cut mid-header", func(t *testing.T, path string, starts []int64) int {
			truncateFile(t, path, starts[len(starts)-1]+3)
			return 1
		}},
		{"flipped byte in the last record", func(t *testing.T, path string, starts []int64) int {
			flipByte(t, path, fileSize(t, path)-2)
			return 1
		}},
		{"flipped length of the last record", func(t *testing.T, path string, starts []int64) int {
			flipByte(t, path, starts[len(starts)-1]) // now runs past the end
			return 1
		}},
		{"zero-filled tail", func(t *testing.T, path string, starts []int64) int {
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			// Zero the last two records and extend, as a file system may
			// after a crash.
			if _, err := f.WriteAt(make([]byte, 200), starts[len(starts)-2]); err != nil {
				t.Fatal(err)
			}
			return 2
		}},
		{"bad last record then zeros", func(t *testing.T, path string, starts []int64) int {
			flipByte(t, path, fileSize(t, path)-2)
			f, err := os.OpenFile(path, os.O_RDWR|os.O_APPEND, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if _, err := f.Write(make([]byte, 100)); err != nil {
				t.Fatal(err)
			}
			return 1
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := buildLog(t, n)
			path := lastSegment(t, dir)
			starts := frameStarts(t, path)
			if len(starts) < 2 {
				t.Fatal("last segment needs 2 records")
			}
			before := fileSize(t, path)
			lost := tt.damage(t, path, starts)
			damaged := fileSize(t, path)

			logger, logs := newLogger()
			l := openLog(t, dir, testOptions(400), logger)
			kept := n - lost
			st := l.Stats()
			if st.NextOffset != uint64(kept) {
				t.Fatalf("next offset %d, want %d", st.NextOffset, kept)
			}
			cut := starts[len(starts)-lost]
			if got := fileSize(t, path); got != cut {
				t.Fatalf("last segment is %d bytes, want %d (was %d)", got, cut, before)
			}
			if st.TornBytes != damaged-cut {
				t.Fatalf("TornBytes %d, want %d", st.TornBytes, damaged-cut)
			}
			if out := logs.String(); !strings.Contains(out, "dropped torn tail") ||
				!strings.Contains(out, fmt.Sprintf("bytes_dropped=%d", damaged-cut)) {
				t.Fatalf("log does not report the dropped bytes:\n%s", out)
			}
			checkRecords(t, readAll(t, l, 0), 0, kept)
			appendN(t, l, kept, 5)
			checkRecords(t, readAll(t, l, 0), 0, kept+5)
		})
	}
}

func TestTornSegmentHeader(t *testing.T) {
	for _, size := range []int64{0, 10, headerSize} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			dir := buildLog(t, 30)
			// A crash while creating the next segment: its header never
			// reached the disk (a short file, or a zero-filled one).
			path := filepath.Join(dir, segmentName(30))
			if err := os.WriteFile(path, make([]byte, size), 0o644); err != nil {
				t.Fatal(err)
			}
			logger, logs := newLogger()
			l := openLog(t, dir, testOptions(400), logger)
			if l.Stats().NextOffset != 30 || !strings.Contains(logs.String(), "header was never written") {
				t.Fatalf("stats %+v, log:\n%s", l.Stats(), logs)
			}
			appendN(t, l, 30, 20)
			checkRecords(t, readAll(t, l, 0), 0, 50)
		})
	}
}

func TestCorruptEarlierSegment(t *testing.T) {
	dir := buildLog(t, 30)
	names := segmentFiles(t, dir)
	path := filepath.Join(dir, names[1])
	base, _ := parseSegmentName(names[1])
	starts := frameStarts(t, path)
	// A flipped byte in the payload of the second record of segment 1.
	flipByte(t, path, starts[1]+20)

	_, err := Open(dir, testOptions(400), nil)
	if !errors.Is(err, ErrCorrupt) || !errors.Is(err, ErrChecksum) {
		t.Fatalf("Open = %v, want ErrCorrupt", err)
	}
	var ce *CorruptError
	if !errors.As(err, &ce) || ce.Segment != path || ce.Offset != base+1 || ce.Pos != starts[1] {
		t.Fatalf("error %v does not name segment %s, offset %d, byte %d", err, path, base+1, starts[1])
	}

	// Even as the last record of an earlier segment, damage is damage.
	dir = buildLog(t, 30)
	path = filepath.Join(dir, segmentFiles(t, dir)[0])
	truncateFile(t, path, fileSize(t, path)-1)
	if _, err := Open(dir, testOptions(400), nil); !errors.Is(err, ErrCorrupt) || !errors.Is(err, ErrRecordLength) {
		t.Fatalf("Open with a cut earlier segment = %v", err)
	}
}

func TestCorruptMiddleOfLastSegment(t *testing.T) {
	dir := buildLog(t, 30)
	path := lastSegment(t, dir)
	starts := frameStarts(t, path)
	flipByte(t, path, starts[0]+10)
	_, err := Open(dir, testOptions(400), nil)
	var ce *CorruptError
	if !errors.As(err, &ce) || !errors.Is(err, ErrCorrupt) || ce.Segment != path {
		t.Fatalf("Open = %v, want a CorruptError for %s", err, path)
	}
}

func TestSegmentGap(t *testing.T) {
	dir := buildLog(t, 30)
	names := segmentFiles(t, dir)
	if err := os.Remove(filepath.Join(dir, names[1])); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(dir, testOptions(400), nil); !errors.Is(err, ErrGap) || !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Open with a missing segment = %v", err)
	}
}

func TestSegmentHeaderErrors(t *testing.T) {
	tests := []struct {
		name   string
		damage func(b []byte)
		want   error
	}{
		{"magic", func(b []byte) { b[1] = 'x' }, ErrBadMagic},
		{"version", func(b []byte) { copy(b, encodeHeaderVersion(0, 9)) }, ErrVersion},
		{"checksum", func(b []byte) { b[13] ^= 1 }, ErrChecksum},
		{"base", func(b []byte) { copy(b, encodeHeader(5)) }, ErrCorrupt},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := buildLog(t, 30)
			path := filepath.Join(dir, segmentFiles(t, dir)[0])
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			tt.damage(b)
			if err := os.WriteFile(path, b, 0o644); err != nil {
				t.Fatal(err)
			}
			_, err = Open(dir, testOptions(400), nil)
			if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), path) {
				t.Fatalf("Open = %v, want %v naming %s", err, tt.want, path)
			}
		})
	}
}

// encodeHeaderVersion is encodeHeader with another version.
func encodeHeaderVersion(base uint64, version uint16) []byte {
	b := encodeHeader(base)
	b[8], b[9] = byte(version), byte(version>>8)
	return resealHeader(b)
}

func resealHeader(b []byte) []byte {
	binary.LittleEndian.PutUint32(b[20:], crc32.Checksum(b[:20], castagnoli))
	return b
}

// TestCrashCopy simulates crashes: while 8 goroutines append, the
// directory is copied at arbitrary moments and the copy's last segment is
// cut at a random byte after its last acknowledged record (unsynced writes
// lost); each copy, reopened, holds every record whose Append had returned
// before the copy started.
func TestCrashCopy(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))

	dir := t.TempDir()
	opts := DefaultOptions()
	opts.SegmentBytes = 2048
	l := openLog(t, dir, opts, nil)

	var mu sync.Mutex
	acked := make(map[uint64]int)  // offset -> message index, once Append returned
	bell := make(chan struct{}, 1) // rung after each acknowledgement
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	var next sync.Mutex
	idx := 0
	for range 8 {
		wg.Go(func() {
			for ctx.Err() == nil {
				next.Lock()
				i := idx
				idx++
				next.Unlock()
				off, err := l.Append(ctx, msg(i))
				if err != nil {
					// The end of the test cancels the appends that wait
					// (for a group commit before a new segment, say).
					if !errors.Is(err, context.Canceled) || ctx.Err() == nil {
						t.Error(err)
					}
					return
				}
				mu.Lock()
				acked[off] = i
				mu.Unlock()
				select {
				case bell <- struct{}{}:
				default:
				}
			}
		})
	}

	type crash struct {
		dir   string
		acked map[uint64]int
	}
	var crashes []crash
	for range 12 {
		// Wait for some more acknowledgements, a random number of them.
		target := len(crashes)*40 + rng.IntN(40) + 1
		for {
			mu.Lock()
			n := len(acked)
			mu.Unlock()
			if n >= target {
				break
			}
			<-bell
		}
		mu.Lock()
		snap := make(map[uint64]int, len(acked))
		for k, v := range acked {
			snap[k] = v
		}
		mu.Unlock()
		c := crash{dir: copyDir(t, dir), acked: snap}
		tearCopy(t, rng, c.dir, snap)
		crashes = append(crashes, c)
	}
	cancel()
	wg.Wait()

	torn := 0
	defer func() { t.Logf("%d of %d copies had a torn tail", torn, len(crashes)) }()
	for k, c := range crashes {
		logger, logs := newLogger()
		cl, err := Open(c.dir, opts, logger)
		if err != nil {
			t.Fatalf("crash %d: Open: %v", k, err)
		}
		if cl.Stats().TornBytes > 0 {
			torn++
		}
		recs := readAll(t, cl, 0)
		byOffset := make(map[uint64]Record, len(recs))
		for _, r := range recs {
			byOffset[r.Offset] = r
		}
		for off, i := range c.acked {
			r, ok := byOffset[off]
			if !ok {
				t.Fatalf("crash %d: acknowledged offset %d missing (%d records recovered)\n%s", k, off, len(recs), logs)
			}
			if !sameMessage(r.Message, msg(i)) {
				t.Fatalf("crash %d: offset %d holds %+v, want message %d", k, off, r.Message, i)
			}
		}
		// The recovered log takes appends at the right offset.
		off, err := cl.Append(context.Background(), msg(1_000_000))
		if err != nil || off != uint64(len(recs)) {
			t.Fatalf("crash %d: Append after recovery = %d, %v; want %d", k, off, err, len(recs))
		}
		if err := cl.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// tearCopy cuts the last segment of a copied log at a random byte after
// the last acknowledged record in it: what a crash may leave of writes
// that were never fsynced.
func tearCopy(t *testing.T, rng *rand.Rand, dir string, acked map[uint64]int) {
	t.Helper()
	path := lastSegment(t, dir)
	base, _ := parseSegmentName(filepath.Base(path))
	size := fileSize(t, path)
	if size < headerSize {
		return
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	keep := int64(headerSize) // end of the last acknowledged record
	off := base
	for pos := int64(headerSize); pos < size; off++ {
		_, n, err := decodeFrame(b[pos:])
		if err != nil {
			break // a record being written when the copy was taken
		}
		pos += n
		if _, ok := acked[off]; ok {
			keep = pos
		}
	}
	truncateFile(t, path, keep+rng.Int64N(size-keep+1))
}
