package ingestlog

import (
	"context"
	"errors"
	"flag"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/edgedio/edged/internal/testutil"
)

var batchSeed = flag.Uint64("batch.seed", 0, "seed of TestBatchAppendCrashDuringGroupCommit (0: random)")

// framesOnDisk returns how many whole records the segment file at path
// holds, from its start, and fails the test unless they are msg(base),
// msg(base+1), ... in that order.
func framesOnDisk(t testing.TB, path string, base int) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Error(err)
		return 0
	}
	n := 0
	for pos := int64(headerSize); pos < int64(len(b)); n++ {
		m, size, err := decodeFrame(b[pos:])
		if err != nil {
			t.Errorf("%s at byte %d (record %d): %v", path, pos, base+n, err)
			return n
		}
		if !sameMessage(m, msg(base+n)) {
			t.Errorf("%s: record %d on disk is %+v, want %+v", path, base+n, m, msg(base+n))
			return n
		}
		pos += size
	}
	return n
}

// Records appended without waiting stay in memory, in offset order, until
// a group commit writes them with one write and fsyncs them: the file
// holds none of them before, and all of them, in order, when the fsync
// starts. Appends go on while the leader writes and fsyncs, into the next
// batch, which that fsync does not cover: durable advances to exactly the
// records taken before it, and only once the fsync has returned.
func TestBatchAppendOneWritePerGroupCommit(t *testing.T) {
	dir := t.TempDir()
	l := openLog(t, dir, testOptions(1<<20), nil)
	path := lastSegment(t, dir)
	entered := make(chan int, 1) // records on disk when the fsync starts
	release := make(chan struct{})
	var hooked atomic.Bool
	l.syncFile = func(f *os.File) error {
		if hooked.Load() {
			entered <- framesOnDisk(t, path, 0)
			<-release
		}
		return f.Sync()
	}
	st0 := l.Stats()

	const first, second = 100, 50
	for i := range first {
		off, err := l.AppendNoWait(context.Background(), msg(i))
		if err != nil || off != uint64(i) {
			t.Fatalf("AppendNoWait %d: offset %d, %v", i, off, err)
		}
	}
	if size := fileSizeOf(t, path); size != headerSize {
		t.Fatalf("segment file holds %d bytes before any group commit, want only its %d-byte header", size, headerSize)
	}
	if st := l.Stats(); st.Writes != st0.Writes || st.Fsyncs != st0.Fsyncs {
		t.Fatalf("before the group commit: %d writes, %d fsyncs; want none", st.Writes-st0.Writes, st.Fsyncs-st0.Fsyncs)
	}

	hooked.Store(true)
	waited := make(chan error, 1)
	go func() { waited <- l.WaitDurable(first - 1) }()
	if n := <-entered; n != first {
		t.Fatalf("the fsync started with %d records on disk, want the batch of %d", n, first)
	}
	// The leader is in its fsync, outside the lock.
	if d := l.DurableOffset(); d != 0 {
		t.Fatalf("durable offset %d while the fsync covering the records runs", d)
	}
	if recs := readAll(t, l, 0); len(recs) != 0 {
		t.Fatalf("a Reader saw %d records before their fsync returned", len(recs))
	}
	for i := first; i < first+second; i++ {
		if _, err := l.AppendNoWait(context.Background(), msg(i)); err != nil {
			t.Fatalf("AppendNoWait %d during the fsync: %v", i, err)
		}
	}
	select {
	case err := <-waited:
		t.Fatalf("WaitDurable returned (%v) before the fsync did", err)
	default:
	}
	hooked.Store(false)
	close(release)
	if err := <-waited; err != nil {
		t.Fatal(err)
	}
	if d := l.DurableOffset(); d != first {
		t.Fatalf("after the fsync: durable offset %d, want %d (the records appended during it are not covered)", d, first)
	}
	st := l.Stats()
	if w, f := st.Writes-st0.Writes, st.Fsyncs-st0.Fsyncs; w != 1 || f != 1 {
		t.Fatalf("group commit of %d records: %d writes, %d fsyncs; want 1 and 1", first, w, f)
	}
	checkRecords(t, readAll(t, l, 0), 0, first)

	if err := l.WaitDurable(first + second - 1); err != nil {
		t.Fatal(err)
	}
	st = l.Stats()
	if w, f := st.Writes-st0.Writes, st.Fsyncs-st0.Fsyncs; w != 2 || f != 2 {
		t.Fatalf("two group commits: %d writes, %d fsyncs; want 2 and 2", w, f)
	}
	checkRecords(t, readAll(t, l, 0), 0, first+second)
}

