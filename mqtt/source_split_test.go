package mqtt

import (
	"slices"
	"testing"
	"time"

	"github.com/edgedio/edged/operators"
)

// In a cluster every subtask reads its own node's log, and a snapshot is
// restored only into the split it was taken of: another node's offset is
// never applied to this node's log, whatever the order of the states.
func TestSourceSplitRestoresOnlyItsOwnOffset(t *testing.T) {
	la, lb := smallLog(t), smallLog(t)
	appendSeq(t, la, 0, 100)
	appendSeq(t, lb, 0, 300)
	var got []Message
	col := operators.CollectorFunc[Message](func(m Message) { got = append(got, m) })

	nodes := []string{"a", "b", "c"}
	a := NewSource(la, WithSplits(nodes, "a"))
	b := NewSource(lb, WithSplits(nodes, "b"))
	for i, s := range []*Source{a, b} {
		// Subtask 1 reads too: each split is active.
		if err := s.Open(opCtx(i)); err != nil {
			t.Fatal(err)
		}
		defer s.Close()
	}
	if _, err := a.Poll(col, 30); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Poll(col, 250); err != nil {
		t.Fatal(err)
	}
	if len(got) != 280 {
		t.Fatalf("read %d records from both splits, want 280", len(got))
	}
	sa, err := a.SnapshotState(4)
	if err != nil {
		t.Fatal(err)
	}
	sb, err := b.SnapshotState(4)
	if err != nil {
		t.Fatal(err)
	}

	// Restored with both states (as at another parallelism), each split
	// takes its own: node-a resumes at 30, not at node-b's 250 (beyond its
	// log).
	for _, states := range [][][]byte{{sb, sa}, {sa, sb}} {
		a2 := NewSource(la, WithSplits(nodes, "a"))
		if err := a2.Open(opCtx(0)); err != nil {
			t.Fatal(err)
		}
		if err := a2.RestoreState(states, 2); err != nil {
			t.Fatal(err)
		}
		if a2.Offset() != 30 {
			t.Fatalf("node-a restored at offset %d, want 30", a2.Offset())
		}
		rest := drain(t, a2)
		if len(rest) != 70 || rest[0].Offset != 30 {
			t.Fatalf("node-a replayed %d records from %d", len(rest), rest[0].Offset)
		}
		a2.Close()
	}

	// A split that finds no snapshot of its own starts at its log's
	// oldest record, ignoring the others'.
	c := NewSource(la, WithSplits(nodes, "c"))
	if err := c.Open(opCtx(2)); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.RestoreState([][]byte{sb}, 3); err != nil {
		t.Fatal(err)
	}
	if c.Offset() != 0 {
		t.Fatalf("a split without a snapshot of its own starts at %d, want 0", c.Offset())
	}

	// A corrupt identity is refused.
	bad := append(sa[:len(sa)-1:len(sa)-1], 0xff, 0xff)
	bs := NewSource(la, WithSplits(nodes, "a"))
	if err := bs.Open(opCtx(0)); err != nil {
		t.Fatal(err)
	}
	if err := bs.RestoreState([][]byte{bad}, 1); err == nil {
		t.Fatal("a state with a corrupt split identity was accepted")
	}

	// Node b's split placed on node a while b is down reads nothing of
	// a's log, marks its stream idle once, and keeps b's snapshot for
	// when b is back.
	var idle []bool
	ctx := opCtx(1)
	ctx.EmitIdle = func(v bool) { idle = append(idle, v) }
	away := NewSource(la, WithSplits(nodes, "a"))
	if err := away.Open(ctx); err != nil {
		t.Fatal(err)
	}
	if err := away.RestoreState([][]byte{sa, sb}, 3); err != nil {
		t.Fatal(err)
	}
	got = got[:0]
	for range 3 {
		if st, err := away.Poll(col, 100); st != operators.NothingAvailable || err != nil {
			t.Fatalf("away split Poll = %v, %v", st, err)
		}
	}
	if len(got) != 0 || len(idle) != 1 || !idle[0] {
		t.Fatalf("away split emitted %d records and idle marks %v; want none and [true]", len(got), idle)
	}
	select {
	case <-away.Available():
		t.Fatal("an away split reports records available")
	default:
	}
	carried, err := away.SnapshotState(5)
	if err != nil || string(carried) != string(sb) {
		t.Fatalf("away split snapshot %x (%v), want node b's %x", carried, err, sb)
	}
	if err := away.NotifyCheckpointComplete(5); err != nil {
		t.Fatal(err)
	}
	if la.Stats().FirstOffset != 0 {
		t.Fatalf("an away split truncated the log it does not read: %+v", la.Stats())
	}
}

