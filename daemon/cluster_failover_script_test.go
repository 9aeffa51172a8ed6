package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/cluster"
	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/snapshot"
)

// startedPlacement waits until the job master on node id runs a
// deployment above epoch and returns its placement and epoch.
func (fc *foCluster) startedPlacement(id string, above uint64) (map[actors.TaskKey]string, uint64) {
	fc.t.Helper()
	var p map[actors.TaskKey]string
	var epoch uint64
	testutil.Eventually(fc.t, time.Minute, "a deployment above the old epoch runs", func() bool {
		j := fc.job(id)
		if j == nil {
			return false
		}
		r, _ := j.run.Execution().Runner()
		if r == nil {
			return false
		}
		select {
		case <-r.Started():
		default:
			return false
		}
		p, epoch = placement(r)
		return epoch > above
	})
	return p, epoch
}

// onNode returns the subtasks p places on node.
func onNode(p map[actors.TaskKey]string, node string) []actors.TaskKey {
	var out []actors.TaskKey
	for k, n := range p {
		if n == node {
			out = append(out, k)
		}
	}
	slices.SortFunc(out, func(x, y actors.TaskKey) int {
		if x.UID != y.UID {
			if x.UID < y.UID {
				return -1
			}
			return 1
		}
		return x.Subtask - y.Subtask
	})
	return out
}

// Script: a worker dies. a leads; the job runs on a, b and c. After a
// checkpoint completes, c is killed. The leader, seeing it dead, places
// c's subtasks on a and b in a new epoch; they restore from the latest
// checkpoint: b reads c's state from its own replica when it holds one
// (cluster.replicas 2: every peer does), and fetches it from a peer that
// holds one when it does not (cluster.replicas 1: c's copy went to a);
// the sources rewind and the committed window counts are exact.
func TestFailoverScriptWorkerKilled(t *testing.T) {
	for _, tc := range []struct {
		name     string
		replicas int
		// from is where b reads c's state; held whether b holds a
		// replica of it.
		from string
		held bool
	}{
		{name: "own replica", replicas: 2, from: "b", held: true},
		{name: "fetched from a peer", replicas: 1, from: "a", held: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testWorkerKilled(t, tc.replicas, tc.from, tc.held)
		})
	}
}

func testWorkerKilled(t *testing.T, replicas int, wantFrom string, held bool) {
	fc := newFailoverCluster(t, foOptions{replicas: replicas})
	a, b := fc.nodes["a"], fc.nodes["b"]
	before, epoch0 := fc.startedPlacement("a", 0)
	onC := onNode(before, "c")
	if len(onC) == 0 {
		t.Fatalf("nothing placed on c: %v", before)
	}
	cp := fc.waitCheckpoint("a", 0)
	t.Logf("epoch %d, c runs %v; checkpoint %d completed", epoch0, onC, cp)

	fc.kill("c")
	// The job fails and retries on its own; then the membership declares
	// c dead and its loop runs its step on the leader.
	a.c.live.follow(fc.declareDead("c"), a.c.executions)

	after, epoch1 := fc.startedPlacement("a", epoch0)
	if n := onNode(after, "c"); len(n) > 0 {
		t.Fatalf("epoch %d still places %v on the dead node", epoch1, n)
	}
	var toB []actors.TaskKey
	for _, k := range onC {
		if after[k] == "b" {
			toB = append(toB, k)
		}
	}
	t.Logf("epoch %d: c's subtasks on b: %v", epoch1, toB)
	restores := fc.job("a").run.Restores()
	if len(restores) == 0 || restores[len(restores)-1] < cp {
		t.Fatalf("restored %v, want the latest checkpoint (at least %d)", restores, cp)
	}
	restored := restores[len(restores)-1]
	files := stateFiles(a.metadata(t, restored), toB)
	if len(files) == 0 {
		t.Fatalf("none of c's subtasks moved to b (%v) has state in snapshot %d: the restore path was not reached", toB, restored)
	}
	for f, h := range files {
		from := b.c.rep.readFromNode(foJob, restored, f)
		if from != wantFrom || b.holds(t, restored, h) != held {
			t.Fatalf("b restored c's %s of snapshot %d from %q, holding a replica %v; want from %q, holding %v",
				f, restored, from, b.holds(t, restored, h), wantFrom, held)
		}
	}
	t.Logf("b restored %d of c's state files of snapshot %d from %q", len(files), restored, wantFrom)
	fc.finish("a")
	fc.checkTotals()
	if fos := fc.failovers("a", 1); len(fos) != 1 || fos[0].DeadNode != "c" || fos[0].Epoch < epoch1 {
		t.Fatalf("failovers recorded %+v", fos)
	}
}