// More than pendFlushBytes appended between group commits are written
// without waiting for one, so memory stays bounded; a record that large
// is written by its own Append. Neither is durable before the fsync.
func TestBatchAppendBoundsMemory(t *testing.T) {
	dir := t.TempDir()
	l := openLog(t, dir, testOptions(8<<20), nil)
	path := lastSegment(t, dir)
	st0 := l.Stats()
	n := 0
	for l.Stats().Writes == st0.Writes {
		if _, err := l.AppendNoWait(context.Background(), msg(n)); err != nil {
			t.Fatal(err)
		}
		n++
		if n > pendFlushBytes {
			t.Fatalf("%d records appended and none written", n)
		}
	}
	if size := fileSizeOf(t, path) - headerSize; size < pendFlushBytes || size > pendFlushBytes+1024 {
		t.Fatalf("%d bytes written after %d records, want about %d", size, n, pendFlushBytes)
	}
	if got := framesOnDisk(t, path, 0); got != n {
		t.Fatalf("%d records on disk, want %d", got, n)
	}
	big := Message{Topic: "big", Payload: make([]byte, pendFlushBytes)}
	if _, err := l.AppendNoWait(context.Background(), msg(n)); err != nil {
		t.Fatal(err)
	}
	off, err := l.AppendNoWait(context.Background(), big)
	if err != nil {
		t.Fatal(err)
	}
	if st := l.Stats(); st.Writes-st0.Writes != 3 || st.DurableOffset != 0 {
		t.Fatalf("after a large record: %d writes (want 3: the batch, the record before it, the record), durable offset %d",
			st.Writes-st0.Writes, st.DurableOffset)
	}
	if err := l.WaitDurable(off); err != nil {
		t.Fatal(err)
	}
	recs := readAll(t, l, 0)
	if len(recs) != n+2 || len(recs[n+1].Payload) != pendFlushBytes {
		t.Fatalf("read %d records, want %d ending with the large one", len(recs), n+2)
	}
	checkRecords(t, recs[:n+1], 0, n+1)
}

// One appender writes in arrival order without waiting while an acker
// waits for each record in that order, as the mqtt Subscriber does, on
// small segments so that the batches cross segment rolls, under CPU
// contention. Every record is acknowledged only once an fsync that began
// with it on disk has returned, the acknowledgements come in offset
// order, and the log reads back in arrival order.
func TestBatchAppendOrderAndDurability(t *testing.T) {
	testutil.Burn(t, 2)
	dir := t.TempDir()
	l := openLog(t, dir, testOptions(32<<10), nil)
	// synced: the most records (counted from offset 0 over every segment)
	// on disk when an fsync that has returned started.
	var synced atomic.Int64
	var segBase atomic.Int64 // offset of the segment being fsynced
	l.syncFile = func(f *os.File) error {
		base, _ := parseSegmentName(filepath.Base(f.Name()))
		on := int64(framesOnDisk(t, f.Name(), int(base))) + int64(base)
		err := f.Sync()
		segBase.Store(int64(base))
		for {
			cur := synced.Load()
			if on <= cur || synced.CompareAndSwap(cur, on) {
				break
			}
		}
		return err
	}

	const n = 6000
	offs := make(chan uint64, 256)
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(offs)
		for i := range n {
			off, err := l.AppendNoWait(context.Background(), msg(i))
			if err != nil {
				t.Errorf("AppendNoWait %d: %v", i, err)
				return
			}
			if off != uint64(i) {
				t.Errorf("AppendNoWait %d got offset %d", i, off)
				return
			}
			offs <- off
		}
	})
	acked := 0
	for off := range offs {
		if off != uint64(acked) {
			t.Fatalf("acknowledgement %d for offset %d", acked, off)
		}
		if err := l.WaitDurable(off); err != nil {
			t.Fatal(err)
		}
		if s := synced.Load(); s <= int64(off) {
			t.Fatalf("offset %d reported durable, but the last fsync that returned started with %d records on disk", off, s)
		}
		acked++
	}
	wg.Wait()
	if acked != n {
		t.Fatalf("%d acknowledged, want %d", acked, n)
	}
	st := l.Stats()
	if st.Segments < 5 {
		t.Fatalf("%d segments: the test did not cross segment rolls", st.Segments)
	}
	if st.Writes >= n/2 {
		t.Fatalf("%d writes for %d records: no batching", st.Writes, n)
	}
	// Each roll fsyncs the sealed segment, the new file and the
	// directory; the other fsyncs are group commits led by WaitDurable.
	if leader := st.Fsyncs - 3*uint64(st.Segments-1); leader == 0 {
		t.Fatalf("%d fsyncs over %d segments: the group commits were not exercised", st.Fsyncs, st.Segments)
	}
	t.Logf("%d records, %d writes, %d fsyncs, %d segments", n, st.Writes, st.Fsyncs, st.Segments)
	checkRecords(t, readAll(t, l, 0), 0, n)
}

