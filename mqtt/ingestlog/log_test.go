package ingestlog

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestAppendReadAcrossSegments(t *testing.T) {
	dir := t.TempDir()
	l := openLog(t, dir, testOptions(300), nil)
	const n = 100
	appendN(t, l, 0, n)

	st := l.Stats()
	if st.NextOffset != n || st.DurableOffset != n || st.FirstOffset != 0 || st.Appends != n {
		t.Fatalf("stats %+v", st)
	}
	if st.Segments < 10 || st.Segments != len(segmentFiles(t, dir)) {
		t.Fatalf("%d segments in stats, %d files", st.Segments, len(segmentFiles(t, dir)))
	}
	checkRecords(t, readAll(t, l, 0), 0, n)

	// Every start offset, segment boundaries included.
	for from := 0; from <= n; from++ {
		checkRecords(t, readAll(t, l, uint64(from)), from, n-from)
	}
	// Segment names are the offsets of their first records.
	for _, name := range segmentFiles(t, dir) {
		base, _ := parseSegmentName(name)
		recs := readAll(t, l, base)
		if len(recs) == 0 && base != n {
			t.Fatalf("segment %s holds no record", name)
		}
	}
	if _, err := l.Reader(n + 1); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("Reader past the end: %v", err)
	}
}

func TestReopen(t *testing.T) {
	dir := t.TempDir()
	l, err := Open(dir, testOptions(512), nil)
	if err != nil {
		t.Fatal(err)
	}
	appendN(t, l, 0, 40)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := l.Append(context.Background(), msg(0)); !errors.Is(err, ErrClosed) {
		t.Fatalf("Append after Close: %v", err)
	}

	l = openLog(t, dir, testOptions(512), nil)
	st := l.Stats()
	if st.NextOffset != 40 || st.FirstOffset != 0 || st.TornBytes != 0 {
		t.Fatalf("reopened stats %+v", st)
	}
	checkRecords(t, readAll(t, l, 0), 0, 40)
	appendN(t, l, 40, 25)
	checkRecords(t, readAll(t, l, 0), 0, 65)
	checkRecords(t, readAll(t, l, 33), 33, 32)
}

func TestOpenLocked(t *testing.T) {
	dir := t.TempDir()
	openLog(t, dir, testOptions(1024), nil)
	if _, err := Open(dir, testOptions(1024), nil); !errors.Is(err, ErrLocked) {
		t.Fatalf("second Open = %v, want ErrLocked", err)
	}
}

func TestOptionsValidate(t *testing.T) {
	if err := DefaultOptions().Validate(); err != nil {
		t.Fatal(err)
	}
	err := Options{SegmentBytes: 10, MaxBytes: -1, SyncInterval: -1}.Validate()
	if !errors.Is(err, ErrInvalidOptions) {
		t.Fatalf("Validate = %v", err)
	}
	for _, key := range []string{"segment_bytes", "max_bytes", "sync_interval"} {
		if !strings.Contains(err.Error(), key) {
			t.Errorf("%q does not name %s", err, key)
		}
	}
	if _, err := Open(t.TempDir(), Options{}, nil); !errors.Is(err, ErrInvalidOptions) {
		t.Fatalf("Open with zero Options = %v", err)
	}
}

func TestAppendTooLarge(t *testing.T) {
	l := openLog(t, t.TempDir(), Options{SegmentBytes: 1024}, nil)
	big := Message{Topic: "t", Payload: make([]byte, 1024)}
	if _, err := l.Append(context.Background(), big); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("Append larger than a segment: %v", err)
	}
	if _, err := l.Append(context.Background(), Message{QoS: 3}); !errors.Is(err, ErrInvalidMessage) {
		t.Fatalf("Append QoS 3: %v", err)
	}
	l2 := openLog(t, t.TempDir(), Options{SegmentBytes: 1 << 20, MaxBytes: 100}, nil)
	if _, err := l2.Append(context.Background(), big); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("Append larger than MaxBytes: %v", err)
	}
	// A record that exactly fills a segment fits.
	exact := Message{Topic: "t"}
	for frameSize(&exact) < 1024-headerSize {
		exact.Payload = append(exact.Payload, 0)
	}
	if frameSize(&exact) != 1024-headerSize {
		t.Fatalf("frame of %d bytes", frameSize(&exact))
	}
	if _, err := l.Append(context.Background(), exact); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Append(context.Background(), exact); err != nil {
		t.Fatal(err)
	}
	if got := l.Stats().Segments; got != 2 {
		t.Fatalf("%d segments, want 2", got)
	}
}

