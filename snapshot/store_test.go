package snapshot

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// openTestStore opens a store in a temporary directory, logging into the
// returned buffer without times.
func openTestStore(t *testing.T, job string) (*Store, *bytes.Buffer) {
	t.Helper()
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		},
	}))
	s, err := OpenStore(t.TempDir(), job, 128, log)
	if err != nil {
		t.Fatal(err)
	}
	return s, &logs
}

// writeSnapshot takes a snapshot through the store the way tasks and the
// coordinator's caller do: Begin, one state file per operator subtask
// (contents from data), Commit.
func writeSnapshot(t *testing.T, s *Store, trig Trigger, data map[string][]string) *Metadata {
	t.Helper()
	dir, err := s.Begin(trig)
	if err != nil {
		t.Fatal(err)
	}
	md := &Metadata{Checkpoint: trig.Checkpoint, Kind: KindCheckpoint, Timestamp: trig.Timestamp}
	if trig.Savepoint {
		md.Kind = KindSavepoint
	}
	for _, uid := range slices.Sorted(maps.Keys(data)) {
		o := Operator{UID: uid, Parallelism: len(data[uid])}
		for i, contents := range data[uid] {
			w, err := s.Create(trig.Checkpoint, uid, i)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := w.Write([]byte(contents)); err != nil {
				t.Fatal(err)
			}
			h, err := w.Finish()
			if err != nil {
				t.Fatal(err)
			}
			h.Sources = []byte(fmt.Sprintf("pos-%d", i))
			o.Subtasks = append(o.Subtasks, h)
		}
		md.Operators = append(md.Operators, o)
	}
	got, err := s.Commit(md)
	if err != nil {
		t.Fatal(err)
	}
	if got != dir || md.Dir != dir {
		t.Fatalf("Commit returned %q (md.Dir %q), Begin %q", got, md.Dir, dir)
	}
	return md
}

