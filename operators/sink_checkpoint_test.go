package operators_test

import (
	"encoding/binary"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/jonboulle/clockwork"

	"github.com/edgedio/edged/codec"
	"github.com/edgedio/edged/operators"
)

func sinkContext(subtask int) *operators.Context {
	return &operators.Context{Subtask: subtask, Parallelism: 1, UID: "sink", Clock: clockwork.NewFakeClock()}
}

func readCommitted(t *testing.T, dir string) []string {
	t.Helper()
	parts, err := operators.CommittedParts(dir)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, p := range parts {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			if l != "" {
				lines = append(lines, l)
			}
		}
	}
	slices.Sort(lines)
	return lines
}

// The file sink makes records visible only when their checkpoint
// completes; a restore re-commits what the checkpoint held, and what came
// after the checkpoint is never committed.
func TestFileSinkTwoPhaseCommit(t *testing.T) {
	dir := t.TempDir()
	s := operators.NewFileSink(dir, func(v string) string { return v })
	st1 := snapshotOf(t, s, "a", "b")
	s.Collect("c")
	if got := readCommitted(t, dir); len(got) != 0 {
		t.Fatalf("visible before completion: %v", got)
	}
	if err := s.NotifyCheckpointComplete(1); err != nil {
		t.Fatal(err)
	}
	if got := readCommitted(t, dir); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("after checkpoint 1: %v", got)
	}
	st2, err := s.SnapshotState(2) // "c" pre-committed for 2
	if err != nil {
		t.Fatal(err)
	}
	s.Collect("d") // after checkpoint 2: must never be committed
	// Crash: no Close, no completion of 2 seen by this instance.

	r := operators.NewFileSink(dir, func(v string) string { return v })
	if err := r.Open(sinkContext(0)); err != nil {
		t.Fatal(err)
	}
	// Restoring checkpoint 2 (it completed elsewhere) re-commits "c";
	// restoring twice changes nothing (commit is idempotent).
	for range 2 {
		if err := r.RestoreState([][]byte{st2}, 1); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.RestoreState([][]byte{st1}, 1); err != nil {
		t.Fatal(err)
	}
	if got := readCommitted(t, dir); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("after restore: %v", got)
	}
	r.Collect("e")
	if err := r.Finish(); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if got := readCommitted(t, dir); !slices.Equal(got, []string{"a", "b", "c", "e"}) {
		t.Fatalf("at the end: %v", got)
	}
	// The crashed attempt's in-progress file ("d") was removed at Open.
	left, _ := filepath.Glob(filepath.Join(dir, ".*inprogress"))
	if len(left) != 0 {
		t.Fatalf("stale in-progress files: %v", left)
	}
}

// A file sink whose input is quiet leaves no file for a checkpoint it
// wrote nothing in (a declared pipeline's dead-letter outputs, most of the
// time): no empty committed part, pending or in-progress file per
// checkpoint. A checkpoint whose transaction was empty restores, in the
// same dir and in another, committing nothing. The same holds for a sink
// that carries its parts (a declared pipeline's file sink in a cluster),
// which before wrote an empty committed part per subtask and output at
// every checkpoint.
func TestFileSinkLeavesNoEmptyParts(t *testing.T) {
	for _, carry := range []bool{false, true} {
		t.Run(fmt.Sprintf("carry=%v", carry), func(t *testing.T) { testFileSinkLeavesNoEmptyParts(t, carry) })
	}
}

