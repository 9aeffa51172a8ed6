package ingestlog

import (
	"context"
	"errors"
	"testing"
)

// AppendNoWait writes without an fsync: the records are neither durable
// nor visible to Readers until WaitDurable, which makes every record
// written before it durable with one fsync. WaitDurable refuses an
// offset not written yet; after Close every written record is durable.
func TestAppendNoWaitThenWaitDurable(t *testing.T) {
	l := openLog(t, t.TempDir(), testOptions(1<<20), nil)
	fsyncs0 := l.Stats().Fsyncs
	for i := range 10 {
		off, err := l.AppendNoWait(context.Background(), msg(i))
		if err != nil || off != uint64(i) {
			t.Fatalf("AppendNoWait %d: offset %d, %v", i, off, err)
		}
	}
	if d := l.DurableOffset(); d != 0 {
		t.Fatalf("durable offset %d before any wait", d)
	}
	if st := l.Stats(); st.Fsyncs != fsyncs0 || st.NextOffset != 10 {
		t.Fatalf("after writing: %d fsyncs, next offset %d", st.Fsyncs-fsyncs0, st.NextOffset)
	}
	if recs := readAll(t, l, 0); len(recs) != 0 {
		t.Fatalf("a Reader saw %d records not yet durable", len(recs))
	}
	if err := l.WaitDurable(10); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("WaitDurable(10) with 10 records: %v, want ErrOutOfRange", err)
	}
	if err := l.WaitDurable(4); err != nil {
		t.Fatal(err)
	}
	if d, f := l.DurableOffset(), l.Stats().Fsyncs-fsyncs0; d != 10 || f != 1 {
		t.Fatalf("after WaitDurable(4): durable offset %d after %d fsyncs, want 10 after 1", d, f)
	}
	if err := l.WaitDurable(9); err != nil {
		t.Fatal(err)
	}
	checkRecords(t, readAll(t, l, 0), 0, 10)

	if _, err := l.AppendNoWait(context.Background(), msg(10)); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.WaitDurable(10); err != nil {
		t.Fatalf("WaitDurable after Close synced the record: %v", err)
	}
}