func readState(t *testing.T, md *Metadata, uid string, subtask int) string {
	t.Helper()
	o, ok := md.Operator(uid)
	if !ok {
		t.Fatalf("no operator %q", uid)
	}
	b, err := os.ReadFile(md.FilePath(o.Subtasks[subtask]))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestStoreCheckpointRoundTrip(t *testing.T) {
	s, _ := openTestStore(t, "job")
	md := writeSnapshot(t, s, Trigger{Checkpoint: 1, Timestamp: 1000},
		map[string][]string{"window": {"aaa", "bbbb"}, "src": {"x"}})
	if md.Job != "job" || md.MaxParallelism != 128 {
		t.Fatalf("Commit did not stamp the job: %q %d", md.Job, md.MaxParallelism)
	}
	latest, err := s.Latest()
	if err != nil {
		t.Fatal(err)
	}
	if !equalMetadata(latest, md) {
		t.Fatalf("Latest:\n got %#v\nwant %#v", latest, md)
	}
	if got := readState(t, latest, "window", 1); got != "bbbb" {
		t.Fatalf("state = %q", got)
	}
	if latest.Dir != filepath.Join(s.Dir(), "checkpoints", "chk-1") {
		t.Fatalf("Dir = %q", latest.Dir)
	}
	// Nothing but state files and _metadata is left behind.
	entries, err := os.ReadDir(latest.Dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if want := "_metadata src.0.state window.0.state window.1.state"; strings.Join(names, " ") != want {
		t.Fatalf("files = %v, want %s", names, want)
	}
	// The layout file is there.
	if b, err := os.ReadFile(filepath.Join(s.Dir(), "LAYOUT")); err != nil || string(b) != layoutContents {
		t.Fatalf("LAYOUT = %q, %v", b, err)
	}
}

func equalMetadata(a, b *Metadata) bool {
	ea, err1 := EncodeMetadata(a)
	eb, err2 := EncodeMetadata(b)
	return err1 == nil && err2 == nil && bytes.Equal(ea, eb) && a.Dir == b.Dir
}

func TestStoreLatestSkipsDamagedCheckpoints(t *testing.T) {
	s, logs := openTestStore(t, "job")
	data := map[string][]string{"op": {"hello"}}
	for id := ID(1); id <= 7; id++ {
		writeSnapshot(t, s, Trigger{Checkpoint: id, Timestamp: int64(id)}, data)
	}
	chk := func(id ID, name string) string { return filepath.Join(s.CheckpointDir(id), name) }
	// 7: another job's checkpoint.
	other, err := OpenStore(s.Dir(), "other-job", 128, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(s.CheckpointDir(7)); err != nil {
		t.Fatal(err)
	}
	writeSnapshot(t, other, Trigger{Checkpoint: 7, Timestamp: 7}, data)
	// 6: a flipped byte in the state file (same size).
	must(t, os.WriteFile(chk(6, "op.0.state"), []byte("hellO"), 0o644))
	// 5: a truncated state file.
	must(t, os.WriteFile(chk(5, "op.0.state"), []byte("hell"), 0o644))
	// 4: a missing state file.
	must(t, os.Remove(chk(4, "op.0.state")))
	// 3: corrupt metadata.
	b, err := os.ReadFile(chk(3, metadataFile))
	must(t, err)
	b[len(b)/2] ^= 0xff
	must(t, os.WriteFile(chk(3, metadataFile), b, 0o644))
	// 2: no metadata (crashed before completing).
	must(t, os.Remove(chk(2, metadataFile)))

	md, err := s.Latest()
	if err != nil {
		t.Fatal(err)
	}
	if md.Checkpoint != 1 {
		t.Fatalf("Latest = %d, want 1", md.Checkpoint)
	}
	for id, why := range map[ID]string{
		7: `snapshot: checkpoint of another job: job \"other-job\", not \"job\"`,
		6: "snapshot: checksum mismatch: op.0.state has crc32c",
		5: "snapshot: state file has the wrong size: op.0.state has 4 bytes, metadata says 5",
		4: "snapshot: state file missing: op.0.state",
		3: "snapshot: checksum mismatch: metadata crc32c",
		2: "snapshot: checkpoint incomplete (no _metadata)",
	} {
		line := fmt.Sprintf("level=WARN msg=\"snapshot: skipping checkpoint\" job=job checkpoint_id=%d dir=%s err=\"", id, s.CheckpointDir(id))
		i := strings.Index(logs.String(), line)
		if i < 0 || !strings.Contains(logs.String()[i:], why) {
			t.Errorf("no log line for checkpoint %d with %q in:\n%s", id, why, logs)
		}
	}
	if n := strings.Count(logs.String(), "\n"); n != 6 {
		t.Errorf("%d log lines, want 6:\n%s", n, logs)
	}
	// Once every complete checkpoint is damaged, there is none to
	// restore, and that is not a fresh start: a restore refuses to start
	// the job from the beginning, which would commit its output again.
	must(t, os.Remove(chk(1, metadataFile)))
	if _, err := s.Latest(); !errors.Is(err, ErrAllDamaged) || errors.Is(err, ErrNoCheckpoint) {
		t.Fatalf("Latest = %v, want ErrAllDamaged", err)
	}
	if _, err := s.RecoveryPoint(false); !errors.Is(err, ErrAllDamaged) || !strings.Contains(err.Error(), "remove the job's checkpoint directory") {
		t.Fatalf("RecoveryPoint = %v, want ErrAllDamaged saying what to do", err)
	}
	// Incomplete checkpoints (crashed before completing) and another
	// job's are not damaged ones: with only those, there is none.
	for _, id := range []ID{3, 4, 5, 6} {
		must(t, os.RemoveAll(s.CheckpointDir(id)))
	}
	if _, err := s.RecoveryPoint(false); !errors.Is(err, ErrNoCheckpoint) {
		t.Fatalf("RecoveryPoint = %v, want ErrNoCheckpoint", err)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestStoreSavepointIsRelocatable(t *testing.T) {
	s, _ := openTestStore(t, "job")
	md := writeSnapshot(t, s, Trigger{Checkpoint: 3, Timestamp: 1234, Savepoint: true},
		map[string][]string{"op": {"one", "two"}})
	if want := filepath.Join(s.Dir(), "savepoints", "sp-3-1234"); md.Dir != want {
		t.Fatalf("savepoint dir = %q, want %q", md.Dir, want)
	}
	// Copy it to another device's disk and delete the original.
	moved := filepath.Join(t.TempDir(), "elsewhere")
	must(t, os.CopyFS(moved, os.DirFS(md.Dir)))
	must(t, os.RemoveAll(md.Dir))
	for _, path := range []string{moved, filepath.Join(moved, metadataFile)} {
		got, err := Load(path)
		if err != nil {
			t.Fatal(err)
		}
		if got.Dir != moved || got.Kind != KindSavepoint || got.Checkpoint != 3 {
			t.Fatalf("Load(%s) = %+v", path, got)
		}
		if s := readState(t, got, "op", 1); s != "two" {
			t.Fatalf("state = %q", s)
		}
	}
	if _, err := Load(t.TempDir()); !errors.Is(err, ErrIncomplete) {
		t.Fatalf("Load(empty dir) = %v, want ErrIncomplete", err)
	}
	// A path that is not there says so, not that a snapshot is incomplete.
	missing := filepath.Join(t.TempDir(), "nosuch")
	if _, err := Load(missing); !errors.Is(err, fs.ErrNotExist) || errors.Is(err, ErrIncomplete) || !strings.Contains(err.Error(), "no such file or directory") {
		t.Fatalf("Load(missing path) = %v, want it not found", err)
	}
}

func TestStoreSavepointPaths(t *testing.T) {
	s, _ := openTestStore(t, "job")
	abs := filepath.Join(t.TempDir(), "backups", "before-upgrade")
	md := writeSnapshot(t, s, Trigger{Checkpoint: 1, Savepoint: true, Path: abs}, map[string][]string{"op": {"a"}})
	if md.Dir != abs {
		t.Fatalf("Dir = %q, want %q", md.Dir, abs)
	}
	md = writeSnapshot(t, s, Trigger{Checkpoint: 2, Savepoint: true, Path: "nightly/monday"}, map[string][]string{"op": {"a"}})
	if want := filepath.Join(s.Dir(), "savepoints", "nightly", "monday"); md.Dir != want {
		t.Fatalf("Dir = %q, want %q", md.Dir, want)
	}
	// An existing empty directory is fine; a non-empty one is refused.
	empty := t.TempDir()
	writeSnapshot(t, s, Trigger{Checkpoint: 3, Savepoint: true, Path: empty}, map[string][]string{"op": {"a"}})
	if _, err := s.Begin(Trigger{Checkpoint: 4, Savepoint: true, Path: empty}); !errors.Is(err, ErrExists) {
		t.Fatalf("Begin into a non-empty dir = %v, want ErrExists", err)
	}
	// A savepoint's failure removes only what it wrote into a directory
	// that existed.
	empty2 := t.TempDir()
	if _, err := s.Begin(Trigger{Checkpoint: 5, Savepoint: true, Path: empty2}); err != nil {
		t.Fatal(err)
	}
	w, err := s.Create(5, "op", 0)
	must(t, err)
	_, err = w.Finish()
	must(t, err)
	must(t, s.Discard(5))
	if entries, err := os.ReadDir(empty2); err != nil || len(entries) != 0 {
		t.Fatalf("after Discard: %v, %v", entries, err)
	}
	// A relative path stays under savepoints/.
	// Neither is savepoints/ itself, nor a path no file system takes.
	for i, p := range []string{"../escaped", "a/../../escaped", "..", "../../../../tmp/x",
		".", "a/..", "./", "a\x00b", filepath.Join(t.TempDir(), "a\x00b"), strings.Repeat("x", 256),
		strings.Repeat("x/", 2048)} {
		if _, err := s.Begin(Trigger{Checkpoint: ID(10 + i), Savepoint: true, Path: p}); !errors.Is(err, ErrName) {
			t.Fatalf("Begin with path %q = %v, want ErrName", p, err)
		}
	}
}

// An absolute savepoint path in the store's checkpoints/ directory is
// refused: the checkpoint whose directory it took failed (the job with
// it, at the default checkpoint.tolerable_failures of 0), and retention
// deletes what lies there.
func TestStoreSavepointInTheCheckpointsDirRefused(t *testing.T) {
	s, _ := openTestStore(t, "job")
	writeSnapshot(t, s, Trigger{Checkpoint: 1}, map[string][]string{"op": {"a"}})
	for i, p := range []string{s.CheckpointDir(3), filepath.Join(s.Dir(), "checkpoints", "mine"),
		filepath.Join(s.Dir(), "checkpoints", "x", "..", "chk-4"), filepath.Join(s.Dir(), "checkpoints")} {
		if _, err := s.Begin(Trigger{Checkpoint: ID(2 + i), Savepoint: true, Path: p}); !errors.Is(err, ErrName) {
			t.Fatalf("Begin savepoint at %q = %v, want ErrName", p, err)
		}
	}
	writeSnapshot(t, s, Trigger{Checkpoint: 3}, map[string][]string{"op": {"a"}})
	// Beside it, and under savepoints/, is fine.
	writeSnapshot(t, s, Trigger{Checkpoint: 7, Savepoint: true, Path: filepath.Join(s.Dir(), "checkpoints-copy")}, map[string][]string{"op": {"a"}})
	writeSnapshot(t, s, Trigger{Checkpoint: 8, Savepoint: true, Path: filepath.Join(s.Dir(), "savepoints", "mine")}, map[string][]string{"op": {"a"}})
}

// A savepoint path that reaches the checkpoints/ directory through a
// symbolic link (to the store's directory, or the store's directory being
// one) is refused as the direct path is. Before, the check compared the
// paths as written and let it through.
func TestStoreSavepointInTheCheckpointsDirThroughALinkRefused(t *testing.T) {
	base := t.TempDir()
	real := filepath.Join(base, "real")
	if err := os.MkdirAll(real, 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(base, "link")
	if err := os.Symlink(real, link); err != nil {
		t.Skipf("no symbolic links here: %v", err)
	}
	s, err := OpenStore(link, "job", 128, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range []string{filepath.Join(real, "checkpoints", "chk-5"), filepath.Join(real, "checkpoints", "new", "sp")} {
		if err := CheckSavepointOutsideCheckpoints(link, p); !errors.Is(err, ErrName) {
			t.Errorf("CheckSavepointOutsideCheckpoints(%q, %q) = %v, want ErrName", link, p, err)
		}
		if _, err := s.Begin(Trigger{Checkpoint: ID(2 + i), Savepoint: true, Path: p}); !errors.Is(err, ErrName) {
			t.Errorf("Begin savepoint at %q = %v, want ErrName", p, err)
		}
	}
	if err := CheckSavepointOutsideCheckpoints(real, filepath.Join(link, "checkpoints", "chk-5")); !errors.Is(err, ErrName) {
		t.Errorf("through the link to the store's directory: %v, want ErrName", err)
	}
	// Beside it is fine.
	if err := CheckSavepointOutsideCheckpoints(link, filepath.Join(real, "checkpoints-copy")); err != nil {
		t.Errorf("beside the checkpoints directory: %v", err)
	}
}

func TestStoreDiscard(t *testing.T) {
	s, _ := openTestStore(t, "job")
	writeSnapshot(t, s, Trigger{Checkpoint: 1}, map[string][]string{"op": {"a"}})
	sp := writeSnapshot(t, s, Trigger{Checkpoint: 2, Savepoint: true, Timestamp: 9}, map[string][]string{"op": {"a"}})
	must(t, s.Discard(1))
	if _, err := os.Stat(s.CheckpointDir(1)); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("checkpoint 1 still there: %v", err)
	}
	must(t, s.Discard(1)) // again: nothing to do
	must(t, s.Discard(2)) // a completed savepoint is never touched
	if _, err := Load(sp.Dir); err != nil {
		t.Fatalf("savepoint gone after Discard: %v", err)
	}
	// A failed savepoint in the default place goes entirely.
	dir, err := s.Begin(Trigger{Checkpoint: 3, Savepoint: true, Timestamp: 10})
	must(t, err)
	must(t, s.Discard(3))
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("failed savepoint still there: %v", err)
	}
}

// A checkpoint directory that a failed checkpoint left behind (its
// Discard met a task still writing a state file into it: "directory not
// empty") is removed at a completion once every completed checkpoint
// older than it was retired; a directory of a checkpoint still in
// progress, the completed checkpoints and the savepoints stay.
func TestStoreCommitRemovesLeftCheckpointDirs(t *testing.T) {
	s, logs := openTestStore(t, "job")
	writeSnapshot(t, s, Trigger{Checkpoint: 1}, map[string][]string{"op": {"a"}})
	sp := writeSnapshot(t, s, Trigger{Checkpoint: 2, Savepoint: true, Timestamp: 9}, map[string][]string{"op": {"a"}})
	// Left behind by a failed checkpoint 3: a state file, no _metadata.
	left := s.CheckpointDir(3)
	must(t, os.MkdirAll(left, 0o755))
	must(t, os.WriteFile(filepath.Join(left, "window.0.state"), []byte("partial"), 0o644))
	// Checkpoint 4 is still in progress (a finalizing one, say).
	inProgress, err := s.Begin(Trigger{Checkpoint: 4})
	must(t, err)
	must(t, os.WriteFile(filepath.Join(inProgress, "window.0.state"), []byte("partial"), 0o644))

	writeSnapshot(t, s, Trigger{Checkpoint: 5}, map[string][]string{"op": {"b"}})
	// Checkpoint 1 is still retained: what lies between it and 5 stays
	// (in a cluster, state files of a completed checkpoint whose
	// metadata the node missed look the same).
	if _, err := os.Stat(left); err != nil {
		t.Fatalf("the directory of checkpoint 3 went while the older checkpoint 1 is retained: %v", err)
	}
	must(t, s.Discard(1)) // retention
	writeSnapshot(t, s, Trigger{Checkpoint: 6}, map[string][]string{"op": {"c"}})
	if _, err := os.Stat(left); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the directory a failed checkpoint left is still there once every checkpoint before it was retired: %v", err)
	}
	if !strings.Contains(logs.String(), "removed the directory of a checkpoint that never completed") {
		t.Errorf("the removal is not logged:\n%s", logs.String())
	}
	for what, dir := range map[string]string{"checkpoint 4, in progress": inProgress, "completed checkpoint 5": s.CheckpointDir(5), "savepoint 2": sp.Dir} {
		if _, err := os.Stat(dir); err != nil {
			t.Errorf("%s removed: %v", what, err)
		}
	}
	if _, err := Load(s.CheckpointDir(5)); err != nil {
		t.Errorf("completed checkpoint 5: %v", err)
	}
}

func TestStoreProgressAndRecoveryPoint(t *testing.T) {
	s, logs := openTestStore(t, "job")
	if _, err := s.RecoveryPoint(false); !errors.Is(err, ErrNoCheckpoint) {
		t.Fatalf("RecoveryPoint on an empty store = %v", err)
	}
	p, err := s.Progress()
	must(t, err)
	if p.NextID != 1 || p.Completed != nil || p.Incomplete != nil {
		t.Fatalf("empty Progress = %+v", p)
	}
	data := map[string][]string{"op": {"a"}}
	writeSnapshot(t, s, Trigger{Checkpoint: 1}, data)
	writeSnapshot(t, s, Trigger{Checkpoint: 2}, data)
	writeSnapshot(t, s, Trigger{Checkpoint: 4, Savepoint: true, Timestamp: 44}, data)
	_, err = s.Begin(Trigger{Checkpoint: 3}) // crashed while in progress
	must(t, err)
	writeSnapshot(t, s, Trigger{Checkpoint: 10}, data)
	must(t, os.Remove(filepath.Join(s.CheckpointDir(10), metadataFile)))
	writeSnapshot(t, s, Trigger{Checkpoint: 11, Savepoint: true, Timestamp: 55}, data)
	must(t, os.Remove(filepath.Join(s.Dir(), "savepoints", "sp-11-55", metadataFile)))
	must(t, os.MkdirAll(filepath.Join(s.Dir(), "checkpoints", "not-a-checkpoint"), 0o755))

	p, err = s.Progress()
	must(t, err)
	if fmt.Sprint(p.NextID, p.Completed, p.Incomplete) != "12 [1 2] [3 10]" {
		t.Fatalf("Progress = %+v", p)
	}
	// Newest wins: savepoint 4 over checkpoint 2 (11 is incomplete).
	md, err := s.RecoveryPoint(false)
	must(t, err)
	if md.Checkpoint != 4 || md.Kind != KindSavepoint {
		t.Fatalf("RecoveryPoint(false) = %d %s", md.Checkpoint, md.Kind)
	}
	// Preferring checkpoints never goes back past the newer savepoint: its
	// completion may have committed output. The setting is ignored, and
	// the log says so, naming both.
	logs.Reset()
	md, err = s.RecoveryPoint(true)
	must(t, err)
	if md.Checkpoint != 4 || md.Kind != KindSavepoint {
		t.Fatalf("RecoveryPoint(true) = %d %s, want savepoint 4", md.Checkpoint, md.Kind)
	}
	for _, want := range []string{"level=WARN", "ignoring checkpoint.prefer_checkpoint_for_recovery", "checkpoint_id=2", "savepoint_id=4", "chk-2", "sp-4-44", "twice"} {
		if !strings.Contains(logs.String(), want) {
			t.Fatalf("log lacks %q:\n%s", want, logs.String())
		}
	}
	// A damaged savepoint still falls back: to checkpoint 2, newest of
	// the rest, without the warning.
	must(t, os.WriteFile(filepath.Join(s.Dir(), "savepoints", "sp-4-44", "op.0.state"), []byte("b"), 0o644))
	logs.Reset()
	md, err = s.RecoveryPoint(true)
	must(t, err)
	if md.Checkpoint != 2 || md.Kind != KindCheckpoint {
		t.Fatalf("RecoveryPoint(true) with savepoint 4 damaged = %d %s", md.Checkpoint, md.Kind)
	}
	if strings.Contains(logs.String(), "ignoring") || !strings.Contains(logs.String(), "skipping savepoint") {
		t.Fatalf("log:\n%s", logs.String())
	}
	writeSnapshot(t, s, Trigger{Checkpoint: 5, Savepoint: true, Timestamp: 45}, data)
	// A newer checkpoint wins either way.
	writeSnapshot(t, s, Trigger{Checkpoint: 12}, data)
	if md, err := s.RecoveryPoint(false); err != nil || md.Checkpoint != 12 {
		t.Fatalf("RecoveryPoint(false) = %v, %v", md, err)
	}
	// With no checkpoint, the savepoint even when checkpoints are preferred.
	for _, id := range []ID{1, 2, 12} {
		must(t, s.Discard(id))
	}
	if md, err := s.RecoveryPoint(true); err != nil || md.Checkpoint != 5 {
		t.Fatalf("RecoveryPoint(true) without checkpoints = %v, %v", md, err)
	}
}

func TestStoreErrors(t *testing.T) {
	s, _ := openTestStore(t, "job")
	if _, err := s.Create(1, "op", 0); !errors.Is(err, ErrUnknownCheckpoint) {
		t.Errorf("Create before Begin = %v", err)
	}
	if _, err := s.Commit(&Metadata{Checkpoint: 1, Kind: KindCheckpoint}); !errors.Is(err, ErrUnknownCheckpoint) {
		t.Errorf("Commit before Begin = %v", err)
	}
	_, err := s.Begin(Trigger{Checkpoint: 1})
	must(t, err)
	if _, err := s.Begin(Trigger{Checkpoint: 1}); !errors.Is(err, ErrExists) {
		t.Errorf("Begin twice = %v", err)
	}
	if _, err := s.StatePath(1, "", 0); !errors.Is(err, ErrName) {
		t.Errorf("empty uid = %v", err)
	}
	if _, err := s.StatePath(1, "op", -1); !errors.Is(err, ErrName) {
		t.Errorf("negative subtask = %v", err)
	}
	w, err := s.Create(1, "op", 0)
	must(t, err)
	_, err = w.Write([]byte("abc"))
	must(t, err)
	h, err := w.Finish()
	must(t, err)
	if _, err := w.Finish(); err == nil {
		t.Error("Finish twice succeeded")
	}
	must(t, w.Abort()) // no-op after Finish

	md := &Metadata{Checkpoint: 1, Kind: KindCheckpoint, Operators: []Operator{{UID: "op", Parallelism: 1, Subtasks: []Handle{h}}}}
	md.Operators[0].Subtasks[0].Size = 4
	if _, err := s.Commit(md); !errors.Is(err, ErrSize) {
		t.Errorf("Commit with a wrong size = %v", err)
	}
	md.Operators[0].Subtasks[0] = Handle{File: "nope.state"}
	if _, err := s.Commit(md); !errors.Is(err, ErrMissing) {
		t.Errorf("Commit with a missing file = %v", err)
	}
	md.Kind = KindSavepoint
	if _, err := s.Commit(md); !errors.Is(err, ErrCorrupt) {
		t.Errorf("Commit of the wrong kind = %v", err)
	}
	// The failed commits left the checkpoint incomplete and begun.
	if _, err := os.Stat(filepath.Join(s.CheckpointDir(1), metadataFile)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("metadata written by a failed commit: %v", err)
	}

	// An aborted writer leaves nothing behind.
	w, err = s.Create(1, "other", 0)
	must(t, err)
	_, err = w.Write([]byte("partial"))
	must(t, err)
	must(t, w.Abort())
	entries, err := os.ReadDir(s.CheckpointDir(1))
	must(t, err)
	if len(entries) != 1 || entries[0].Name() != "op.0.state" {
		t.Errorf("after Abort: %v", entries)
	}

	// A store of another layout version is refused.
	must(t, os.WriteFile(filepath.Join(s.Dir(), "LAYOUT"), []byte("edged snapshot store 2\n"), 0o644))
	if _, err := OpenStore(s.Dir(), "job", 128, nil); !errors.Is(err, ErrLayout) {
		t.Errorf("OpenStore of layout 2 = %v", err)
	}
	if _, err := OpenStore("", "job", 128, nil); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("OpenStore without a dir = %v", err)
	}
	if _, err := OpenStore(t.TempDir(), "job", 0, nil); err == nil {
		t.Error("OpenStore with max parallelism 0 succeeded")
	}
}

func TestStateFileName(t *testing.T) {
	for uid, want := range map[string]string{
		"window-avg_1.v2": "window-avg_1.v2.3.state",
		"my op/1":         "my%20op%2F1.3.state",
		"..":              "...3.state",
		"温度":              "%E6%B8%A9%E5%BA%A6.3.state",
	} {
		got, err := stateFileName(uid, 3)
		if err != nil || got != want {
			t.Errorf("stateFileName(%q) = %q, %v; want %q", uid, got, err, want)
		}
		if err := validFileName(got); err != nil {
			t.Errorf("%q: %v", got, err)
		}
	}
	long := strings.Repeat("x", 300)
	got, err := stateFileName(long, 0)
	if err != nil || len(got) > 255 || validFileName(got) != nil {
		t.Errorf("long uid: %q (%d bytes), %v", got, len(got), err)
	}
	other, _ := stateFileName(long+"y", 0)
	if other == got {
		t.Errorf("two long UIDs share the file name %q", got)
	}
}

// A savepoint written to a path of the user's (absolute, or a name under
// savepoints/) is what recovery restores when it is the newest snapshot,
// and the next IDs go above it, as for a savepoint in its default place:
// the store links it as savepoints/sp-<id>-<timestamp>. Without the link a
// job started again after a stop with such a savepoint resumed from the
// checkpoint before it, and committed again what the savepoint's
// completion had committed.
func TestStoreSavepointOnAPathOfTheUsersIsRecovered(t *testing.T) {
	s, _ := openTestStore(t, "job")
	data := map[string][]string{"op": {"a"}}
	writeSnapshot(t, s, Trigger{Checkpoint: 1}, data)
	writeSnapshot(t, s, Trigger{Checkpoint: 2}, data)
	abs := filepath.Join(t.TempDir(), "backups", "before-upgrade")
	writeSnapshot(t, s, Trigger{Checkpoint: 3, Savepoint: true, Timestamp: 33, Path: abs}, data)
	recovers := func(want ID) {
		t.Helper()
		md, err := s.RecoveryPoint(false)
		if err != nil || md.Checkpoint != want {
			t.Fatalf("RecoveryPoint = %v, %v; want snapshot %d", md, err, want)
		}
		if got := readState(t, md, "op", 0); got != "a" {
			t.Fatalf("state through %s = %q", md.Dir, got)
		}
		p, err := s.Progress()
		must(t, err)
		if p.NextID != want+1 {
			t.Fatalf("NextID = %d after snapshot %d", p.NextID, want)
		}
	}
	recovers(3)
	writeSnapshot(t, s, Trigger{Checkpoint: 4, Savepoint: true, Timestamp: 44, Path: "nightly/monday"}, data)
	recovers(4)
	if target, err := os.Readlink(filepath.Join(s.Dir(), "savepoints", "sp-4-44")); err != nil || target != filepath.Join("nightly", "monday") {
		t.Fatalf("link of savepoint 4 = %q, %v; want the relative path", target, err)
	}
	writeSnapshot(t, s, Trigger{Checkpoint: 5}, data)
	recovers(5)
	// A savepoint that fails leaves no link; one whose directory the user
	// removed later is skipped.
	_, err := s.Begin(Trigger{Checkpoint: 6, Savepoint: true, Timestamp: 66, Path: filepath.Join(t.TempDir(), "failed")})
	must(t, err)
	must(t, s.Discard(6))
	if _, err := os.Lstat(filepath.Join(s.Dir(), "savepoints", "sp-6-66")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a failed savepoint left its link: %v", err)
	}
	writeSnapshot(t, s, Trigger{Checkpoint: 7, Savepoint: true, Timestamp: 77, Path: filepath.Join(t.TempDir(), "gone")}, data)
	recovers(7)
	md, err := s.RecoveryPoint(false)
	must(t, err)
	must(t, os.RemoveAll(func() string { p, _ := filepath.EvalSymlinks(md.Dir); return p }()))
	if md, err := s.RecoveryPoint(false); err != nil || md.Checkpoint != 5 {
		t.Fatalf("RecoveryPoint with savepoint 7's directory removed = %v, %v; want checkpoint 5", md, err)
	}
}

// A checkpoint with a state file missing is skipped either way; when it
// is the only complete one, a store for a job on one node
// (MissingIsDamage) has nothing to restore and says so with
// ErrAllDamaged, since starting from the beginning would commit the job's
// output again, while a store of a cluster node, whose file a replica may
// still hold, finds no checkpoint.
func TestStoreMissingFileIsDamageOnOneNode(t *testing.T) {
	for _, oneNode := range []bool{false, true} {
		s, _ := openTestStore(t, "job")
		writeSnapshot(t, s, Trigger{Checkpoint: 1, Timestamp: 1}, map[string][]string{"op": {"hello"}})
		must(t, os.Remove(filepath.Join(s.CheckpointDir(1), "op.0.state")))
		want := ErrNoCheckpoint
		if oneNode {
			s.MissingIsDamage()
			want = ErrAllDamaged
		}
		if _, err := s.RecoveryPoint(false); !errors.Is(err, want) {
			t.Fatalf("one node %v: RecoveryPoint = %v, want %v", oneNode, err, want)
		}
	}
}

func TestCheckSavepointDir(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Join(dir, "new", "sp"), dir, "relative/sp", ""} {
		if err := CheckSavepointDir(p); err != nil {
			t.Errorf("CheckSavepointDir(%q) = %v, want nil", p, err)
		}
	}
	for _, p := range []string{file, filepath.Join(file, "sp"), "/dev/null"} {
		if err := CheckSavepointDir(p); !errors.Is(err, ErrName) || !strings.Contains(err.Error(), "is not a directory") {
			t.Errorf("CheckSavepointDir(%q) = %v, want ErrName: … is not a directory", p, err)
		}
	}
}
