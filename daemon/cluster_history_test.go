package daemon

import (
	"context"
	"fmt"
	"github.com/edgedio/edged/internal/testutil"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/edgedio/edged/keygroup"
	"github.com/edgedio/edged/snapshot"
)

// Script: a power loss of the whole cluster, b's device replaced during
// the outage (same node id, empty data dir), and only b and c come back.
// Every state file is on its writer and two peers (cluster.replicas 2),
// so c holds a copy of each.
// b, the lowest live node, took part in no deployment: on its own it
// never takes over, and c, which did, defers to it — the cluster would
// wait for a forever. Once b has adopted the cluster's history from c
// (the highest epoch c saw, the metadata of c's newest snapshot), the
// rule that holds for nodes that took part applies: neither takes over
// before a has stayed away for three detection times (on the fake clock),
// then b does, restores that snapshot with every state file copied in
// from c, deploys on b and c in an epoch above a's, numbers checkpoints
// above the snapshot's, and the committed window counts are exact.
func TestFailoverScriptPowerLossReplacedLowestNode(t *testing.T) {
	fc := newFailoverCluster(t, foOptions{replicas: 2})
	b, c := fc.nodes["b"], fc.nodes["c"]
	_, epoch0 := fc.startedPlacement("a", 0)
	fc.waitCheckpoint("a", 0)
	fc.kill("a")
	for _, fn := range []*foNode{b, c} {
		fn.c.worker.Evict()
	}
	latest := mustLatestOf(t, c)
	// b's device is replaced: its data dir and its store are empty. (A
	// copy of a's last checkpoint to b may still be landing in b's store:
	// removing a directory while a file is written into it fails with
	// "directory not empty", so the removal is tried until it succeeds.)
	testutil.Eventually(t, 0, "b's data dir removed", func() bool { return os.RemoveAll(b.dir) == nil })
	if _, err := snapshot.OpenStore(b.pc.Checkpoint.Dir, foJob, keygroup.DefaultMaxParallelism, nil); err != nil {
		t.Fatal(err)
	}
	b.c.seen.Store(0)
	for _, fn := range []*foNode{b, c} {
		seen, err := readEpoch(filepath.Join(fn.dir, "cluster", "epoch"))
		if err != nil {
			t.Fatal(err)
		}
		fn.c.lead.mu.Lock()
		fn.c.lead.id, fn.c.lead.followed, fn.c.lead.before = "a", false, seen > 0
		fn.c.lead.mu.Unlock()
	}
	alive := fc.declareDead("a")
	step := func() {
		c.c.live.maybeTakeOver(alive)
		b.c.live.maybeTakeOver(alive)
	}
	grace := restartGrace("")
	step()
	fc.clock.Advance(10 * grace)
	step()
	if b.c.isMaster() || c.c.isMaster() {
		t.Fatalf("a node took over, b having no history yet: b %v, c %v", b.c.isMaster(), c.c.isMaster())
	}
	if !fc.logs.logged("waiting for the leader to start", "node=b") {
		t.Fatal("b did not log that it waits for the leader")
	}

	ok, err := b.c.adoptHistory(context.Background())
	if err != nil || !ok {
		t.Fatalf("b adopting the cluster's history: %v, %v", ok, err)
	}
	if seen := b.c.seen.Load(); seen < c.c.seen.Load() {
		t.Fatalf("b adopted epoch %d, c saw %d", seen, c.c.seen.Load())
	}
	if got, err := readEpoch(filepath.Join(b.dir, "cluster", "epoch")); err != nil || got != b.c.seen.Load() {
		t.Fatalf("b's data dir keeps epoch %d (%v), want %d", got, err, b.c.seen.Load())
	}
	if got := b.c.latestCheckpoints()[foJob]; got != uint64(latest.Checkpoint) {
		t.Fatalf("b has the metadata of snapshot %d, want c's newest, %d", got, latest.Checkpoint)
	}
	step()
	fc.clock.Advance(grace - time.Millisecond)
	step()
	if b.c.isMaster() || c.c.isMaster() {
		t.Fatalf("a node took over before a stayed away for %v after b adopted the history: b %v, c %v", grace, b.c.isMaster(), c.c.isMaster())
	}
	fc.clock.Advance(time.Millisecond)
	step()
	if !b.c.isMaster() || c.c.isMaster() {
		t.Fatalf("a away for %v: b master %v, c master %v; want b", grace, b.c.isMaster(), c.c.isMaster())
	}
	after, epoch1 := fc.startedPlacement("b", epoch0)
	if n := onNode(after, "a"); len(n) > 0 {
		t.Fatalf("epoch %d places %v on the dead leader", epoch1, n)
	}
	if !fc.logs.logged("resuming from the latest snapshot", "node=b", fmt.Sprintf("checkpoint_id=%d", latest.Checkpoint)) {
		t.Fatalf("b did not resume the job from checkpoint %d (c's newest metadata)", latest.Checkpoint)
	}
	if next := b.c.nextCheckpoint(); next <= latest.Checkpoint {
		t.Fatalf("b numbers checkpoints from %d, not above the restored %d", next, latest.Checkpoint)
	}
	t.Logf("b adopted the history, took over after %v and resumed checkpoint %d in epoch %d (a's was %d)", grace, latest.Checkpoint, epoch1, epoch0)
	fc.finish("b")
	fc.checkTotals()
}