// A crash while a group commit's write is on its way to the disk leaves
// any part of the batch: cut anywhere in it, or with a hole of zeros in
// it (pages written back out of order). Recovery keeps the records
// before the first damaged one, in order, including every record durable
// before the crash, cuts the rest as torn, and appends at the offset
// after them.
func TestBatchAppendCrashDuringGroupCommit(t *testing.T) {
	seed := *batchSeed
	if seed == 0 {
		seed = rand.Uint64()
	}
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 3))
	for round := range 20 {
		dir := t.TempDir()
		l := openLog(t, dir, testOptions(1<<20), nil)
		path := lastSegment(t, dir)
		durable := 1 + rng.IntN(30)
		for i := range durable {
			if _, err := l.AppendNoWait(context.Background(), msg(i)); err != nil {
				t.Fatal(err)
			}
		}
		if err := l.WaitDurable(uint64(durable - 1)); err != nil {
			t.Fatal(err)
		}
		durableEnd := fileSizeOf(t, path)
		batch := 1 + rng.IntN(40)
		var crashDir string
		l.syncFile = func(f *os.File) error {
			if crashDir == "" {
				crashDir = copyDir(t, dir) // the batch is written, not fsynced
			}
			return f.Sync()
		}
		for i := durable; i < durable+batch; i++ {
			if _, err := l.AppendNoWait(context.Background(), msg(i)); err != nil {
				t.Fatal(err)
			}
		}
		if err := l.WaitDurable(uint64(durable + batch - 1)); err != nil {
			t.Fatal(err)
		}
		if crashDir == "" {
			t.Fatal("the group commit never reached its fsync")
		}
		cpath := lastSegment(t, crashDir)
		end := fileSizeOf(t, cpath)
		if got := framesOnDisk(t, cpath, 0); got != durable+batch {
			t.Fatalf("round %d: %d records written before the fsync, want %d", round, got, durable+batch)
		}
		starts := frameStarts(t, cpath)
		orig, err := os.ReadFile(cpath)
		if err != nil {
			t.Fatal(err)
		}
		cut := durableEnd + rng.Int64N(end-durableEnd+1)
		if round%2 == 0 {
			truncateFile(t, cpath, cut)
		} else if cut < end {
			overwrite(t, cpath, cut, make([]byte, 1+rng.Int64N(end-cut)))
		}
		// The first byte the damage changed (zeros written over zeros
		// change nothing); the records that end at or before it survive.
		damaged, err := os.ReadFile(cpath)
		if err != nil {
			t.Fatal(err)
		}
		first := int64(len(damaged))
		for i := range damaged {
			if damaged[i] != orig[i] {
				first = int64(i)
				break
			}
		}
		kept := 0
		for k := range starts {
			e := end
			if k+1 < len(starts) {
				e = starts[k+1]
			}
			if e <= first {
				kept = k + 1
			}
		}
		cl, err := Open(crashDir, testOptions(1<<20), nil)
		if err != nil {
			t.Fatalf("round %d (durable %d, batch %d, cut at %d of %d..%d): Open: %v", round, durable, batch, cut, durableEnd, end, err)
		}
		recs := readAll(t, cl, 0)
		if len(recs) < durable {
			t.Fatalf("round %d: %d records recovered, but %d were durable", round, len(recs), durable)
		}
		checkRecords(t, recs, 0, kept)
		off, err := cl.Append(context.Background(), msg(kept))
		if err != nil || off != uint64(kept) {
			t.Fatalf("round %d: Append after recovery = %d, %v; want %d", round, off, err, kept)
		}
		if err := cl.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// Close writes and fsyncs the records still held in memory.
func TestBatchAppendClose(t *testing.T) {
	dir := t.TempDir()
	l, err := Open(dir, testOptions(1<<20), nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if _, err := l.AppendNoWait(context.Background(), msg(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = openLog(t, dir, testOptions(1<<20), nil)
	checkRecords(t, readAll(t, l, 0), 0, 10)
}

// A Reader or a Truncate at an offset whose records before it are still
// in memory first makes them durable, then finds its place in the file.
func TestBatchAppendReaderAndTruncateInsideBatch(t *testing.T) {
	l := openLog(t, t.TempDir(), testOptions(1<<20), nil)
	for i := range 20 {
		if _, err := l.AppendNoWait(context.Background(), msg(i)); err != nil {
			t.Fatal(err)
		}
	}
	r, err := l.Reader(7)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if d := l.DurableOffset(); d < 7 {
		t.Fatalf("durable offset %d after a Reader from 7", d)
	}
	var recs []Record
	for len(recs) < 13 {
		rec, err := r.Next(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, rec)
	}
	checkRecords(t, recs, 7, 13)
	for i := 20; i < 30; i++ {
		if _, err := l.AppendNoWait(context.Background(), msg(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Truncate(25); err != nil {
		t.Fatal(err)
	}
	if st := l.Stats(); st.ReleasedOffset != 25 || st.DurableOffset < 25 {
		t.Fatalf("after Truncate(25): %+v", st)
	}
	if err := l.WaitDurable(29); err != nil {
		t.Fatal(err)
	}
	checkRecords(t, readAll(t, l, 25), 25, 5)
}

// A failed write of a batch stops the log: its records already have
// offsets, so WaitDurable, later appends and Readers at the end report
// ErrFailed, nothing of the batch is reported durable, and a reopen keeps
// what was durable.
func TestBatchAppendWriteFailureFailsTheLog(t *testing.T) {
	dir := t.TempDir()
	l, err := Open(dir, testOptions(1<<20), nil)
	if err != nil {
		t.Fatal(err)
	}
	appendN(t, l, 0, 5)
	for i := 5; i < 10; i++ {
		if _, err := l.AppendNoWait(context.Background(), msg(i)); err != nil {
			t.Fatal(err)
		}
	}
	// Writes through a read-only handle fail (EBADF); the test owns l.mu
	// while it swaps the handle in.
	seg := l.segs[len(l.segs)-1]
	ro, err := os.Open(seg.path)
	if err != nil {
		t.Fatal(err)
	}
	l.mu.Lock()
	rw := seg.f
	seg.f = ro
	l.mu.Unlock()
	if err := l.WaitDurable(9); !errors.Is(err, ErrFailed) {
		t.Fatalf("WaitDurable after a failed write: %v, want ErrFailed", err)
	}
	if d := l.DurableOffset(); d != 5 {
		t.Fatalf("durable offset %d after the failed batch, want 5", d)
	}
	if _, err := l.AppendNoWait(context.Background(), msg(10)); !errors.Is(err, ErrFailed) {
		t.Fatalf("AppendNoWait on a failed log: %v, want ErrFailed", err)
	}
	l.mu.Lock()
	seg.f = rw
	l.mu.Unlock()
	ro.Close()
	l.Close()
	l = openLog(t, dir, testOptions(1<<20), nil)
	checkRecords(t, readAll(t, l, 0), 0, 5)
}