// A split at home marks its stream active at its first Poll, once: a task
// restored from a snapshot taken while the split ran away (idle) would
// otherwise stay idle downstream, and the others' watermarks would make
// its records late.
func TestSourceSplitHomeMarksActive(t *testing.T) {
	la := smallLog(t)
	appendSeq(t, la, 0, 10)
	var idle []bool
	ctx := opCtx(0)
	ctx.EmitIdle = func(v bool) { idle = append(idle, v) }
	home := NewSource(la, WithSplits([]string{"a", "b"}, "a"))
	if err := home.Open(ctx); err != nil {
		t.Fatal(err)
	}
	defer home.Close()
	var got []Message
	col := operators.CollectorFunc[Message](func(m Message) { got = append(got, m) })
	for range 3 {
		if _, err := home.Poll(col, 4); err != nil {
			t.Fatal(err)
		}
	}
	if len(got) != 10 || len(idle) != 1 || idle[0] {
		t.Fatalf("home split emitted %d records and idle marks %v; want 10 and [false]", len(got), idle)
	}
}

// A split away from its node waits for it while the node is back
// (WithSplitHome): it says its stream is active (holding the watermark
// of the others back) though it reads nothing, idle again when the node
// is gone, and Available fires so that Poll asks again.
func TestSourceSplitAwayWaitsForItsNodeWhileItIsBack(t *testing.T) {
	la := smallLog(t)
	appendSeq(t, la, 0, 10)
	var idle []bool
	ctx := opCtx(1)
	ctx.EmitIdle = func(v bool) { idle = append(idle, v) }
	var back bool
	var asked []string
	away := NewSource(la, WithSplits([]string{"a", "b"}, "a"), WithSplitHome(func(node string) bool {
		asked = append(asked, node)
		return back
	}))
	if err := away.Open(ctx); err != nil {
		t.Fatal(err)
	}
	defer away.Close()
	var got []Message
	col := operators.CollectorFunc[Message](func(m Message) { got = append(got, m) })
	poll := func() {
		t.Helper()
		if st, err := away.Poll(col, 100); st != operators.NothingAvailable || err != nil {
			t.Fatalf("away split Poll = %v, %v", st, err)
		}
	}
	poll()
	poll()
	back = true
	poll()
	poll()
	back = false
	poll()
	if want := []bool{true, false, true}; len(got) != 0 || !slices.Equal(idle, want) {
		t.Fatalf("away split emitted %d records and idle marks %v; want none and %v", len(got), idle, want)
	}
	if len(asked) != 5 || asked[0] != "b" {
		t.Fatalf("the split asked about %v; want node b at each Poll", asked)
	}
	select {
	case <-away.Available():
	case <-time.After(10 * time.Second):
		t.Fatal("an away split with WithSplitHome is never polled again")
	}
	poll()
	select {
	case <-away.Available():
		// A new recheck, not the one that fired.
		t.Fatal("Available is still ready right after the Poll it called for")
	default:
	}
}

// A node that comes back with a new data_dir has a log behind its split's
// checkpoint: the split reads the new log from its start instead of
// failing the restore (which would fail the cluster's job at every
// attempt).
func TestSourceSplitRestoreOntoNewLogReadsItFromTheStart(t *testing.T) {
	splitRestoredOntoNewLogReadsItAll(t, 100, 10)
}

// The same when the new log already holds more records than the
// checkpoint's offset (the devices published to the replaced node before
// the job restored): the offset names other records in it, so the split
// reads the new log from its start too. Before, it read from the
// checkpoint's offset and skipped the new log's first records.
func TestSourceSplitRestoreOntoALongerNewLogReadsItFromTheStart(t *testing.T) {
	splitRestoredOntoNewLogReadsItAll(t, 40, 100)
}

// splitRestoredOntoNewLogReadsItAll snapshots split "a" after it read
// oldLen records of its log, restores it onto another log holding newLen
// records, and checks that it reads them all, from offset 0.
func splitRestoredOntoNewLogReadsItAll(t *testing.T, oldLen, newLen int) {
	t.Helper()
	old, fresh := smallLog(t), smallLog(t)
	appendSeq(t, old, 0, oldLen)
	nodes := []string{"a", "b"}
	a := NewSource(old, WithSplits(nodes, "a"))
	if err := a.Open(opCtx(0)); err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	drain(t, a)
	st, err := a.SnapshotState(7)
	if err != nil {
		t.Fatal(err)
	}
	appendSeq(t, fresh, 0, newLen)
	a2 := NewSource(fresh, WithSplits(nodes, "a"))
	if err := a2.Open(opCtx(0)); err != nil {
		t.Fatal(err)
	}
	defer a2.Close()
	if err := a2.RestoreState([][]byte{st, nil}, 2); err != nil {
		t.Fatalf("restore onto a new log: %v", err)
	}
	if rest := drain(t, a2); len(rest) != newLen || rest[0].Offset != 0 {
		t.Fatalf("read %d records of the new log, want its %d from offset 0", len(rest), newLen)
	}
}