// Script: as TestFailoverScriptPowerLossReplacedLowestNode, but each
// state file is on its writer and one peer (cluster.replicas 1): some
// of b's files were only on a and on b's old disk. b adopts the history
// and takes over, but the snapshot cannot be completed from the live
// holders: its takeover fails, logged, and the job does not start from
// the beginning (which would commit its output again).
func TestFailoverScriptReplacedNodeNeverStartsFromTheBeginning(t *testing.T) {
	fc := newFailoverCluster(t, foOptions{replicas: 1})
	b, c := fc.nodes["b"], fc.nodes["c"]
	fc.startedPlacement("a", 0)
	fc.waitCheckpoint("a", 0)
	fc.kill("a")
	for _, fn := range []*foNode{b, c} {
		fn.c.worker.Evict()
	}
	// b's device is replaced: its data dir and its store are empty.
	if err := os.RemoveAll(b.dir); err != nil {
		t.Fatal(err)
	}
	if _, err := snapshot.OpenStore(b.pc.Checkpoint.Dir, foJob, keygroup.DefaultMaxParallelism, nil); err != nil {
		t.Fatal(err)
	}
	b.c.seen.Store(0)
	for _, fn := range []*foNode{b, c} {
		fn.c.lead.mu.Lock()
		fn.c.lead.id, fn.c.lead.followed, fn.c.lead.before = "a", false, fn == c
		fn.c.lead.mu.Unlock()
	}
	if ok, err := b.c.adoptHistory(context.Background()); err != nil || !ok {
		t.Fatalf("b adopting the cluster's history: %v, %v", ok, err)
	}
	alive := fc.declareDead("a")
	b.c.live.maybeTakeOver(alive)
	fc.clock.Advance(restartGrace(""))
	b.c.live.maybeTakeOver(alive)
	failed := func() int {
		return fc.logs.count("cluster: takeover failed", "node=b", "would commit its output again")
	}
	testutil.Eventually(t, time.Minute, "b's takeover to fail on the snapshot it cannot complete", func() bool { return failed() == 1 })
	// It is tried again after resume_backoff (a holder may come back),
	// and fails the same way.
	blockUntil(t, fc.clock, 1)
	fc.clock.Advance(b.c.hb.cfg.ResumeBackoff)
	testutil.Eventually(t, time.Minute, "b's retried takeover to fail", func() bool { return failed() == 2 })
	b.c.stopTakeover()
	b.c.live.wg.Wait()
	if fc.logs.logged("job started", "node=b") {
		t.Fatal("b started the job without its snapshot")
	}
}

// Script: a cluster's first start. The leader, a, took part in no
// deployment before its own, and adopts as the cluster's history the
// epoch its first deployment gave its peers (so it counts as a node that
// took part from then on). That is no warning that it may take over from
// a leader that stays away: it leads. It is logged at INFO as the
// leader's own history; a worker that adopts the history still warns.
func TestFailoverScriptLeaderAdoptsItsOwnFirstDeploymentQuietly(t *testing.T) {
	fc := newFailoverCluster(t, foOptions{replicas: 2})
	a := fc.nodes["a"]
	fc.startedPlacement("a", 0)
	fc.waitCheckpoint("a", 0)
	a.c.lead.mu.Lock()
	a.c.lead.before = false
	a.c.lead.mu.Unlock()
	ok, err := a.c.adoptHistory(context.Background())
	if err != nil || !ok {
		t.Fatalf("a adopting its first deployment's epoch: %v, %v", ok, err)
	}
	if fc.logs.logged("may take over from a leader that stays away", "node=a") {
		t.Fatal("the leader warned that it may take over from a leader that stays away")
	}
	if !fc.logs.logged("this node leads and took part in no deployment before", "node=a") {
		t.Fatal("the leader did not log the epoch it keeps")
	}
	fc.finish("a")
	fc.checkTotals()
}