// TestMaxMessageBytes: a message whose topic and payload together are
// MaxMessageBytes long is appended, with the largest packet identifier
// and receive time, and one framed past the segment is refused with an
// error that names its topic and sizes.
func TestMaxMessageBytes(t *testing.T) {
	for _, opts := range []Options{{SegmentBytes: 1024}, {SegmentBytes: 1 << 20, MaxBytes: 500}} {
		l := openLog(t, t.TempDir(), opts, nil)
		n := l.MaxMessageBytes()
		if n != opts.MaxMessageBytes() || n <= 0 {
			t.Fatalf("MaxMessageBytes = %d (options say %d)", n, opts.MaxMessageBytes())
		}
		fit := Message{Topic: "sensors/a", QoS: 2, PacketID: 65535, Received: time.Unix(0, -1<<62)}
		fit.Payload = make([]byte, n-int64(len(fit.Topic)))
		if _, err := l.Append(context.Background(), fit); err != nil {
			t.Fatalf("Append of MaxMessageBytes (%d): %v", n, err)
		}
		big := Message{Topic: "sensors/b", Payload: make([]byte, opts.SegmentBytes)}
		_, err := l.AppendNoWait(context.Background(), big)
		if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), `"sensors/b"`) ||
			!strings.Contains(err.Error(), fmt.Sprint(opts.SegmentBytes)) {
			t.Fatalf("AppendNoWait of a payload of a segment's size: %v", err)
		}
	}
	if got := (Options{SegmentBytes: 1024, MaxBytes: 10}).MaxMessageBytes(); got != 0 {
		t.Errorf("MaxMessageBytes with max_bytes 10 = %d, want 0", got)
	}
}

func TestConcurrentAppends(t *testing.T) {
	dir := t.TempDir()
	opts := DefaultOptions()
	opts.SegmentBytes = 4096
	l := openLog(t, dir, opts, nil)
	const writers, each = 16, 150
	offsets := make([][]uint64, writers)
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				m := msg(w*each + i)
				off, err := l.Append(context.Background(), m)
				if err != nil {
					errs <- err
					return
				}
				offsets[w] = append(offsets[w], off)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	// Every offset returned once, dense, and each holds what its Append
	// stored; each writer's offsets increase.
	byOffset := make(map[uint64]int, writers*each)
	for w, offs := range offsets {
		for i, off := range offs {
			if i > 0 && off <= offs[i-1] {
				t.Fatalf("writer %d: offset %d after %d", w, off, offs[i-1])
			}
			if _, dup := byOffset[off]; dup {
				t.Fatalf("offset %d returned twice", off)
			}
			byOffset[off] = w*each + i
		}
	}
	check := func(l *Log) {
		recs := readAll(t, l, 0)
		if len(recs) != writers*each {
			t.Fatalf("read %d records, want %d", len(recs), writers*each)
		}
		for k, rec := range recs {
			i, ok := byOffset[rec.Offset]
			if !ok || rec.Offset != uint64(k) || !sameMessage(rec.Message, msg(i)) {
				t.Fatalf("record at %d: %+v", k, rec)
			}
		}
	}
	check(l)
	st := l.Stats()
	t.Logf("%d appends, %d fsyncs (%.3f per append), %d segments", st.Appends, st.Fsyncs,
		float64(st.Fsyncs)/float64(st.Appends), st.Segments)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	check(openLog(t, dir, opts, nil))
}

