package daemon

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgedio/edged/cluster"
	"github.com/edgedio/edged/snapshot"
)

// commitSavepoint takes savepoint id of the replica test's job on a, the
// job master, with a state file written on each of a, b and c and copied
// to their replica peers, and publishes its metadata on every node. It
// returns the savepoint's directory on a.
func commitSavepoint(t *testing.T, nodes map[string]*replicaNode, id snapshot.ID) string {
	t.Helper()
	a := nodes["a"]
	ctx := context.Background()
	master := a.store(t)
	if _, err := master.Begin(snapshot.Trigger{Checkpoint: id, Savepoint: true, Timestamp: 1000 + int64(id)}); err != nil {
		t.Fatal(err)
	}
	md := &snapshot.Metadata{Checkpoint: id, Kind: snapshot.KindSavepoint, Timestamp: 1000 + int64(id),
		Operators: []snapshot.Operator{{UID: "j/win", Parallelism: 3, Subtasks: make([]snapshot.Handle, 3)}}}
	for i, w := range []*replicaNode{a, nodes["b"], nodes["c"]} {
		path, h := stateFile(t, t.TempDir(), id, fmt.Sprintf("j%%2Fwin.%d.state", i))
		if err := w.rep.push(ctx, "a", replicaJobName, 1<<32+1, id, path, h); err != nil {
			t.Fatal(err)
		}
		f, _ := os.Open(path)
		err := master.Import(id, h.File, h.Size, h.Checksum, f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		if w != a {
			a.mu.Lock()
			a.rep.hold(replicaJobName, id, h.File, strings.Split(a.got[h.File], ","))
			a.mu.Unlock()
		}
		md.Operators[0].Subtasks[i] = h
	}
	dir, err := master.Commit(md)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.rep.publish(ctx, 1<<32+1, md); err != nil {
		t.Fatal(err)
	}
	return dir
}

// savepointIDs returns the ids of the savepoint directories in rn's
// store, ascending, and those of them that carry the stop mark.
func savepointIDs(t *testing.T, rn *replicaNode) (all, marked []snapshot.ID) {
	t.Helper()
	dir := filepath.Join(rn.store(t).Dir(), "savepoints")
	des, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, de := range des {
		id, ok := snapshot.SavepointDirID(de.Name())
		if !ok {
			continue
		}
		all = append(all, id)
		if _, err := os.Stat(filepath.Join(dir, de.Name(), stopSavepointMark)); err == nil {
			marked = append(marked, id)
		}
	}
	slices.Sort(all)
	slices.Sort(marked)
	return all, marked
}

// The savepoints a cluster takes on its own are marked and pruned on
// every node that keeps a copy: the master and its peers each keep the
// newest two of them and delete their own copies of the older ones. A
// savepoint a user asked for is kept everywhere; a peer whose copy of the
// new savepoint is damaged marks it but prunes nothing; a stale master's
// message is refused.
func TestClusterKeepsItsNewestStopSavepoints(t *testing.T) {
	nodes := replicaCluster(t)
	a, b, c := nodes["a"], nodes["b"], nodes["c"]
	ctx := context.Background()
	own := func(id snapshot.ID) {
		t.Helper()
		a.rep.ownSavepoint(ctx, replicaJobName, commitSavepoint(t, nodes, id))
	}
	own(1)
	commitSavepoint(t, nodes, 2) // asked for by a user: never marked
	own(3)
	own(4)
	for _, rn := range []*replicaNode{a, b, c} {
		all, marked := savepointIDs(t, rn)
		if !slices.Equal(all, []snapshot.ID{2, 3, 4}) || !slices.Equal(marked, []snapshot.ID{3, 4}) {
			t.Errorf("node %s keeps savepoints %v, marked %v; want [2 3 4], marked [3 4]", rn.id, all, marked)
		}
	}

	// c's copy of its own state file of savepoint 5 is damaged: c marks
	// 5 (the cluster's own) but keeps 3 until a copy that reads back.
	dir5 := commitSavepoint(t, nodes, 5)
	spc := filepath.Join(c.store(t).Dir(), "savepoints", filepath.Base(dir5))
	if err := os.WriteFile(filepath.Join(spc, "j%2Fwin.2.state"), []byte("damaged"), 0o644); err != nil {
		t.Fatal(err)
	}
	a.rep.ownSavepoint(ctx, replicaJobName, dir5)
	for _, rn := range []*replicaNode{a, b} {
		if all, _ := savepointIDs(t, rn); !slices.Equal(all, []snapshot.ID{2, 4, 5}) {
			t.Errorf("node %s keeps savepoints %v, want [2 4 5]", rn.id, all)
		}
	}
	if all, _ := savepointIDs(t, c); !slices.Equal(all, []snapshot.ID{2, 3, 4, 5}) {
		t.Errorf("node c, whose copy of 5 is damaged, keeps savepoints %v, want [2 3 4 5]", all)
	}
	// The next one prunes c too: the message names every savepoint the
	// master marked.
	own(6)
	for _, rn := range []*replicaNode{a, b, c} {
		all, marked := savepointIDs(t, rn)
		if !slices.Equal(all, []snapshot.ID{2, 5, 6}) || !slices.Equal(marked, []snapshot.ID{5, 6}) {
			t.Errorf("node %s keeps savepoints %v, marked %v; want [2 5 6], marked [5 6]", rn.id, all, marked)
		}
	}

	// A master of an older epoch than a node saw marks nothing there.
	commitSavepoint(t, nodes, 7)
	dir8 := commitSavepoint(t, nodes, 8)
	b.rep.epoch = func() uint64 { return 1 << 40 }
	a.rep.ownSavepoint(ctx, replicaJobName, dir8)
	if all, marked := savepointIDs(t, b); !slices.Equal(all, []snapshot.ID{2, 5, 6, 7, 8}) || !slices.Equal(marked, []snapshot.ID{5, 6}) {
		t.Errorf("node b after a stale master's message keeps savepoints %v, marked %v; want [2 5 6 7 8], marked [5 6]", all, marked)
	}
}

// A peer that takes the connection and never answers holds up neither
// the marking of a stop savepoint nor the publication or fetch of a
// snapshot's metadata: each call gives up after replicas.callTimeout, the
// other peers are served, and the fetch and publication say which peer
// failed.
func TestClusterPeerThatNeverAnswersDoesNotStallMetadataCalls(t *testing.T) {
	nodes := replicaCluster(t)
	a, b, c := nodes["a"], nodes["b"], nodes["c"]
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir1 := commitSavepoint(t, nodes, 1)
	b.mu.Lock()
	b.hang = true
	b.mu.Unlock()
	a.rep.callTimeout = 100 * time.Millisecond
	a.rep.ownSavepoint(ctx, replicaJobName, dir1)
	if ctx.Err() != nil {
		t.Fatal("ownSavepoint waited for the peer that never answers")
	}
	if _, marked := savepointIDs(t, c); !slices.Equal(marked, []snapshot.ID{1}) {
		t.Errorf("node c, beside the peer that never answers, marked %v, want [1]", marked)
	}
	if err := a.rep.fetchMetadata(ctx, "b", replicaJobName, 1); !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), `"b"`) {
		t.Errorf("fetch from the peer that never answers: %v, want its deadline naming b", err)
	}
	md, err := snapshot.Load(dir1)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.rep.publish(ctx, 1<<32+1, md); !errors.Is(err, cluster.ErrReplication) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("publish to the peer that never answers: %v, want a replication failure by its deadline", err)
	}
	if ctx.Err() != nil {
		t.Fatal("the calls waited for the peer that never answers")
	}
}

