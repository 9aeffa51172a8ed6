package daemon

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/edgedio/edged/snapshot"
)

// committedCopy loads node rn's copy of snapshot id and reports whether
// it is marked committed.
func committedCopy(t *testing.T, rn *replicaNode, id snapshot.ID) bool {
	t.Helper()
	mds, err := rn.store(t).Completed()
	if err != nil {
		t.Fatal(err)
	}
	for _, md := range mds {
		if md.Checkpoint == id {
			// As snapshot.Load sets Metadata.Committed (the copy of a node
			// that adopted the metadata may lack state files yet).
			_, err := os.Stat(filepath.Join(md.Dir, snapshot.CommittedFile))
			return err == nil
		}
	}
	t.Fatalf("node %s holds no copy of snapshot %d", rn.id, id)
	return false
}

// A stop savepoint the job master marked committed is marked on every
// peer's copy too, so that a node that takes the job masters over and
// restores its own copy publishes none of its held output again. A
// snapshot a peer holds no metadata of is reported by its name, and a
// master of an older epoch than a peer saw marks nothing there.
func TestClusterStopSavepointCommittedOnEveryCopy(t *testing.T) {
	nodes := replicaCluster(t)
	a, b, c := nodes["a"], nodes["b"], nodes["c"]
	ctx := context.Background()
	dir := commitSavepoint(t, nodes, 1)
	if err := snapshot.MarkCommitted(dir); err != nil {
		t.Fatal(err)
	}
	for _, rn := range []*replicaNode{b, c} {
		if committedCopy(t, rn, 1) {
			t.Fatalf("node %s's copy is marked committed before the master said so", rn.id)
		}
	}
	if err := a.rep.markCommitted(ctx, 1<<32+1, replicaJobName, 1); err != nil {
		t.Fatal(err)
	}
	for _, rn := range []*replicaNode{a, b, c} {
		if !committedCopy(t, rn, 1) {
			t.Errorf("node %s's copy of the stop savepoint is not marked committed", rn.id)
		}
	}

	// A node that lost its copy (a replaced device, empty data dir)
	// adopts the metadata from a peer, and the mark with it.
	if err := os.RemoveAll(c.store(t).Dir()); err != nil {
		t.Fatal(err)
	}
	c.rep.stores = map[string]*snapshot.Store{}
	if err := c.rep.fetchMetadata(ctx, "b", replicaJobName, 1); err != nil {
		t.Fatal(err)
	}
	if !committedCopy(t, c, 1) {
		t.Error("node c adopted the stop savepoint's metadata from b without its committed mark")
	}

	// A snapshot the peers hold no metadata of: each says so.
	err := a.rep.markCommitted(ctx, 1<<32+1, replicaJobName, 9)
	var ae *APIError
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusNotFound {
		t.Errorf("mark of a snapshot no peer holds: %v, want 404", err)
	}

	// A stale master marks nothing on a node that saw a newer epoch.
	commitSavepoint(t, nodes, 2)
	b.rep.epoch = func() uint64 { return 1 << 40 }
	err = a.rep.markCommitted(ctx, 1<<32+1, replicaJobName, 2)
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusConflict {
		t.Errorf("mark by a stale master: %v, want 409", err)
	}
	if committedCopy(t, b, 2) {
		t.Error("node b marked its copy committed for a stale master")
	}
	if !committedCopy(t, c, 2) {
		t.Error("node c, which saw no newer epoch, did not mark its copy")
	}
}

// A node that was down (or did not answer) when the master marked the
// copies of a stop savepoint, and then takes the job masters over, marks
// its own copy from a peer's before it restores it: the held output is
// not published again. With no peer holding a marked copy (the master died
// before it marked any) the copy stays unmarked.
func TestTakeoverLearnsTheCommittedMarkFromAPeer(t *testing.T) {
	nodes := replicaCluster(t)
	a, b, c := nodes["a"], nodes["b"], nodes["c"]
	ctx := context.Background()

	commitSavepoint(t, nodes, 1)
	if committedCopy(t, b, 1) {
		t.Fatal("node b's copy is marked committed before any node said so")
	}
	md, err := b.rep.recover(ctx, replicaJobName)
	if err != nil || md == nil || md.Checkpoint != 1 {
		t.Fatalf("recover: %v, %v; want savepoint 1", md, err)
	}
	if md.Committed || committedCopy(t, b, 1) {
		t.Fatal("node b marked its copy committed though no peer holds a marked copy")
	}

	// The master marked its own copy and c's; b was down.
	for _, rn := range []*replicaNode{a, c} {
		mds, err := rn.store(t).Completed()
		if err != nil || len(mds) == 0 {
			t.Fatalf("node %s: %v, %d snapshots", rn.id, err, len(mds))
		}
		if err := snapshot.MarkCommitted(mds[0].Dir); err != nil {
			t.Fatal(err)
		}
	}
	md, err = b.rep.recover(ctx, replicaJobName)
	if err != nil || md == nil || md.Checkpoint != 1 {
		t.Fatalf("recover: %v, %v; want savepoint 1", md, err)
	}
	if !md.Committed || !committedCopy(t, b, 1) {
		t.Fatal("node b restores its unmarked copy of the stop savepoint though its peers hold it marked committed: its held output would be published again")
	}
}