func TestTruncate(t *testing.T) {
	dir := t.TempDir()
	l := openLog(t, dir, testOptions(300), nil)
	appendN(t, l, 0, 60)
	var bases []uint64
	for _, name := range segmentFiles(t, dir) {
		b, _ := parseSegmentName(name)
		bases = append(bases, b)
	}
	if len(bases) < 6 {
		t.Fatalf("only %d segments", len(bases))
	}
	old, err := l.Reader(0)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if _, ok, err := old.TryNext(); !ok || err != nil {
		t.Fatalf("TryNext: %v %v", ok, err)
	}

	// Truncating inside segment 3 deletes segments 0..2, exactly.
	before := bases[3] + 1
	if err := l.Truncate(before); err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, b := range bases[3:] {
		want = append(want, segmentName(b))
	}
	if got := segmentFiles(t, dir); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("segments after Truncate(%d):\n got %v\nwant %v", before, got, want)
	}
	st := l.Stats()
	if st.FirstOffset != bases[3] || st.ReleasedOffset != before || st.Segments != len(want) {
		t.Fatalf("stats %+v", st)
	}
	if _, err := l.Reader(bases[3] - 1); !errors.Is(err, ErrTruncated) {
		t.Fatalf("Reader before the first offset: %v", err)
	}
	if _, _, err := old.TryNext(); !errors.Is(err, ErrTruncated) {
		t.Fatalf("Reader positioned in a deleted segment: %v", err)
	}
	// Records of the partly released segment are still readable.
	checkRecords(t, readAll(t, l, bases[3]), int(bases[3]), 60-int(bases[3]))

	// Truncating at a segment boundary deletes the segments before it.
	if err := l.Truncate(bases[5]); err != nil {
		t.Fatal(err)
	}
	if got := segmentFiles(t, dir)[0]; got != segmentName(bases[5]) {
		t.Fatalf("first segment %s, want %s", got, segmentName(bases[5]))
	}
	// Going back does nothing; beyond the end is refused.
	if err := l.Truncate(2); err != nil {
		t.Fatal(err)
	}
	if err := l.Truncate(61); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("Truncate past the end: %v", err)
	}
	// Everything released: only the active segment stays.
	if err := l.Truncate(60); err != nil {
		t.Fatal(err)
	}
	if got := segmentFiles(t, dir); len(got) != 1 || got[0] != segmentName(bases[len(bases)-1]) {
		t.Fatalf("segments after releasing everything: %v", got)
	}
	if st := l.Stats(); st.UnreleasedBytes != 0 {
		t.Fatalf("%d bytes unreleased", st.UnreleasedBytes)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}

	// Offsets survive: a reopened log continues where it was.
	l = openLog(t, dir, testOptions(300), nil)
	if st := l.Stats(); st.FirstOffset != bases[len(bases)-1] || st.NextOffset != 60 {
		t.Fatalf("reopened stats %+v", st)
	}
	appendN(t, l, 60, 5)
	checkRecords(t, readAll(t, l, 58), 58, 7)
}

func TestTruncateAccounting(t *testing.T) {
	l := openLog(t, t.TempDir(), testOptions(1<<20), nil)
	appendN(t, l, 0, 10)
	var sizes []int64
	onDisk := frameSizes(t, l.dir)
	for i := range 10 {
		m := msg(i)
		if n := onDisk[uint64(i)]; i > 0 && n != frameSize(&m)+markSize(uint64(i)) {
			t.Fatalf("record %d takes %d bytes, want its frame and a commit mark", i, n)
		}
		sizes = append(sizes, onDisk[uint64(i)])
	}
	sum := func(from int) (s int64) {
		for _, n := range sizes[from:] {
			s += n
		}
		return s
	}
	for _, before := range []uint64{0, 3, 4, 9, 10} {
		if err := l.Truncate(before); err != nil {
			t.Fatal(err)
		}
		if got := l.Stats().UnreleasedBytes; got != sum(int(before)) {
			t.Fatalf("after Truncate(%d): %d bytes unreleased, want %d", before, got, sum(int(before)))
		}
	}
}

