package mqtt

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/edgedio/edged/mqtt/ingestlog"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/snapshot"
)

// readTo polls src until it has emitted every record before offset to.
func readTo(t *testing.T, src *Source, to uint64) {
	t.Helper()
	col := operators.CollectorFunc[Message](func(Message) {})
	for src.Offset() < to {
		if _, err := src.Poll(col, int(to-src.Offset())); err != nil {
			t.Fatal(err)
		}
	}
	if src.Offset() != to {
		t.Fatalf("read to %d, want %d", src.Offset(), to)
	}
}

// checkpointAt reads src to offset to, snapshots checkpoint id there and
// reports it complete; it returns the snapshot.
func checkpointAt(t *testing.T, src *Source, id int64, to uint64) []byte {
	t.Helper()
	readTo(t, src, to)
	st, err := src.SnapshotState(id)
	if err != nil {
		t.Fatal(err)
	}
	if err := src.NotifyCheckpointComplete(id); err != nil {
		t.Fatal(err)
	}
	return st
}

func openSource(t *testing.T, l *ingestlog.Log, opts ...SourceOption) *Source {
	t.Helper()
	src := NewSource(l, opts...)
	if err := src.Open(opCtx(0)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	return src
}

// replayFrom restores a new Source from state and checks that it replays
// exactly the records from offset from to the end of the log.
func replayFrom(t *testing.T, l *ingestlog.Log, state []byte, from uint64, opts ...SourceOption) *Source {
	t.Helper()
	src := openSource(t, l, opts...)
	if err := src.RestoreState([][]byte{state}, 1); err != nil {
		t.Fatal(err)
	}
	got := drain(t, src)
	next := l.Stats().NextOffset
	if uint64(len(got)) != next-from || (len(got) > 0 && got[0].Offset != from) {
		t.Fatalf("restored at %d: replayed %d records from %v, want %d from %d", from, len(got), got[:min(1, len(got))], next-from, from)
	}
	return src
}

// With two checkpoints retained (the default), completing a checkpoint
// truncates the log only below the older retained one, so that falling
// back to it (the newest damaged) replays from its offset.
func TestSourceKeepsLogForRetainedCheckpoints(t *testing.T) {
	l := smallLog(t)
	appendSeq(t, l, 0, 400)
	src := openSource(t, l)
	checkpointAt(t, src, 1, 100)
	if r := l.Stats().ReleasedOffset; r != 100 {
		t.Fatalf("after checkpoint 1: released %d, want 100", r)
	}
	st2 := checkpointAt(t, src, 2, 200)
	if r := l.Stats().ReleasedOffset; r != 100 {
		t.Fatalf("after checkpoint 2: released %d, want 100 (checkpoint 1 is retained)", r)
	}
	checkpointAt(t, src, 3, 300)
	if st := l.Stats(); st.ReleasedOffset != 200 || st.FirstOffset > 200 || st.FirstOffset <= 100 {
		t.Fatalf("after checkpoint 3: %+v, want released 200 with segments before it deleted", st)
	}
	// Checkpoint 3 is damaged: the job restores checkpoint 2.
	src2 := replayFrom(t, l, st2, 200)
	// The knowledge survived: the restored source knows checkpoint 1 and 2
	// and, when checkpoint 4 completes, keeps checkpoint 2's records.
	st4 := checkpointAt(t, src2, 4, 400)
	if r := l.Stats().ReleasedOffset; r != 200 {
		t.Fatalf("after checkpoint 4 of the restored source: released %d, want 200", r)
	}
	replayFrom(t, l, st4, 400)
}

// fakeStore is a CheckpointStore listing fixed checkpoints.
type fakeStore struct{ completed []snapshot.ID }

func (f *fakeStore) Progress() (snapshot.Progress, error) {
	return snapshot.Progress{Completed: f.completed}, nil
}

// With the store, a savepoint between checkpoints does not push a
// retained checkpoint out: the log keeps what the store's retained
// checkpoints need.
func TestSourceAsksStoreWhatIsRetained(t *testing.T) {
	l := smallLog(t)
	appendSeq(t, l, 0, 400)
	store := &fakeStore{}
	src := openSource(t, l, WithCheckpointStore(store))
	store.completed = []snapshot.ID{1}
	checkpointAt(t, src, 1, 100)
	store.completed = []snapshot.ID{1, 2}
	st2 := checkpointAt(t, src, 2, 200)
	checkpointAt(t, src, 3, 300) // a savepoint: the store retains 1 and 2
	if r := l.Stats().ReleasedOffset; r != 100 {
		t.Fatalf("after savepoint 3: released %d, want 100", r)
	}
	// Without the store the savepoint counts as a checkpoint.
	l2 := smallLog(t)
	appendSeq(t, l2, 0, 400)
	src2 := openSource(t, l2)
	checkpointAt(t, src2, 1, 100)
	checkpointAt(t, src2, 2, 200)
	checkpointAt(t, src2, 3, 300)
	if r := l2.Stats().ReleasedOffset; r != 200 {
		t.Fatalf("without a store: released %d, want 200", r)
	}

	// The job restores checkpoint 2 (savepoint 3 damaged too); the store
	// still lists 1 and 2, then the restored attempt's checkpoint 5
	// completes and the store retains 2 and 5.
	src3 := replayFrom(t, l, st2, 200, WithCheckpointStore(store))
	store.completed = []snapshot.ID{2, 5}
	checkpointAt(t, src3, 5, 400)
	if r := l.Stats().ReleasedOffset; r != 200 {
		t.Fatalf("after checkpoint 5: released %d, want 200", r)
	}
}

// A savepoint older than what the retained checkpoints need cannot be
// restored: the error names its offset and the log's first offset.
func TestSourceRestoreOfTruncatedSavepointFails(t *testing.T) {
	l := smallLog(t)
	appendSeq(t, l, 0, 400)
	src := openSource(t, l)
	sp := checkpointAt(t, src, 1, 10)
	for id := int64(2); id <= 4; id++ {
		checkpointAt(t, src, id, uint64(id)*100)
	}
	first := l.Stats().FirstOffset
	if first <= 10 {
		t.Fatalf("first offset %d: nothing was truncated", first)
	}
	src2 := openSource(t, l)
	err := src2.RestoreState([][]byte{sp}, 1)
	if !errors.Is(err, ingestlog.ErrTruncated) {
		t.Fatalf("RestoreState of a truncated savepoint = %v, want ErrTruncated", err)
	}
	for _, want := range []string{"snapshot 1", "offset 10", fmt.Sprintf("first offset is %d", first)} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("error %q lacks %q", err, want)
		}
	}
}