// The savepoints a redeployment takes (a drain's, a rebalance's) are the
// cluster's own: after three, every node keeps its copies of the newest
// two and has deleted the oldest, and the job's windows stay exact. The
// input's end is held until the third redeployment ran: a finished job
// takes no savepoint.
func TestClusterRedeploymentSavepointsPruned(t *testing.T) {
	fc := newFailoverCluster(t, foOptions{replicas: 2, holdEnd: true})
	a := fc.nodes["a"]
	_, epoch := fc.startedPlacement("a", 0)
	fc.waitCheckpoint("a", 0)
	var ids []snapshot.ID
	for range 3 {
		rec, err := a.c.redeploy(context.Background(), cluster.TriggerManual, "test")
		if err != nil {
			t.Fatalf("redeploy: %v (%+v)", err, rec)
		}
		_, epoch = fc.startedPlacement("a", epoch)
		s, err := a.c.rep.store(foJob)
		if err != nil {
			t.Fatal(err)
		}
		sp, err := s.LatestSavepoint()
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sp.Checkpoint)
	}
	for _, id := range fc.ids {
		s, err := fc.nodes[id].c.rep.store(foJob)
		if err != nil {
			t.Fatal(err)
		}
		dirs := savepointDirs(filepath.Join(s.Dir(), "savepoints"))
		got := slices.Sorted(maps.Keys(dirs))
		if !slices.Equal(got, ids[1:]) {
			t.Errorf("node %s keeps savepoints %v, want %v (the newest two of %v)", id, got, ids[1:], ids)
		}
		for sid, dir := range dirs {
			if _, err := os.Stat(filepath.Join(dir, stopSavepointMark)); err != nil {
				t.Errorf("node %s: savepoint %d not marked: %v", id, sid, err)
			}
		}
	}
	fc.finish("a")
	fc.checkTotals()
}