func testFileSinkLeavesNoEmptyParts(t *testing.T, carry bool) {
	dir := t.TempDir()
	format := func(v string) string { return v }
	opts := operators.FileSinkOptions{CarryParts: carry}
	files := func(dir string) []string {
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		return names
	}
	s := operators.NewFileSinkWith(dir, format, opts)
	if err := s.Open(sinkContext(0)); err != nil {
		t.Fatal(err)
	}
	var states [][]byte
	for id := int64(1); id <= 3; id++ {
		st, err := s.SnapshotState(id)
		if err != nil {
			t.Fatal(err)
		}
		states = append(states, st)
		if err := s.NotifyCheckpointComplete(id); err != nil {
			t.Fatal(err)
		}
	}
	if got := files(dir); len(got) != 0 {
		t.Fatalf("after three checkpoints without a record the dir holds %v, want nothing", got)
	}
	s.Collect("a")
	st4, err := s.SnapshotState(4)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.NotifyCheckpointComplete(4); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SnapshotState(5); err != nil { // empty, never completes
		t.Fatal(err)
	}
	if got := files(dir); len(got) != 1 || !strings.HasPrefix(got[0], "part-0-") {
		t.Fatalf("after a checkpoint with one record the dir holds %v, want its one part", got)
	}
	// Restores of checkpoints whose pending transaction was empty, here
	// and in a dir that never saw the parts.
	for _, d := range []string{dir, t.TempDir()} {
		r := operators.NewFileSinkWith(d, format, opts)
		if err := r.Open(sinkContext(0)); err != nil {
			t.Fatal(err)
		}
		for _, st := range states {
			if err := r.RestoreState([][]byte{st}, 1); err != nil {
				t.Fatalf("restore of a checkpoint with an empty part: %v", err)
			}
		}
		if _, err := r.SnapshotState(6); err != nil {
			t.Fatal(err)
		}
		if err := r.NotifyCheckpointComplete(6); err != nil {
			t.Fatal(err)
		}
		if d != dir {
			if got := files(d); len(got) != 0 {
				t.Fatalf("another dir after the restores holds %v, want nothing", got)
			}
		}
	}
	if got := readCommitted(t, dir); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("committed %v, want [a]", got)
	}
	r := operators.NewFileSinkWith(dir, format, opts)
	if err := r.Open(sinkContext(0)); err != nil {
		t.Fatal(err)
	}
	if err := r.RestoreState([][]byte{st4}, 1); err != nil {
		t.Fatal(err)
	}
	if got := files(dir); len(got) != 1 {
		t.Fatalf("after the restores the dir holds %v, want the one part", got)
	}
}

// The write-ahead sink publishes a checkpoint's records when it completes,
// with ids that are the same when they are published again after a
// restore.
func TestWriteAheadSink(t *testing.T) {
	type published struct {
		v  string
		id string
	}
	var out []published
	publish := func(vs []string, id func(int) string) error {
		for i, v := range vs {
			out = append(out, published{v, id(i)})
		}
		return nil
	}
	s := operators.NewWriteAheadSink(publish, nil)
	if err := s.Open(sinkContext(0)); err != nil {
		t.Fatal(err)
	}
	s.Collect("a")
	s.Collect("b")
	st, err := s.SnapshotState(1)
	if err != nil {
		t.Fatal(err)
	}
	s.Collect("c")
	if len(out) != 0 {
		t.Fatalf("published before completion: %v", out)
	}
	if err := s.NotifyCheckpointComplete(1); err != nil {
		t.Fatal(err)
	}
	if len(out) != 2 || out[0].v != "a" || out[1].v != "b" || out[0].id == out[1].id {
		t.Fatalf("after checkpoint 1: %v", out)
	}
	first := slices.Clone(out)
	// Restore checkpoint 1 in a new instance: the same records again, with
	// the same ids, so a consumer dropping duplicate ids sees them once.
	out = nil
	r := operators.NewWriteAheadSink(publish, nil)
	if err := r.Open(sinkContext(0)); err != nil {
		t.Fatal(err)
	}
	if err := r.RestoreState([][]byte{st}, 1); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(out, first) {
		t.Fatalf("re-published %v, want %v", out, first)
	}
	if err := r.NotifyCheckpointAborted(2); err != nil {
		t.Fatal(err)
	}
	// A corrupt state is an error, never a panic.
	if err := r.RestoreState([][]byte{{0xff, 0xff}}, 1); err == nil {
		t.Fatal("corrupt state accepted")
	}
}

func TestRecordIDIsDeterministic(t *testing.T) {
	a := operators.RecordID("uid", "sensor_1", "1000")
	if a != operators.RecordID("uid", "sensor_1", "1000") {
		t.Fatal("same parts, different ids")
	}
	if a == operators.RecordID("uid", "sensor_1", "2000") || a == operators.RecordID("uids", "ensor_1", "1000") {
		t.Fatal("different parts, same id")
	}
}

