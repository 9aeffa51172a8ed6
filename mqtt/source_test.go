package mqtt

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/edgedio/edged/mqtt/ingestlog"
	"github.com/edgedio/edged/operators"
)

func smallLog(t *testing.T) *ingestlog.Log {
	return openLog(t, t.TempDir(), smallLogOptions())
}

// smallLogOptions are smallLog's: 1 KiB segments.
func smallLogOptions() ingestlog.Options {
	opts := ingestlog.DefaultOptions()
	opts.SegmentBytes = 1024
	opts.SyncInterval = 0
	return opts
}

func TestSourceSnapshotRestoreTruncate(t *testing.T) {
	l := smallLog(t)
	appendSeq(t, l, 0, 300)

	src := NewSource(l)
	if err := src.Open(opCtx(0)); err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	var got []Message
	col := operators.CollectorFunc[Message](func(m Message) { got = append(got, m) })
	if st, err := src.Poll(col, 120); err != nil || st != operators.MoreAvailable {
		t.Fatalf("Poll = %v, %v", st, err)
	}
	state, err := src.SnapshotState(7)
	if err != nil {
		t.Fatal(err)
	}
	rest := drain(t, src)
	if len(got) != 120 || len(rest) != 180 || rest[0].Offset != 120 {
		t.Fatalf("read %d then %d from %d", len(got), len(rest), rest[0].Offset)
	}

	// Checkpoint 7 completes: the segments wholly before offset 120 go.
	before := l.Stats()
	if err := src.NotifyCheckpointComplete(7); err != nil {
		t.Fatal(err)
	}
	after := l.Stats()
	if after.ReleasedOffset != 120 || after.Segments >= before.Segments || after.FirstOffset == 0 || after.FirstOffset > 120 {
		t.Fatalf("after truncation %+v (before %+v)", after, before)
	}

	// A new source restored from checkpoint 7 replays exactly from 120.
	src2 := NewSource(l)
	if err := src2.Open(opCtx(0)); err != nil {
		t.Fatal(err)
	}
	defer src2.Close()
	if err := src2.RestoreState([][]byte{state}, 1); err != nil {
		t.Fatal(err)
	}
	replay := drain(t, src2)
	if len(replay) != 180 {
		t.Fatalf("replayed %d, want 180", len(replay))
	}
	for k, m := range replay {
		if m.Offset != rest[k].Offset || string(m.Payload) != string(rest[k].Payload) || m.Topic != rest[k].Topic {
			t.Fatalf("replay %d = %+v, first run %+v", k, m, rest[k])
		}
	}

	// Other subtasks read nothing.
	idle := NewSource(l)
	if err := idle.Open(opCtx(1)); err != nil {
		t.Fatal(err)
	}
	if err := idle.RestoreState([][]byte{state}, 2); err != nil {
		t.Fatal(err)
	}
	if st, err := idle.Poll(col, 10); st != operators.EndOfInput || err != nil {
		t.Fatalf("subtask 1 Poll = %v, %v", st, err)
	}

	// An aborted checkpoint truncates nothing.
	if _, err := src2.SnapshotState(8); err != nil {
		t.Fatal(err)
	}
	if err := src2.NotifyCheckpointAborted(8); err != nil {
		t.Fatal(err)
	}
	if err := src2.NotifyCheckpointComplete(8); err != nil {
		t.Fatal(err)
	}
	if st := l.Stats(); st.ReleasedOffset != 120 {
		t.Fatalf("aborted checkpoint truncated: %+v", st)
	}
}

func TestSourceAvailable(t *testing.T) {
	l := smallLog(t)
	src := NewSource(l)
	if err := src.Open(opCtx(0)); err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	if len(drain(t, src)) != 0 {
		t.Fatal("records from an empty log")
	}
	ready := src.Available()
	select {
	case <-ready:
		t.Fatal("Available ready on a caught-up source")
	default:
	}
	appendSeq(t, l, 0, 1)
	select {
	case <-ready:
	case <-time.After(waitBound):
		t.Fatal("Available not ready after an append")
	}
	if got := drain(t, src); len(got) != 1 || got[0].Offset != 0 {
		t.Fatalf("got %+v", got)
	}
}

func TestSourceRestoreErrors(t *testing.T) {
	l := smallLog(t)
	src := NewSource(l)
	if err := src.Open(opCtx(0)); err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	for _, bad := range [][]byte{{9, 1}, {1}, {1, 0x80}, {1, 1, 1}} {
		if err := src.RestoreState([][]byte{bad}, 1); !errors.Is(err, ErrCorruptState) {
			t.Errorf("RestoreState(%x) = %v", bad, err)
		}
	}
	// An offset beyond the log fails when the source reads.
	if err := src.RestoreState([][]byte{{1, 50}}, 1); err == nil {
		t.Fatal("restore beyond the end of the log")
	}
}

// A redelivery note in the log (ingestlog.Message.Note) is no message:
// the source skips it, and the messages keep their offsets.
func TestSourceSkipsRedeliveryNotes(t *testing.T) {
	l := smallLog(t)
	ctx := context.Background()
	for _, m := range []ingestlog.Message{
		{Topic: "sensors/1", Payload: []byte("a"), QoS: 1, PacketID: 1},
		{Topic: "sensors/1", Payload: []byte("a"), QoS: 1, PacketID: 1, Note: true},
		{Topic: "sensors/2", Payload: []byte("b"), QoS: 1, PacketID: 2},
	} {
		if _, err := l.Append(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	src := NewSource(l)
	if err := src.Open(opCtx(0)); err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	got := drain(t, src)
	if len(got) != 2 || got[0].Offset != 0 || string(got[0].Payload) != "a" || got[1].Offset != 2 || string(got[1].Payload) != "b" {
		t.Fatalf("read %+v, want a at 0 and b at 2", got)
	}
}