// maxTriggered returns the highest checkpoint id the job master of j
// triggered, completed or not.
func maxTriggered(j *job) snapshot.ID {
	var id snapshot.ID
	for _, s := range j.run.History() {
		id = max(id, s.Checkpoint)
	}
	for _, s := range j.snapshot().History {
		id = max(id, s.Checkpoint)
	}
	return id
}

// Script: the leader dies. a leads; the job runs on a, b and c, each
// state file copied to one peer (cluster.replicas 1). After a checkpoint
// completes, a is killed with its job master. b, the lowest survivor and
// a follower of a, takes over: it recovers the coordinator from the
// snapshot metadata a published to it, copying in the state files it
// holds no replica of from c, restores the job in an epoch above a's,
// numbers checkpoints above every id a triggered, and places a's
// subtasks on b and c; the committed window counts are exact.
func TestFailoverScriptLeaderKilled(t *testing.T) {
	fc := newFailoverCluster(t, foOptions{replicas: 1})
	b, c := fc.nodes["b"], fc.nodes["c"]
	_, epoch0 := fc.startedPlacement("a", 0)
	cp := fc.waitCheckpoint("a", 0)
	if md := b.metadata(t, cp); md == nil {
		t.Fatalf("b lacks the metadata of checkpoint %d", cp)
	}
	fc.kill("a")
	triggered := maxTriggered(fc.job("a"))
	latest := mustLatestOf(t, b)
	t.Logf("a died in epoch %d having triggered checkpoints up to %d; b's newest metadata: checkpoint %d", epoch0, triggered, latest.Checkpoint)
	var lacked []string
	for _, h := range snapshot.Missing(latest) {
		lacked = append(lacked, h.File)
	}
	if len(lacked) == 0 {
		t.Fatalf("b holds every file of checkpoint %d: the fetch from a peer is not reached", latest.Checkpoint)
	}

	// The membership loop's step on the survivors once a is declared
	// dead: b takes over, c does not.
	alive := fc.declareDead("a")
	c.c.live.maybeTakeOver(alive)
	b.c.live.maybeTakeOver(alive)
	if c.c.isMaster() || !b.c.isMaster() {
		t.Fatalf("after a died: b master %v, c master %v", b.c.isMaster(), c.c.isMaster())
	}
	after, epoch1 := fc.startedPlacement("b", epoch0)
	if n := onNode(after, "a"); len(n) > 0 {
		t.Fatalf("epoch %d places %v on the dead leader", epoch1, n)
	}
	j := fc.job("b")
	if !fc.logs.logged("resuming from the latest snapshot", "node=b", fmt.Sprintf("checkpoint_id=%d", latest.Checkpoint)) {
		t.Fatalf("b did not resume the job from checkpoint %d (its newest metadata)", latest.Checkpoint)
	}
	for _, f := range lacked {
		if from := b.c.rep.readFromNode(foJob, latest.Checkpoint, f); from != "c" {
			t.Fatalf("b copied in %s of checkpoint %d from %q, want c (the one live holder)", f, latest.Checkpoint, from)
		}
	}
	t.Logf("b recovered checkpoint %d, copying %d files in from c; epoch %d", latest.Checkpoint, len(lacked), epoch1)
	fc.finish("b")
	fc.checkTotals()
	// No checkpoint id of a is used again.
	var ids []snapshot.ID
	for _, s := range j.snapshot().History {
		ids = append(ids, s.Checkpoint)
		if s.Checkpoint <= triggered {
			t.Fatalf("b took checkpoint %d: a triggered up to %d", s.Checkpoint, triggered)
		}
	}
	if len(ids) == 0 {
		t.Fatal("b took no checkpoint: the ids were not checked")
	}
	t.Logf("b's checkpoints %v, all above %d", ids, triggered)
	if fos := fc.failovers("b", 1); len(fos) != 1 || fos[0].DeadNode != "a" {
		t.Fatalf("failovers recorded on b: %+v", fos)
	}
}

