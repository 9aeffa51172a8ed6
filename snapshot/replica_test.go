package snapshot

import (
	"bytes"
	"errors"
	"hash/crc32"
	"os"
	"path/filepath"
	"testing"
)

func replicaHandle(name string, data []byte) Handle {
	return Handle{File: name, Size: int64(len(data)), Checksum: crc32.Checksum(data, castagnoli)}
}

// A node's store keeps copies of another node's snapshots: files imported
// without Begin, metadata added (a savepoint's moved under savepoints/),
// incomplete until every file is in, then restorable through Latest and
// RecoveryPoint; retention keeps the newest completed ones.
func TestStoreReplicaCopies(t *testing.T) {
	s, _ := openTestStore(t, "job")
	d0, d1 := []byte("subtask zero state"), []byte("subtask one state!")
	h0, h1 := replicaHandle("op.0.state", d0), replicaHandle("op.1.state", d1)
	md := func(id ID, kind Kind) *Metadata {
		return &Metadata{Job: "job", MaxParallelism: 128, Checkpoint: id, Kind: kind, Timestamp: 1000 + int64(id),
			Operators: []Operator{{UID: "op", Parallelism: 2, Subtasks: []Handle{h0, h1}}}}
	}
	if err := s.ImportReplica(4, h0.File, h0.Size, h0.Checksum, bytes.NewReader(d0)); err != nil {
		t.Fatal(err)
	}
	if err := s.ImportReplica(4, h1.File, h1.Size, h1.Checksum+1, bytes.NewReader(d1)); !errors.Is(err, ErrChecksum) {
		t.Fatalf("import of a damaged copy: %v", err)
	}
	if err := s.ImportReplica(4, "_metadata", 1, 0, bytes.NewReader(d1)); !errors.Is(err, ErrName) {
		t.Fatalf("import of _metadata: %v", err)
	}
	m4 := md(4, KindCheckpoint)
	dir, err := s.AddMetadata(m4, "_replicas", []byte(`{}`))
	if err != nil || dir != s.CheckpointDir(4) {
		t.Fatalf("add metadata: %q, %v", dir, err)
	}
	if miss := Missing(m4); len(miss) != 1 || miss[0].File != h1.File {
		t.Fatalf("missing %v, want %s", miss, h1.File)
	}
	if _, err := s.Latest(); !errors.Is(err, ErrNoCheckpoint) {
		t.Fatalf("latest with a file missing: %v", err)
	}
	if err := s.ImportReplica(4, h1.File, h1.Size, h1.Checksum, bytes.NewReader(d1)); err != nil {
		t.Fatal(err)
	}
	if got, err := s.RecoveryPoint(false); err != nil || got.Checkpoint != 4 {
		t.Fatalf("recovery point: %v, %v", got, err)
	}
	// A savepoint moves under savepoints/ and is never retained away.
	for _, h := range []Handle{h0, h1} {
		data := map[string][]byte{h0.File: d0, h1.File: d1}[h.File]
		if err := s.ImportReplica(5, h.File, h.Size, h.Checksum, bytes.NewReader(data)); err != nil {
			t.Fatal(err)
		}
	}
	sp := md(5, KindSavepoint)
	if _, err := s.AddMetadata(sp, "", nil); err != nil {
		t.Fatal(err)
	}
	if got, err := s.RecoveryPoint(false); err != nil || got.Checkpoint != 5 || got.Kind != KindSavepoint {
		t.Fatalf("recovery point after the savepoint: %v, %v", got, err)
	}
	for id := ID(6); id <= 8; id++ {
		if _, err := s.AddMetadata(md(id, KindCheckpoint), "", nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(s.CheckpointDir(9), 0o755); err != nil { // pending
		t.Fatal(err)
	}
	if err := s.RetainCompleted(2); err != nil {
		t.Fatal(err)
	}
	all, err := s.Completed()
	if err != nil {
		t.Fatal(err)
	}
	var ids []ID
	for _, m := range all {
		ids = append(ids, m.Checkpoint)
	}
	if len(ids) != 3 || ids[0] != 8 || ids[1] != 7 || ids[2] != 5 {
		t.Fatalf("completed after retain 2: %v, want [8 7 5]", ids)
	}
	if _, err := os.Stat(s.CheckpointDir(9)); err != nil {
		t.Fatalf("the pending checkpoint went: %v", err)
	}
	if _, err := os.Stat(filepath.Join(s.CheckpointDir(4))); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("checkpoint 4 kept: %v", err)
	}
	if _, err := s.AddMetadata(&Metadata{Job: "other", MaxParallelism: 128, Checkpoint: 10, Kind: KindCheckpoint}, "", nil); !errors.Is(err, ErrJobMismatch) {
		t.Fatalf("metadata of another job: %v", err)
	}
}

// Metadata added for a savepoint the store already holds whole (its own,
// or a copy added before: a history adopted from a peer, a publication
// sent again) leaves it whole: its state files stay, and the savepoint
// still loads. Before, the directory was replaced by one holding only the
// metadata, so the node's own savepoint lost its state files.
func TestStoreAddMetadataKeepsAHeldSavepoint(t *testing.T) {
	s, _ := openTestStore(t, "job")
	d0 := []byte("subtask zero state")
	h0 := replicaHandle("op.0.state", d0)
	md := func() *Metadata {
		return &Metadata{Job: "job", MaxParallelism: 128, Checkpoint: 7, Kind: KindSavepoint, Timestamp: 1007,
			Operators: []Operator{{UID: "op", Parallelism: 1, Subtasks: []Handle{h0}}}}
	}
	if err := s.ImportReplica(7, h0.File, h0.Size, h0.Checksum, bytes.NewReader(d0)); err != nil {
		t.Fatal(err)
	}
	dir, err := s.AddMetadata(md(), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	again, err := s.AddMetadata(md(), "_replicas", []byte(`{}`))
	if err != nil || again != dir {
		t.Fatalf("add the metadata again: %q, %v; want %q", again, err, dir)
	}
	if _, err := Load(dir); err != nil {
		t.Fatalf("the savepoint after its metadata was added again: %v", err)
	}
	if _, err := os.Stat(s.CheckpointDir(7)); !os.IsNotExist(err) {
		t.Fatalf("the staging directory is left: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "_replicas")); err != nil {
		t.Fatalf("the new extra file did not join the savepoint: %v", err)
	}
}

// A copy that fails its size or checksum leaves no directory behind when
// it made the one it was to go in: a peer's copy of a snapshot with an id
// above every completed one would otherwise stay for good, since
// retention keeps what is newer than the newest checkpoint. A directory
// that holds other copies stays.
func TestImportReplicaFailedLeavesNoDirectory(t *testing.T) {
	s, _ := openTestStore(t, "job")
	d := []byte("state")
	h := replicaHandle("op.0.state", d)
	for _, id := range []ID{99999, ^ID(0)} {
		if err := s.ImportReplica(id, h.File, h.Size, h.Checksum+1, bytes.NewReader(d)); !errors.Is(err, ErrChecksum) {
			t.Fatalf("bad checksum: %v", err)
		}
		if err := s.ImportReplica(id, h.File, h.Size+1, h.Checksum, bytes.NewReader(d)); !errors.Is(err, ErrSize) {
			t.Fatalf("bad size: %v", err)
		}
		if _, err := os.Stat(s.CheckpointDir(id)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("directory of snapshot %d after failed copies: %v, want none", id, err)
		}
	}
	if err := s.ImportReplica(7, h.File, h.Size, h.Checksum, bytes.NewReader(d)); err != nil {
		t.Fatal(err)
	}
	if err := s.ImportReplica(7, "op.1.state", h.Size, h.Checksum+1, bytes.NewReader(d)); !errors.Is(err, ErrChecksum) {
		t.Fatalf("bad checksum: %v", err)
	}
	if _, err := os.Stat(filepath.Join(s.CheckpointDir(7), h.File)); err != nil {
		t.Fatalf("good copy beside a failed one: %v", err)
	}
}