func TestReaderWaitsForRecords(t *testing.T) {
	l := openLog(t, t.TempDir(), testOptions(256), nil)
	r, err := l.Reader(0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, ok, err := r.TryNext(); ok || err != nil {
		t.Fatalf("TryNext on an empty log: %v %v", ok, err)
	}
	ready := r.Ready()
	select {
	case <-ready:
		t.Fatal("Ready with nothing to read")
	default:
	}
	for i := range 8 {
		appendN(t, l, i, 1)
		<-ready // closed by the fsync that made record i durable
		rec, ok, err := r.TryNext()
		if err != nil || !ok {
			t.Fatalf("TryNext after append %d: %v %v", i, ok, err)
		}
		checkRecords(t, []Record{rec}, i, 1)
		ready = r.Ready()
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := r.Next(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Next with a cancelled context: %v", err)
	}
	appendN(t, l, 8, 1)
	rec, err := r.Next(context.Background())
	if err != nil || rec.Offset != 8 {
		t.Fatalf("Next = %d, %v", rec.Offset, err)
	}
	if r.Offset() != 9 {
		t.Fatalf("Offset = %d", r.Offset())
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	<-r.Ready()
	if _, _, err := r.TryNext(); !errors.Is(err, ErrClosed) {
		t.Fatalf("TryNext after Close: %v", err)
	}
}

func TestReaderFollowsAppends(t *testing.T) {
	// A reader in one goroutine follows 16 appenders across segments.
	l := openLog(t, t.TempDir(), testOptions(512), nil)
	const writers, each = 16, 40
	r, err := l.Reader(0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				if _, err := l.Append(context.Background(), msg(w*each+i)); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	for want := uint64(0); want < writers*each; want++ {
		rec, err := r.Next(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if rec.Offset != want {
			t.Fatalf("read offset %d, want %d", rec.Offset, want)
		}
	}
	wg.Wait()
}

func TestEmptyDirectoryAndStrayFiles(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	l := openLog(t, dir, testOptions(256), nil)
	if got := segmentFiles(t, dir); len(got) != 1 || got[0] != segmentName(0) {
		t.Fatalf("segments of a new log: %v", got)
	}
	appendN(t, l, 0, 3)
	checkRecords(t, readAll(t, l, 0), 0, 3)
}

func TestWriteFailureStopsTheLog(t *testing.T) {
	dir := t.TempDir()
	logger, logs := newLogger()
	l, err := Open(dir, testOptions(4096), logger)
	if err != nil {
		t.Fatal(err)
	}
	appendN(t, l, 0, 5)
	r, err := l.Reader(0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()

	// Swap the active segment's handle for a read-only one: the next write
	// fails, and so does cutting it back.
	l.mu.Lock()
	active := l.segs[len(l.segs)-1]
	ro, err := os.Open(active.path)
	if err != nil {
		t.Fatal(err)
	}
	active.f.Close()
	active.f = ro
	l.mu.Unlock()

	if _, err := l.Append(context.Background(), msg(5)); !errors.Is(err, ErrFailed) {
		t.Fatalf("Append with a failing disk = %v, want ErrFailed", err)
	}
	if _, err := l.Append(context.Background(), msg(5)); !errors.Is(err, ErrFailed) {
		t.Fatalf("Append after a failure = %v, want ErrFailed", err)
	}
	if !strings.Contains(logs.String(), "ingest log failed") {
		t.Fatalf("failure not logged:\n%s", logs)
	}
	// Readers still get what is durable, then the failure.
	for i := range 5 {
		rec, ok, err := r.TryNext()
		if err != nil || !ok || rec.Offset != uint64(i) {
			t.Fatalf("TryNext %d: %v %v %v", i, rec.Offset, ok, err)
		}
	}
	<-r.Ready()
	if _, _, err := r.TryNext(); !errors.Is(err, ErrFailed) {
		t.Fatalf("TryNext at the end of a failed log = %v", err)
	}
	if err := l.Truncate(2); !errors.Is(err, ErrFailed) {
		t.Fatalf("Truncate on a failed log = %v", err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}

	// Reopening recovers what is on disk.
	l = openLog(t, dir, testOptions(4096), nil)
	checkRecords(t, readAll(t, l, 0), 0, 5)
	appendN(t, l, 5, 1)
}