// The held records of a write-ahead sink are restored at another
// parallelism: each is published again by exactly one new subtask, with
// the id the old run gave it, and two different records never share an
// id.
func TestWriteAheadSinkRescale(t *testing.T) {
	type published struct {
		v, id   string
		subtask int
	}
	var out []published
	newSink := func(subtask, parallelism int) *operators.WriteAheadSink[string] {
		s := operators.NewWriteAheadSink(func(vs []string, id func(int) string) error {
			for i, v := range vs {
				out = append(out, published{v, id(i), subtask})
			}
			return nil
		}, nil)
		ctx := sinkContext(subtask)
		ctx.Parallelism = parallelism
		if err := s.Open(ctx); err != nil {
			t.Fatal(err)
		}
		return s
	}
	// A run at parallelism 2: both subtasks hold records of checkpoints 1
	// and 2 (the same positions in both, so ids from positions collide).
	var states [][]byte
	for sub := range 2 {
		s := newSink(sub, 2)
		for cp := int64(1); cp <= 2; cp++ {
			for i := range 3 {
				s.Collect(fmt.Sprintf("cp%d-sub%d-rec%d", cp, sub, i))
			}
			st, err := s.SnapshotState(cp)
			if err != nil {
				t.Fatal(err)
			}
			if cp == 2 {
				states = append(states, st)
			}
		}
	}
	if len(out) != 0 {
		t.Fatalf("published before any completion: %v", out)
	}
	// What the run at parallelism 2 publishes when checkpoint 2 completes.
	want := map[string]string{} // record -> id
	ids := map[string]string{}  // id -> record
	for sub := range 2 {
		s := newSink(sub, 2)
		if err := s.RestoreState(states[sub:sub+1], 2); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range out {
		if other, dup := ids[p.id]; dup {
			t.Fatalf("records %q and %q share the id %s", other, p.v, p.id)
		}
		ids[p.id] = p.v
		want[p.v] = p.id
	}
	if len(want) != 12 {
		t.Fatalf("parallelism 2 published %d records, want 12: %v", len(want), out)
	}
	for _, n := range []int{1, 3, 4} {
		out = nil
		for sub := range n {
			if err := newSink(sub, n).RestoreState(states, 2); err != nil {
				t.Fatal(err)
			}
		}
		got := map[string]string{}
		for _, p := range out {
			if _, dup := got[p.v]; dup {
				t.Fatalf("parallelism %d: %q published twice: %v", n, p.v, out)
			}
			got[p.v] = p.id
		}
		if !maps.Equal(got, want) {
			t.Fatalf("parallelism %d re-published %v, want %v", n, got, want)
		}
	}
}

// noPublish is the publish function of a sink whose ids alone are looked
// at: it is never called.
func noPublish([]string, func(int) string) error { return nil }

// Ids are a function of the record: the same record gets the same id in
// any subtask, and WithIdentity decides what makes two records one.
func TestWriteAheadSinkIdentity(t *testing.T) {
	a := operators.NewWriteAheadSink[string](noPublish, nil)
	b := operators.NewWriteAheadSink[string](noPublish, nil)
	if err := a.Open(sinkContext(0)); err != nil {
		t.Fatal(err)
	}
	if err := b.Open(sinkContext(1)); err != nil {
		t.Fatal(err)
	}
	if a.ID("x") != b.ID("x") || a.ID("x") == a.ID("y") {
		t.Fatalf("ids x=%s/%s y=%s", a.ID("x"), b.ID("x"), a.ID("y"))
	}
	firstByte := operators.NewWriteAheadSink[string](noPublish, nil).WithIdentity(func(s string) string { return s[:1] })
	if err := firstByte.Open(sinkContext(0)); err != nil {
		t.Fatal(err)
	}
	if firstByte.ID("xa") != firstByte.ID("xb") || firstByte.ID("xa") == a.ID("xa") {
		t.Fatal("WithIdentity not used")
	}
}

// Both exactly-once sinks tell the runtime of their first held record of
// a run (Context.OutputHeld) once, however many records, chunks and
// checkpoints follow; a sink opened again (the next run) tells it again.
func TestExactlyOnceSinksTellTheirFirstHeldRecordOnce(t *testing.T) {
	sinks := map[string]func() operators.Sink[string]{
		"write-ahead": func() operators.Sink[string] {
			return operators.NewWriteAheadSink(func([]string, func(int) string) error { return nil }, nil)
		},
		"file": func() operators.Sink[string] {
			return operators.NewFileSink(t.TempDir(), func(v string) string { return v })
		},
	}
	for name, mk := range sinks {
		t.Run(name, func(t *testing.T) {
			for run := range 2 {
				told := 0
				ctx := sinkContext(0)
				ctx.OutputHeld = func() { told++ }
				s := mk()
				if err := s.Open(ctx); err != nil {
					t.Fatal(err)
				}
				if told != 0 {
					t.Fatalf("run %d: told %d times before a record", run, told)
				}
				for i := range 20_000 {
					s.Collect(fmt.Sprint(i))
					if told != 1 {
						t.Fatalf("run %d: told %d times after record %d, want 1", run, told, i)
					}
					if i%5000 == 4999 {
						c := s.(operators.CheckpointListener)
						if _, err := s.(operators.Snapshotter).SnapshotState(int64(i)); err != nil {
							t.Fatal(err)
						}
						if err := c.NotifyCheckpointComplete(int64(i)); err != nil {
							t.Fatal(err)
						}
					}
				}
				if err := s.Close(); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// memTransactions is a Transactional kept in memory, shared across the
// runs of a test; it cleans stale transactions when asked.
type memTransactions struct {
	next   int
	state  map[int]string // begun, pre-committed, committed or aborted
	data   map[int][]string
	events []string
}

func (m *memTransactions) Begin() (int, error) {
	m.next++
	m.state[m.next] = "begun"
	return m.next, nil
}
func (m *memTransactions) Write(tx int, v string) error {
	m.data[tx] = append(m.data[tx], v)
	return nil
}
func (m *memTransactions) PreCommit(tx int) error {
	m.state[tx] = "pre-committed"
	m.events = append(m.events, fmt.Sprintf("pre-commit %d", tx))
	return nil
}
func (m *memTransactions) Commit(tx int) error {
	m.state[tx] = "committed"
	m.events = append(m.events, fmt.Sprintf("commit %d", tx))
	return nil
}
func (m *memTransactions) Abort(tx int) error {
	if m.state[tx] != "committed" {
		m.state[tx] = "aborted"
	}
	return nil
}

// CleanStale aborts every transaction not committed but the newest (the
// run's open one).
func (m *memTransactions) CleanStale() error {
	m.events = append(m.events, "clean")
	for tx, st := range m.state {
		if st != "committed" && tx != m.next {
			m.state[tx] = "aborted"
		}
	}
	return nil
}

// A custom Transactional that implements operators.StaleCleaner is asked
// once per run, after the restore committed what the restored checkpoint
// holds and before the run's first pre-commit, to drop what a failed
// checkpoint pre-committed: the restored checkpoint does not name it, so
// nothing else would.
func TestTwoPhaseCommitSinkCleansStaleTransactions(t *testing.T) {
	m := &memTransactions{state: map[int]string{}, data: map[int][]string{}}
	s := operators.NewTwoPhaseCommitSink[string, int](m, nil)
	if err := s.Open(sinkContext(0)); err != nil {
		t.Fatal(err)
	}
	s.Collect("a")
	st1, err := s.SnapshotState(1) // tx 1 pre-committed
	if err != nil {
		t.Fatal(err)
	}
	if err := s.NotifyCheckpointComplete(1); err != nil {
		t.Fatal(err)
	}
	s.Collect("b")
	if _, err := s.SnapshotState(2); err != nil { // tx 2 pre-committed; 2 never completes
		t.Fatal(err)
	}
	// Crash; the job restores checkpoint 1.
	m.events = nil
	r := operators.NewTwoPhaseCommitSink[string, int](m, nil)
	if err := r.Open(sinkContext(0)); err != nil {
		t.Fatal(err)
	}
	if err := r.RestoreState([][]byte{st1}, 1); err != nil {
		t.Fatal(err)
	}
	r.Collect("b")
	if _, err := r.SnapshotState(3); err != nil {
		t.Fatal(err)
	}
	if _, err := r.SnapshotState(4); err != nil {
		t.Fatal(err)
	}
	if want := []string{"commit 1", "clean", "pre-commit 4", "pre-commit 5"}; !slices.Equal(m.events, want) {
		t.Fatalf("events %v, want %v", m.events, want)
	}
	if m.state[2] != "aborted" || m.state[1] != "committed" {
		t.Fatalf("transactions %v: want 1 committed, 2 (pre-committed for the failed checkpoint) aborted", m.state)
	}
	if !maps.Equal(map[int]string{4: "pre-committed", 5: "pre-committed", 6: "begun"}, map[int]string{4: m.state[4], 5: m.state[5], 6: m.state[6]}) {
		t.Fatalf("transactions of the new run: %v", m.state)
	}
}

// A file sink that carries its parts commits, on restore in another dir
// (another machine's), the parts pre-committed in the first one from the
// checkpoint, once; one that does not fails the restore there. Their
// snapshots restore into either kind.
func TestFileSinkCarriedPartsCommitElsewhere(t *testing.T) {
	dirA, dirB := t.TempDir(), t.TempDir()
	s := operators.NewFileSinkWith(dirA, func(v string) string { return v }, operators.FileSinkOptions{CarryParts: true})
	st := snapshotOf(t, s, "a", "b")
	if err := s.NotifyCheckpointComplete(1); err != nil {
		t.Fatal(err)
	}
	if got := readCommitted(t, dirA); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("dir A: %v", got)
	}
	// The subtask restores on another machine: dir B lacks the part.
	plain := operators.NewFileSink(dirB, func(v string) string { return v })
	if err := plain.Open(sinkContext(0)); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := plain.RestoreState([][]byte{st}, 1); err != nil {
			t.Fatal(err)
		}
	}
	if got := readCommitted(t, dirB); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("dir B after the restore: %v", got)
	}
	partsA, _ := operators.CommittedParts(dirA)
	partsB, _ := operators.CommittedParts(dirB)
	if len(partsA) != 1 || len(partsB) != 1 || filepath.Base(partsA[0]) != filepath.Base(partsB[0]) {
		t.Fatalf("parts %v and %v: want the same part name in both dirs", partsA, partsB)
	}
	if left, _ := filepath.Glob(filepath.Join(dirB, ".*")); len(left) != 0 { // the new run creates its part at its first record
		t.Fatalf("dir B holds %v", left)
	}

	// Without carried parts the restore elsewhere cannot commit.
	st2 := snapshotOf(t, operators.NewFileSink(t.TempDir(), func(v string) string { return v }), "c")
	other := operators.NewFileSinkWith(t.TempDir(), func(v string) string { return v }, operators.FileSinkOptions{CarryParts: true})
	if err := other.Open(sinkContext(0)); err != nil {
		t.Fatal(err)
	}
	if err := other.RestoreState([][]byte{st2}, 1); err == nil || !strings.Contains(err.Error(), "neither pending nor committed") {
		t.Fatalf("restore elsewhere of a part not carried: %v", err)
	}
}

// snapshotOf opens s as subtask 0, collects vs and returns its snapshot
// of checkpoint 1.
func snapshotOf(t *testing.T, s *operators.TwoPhaseCommitSink[string, operators.FileTx], vs ...string) []byte {
	t.Helper()
	if err := s.Open(sinkContext(0)); err != nil {
		t.Fatal(err)
	}
	for _, v := range vs {
		s.Collect(v)
	}
	st, err := s.SnapshotState(1)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// After a restore at another parallelism every new subtask commits every
// transaction the old subtasks left pending, at once: several subtasks
// on another machine commit the same carried part concurrently. Each
// commit succeeds, the part is committed once with its content, and no
// temporary file stays.
func TestFileSinkCarriedPartCommittedConcurrently(t *testing.T) {
	const subtasks = 6
	for round := range 20 {
		s := operators.NewFileSinkWith(t.TempDir(), func(v string) string { return v }, operators.FileSinkOptions{CarryParts: true})
		st := snapshotOf(t, s, "a", "b")
		dir := t.TempDir()
		errs := make(chan error, subtasks)
		for i := range subtasks {
			go func() {
				sink := operators.NewFileSinkWith(dir, func(v string) string { return v }, operators.FileSinkOptions{CarryParts: true})
				ctx := sinkContext(i)
				ctx.Parallelism = subtasks
				if err := sink.Open(ctx); err != nil {
					errs <- err
					return
				}
				errs <- sink.RestoreState([][]byte{st}, 1)
			}()
		}
		for range subtasks {
			if err := <-errs; err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
		}
		if got := readCommitted(t, dir); !slices.Equal(got, []string{"a", "b"}) {
			t.Fatalf("round %d: committed %v", round, got)
		}
		if left, _ := filepath.Glob(filepath.Join(dir, ".*")); len(left) != 0 {
			t.Fatalf("round %d: left %v", round, left)
		}
	}
}

// Snapshots of the file sink from before parts could be carried (the
// transaction encoded as its name only) restore.
func TestFileSinkRestoresSnapshotsWithoutCarriedParts(t *testing.T) {
	dir := t.TempDir()
	name := "part-0-1-1"
	if err := os.WriteFile(filepath.Join(dir, "."+name+".pending"), []byte("x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	old, err := codec.For[struct{ Name string }]().Append(nil, struct{ Name string }{name})
	if err != nil {
		t.Fatal(err)
	}
	st := append(binary.AppendVarint(binary.AppendUvarint(nil, 1), 1), old...)
	s := operators.NewFileSink(dir, func(v string) string { return v })
	if err := s.Open(sinkContext(0)); err != nil {
		t.Fatal(err)
	}
	if err := s.RestoreState([][]byte{st}, 1); err != nil {
		t.Fatal(err)
	}
	if got := readCommitted(t, dir); !slices.Equal(got, []string{"x"}) {
		t.Fatalf("committed %v", got)
	}
}

// A file sink restored from a snapshot every sink committed before the job
// stopped (Context.RestoredCommitted) commits nothing again: its parts are
// visible in the directory they were written to, and one restored with
// another directory, which lacks them, neither fails nor writes them there
// (with carried parts, which it could).
func TestFileSinkRestoredCommittedCommitsNothingAgain(t *testing.T) {
	for _, carry := range []bool{false, true} {
		t.Run(fmt.Sprintf("carry=%v", carry), func(t *testing.T) {
			opts := operators.FileSinkOptions{CarryParts: carry}
			dirA, dirB := t.TempDir(), t.TempDir()
			s := operators.NewFileSinkWith(dirA, func(v string) string { return v }, opts)
			if err := s.Open(sinkContext(0)); err != nil {
				t.Fatal(err)
			}
			s.Collect("a")
			st, err := s.SnapshotState(1)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.NotifyCheckpointComplete(1); err != nil {
				t.Fatal(err)
			}
			for _, dir := range []string{dirA, dirB} {
				ctx := sinkContext(0)
				ctx.RestoredCommitted = true
				r := operators.NewFileSinkWith(dir, func(v string) string { return v }, opts)
				if err := r.Open(ctx); err != nil {
					t.Fatal(err)
				}
				if err := r.RestoreState([][]byte{st}, 1); err != nil {
					t.Fatalf("restore of a committed snapshot in %s: %v", dir, err)
				}
				if err := r.Close(); err != nil {
					t.Fatal(err)
				}
			}
			if got := readCommitted(t, dirA); !slices.Equal(got, []string{"a"}) {
				t.Fatalf("dir A: %v", got)
			}
			if got := readCommitted(t, dirB); len(got) != 0 {
				t.Fatalf("dir B, which the stop never wrote to: %v", got)
			}
		})
	}
}