func TestReleasable(t *testing.T) {
	known := []checkpointOffset{{2, 20}, {4, 40}, {5, 50}, {9, 90}}
	for _, tc := range []struct {
		retained []int64
		before   uint64
		keepFrom int
		ok       bool
	}{
		{nil, 0, 0, false},
		{[]int64{1}, 0, 0, false},       // older than anything known
		{[]int64{1, 9}, 0, 0, false},    // idem
		{[]int64{9}, 90, 3, true},       // known
		{[]int64{5, 9}, 50, 2, true},    // known
		{[]int64{6, 9}, 50, 2, true},    // 6 unknown: at least 5's offset
		{[]int64{9, 12}, 90, 3, true},   // 12 unknown, newer
		{[]int64{3, 4}, 20, 0, true},    // 3 unknown: at least 2's
		{[]int64{4, 5, 9}, 40, 1, true}, // three retained
	} {
		before, keepFrom, ok := releasable(known, tc.retained)
		if before != tc.before || keepFrom != tc.keepFrom || ok != tc.ok {
			t.Errorf("releasable(%v) = %d, %d, %t; want %d, %d, %t", tc.retained, before, keepFrom, ok, tc.before, tc.keepFrom, tc.ok)
		}
	}
}

func TestSourceStateDecode(t *testing.T) {
	src := &Source{active: true, known: []checkpointOffset{{1, 5}, {3, 7}}, pending: map[int64]uint64{}, pos: 9}
	b, err := src.SnapshotState(4)
	if err != nil {
		t.Fatal(err)
	}
	st, err := decodeSourceState(b)
	if err != nil || st.offset != 9 || st.id != 4 || fmt.Sprint(st.known) != "[{1 5} {3 7}]" {
		t.Fatalf("decode = %+v, %v", st, err)
	}
	if st, err := decodeSourceState([]byte{1, 42}); err != nil || st.offset != 42 || st.id != 0 {
		t.Fatalf("version 1 = %+v, %v", st, err)
	}
	withLog := &Source{active: true, pending: map[int64]uint64{}, pos: 9, logID: "0123abcd"}
	b4, err := withLog.SnapshotState(4)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := decodeSourceState(b4); err != nil || b4[0] != sourceStateV4 || st.offset != 9 || st.log != "0123abcd" || st.split != "" {
		t.Fatalf("version 4 = %+v, %v", st, err)
	}
	for _, bad := range [][]byte{b[:len(b)-1], append(b, 0), {2, 1, 0, 0}, {2, 1, 1, 2, 3, 1, 3, 1}, b4[:len(b4)-1], {4, 1, 1, 0, 0, 0}} {
		if _, err := decodeSourceState(bad); !errors.Is(err, ErrCorruptState) {
			t.Errorf("decode(%x) = %v", bad, err)
		}
	}
}