// mustLatestOf returns the newest snapshot metadata in node fn's store.
func mustLatestOf(t *testing.T, fn *foNode) *snapshot.Metadata {
	t.Helper()
	s, err := fn.c.rep.store(foJob)
	if err != nil {
		t.Fatal(err)
	}
	mds, err := s.Completed()
	if err != nil || len(mds) == 0 {
		t.Fatalf("completed: %v, %v", mds, err)
	}
	return mds[0]
}

// Script: a corrupt replica. As when a worker dies with every peer
// holding a copy of each state file, but every copy b stores of c's
// state files is damaged right after it was stored (same size, other
// bytes: only the checksum tells). Once c died, b, restoring c's
// subtasks, finds its copies damaged by their checksum, counts and logs
// each, and copies the file from another holder (a) instead; the
// committed window counts are exact.
func TestFailoverScriptCorruptReplica(t *testing.T) {
	// c runs subtask 2 of every operator.
	fc := newFailoverCluster(t, foOptions{replicas: 2, damage: func(file string) bool { return strings.HasSuffix(file, ".2.state") }})
	a, b := fc.nodes["a"], fc.nodes["b"]
	before, epoch0 := fc.startedPlacement("a", 0)
	onC := onNode(before, "c")
	for _, k := range onC {
		if k.Subtask != 2 {
			t.Fatalf("c runs %v: not subtask 2 of every operator", onC)
		}
	}
	fc.waitCheckpoint("a", 0)
	if b.damaged.Load() == 0 {
		t.Fatal("b stored no copy of c's state files: nothing damaged")
	}
	badBefore := b.c.rep.bad.Load()
	fc.kill("c")
	a.c.live.follow(fc.declareDead("c"), a.c.executions)

	after, epoch1 := fc.startedPlacement("a", epoch0)
	var toB []actors.TaskKey
	for _, k := range onC {
		if after[k] == "b" {
			toB = append(toB, k)
		}
	}
	restores := fc.job("a").run.Restores()
	if len(restores) == 0 || restores[len(restores)-1] == 0 {
		t.Fatalf("restored %v, want a checkpoint", restores)
	}
	restored := restores[len(restores)-1]
	files := stateFiles(a.metadata(t, restored), toB)
	if len(files) == 0 {
		t.Fatalf("none of c's subtasks moved to b (%v) has state: the damaged copies were never read", toB)
	}
	for f, h := range files {
		if b.holds(t, restored, h) {
			t.Fatalf("b's copy of %s of checkpoint %d is intact: the damage was not done", f, restored)
		}
		if from := b.c.rep.readFromNode(foJob, restored, f); from != "a" {
			t.Fatalf("b restored c's %s of checkpoint %d from %q, want a (its own copy is damaged)", f, restored, from)
		}
		if !fc.logs.logged("damaged copy of a state file", "node=b", "file="+f, fmt.Sprintf("checkpoint_id=%d", restored)) {
			t.Fatalf("b did not log its copy of %s of checkpoint %d as damaged", f, restored)
		}
	}
	if bad := b.c.rep.bad.Load() - badBefore; bad < int64(len(files)) {
		t.Fatalf("%d damaged copies counted on b, want at least %d", bad, len(files))
	}
	t.Logf("epoch %d: b found its %d copies of c's files of checkpoint %d damaged and copied them from a", epoch1, len(files), restored)
	fc.finish("a")
	fc.checkTotals()
}

