package ingestlog

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

// fullLog opens a log bounded to its first three records (msg(0..2), the
// last two with a commit mark) and fills it.
func fullLog(t *testing.T) (*Log, int64) {
	t.Helper()
	probe := openLog(t, t.TempDir(), Options{SegmentBytes: 4096}, nil)
	appendN(t, probe, 0, 3)
	full := probe.Stats().UnreleasedBytes
	m := msg(0)
	if frame := frameSize(&m); full <= 3*frame || full > 3*frame+2*maxMarkSize {
		t.Fatalf("three records take %d bytes, frames of %d", full, frame)
	}
	l := openLog(t, t.TempDir(), Options{SegmentBytes: 4096, MaxBytes: full}, nil)
	appendN(t, l, 0, 3)
	if st := l.Stats(); st.UnreleasedBytes != full || st.Blocked != 0 {
		t.Fatalf("stats of a full log %+v", st)
	}
	return l, frameSize(&m)
}

type appendResult struct {
	off uint64
	err error
}

// appendAsync appends msg(i) on another goroutine.
func appendAsync(ctx context.Context, l *Log, i int) <-chan appendResult {
	done := make(chan appendResult, 1)
	go func() {
		off, err := l.Append(ctx, msg(i))
		done <- appendResult{off, err}
	}()
	return done
}

func TestBackpressureTruncateUnblocks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, _ := fullLog(t)
		done := appendAsync(context.Background(), l, 3)
		synctest.Wait() // the append is blocked, nothing else runs
		select {
		case r := <-done:
			t.Fatalf("Append on a full log returned %+v", r)
		default:
		}
		if st := l.Stats(); st.Waiting != 1 || st.Blocked != 1 || st.NextOffset != 3 {
			t.Fatalf("stats while blocked %+v", st)
		}

		time.Sleep(5 * time.Second) // fake time: the blocked time is measured
		// Releasing nothing new keeps it blocked.
		if err := l.Truncate(0); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if len(done) != 0 {
			t.Fatal("Append returned without space")
		}
		// Record 3 carries a commit mark: one record's release is not
		// quite enough room; two are.
		if err := l.Truncate(2); err != nil {
			t.Fatal(err)
		}
		r := <-done
		if r.err != nil || r.off != 3 {
			t.Fatalf("unblocked Append = %+v", r)
		}
		st := l.Stats()
		if st.Waiting != 0 || st.Blocked != 1 || st.BlockedTime < 5*time.Second {
			t.Fatalf("stats after unblocking %+v", st)
		}
		checkRecords(t, readAll(t, l, 0), 0, 4)
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
	})
}

func TestBackpressureCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, _ := fullLog(t)
		ctx, cancel := context.WithCancel(context.Background())
		done := appendAsync(ctx, l, 3)
		synctest.Wait()
		if len(done) != 0 {
			t.Fatal("Append on a full log returned")
		}
		cancel()
		r := <-done
		if !errors.Is(r.err, context.Canceled) {
			t.Fatalf("cancelled Append = %+v", r)
		}
		st := l.Stats()
		if st.NextOffset != 3 || st.Waiting != 0 || st.Blocked != 1 {
			t.Fatalf("stats after a cancelled append %+v", st)
		}
		// Nothing was stored: the next append gets offset 3.
		if err := l.Truncate(3); err != nil {
			t.Fatal(err)
		}
		appendN(t, l, 3, 1)
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
	})
}

func TestBackpressureDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, _ := fullLog(t)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		start := time.Now()
		_, err := l.Append(ctx, msg(3))
		if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) != time.Second {
			t.Fatalf("Append = %v after %v", err, time.Since(start))
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
	})
}

func TestBackpressureClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, _ := fullLog(t)
		done := appendAsync(context.Background(), l, 3)
		synctest.Wait()
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		if r := <-done; !errors.Is(r.err, ErrClosed) {
			t.Fatalf("Append blocked across Close = %+v", r)
		}
	})
}

func TestGroupCommitWindow(t *testing.T) {
	// With a 2ms window, appends that arrive within it share one fsync,
	// and none waits longer than the window plus the fsync.
	synctest.Test(t, func(t *testing.T) {
		opts := DefaultOptions()
		opts.SyncInterval = 2 * time.Millisecond
		l := openLog(t, t.TempDir(), opts, nil)
		appendN(t, l, 0, 1) // the first fsync: lastSync is now set
		before := l.Stats().Fsyncs
		start := time.Now()
		results := make([]<-chan appendResult, 10)
		for i := range results {
			results[i] = appendAsync(context.Background(), l, 1+i)
		}
		seen := make(map[uint64]bool)
		for _, done := range results {
			r := <-done
			if r.err != nil || seen[r.off] {
				t.Fatalf("append = %+v", r)
			}
			seen[r.off] = true
		}
		if d := time.Since(start); d > opts.SyncInterval {
			t.Fatalf("appends took %v of fake time, window is %v", d, opts.SyncInterval)
		}
		if got := l.Stats().Fsyncs - before; got != 1 {
			t.Fatalf("10 appends in one window took %d fsyncs, want 1", got)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
	})
}

// A full log that sheds refuses appends at once with ErrShed, the one
// blocked when shedding starts included, and counts them; it stores
// again once space is released, and blocks again once it stops shedding.
func TestShedWhenFull(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, _ := fullLog(t)
		blocked := appendAsync(context.Background(), l, 3)
		synctest.Wait()
		if len(blocked) != 0 {
			t.Fatal("Append on a full log returned before shedding")
		}
		l.ShedWhenFull(true)
		if r := <-blocked; !errors.Is(r.err, ErrShed) {
			t.Fatalf("the blocked Append returned %+v once shedding, want ErrShed", r)
		}
		if _, err := l.Append(context.Background(), msg(4)); !errors.Is(err, ErrShed) {
			t.Fatalf("Append on a full shedding log: %v, want ErrShed", err)
		}
		if st := l.Stats(); st.Shed != 2 || st.NextOffset != 3 || st.Waiting != 0 {
			t.Fatalf("stats after shedding %+v", st)
		}
		// Released space is used while shedding: what fits is stored.
		if err := l.Truncate(2); err != nil {
			t.Fatal(err)
		}
		if off, err := l.Append(context.Background(), msg(5)); err != nil || off != 3 {
			t.Fatalf("Append with room while shedding = %d, %v", off, err)
		}
		// No longer shedding: a full log blocks again.
		l.ShedWhenFull(false)
		done := appendAsync(context.Background(), l, 6)
		synctest.Wait()
		if len(done) != 0 {
			t.Fatal("Append on a full log returned after shedding stopped")
		}
		if err := l.Truncate(4); err != nil {
			t.Fatal(err)
		}
		if r := <-done; r.err != nil || r.off != 4 {
			t.Fatalf("Append unblocked = %+v", r)
		}
		if st := l.Stats(); st.Shed != 2 {
			t.Fatalf("%d shed, want 2", st.Shed)
		}
	})
}