func FuzzSourceState(f *testing.F) {
	src := &Source{active: true, known: []checkpointOffset{{1, 5}, {3, 7}}, pending: map[int64]uint64{}, pos: 9}
	b, _ := src.SnapshotState(4)
	f.Add(b)
	f.Add([]byte{1, 42})
	v4 := &Source{active: true, pending: map[int64]uint64{}, pos: 9, splits: []string{"a"}, split: "a", logID: "0123abcd"}
	b4, _ := v4.SnapshotState(4)
	f.Add(b4)
	f.Fuzz(func(t *testing.T, b []byte) {
		st, err := decodeSourceState(b)
		if err != nil {
			return
		}
		if st.id == 0 {
			return
		}
		s := &Source{active: true, known: st.known, pending: map[int64]uint64{}, pos: st.offset, split: st.split, logID: st.log}
		if st.split != "" {
			s.splits = []string{st.split}
		}
		again, err := s.SnapshotState(st.id)
		if err != nil {
			t.Fatal(err)
		}
		st2, err := decodeSourceState(again)
		if err != nil || fmt.Sprint(st2) != fmt.Sprint(st) {
			t.Fatalf("round trip of %x: %+v, %v; want %+v", b, st2, err, st)
		}
	})
}

// WithCheckpointDir reads the retained checkpoints from the job's store
// on disk, opened only when a checkpoint completes.
func TestSourceWithCheckpointDir(t *testing.T) {
	dir := t.TempDir()
	l := smallLog(t)
	appendSeq(t, l, 0, 400)
	src := openSource(t, l, WithCheckpointDir(dir, "job"))
	store, err := snapshot.OpenStore(dir, "job", 128, nil)
	if err != nil {
		t.Fatal(err)
	}
	commit := func(id snapshot.ID) {
		t.Helper()
		if _, err := store.Begin(snapshot.Trigger{Checkpoint: id}); err != nil {
			t.Fatal(err)
		}
		if _, err := store.Commit(&snapshot.Metadata{Checkpoint: id, Kind: snapshot.KindCheckpoint}); err != nil {
			t.Fatal(err)
		}
	}
	commit(1)
	checkpointAt(t, src, 1, 100)
	commit(2)
	checkpointAt(t, src, 2, 200)
	checkpointAt(t, src, 3, 300) // a savepoint: not in checkpoints/
	if r := l.Stats().ReleasedOffset; r != 100 {
		t.Fatalf("released %d, want 100: checkpoints 1 and 2 are retained", r)
	}
}