// Script: the job restarts before the leader's step. As when a worker
// dies, but the job, failing on c's loss, restarts on its own once the
// membership declared c dead and before the membership loop's step on
// the leader (liveView.follow) ran: the deployment that follows no longer
// names c, so the step finds no deployed node dead. The failover is
// recorded all the same, once, with its durations: in GET /cluster (what
// `edged cluster status` prints) and in the Prometheus metrics; the
// committed window counts are exact.
func TestFailoverScriptRestartedBeforeFollow(t *testing.T) {
	fc := newFailoverCluster(t, foOptions{replicas: 2})
	a := fc.nodes["a"]
	epoch0 := fc.checkpointedWith("c")
	fc.kill("c")
	alive := fc.declareDead("c")

	// The job restarts on its own on a and b.
	after, epoch1 := fc.startedPlacement("a", epoch0)
	if n := onNode(after, "c"); len(n) > 0 {
		t.Fatalf("epoch %d still places %v on the dead node", epoch1, n)
	}
	v := a.c.live
	v.mu.Lock()
	deployed := slices.Clone(v.deployed)
	v.mu.Unlock()
	if len(deployed) == 0 || slices.Contains(deployed, "c") {
		t.Fatalf("latest deployment %v: the leader's step would see c dead itself; the path is not reached", deployed)
	}
	// Now the membership loop's step runs on the leader.
	v.follow(alive, a.c.executions)

	fos := fc.failovers("a", 1)
	if len(fos) != 1 || fos[0].DeadNode != "c" || fos[0].Epoch < epoch1 {
		t.Fatalf("failovers recorded %+v, want one from c in epoch %d or later", fos, epoch1)
	}
	var f cluster.Failover
	testutil.Eventually(t, time.Minute, "the failover's first record is recorded", func() bool {
		f = a.c.Status().Failovers[0]
		return f.FirstRecordMS > 0
	})
	if f.DetectionMS <= 0 || f.PlacementMS <= 0 || f.RestoreMS <= 0 {
		t.Fatalf("failover %+v: a duration is missing", f)
	}
	t.Logf("failover from c recorded in epoch %d: detection %.1f ms, placement %.2f ms, restore %.1f ms, first record %.1f ms",
		f.Epoch, f.DetectionMS, f.PlacementMS, f.RestoreMS, f.FirstRecordMS)

	api, _ := clusterAPI(t, a.c)
	s, err := api.Cluster(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if s.FailoversTotal != 1 || len(s.Failovers) != 1 || !sameFailover(s.Failovers[0], f) {
		t.Fatalf("GET /cluster: %d failovers %+v, want 1: %+v", s.FailoversTotal, s.Failovers, f)
	}
	code, body := get(t, api, "/metrics")
	if code != http.StatusOK {
		t.Fatalf("GET /metrics: %d", code)
	}
	if !strings.Contains(body, "edged_cluster_failovers_total 1\n") {
		t.Fatalf("metrics:\n%s", grepLines(body, "failover"))
	}
	for _, phase := range []string{"detection", "placement", "restore", "first_record", "total"} {
		if !strings.Contains(body, fmt.Sprintf("edged_cluster_last_failover_seconds{phase=%q} ", phase)) ||
			strings.Contains(body, fmt.Sprintf("edged_cluster_last_failover_seconds{phase=%q} 0\n", phase)) {
			t.Fatalf("metrics lack a non-zero %s phase:\n%s", phase, grepLines(body, "failover"))
		}
	}
	fc.finish("a")
	fc.checkTotals()
	if n := len(fc.failovers("a", 1)); n != 1 {
		t.Fatalf("%d failovers recorded, want 1", n)
	}
}

// sameFailover reports whether x and y record the same failover (At
// compared as an instant, as JSON keeps it).
func sameFailover(x, y cluster.Failover) bool {
	if !x.At.Equal(y.At) {
		return false
	}
	x.At, y.At = time.Time{}, time.Time{}
	return x == y
}

// Script: the leader cut off. a leads; the job runs on a, b and c. A
// partition cuts a off from b and c: a's probes of them fail, none of
// the three is declared dead yet (each side's confirmation is still
// running). The membership loop's step on a ends its job's attempt at
// once, and a's tries to deploy it again (every
// cluster.leadership.deploy_retry) deploy nothing while a reaches no
// majority: a stops before the majority could confirm its death and
// take over, so the two sides never both run the job's key groups.
// Those tries do not use up the restart strategy: the cut lasts more
// tries than its budget (3) and the job does not end. Healed, the job
// restarts on its own from its latest checkpoint in a newer epoch; the
// committed window counts are exact.
func TestFailoverScriptLeaderCutOff(t *testing.T) {
	// About 6 s of input: under the race detector on one CPU, 3 s ran
	// out before the cut and the job finished before its restart was seen.
	const budget = 3
	fc := newFailoverCluster(t, foOptions{replicas: 2, count: 12000, attempts: budget})
	a := fc.nodes["a"]
	_, epoch0 := fc.startedPlacement("a", 0)
	fc.waitCheckpoint("a", 0)
	j := fc.job("a")
	e := j.run.Execution()
	ended := func() bool {
		select {
		case <-j.run.Done():
			return true
		default:
			return false
		}
	}

	fc.cutOff("a")
	a.c.live.step(a.c.executions)
	testutil.Eventually(t, 10*time.Second, "a's job runs no attempt", func() bool {
		if ended() {
			t.Fatal("the job ended while a reaches no majority: it ran on")
		}
		r, _ := e.Runner()
		return r == nil
	})
	// a tries again every 100 ms: each try is refused while a reaches
	// no majority, more of them than the restart budget.
	cutTries := e.NotPlaced()
	refusals := func() int { return e.NotPlaced() - cutTries }
	testutil.Eventually(t, 30*time.Second, "a refused more deployments than its restart budget, reaching no majority", func() bool {
		if r, _ := e.Runner(); r != nil || ended() {
			t.Fatalf("a's job runs (%v) or ended (%v) while a reaches no majority", r != nil, ended())
		}
		return refusals() >= 2*budget
	})
	if !fc.logs.logged("this node sees no majority; its jobs stopped", "node=a") {
		t.Fatal("a did not log that it stopped its jobs")
	}
	if !fc.logs.logged("job not deployed; trying again until the cluster places it", "reaches 1 of 3 nodes", "node=a") {
		t.Fatal("a did not log why its job is not deployed")
	}
	t.Logf("cut off, a stopped its job and refused %d deployments", refusals())

	fc.cutOff("")
	_, epoch1 := fc.startedPlacement("a", epoch0)
	t.Logf("healed: the job runs again in epoch %d (was %d)", epoch1, epoch0)
	fc.finish("a")
	fc.checkTotals()
}

// Script: the leader cut off silently, with its sends to the other
// side stuck. a leads; the job runs on a, b and c, its channels with one
// credit each. A partition drops every frame between a and the others,
// without a disconnection (a switch that lost a's cable): a's job master
// sends a command after the cut, so its control channels to b and c
// hold a frame that is never acknowledged and the next send to them
// waits for credit (up to the control timeout, 10 s, when the attempt
// ends). The membership
// loop's step on a (no majority) must stop a's own tasks at once: no
// local task of the attempt may still take input while the master waits
// on the nodes it cannot reach. Healed, the job runs again in a newer
// epoch; the committed window counts are exact.
func TestFailoverScriptLeaderCutOffStopsLocalTasksAtOnce(t *testing.T) {
	fc := newFailoverCluster(t, foOptions{replicas: 2, count: 12000, credits: 1, maxConcurrent: 50})
	a := fc.nodes["a"]
	_, epoch0 := fc.startedPlacement("a", 0)
	fc.waitCheckpoint("a", 0)
	j := fc.job("a")
	e := j.run.Execution()
	r0, _ := e.Runner()
	if len(r0.Metrics()) == 0 {
		t.Fatal("a runs no task of the job before the cut")
	}

	fc.cutSilently("a")
	fc.cutOff("a")
	// A command sent after the cut (a checkpoint's trigger, say) is
	// lost, and with one credit the control channels to b and c are
	// full: the job master's loop waits to send the next one. That
	// command may come more than 10 s after the cut on a loaded machine
	// (the job's checkpoints slow down): this wait has the default bound.
	testutil.Eventually(t, 0, "a's job master waits to send a command to b and c", func() bool {
		return testutil.Waiting("actors.(*Runner).commandAll")
	})
	stopped := time.Now()
	a.c.live.step(a.c.executions)
	// Well under the control timeout (10 s) that the master's sends to
	// b and c wait for.
	testutil.Eventually(t, 3*time.Second, "a's own tasks of the attempt stop", func() bool {
		return len(r0.Metrics()) == 0
	})
	took := time.Since(stopped)
	// The path this test names: the master still waits on b and c. It
	// gets there once its attempt has unwound, which on a loaded machine
	// takes longer than the local stop; its wait there lasts up to the
	// control timeout (10 s), so this wait has the default bound.
	testutil.Eventually(t, 0, "the job master waits on the nodes it cannot reach", func() bool {
		return testutil.Waiting("actors.(*Runner).cancelHosts")
	})
	if r, _ := e.Runner(); r != r0 {
		t.Fatalf("the attempt ended before its master gave up on b and c (runner %p, was %p): the cut did not hold its sends", r, r0)
	}
	t.Logf("cut off silently, a stopped its own tasks %v after it saw no majority, while its master waited on b and c", took.Round(time.Millisecond))

	fc.cutSilently("")
	fc.cutOff("")
	_, epoch1 := fc.startedPlacement("a", epoch0)
	t.Logf("healed: the job runs again in epoch %d (was %d)", epoch1, epoch0)
	fc.finish("a")
	fc.checkTotals()
}

// Script: the leader cut off, then healed. a leads; the job runs on a, b
// and c. A partition cuts a off, and each side confirms the other's
// death: a stops its job (it reaches no majority) and b, the lowest node
// of the majority, takes over in a newer epoch and completes a
// checkpoint. Then the partition heals: a and b both lead, and a holds
// the metadata of b's checkpoints (replicated to every node), so their
// newest snapshots tie. The split rule (run on both at once) keeps b,
// whose epoch is newer, leading; a, whose epochs every node refuses,
// cancels its job and follows b: its stale retries end and none of its
// attempts runs again. The job keeps making progress on b; then b hands
// the leadership back to a, which restarts the job from b's savepoint
// in an epoch above every epoch any node saw. Checkpoint ids are never
// reused; the committed window counts are exact.
func TestFailoverScriptLeaderCutOffHealed(t *testing.T) {
	// About 12 s of input, records still flowing at the partition and
	// the heal; its end is held until finish, so that the job outlives
	// the hand-back however slowly the machine runs it.
	fc := newFailoverCluster(t, foOptions{replicas: 2, count: 24000, holdEnd: true})
	a, b, c := fc.nodes["a"], fc.nodes["b"], fc.nodes["c"]
	_, epoch0 := fc.startedPlacement("a", 0)
	fc.waitCheckpoint("a", 0)
	ja := fc.job("a")
	ea := ja.run.Execution()

	fc.partition("a")
	a.c.live.step(a.c.executions)
	testutil.Eventually(t, 10*time.Second, "a's job runs no attempt", func() bool {
		r, _ := ea.Runner()
		return r == nil
	})
	// The majority's step: b takes over, c follows it.
	c.c.live.step(c.c.executions)
	b.c.live.step(b.c.executions)
	if !b.c.isMaster() || c.c.isMaster() || !a.c.isMaster() {
		t.Fatalf("during the partition: a master %v, b master %v, c master %v; want a and b", a.c.isMaster(), b.c.isMaster(), c.c.isMaster())
	}
	_, epoch1 := fc.startedPlacement("b", epoch0)
	cpB := fc.waitCheckpoint("b", 0)
	triggeredA := maxTriggered(ja)
	if cpB <= triggeredA {
		t.Fatalf("b completed checkpoint %d, not above a's %d: a checkpoint id reused", cpB, triggeredA)
	}
	refusals := fc.logs.count("reaches 1 of 3 nodes", "node=a")
	if refusals == 0 {
		t.Fatal("a refused no deployment while cut off: its retries were not reached")
	}
	t.Logf("partitioned: a stopped in epoch %d, b took over in epoch %d and completed checkpoint %d; a refused %d deployments", epoch0, epoch1, cpB, refusals)

	fc.heal("a")
	// a catches up with b's metadata (every checkpoint b completes now
	// goes to a too) before the two leaders run the split rule.
	cpHealed := fc.waitCheckpoint("b", cpB)
	testutil.Eventually(t, 30*time.Second, "a holds the metadata of b's newest checkpoints", func() bool {
		return a.c.latestCheckpoints()[foJob] >= uint64(cpHealed)
	})
	// Both leaders run the split rule at once, at most every split_poll,
	// until one yields.
	testutil.Eventually(t, 30*time.Second, "one of a and b yields", func() bool {
		for _, fn := range []*foNode{a, b} {
			fn.c.live.maybeYield(fc.aliveNow())
		}
		for _, fn := range []*foNode{a, b} {
			h := fn.c.hb
			testutil.Eventually(t, 30*time.Second, "the split rule's poll ends on "+fn.id, func() bool {
				h.mu.Lock()
				defer h.mu.Unlock()
				return !h.polling
			})
		}
		return !a.c.isMaster() || !b.c.isMaster()
	})
	if a.c.isMaster() || !b.c.isMaster() || c.c.isMaster() || a.c.leader() != "b" {
		t.Fatalf("after the heal: a master %v (follows %q), b master %v, c master %v; want b alone", a.c.isMaster(), a.c.leader(), b.c.isMaster(), c.c.isMaster())
	}
	select {
	case <-ja.run.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("a's stale job did not end after a yielded")
	}
	if r, _ := ea.Runner(); r != nil {
		t.Fatalf("a's stale job runs an attempt in epoch %d", r.Epoch())
	}
	// The job keeps making progress on b after the heal.
	jb := fc.job("b")
	progressed := fc.waitCheckpoint("b", cpHealed)
	t.Logf("healed: a yielded to b (epoch %d), whose job completed checkpoint %d", epoch1, progressed)

	// b hands the leadership back to a, the lowest id, queued now (as
	// maybeHandBack queues it: only checkpoints triggered before hold it).
	queued := time.Now()
	testutil.Eventually(t, time.Minute, "b hands the leadership back to a", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		err := b.c.handBack(ctx, "a", queued)
		if err != nil && !errors.Is(err, errHandbackNotReady) {
			t.Fatalf("hand-back: %v", err)
		}
		return err == nil
	})
	var seen uint64
	for _, fn := range fc.nodes {
		seen = max(seen, fn.c.seen.Load())
	}
	_, epoch2 := fc.startedPlacement("a", max(epoch1, seen))
	if !a.c.isMaster() || b.c.isMaster() || c.c.isMaster() {
		t.Fatalf("after the hand-back: a master %v, b master %v, c master %v; want a alone", a.c.isMaster(), b.c.isMaster(), c.c.isMaster())
	}
	triggeredB := maxTriggered(jb)
	ja2 := fc.job("a")
	after := fc.waitCheckpoint("a", triggeredB)
	t.Logf("handed back: a leads in epoch %d (b's %d, a's before the cut %d), checkpoint %d completed", epoch2, epoch1, epoch0, after)
	fc.finish("a")
	fc.checkTotals()
	for _, s := range jb.snapshot().History {
		if s.Checkpoint <= triggeredA {
			t.Fatalf("b took checkpoint %d: a triggered up to %d", s.Checkpoint, triggeredA)
		}
	}
	for _, s := range ja2.snapshot().History {
		if s.Checkpoint <= triggeredB {
			t.Fatalf("a took checkpoint %d after the hand-back: b triggered up to %d", s.Checkpoint, triggeredB)
		}
	}
}

