package ingestlog

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/edgedio/edged/internal/testutil"
)

// fullDisk makes l's writes fail with ENOSPC while it is set, after
// writing half of what they were given (a short write, as a device that
// fills up mid-write leaves).
func fullDisk(l *Log) *atomic.Bool {
	var full atomic.Bool
	l.noSpaceRetry = time.Millisecond
	l.writeFile = func(f *os.File, b []byte, pos int64) (int, error) {
		if full.Load() {
			n, _ := f.WriteAt(b[:len(b)/2], pos)
			return n, &os.PathError{Op: "write", Path: f.Name(), Err: syscall.ENOSPC}
		}
		return f.WriteAt(b, pos)
	}
	return &full
}

// A device that runs out of space does not fail the log: the records
// whose write failed wait in memory with their Appends (no Append returns
// for them: back-pressure), Readers see the durable records and no error,
// and once there is space again the same records are written, each once,
// and the Appends return. Before, the first failed write failed the log
// for good (ErrFailed): every later append and the Readers at its end
// failed until the process reopened it.
func TestNoSpaceWaitsAndWritesAgain(t *testing.T) {
	dir := t.TempDir()
	logger, logs := newLogger()
	l := openLog(t, dir, testOptions(1<<20), logger)
	full := fullDisk(l)
	appendN(t, l, 0, 5)
	r, err := l.Reader(0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()

	full.Store(true)
	type result struct {
		off uint64
		err error
	}
	done := make(chan result, 5)
	for i := 5; i < 10; i++ {
		go func() {
			off, err := l.Append(context.Background(), msg(i))
			done <- result{off, err}
		}()
		// One at a time, so that offset i is msg(i).
		testutil.Eventually(t, 0, "append taken", func() bool { return l.Stats().NextOffset == uint64(i+1) })
	}
	testutil.Eventually(t, 0, "a write that finds no space", func() bool { return l.Stats().NoSpaceNow })
	select {
	case res := <-done:
		t.Fatalf("an Append returned while the device is full: offset %d, %v", res.off, res.err)
	default:
	}
	if d := l.DurableOffset(); d != 5 {
		t.Fatalf("durable offset %d while the device is full, want 5", d)
	}
	for i := range 5 {
		rec, ok, err := r.TryNext()
		if err != nil || !ok || rec.Offset != uint64(i) {
			t.Fatalf("TryNext %d: offset %d, %v, %v", i, rec.Offset, ok, err)
		}
	}
	if _, ok, err := r.TryNext(); ok || err != nil {
		t.Fatalf("TryNext past the durable records: %v, %v; want nothing and no error", ok, err)
	}
	if err := l.Truncate(3); err != nil {
		t.Fatalf("Truncate while the device is full: %v", err)
	}
	if !strings.Contains(logs.String(), "no space left on the device") {
		t.Fatalf("running out of space not logged:\n%s", logs)
	}

	full.Store(false)
	for range 5 {
		res := testutil.Receive(t, 0, "append after space came back", done)
		if res.err != nil {
			t.Fatalf("Append after space came back: %v", res.err)
		}
	}
	if st := l.Stats(); st.NoSpaceNow || st.NoSpace != 1 || st.DurableOffset != 10 {
		t.Fatalf("stats after space came back: NoSpaceNow %v, NoSpace %d, durable %d; want false, 1, 10",
			st.NoSpaceNow, st.NoSpace, st.DurableOffset)
	}
	if !strings.Contains(logs.String(), "writing again after running out of space") {
		t.Fatalf("recovery not logged:\n%s", logs)
	}
	appendN(t, l, 10, 2)
	for i := 5; i < 12; i++ {
		rec, err := r.Next(context.Background())
		if err != nil || rec.Offset != uint64(i) || !sameMessage(rec.Message, msg(i)) {
			t.Fatalf("record %d after space came back: %+v, %v", i, rec, err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = openLog(t, dir, testOptions(1<<20), nil)
	checkRecords(t, readAll(t, l, 3), 3, 9)
}

// While the device is full, AppendNoWait holds at most pendFlushBytes of
// records in memory: past that it waits, and gives up when its context
// is done, storing nothing. Closing the log while records wait for space
// fails their waits instead of leaving them blocked.
func TestNoSpaceBoundsWhatWaitsInMemory(t *testing.T) {
	dir := t.TempDir()
	l := openLog(t, dir, testOptions(4<<20), nil)
	full := fullDisk(l)
	appendN(t, l, 0, 1)
	full.Store(true)
	big := msg(1)
	big.Payload = make([]byte, 32<<10)
	var offs []uint64
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		off, err := l.AppendNoWait(ctx, big)
		cancel()
		if err != nil {
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("AppendNoWait on a full device: %v, want a wait that ends with its context", err)
			}
			break
		}
		offs = append(offs, off)
		if len(offs) > 2*pendFlushBytes/len(big.Payload) {
			t.Fatalf("%d records of %d bytes held in memory on a full device", len(offs), len(big.Payload))
		}
	}
	if next := l.Stats().NextOffset; next != uint64(1+len(offs)) {
		t.Fatalf("next offset %d after %d appends, want %d: the refused one was stored", next, len(offs), 1+len(offs))
	}
	waited := make(chan error, 1)
	go func() { waited <- l.WaitDurable(offs[len(offs)-1]) }()
	l.Close() // its error, if the wait did not fail the log first, is the write's
	if err := testutil.Receive(t, 0, "wait ended by Close", waited); err == nil {
		t.Fatal("WaitDurable of a record never written returned no error")
	}
	l = openLog(t, dir, testOptions(4<<20), nil)
	checkRecords(t, readAll(t, l, 0), 0, 1)
}

// Records whose write failed were never acknowledged: their publishers
// send them again. Close cuts them from the file, so that a reopen does
// not keep the whole records a short write left of them (it keeps valid
// records before the first damage, as after a crash) and the log holds
// them twice once they are sent again. Before, a node stopped after a
// failed write reopened its log with the refused records in it.
func TestCloseCutsRecordsThatNeverBecameDurable(t *testing.T) {
	dir := t.TempDir()
	l := openLog(t, dir, testOptions(1<<20), nil)
	appendN(t, l, 0, 3)
	l.writeFile = func(f *os.File, b []byte, pos int64) (int, error) {
		n, _ := f.WriteAt(b[:len(b)*3/4], pos) // whole records, then part of one
		return n, &os.PathError{Op: "write", Path: f.Name(), Err: syscall.EIO}
	}
	for i := 3; i < 8; i++ {
		if _, err := l.AppendNoWait(context.Background(), msg(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.WaitDurable(7); !errors.Is(err, ErrFailed) {
		t.Fatalf("WaitDurable after a failed write: %v, want ErrFailed", err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = openLog(t, dir, testOptions(1<<20), nil)
	checkRecords(t, readAll(t, l, 0), 0, 3)
	appendN(t, l, 3, 5) // sent again: each once
	checkRecords(t, readAll(t, l, 0), 0, 8)
}

// A wait for a record that waits for space gives up when its context is
// done, so that a broker or subscriber that stops does not wait for the
// card (their gates wait with their own context). Giving up fails the
// log, so that no record held then becomes durable afterwards, when its
// publisher was refused: the log closed and opened again holds only what
// was durable.
func TestNoSpaceWaitGivesUpWithItsContext(t *testing.T) {
	l := openLog(t, t.TempDir(), testOptions(1<<20), nil)
	full := fullDisk(l)
	appendN(t, l, 0, 2)
	full.Store(true)
	off, err := l.AppendNoWait(context.Background(), msg(2))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	gaveUp := make(chan error, 1)
	go func() { gaveUp <- l.WaitDurableContext(ctx, off) }()
	testutil.Eventually(t, 0, "a write that finds no space", func() bool { return l.Stats().NoSpaceNow })
	cancel()
	err = testutil.Receive(t, 0, "the wait to give up", gaveUp)
	if !errors.Is(err, ErrNoSpace) || !errors.Is(err, context.Canceled) || !errors.Is(err, ErrFailed) {
		t.Fatalf("WaitDurableContext with its context done on a full device: %v, want ErrFailed wrapping ErrNoSpace and context.Canceled", err)
	}
	full.Store(false)
	if err := l.WaitDurable(off); !errors.Is(err, ErrFailed) {
		t.Fatalf("the record given up on, after space came back: %v, want ErrFailed", err)
	}
	dir := l.Dir()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = openLog(t, dir, testOptions(1<<20), nil)
	checkRecords(t, readAll(t, l, 0), 0, 2)
}

// An append whose own write finds no space — a record of pendFlushBytes
// or more, written alone, or one that starts a new segment — waits and
// is written again, as the records held in memory are, rather than being
// refused: a refused publisher's connection ends, and with it the
// acknowledgements of its earlier messages that wait for the same space,
// which then become durable without them and are sent again. A done
// context ends the wait with its error.
func TestNoSpaceDirectWritesWait(t *testing.T) {
	for _, tc := range []struct {
		name    string
		segment int64
		payload int
	}{
		{"large record", 64 << 20, 300 << 10},
		{"new segment", 128 << 10, 8 << 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := openLog(t, t.TempDir(), testOptions(tc.segment), nil)
			full := fullDisk(l)
			appendN(t, l, 0, 1)
			full.Store(true)
			// A record whose acknowledgement waits for space, held in
			// memory (nobody waits for it yet: the append below is the
			// first write to find no space).
			held, err := l.AppendNoWait(context.Background(), msg(1))
			if err != nil {
				t.Fatal(err)
			}

			m := msg(2)
			m.Payload = make([]byte, tc.payload)
			n := 2 * int(tc.segment) / tc.payload // past the segment's end
			type result struct {
				off uint64
				err error
			}
			done := make(chan result, 1)
			go func() {
				var r result
				for range n {
					if r.off, r.err = l.AppendNoWait(context.Background(), m); r.err != nil {
						break
					}
				}
				done <- r
			}()
			testutil.Eventually(t, 0, "an append whose own write found no space waiting to write again", func() bool {
				select {
				case r := <-done:
					t.Fatalf("appends while the device is full returned (offset %d, %v) before there was space", r.off, r.err)
				default:
				}
				return l.Stats().NoSpaceRetries > 0
			})
			// A done context ends such a wait with its error.
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			if _, err := l.AppendNoWait(ctx, m); !errors.Is(err, context.Canceled) {
				t.Fatalf("append with a done context while the device is full: %v, want context.Canceled", err)
			}
			durable := make(chan error, 1)
			go func() { durable <- l.WaitDurable(held) }()
			full.Store(false)
			r := testutil.Receive(t, 0, "the appends once there is space", done)
			if r.err != nil {
				t.Fatalf("append once there is space: %v", r.err)
			}
			if err := testutil.Receive(t, 0, "the held record durable", durable); err != nil {
				t.Fatal(err)
			}
			if err := l.WaitDurable(r.off); err != nil {
				t.Fatal(err)
			}
			if l.Stats().NoSpaceNow {
				t.Error("Stats.NoSpaceNow still set once everything was written")
			}
		})
	}
}