// Script: a worker dies and each node's file sink writes to a dir of its
// own, as on separate machines. The sink subtask that ran on c restores
// on a survivor, whose dir does not hold c's pre-committed part: it
// commits the part there from the checkpoint. The union of the dirs,
// each part name once, holds every window count exactly; a part c had
// committed too is in both dirs with the same content. Before, the
// survivor failed the restore (neither pending nor committed) on every
// attempt and the job never ran again without c.
//
// A sink writes no part for a checkpoint interval it wrote nothing in,
// so the checkpoint restored must hold a part of c's: with checkpoints a
// second apart, each interval after the first windows fired holds tens
// of them (a 10 s window of event time closes every 0.1 s).
func TestFailoverScriptWorkerKilledNodeLocalFileSinks(t *testing.T) {
	fc := newFailoverCluster(t, foOptions{replicas: 1, localSinks: true, interval: time.Second})
	a := fc.nodes["a"]
	epoch0 := fc.checkpointedWith("c")
	fc.kill("c")
	a.c.live.follow(fc.declareDead("c"), a.c.executions)
	after, _ := fc.startedPlacement("a", epoch0)
	if n := onNode(after, "c"); len(n) > 0 {
		t.Fatalf("still placed on the dead node: %v", n)
	}
	fc.finish("a")
	fc.checkTotals()

	// The restore path was reached: a part c wrote (committed or pending
	// in c's dir) is committed in a survivor's dir.
	written := map[string]bool{}
	entries, err := os.ReadDir(filepath.Join(fc.out, "c", "windows"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		name := strings.TrimSuffix(strings.TrimPrefix(e.Name(), "."), ".pending")
		written[name] = true
	}
	carried := 0
	for _, id := range []string{"a", "b"} {
		parts, err := operators.CommittedParts(filepath.Join(fc.out, id, "windows"))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range parts {
			if written[filepath.Base(p)] {
				carried++
			}
		}
	}
	if carried == 0 {
		t.Fatal("no part c pre-committed was committed on a survivor: the carried restore was not reached")
	}
	t.Logf("%d of c's parts committed on a survivor from the checkpoint", carried)
}

// checkpointedWith waits until the job runs its first deployment, with
// subtasks on node, and completed a checkpoint; it returns the epoch.
func (fc *foCluster) checkpointedWith(node string) uint64 {
	fc.t.Helper()
	before, epoch := fc.startedPlacement("a", 0)
	if len(onNode(before, node)) == 0 {
		fc.t.Fatalf("nothing placed on %s: %v", node, before)
	}
	fc.waitCheckpoint("a", 0)
	return epoch
}

// Script: a power loss of the whole cluster, and only b and c come back.
// a leads; the job runs on a, b and c, each state file copied to one
// peer (cluster.replicas 1). After a checkpoint completes, a dies with
// its job master, and b and c are left in the state their restart would
// leave them in: their tasks gone, no leader followed in this run, and
// whether they took part in a deployment read from their data dirs, as
// a start reads it. They see each other, a majority, and not a: neither
// takes over before a has stayed away for three detection times (on the
// fake clock); then b, the lowest, does: it recovers the job from the
// snapshot metadata a had published to it, copying in the state files
// it holds no copy of from c, and deploys on b and c in an epoch above
// a's; the committed window counts are exact.
func TestFailoverScriptPowerLossMajorityRestarts(t *testing.T) {
	fc := newFailoverCluster(t, foOptions{replicas: 1})
	b, c := fc.nodes["b"], fc.nodes["c"]
	_, epoch0 := fc.startedPlacement("a", 0)
	fc.waitCheckpoint("a", 0)
	fc.kill("a")
	for _, fn := range []*foNode{b, c} {
		fn.c.worker.Evict()
		seen, err := readEpoch(filepath.Join(fn.dir, "cluster", "epoch"))
		if err != nil || seen == 0 {
			t.Fatalf("node %s: highest epoch seen on disk %d (%v): it took part in a deployment", fn.id, seen, err)
		}
		fn.c.lead.mu.Lock()
		fn.c.lead.id, fn.c.lead.followed, fn.c.lead.before = "a", false, seen > 0
		fn.c.lead.mu.Unlock()
	}
	latest := mustLatestOf(t, b)
	alive := fc.declareDead("a")
	step := func() {
		c.c.live.maybeTakeOver(alive)
		b.c.live.maybeTakeOver(alive)
	}
	grace := restartGrace("")
	step()
	fc.clock.Advance(grace - time.Millisecond)
	step()
	if b.c.isMaster() || c.c.isMaster() {
		t.Fatalf("a node took over before a stayed away for %v: b %v, c %v", grace, b.c.isMaster(), c.c.isMaster())
	}
	if !fc.logs.logged("the leader is not up; the cluster ran before", "node=b", "leader=a") {
		t.Fatal("b did not log that it waits for the leader")
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
		t.Fatalf("b did not resume the job from checkpoint %d (its newest metadata)", latest.Checkpoint)
	}
	t.Logf("b took over after %v and resumed checkpoint %d in epoch %d (a's was %d)", grace, latest.Checkpoint, epoch1, epoch0)
	fc.finish("b")
	fc.checkTotals()
}
