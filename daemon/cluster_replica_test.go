package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/edgedio/edged/cluster"
	"github.com/edgedio/edged/pipeline"
	"github.com/edgedio/edged/snapshot"
)

// replicaNode is one node of a replica test: its replicas on an httptest
// server, and what its master's push route received.
type replicaNode struct {
	id   string
	dir  string
	rep  *replicas
	srv  *httptest.Server
	mu   sync.Mutex
	got  map[string]string // file pushed to the master route -> holders header
	fail bool              // the replica route fails every PUT
	// hang, when set, holds every request to a metadata or mark route
	// unanswered until the caller gives up.
	hang bool
	// down, when set, fails every request (a node shutting down); downs
	// counts those failed.
	down  bool
	downs int
}

// refused reports whether rn refused a request since it went down.
func (rn *replicaNode) refused() bool {
	rn.mu.Lock()
	defer rn.mu.Unlock()
	return rn.downs > 0
}

const replicaJobName = "j"

// replicaCluster starts nodes a, b and c (or the nodes ids) with replicas
// in temporary directories (checkpoint.retain 2, cluster.replicas 2),
// every one alive.
func replicaCluster(t testing.TB, ids ...string) map[string]*replicaNode {
	t.Helper()
	if len(ids) == 0 {
		ids = []string{"a", "b", "c"}
	}
	nodes := map[string]*replicaNode{}
	for _, id := range ids {
		rn := &replicaNode{id: id, dir: filepath.Join(t.TempDir(), id), got: map[string]string{}}
		release := make(chan struct{})
		mux := http.NewServeMux()
		rn.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			rn.mu.Lock()
			fail, down := rn.fail, rn.down
			if down {
				rn.downs++
			}
			rn.mu.Unlock()
			if down {
				http.Error(w, "shutting down", http.StatusServiceUnavailable)
				return
			}
			if fail && r.Method == http.MethodPut && strings.Contains(r.URL.Path, "/replicas/") {
				http.Error(w, "disk full", http.StatusInternalServerError)
				return
			}
			rn.mu.Lock()
			hang := rn.hang
			rn.mu.Unlock()
			if hang && (strings.HasSuffix(r.URL.Path, "/metadata") || strings.HasSuffix(r.URL.Path, "/own")) {
				// Read to the end: only then does the server notice
				// the caller hang up.
				io.Copy(io.Discard, r.Body)
				select {
				case <-r.Context().Done():
				case <-release:
				}
				return
			}
			mux.ServeHTTP(w, r)
		}))
		t.Cleanup(rn.srv.Close)
		t.Cleanup(func() { close(release) }) // before Close
		// The job master's route for pushed files: the test records who
		// holds each.
		mux.HandleFunc("PUT /cluster/jobs/{job}/epochs/{epoch}/checkpoints/{id}/files/{name}", func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			rn.mu.Lock()
			rn.got[r.PathValue("name")] = r.Header.Get(holdersHeader)
			rn.mu.Unlock()
			writeJSON(w, http.StatusOK, nil)
		})
		nodes[id] = rn
		defer func() { rn.rep.mount(mux) }()
	}
	for _, id := range ids {
		rn := nodes[id]
		cfg := &pipeline.ClusterConfig{Node: id, Listen: "127.0.0.1:1"}
		for _, p := range ids {
			if p != id {
				cfg.Peers = append(cfg.Peers, pipeline.PeerConfig{ID: p, Address: "127.0.0.1:1", API: strings.TrimPrefix(nodes[p].srv.URL, "http://")})
			}
		}
		pc := pipeline.DefaultPipelineConfig()
		pc.Name = replicaJobName
		pc.Checkpoint.Dir = rn.dir
		pc.Checkpoint.Retain = 2
		peers := &peerClient{cfg: cfg, http: rn.srv.Client()}
		rn.rep = newReplicas(cfg, []pipeline.PipelineConfig{pc}, peers, cfg.Nodes, func() uint64 { return 1<<32 + 7 }, slog.New(slog.DiscardHandler))
		peers.rep = rn.rep
	}
	return nodes
}

// stateFile writes a state file of checkpoint id in dir and returns its
// handle.
func stateFile(t *testing.T, dir string, id snapshot.ID, name string) (string, snapshot.Handle) {
	t.Helper()
	path := filepath.Join(dir, fmt.Sprintf("stage-%d", id), name)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, bytes.Repeat([]byte(name+fmt.Sprint(id)), 100), 0o644); err != nil {
		t.Fatal(err)
	}
	size, sum, err := snapshot.Checksum(path)
	if err != nil {
		t.Fatal(err)
	}
	return path, snapshot.Handle{File: name, Size: size, Checksum: sum}
}

func (rn *replicaNode) store(t testing.TB) *snapshot.Store {
	t.Helper()
	s, err := rn.rep.store(replicaJobName)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// holds reports whether node rn holds an intact copy of h of checkpoint
// id.
func (rn *replicaNode) holds(t testing.TB, id snapshot.ID, h snapshot.Handle) bool {
	_, err := rn.rep.localFile(rn.store(t), id, h)
	return err == nil
}

// A state file a worker writes is on its replica targets and in its own
// store once Push returns, before it reaches the job master (whose push
// carries the holders): the acknowledgement that follows counts only for
// replicated files. A target that cannot store its copy fails the push,
// and the master never gets the file.
func TestReplicasPushCopiesBeforeTheAck(t *testing.T) {
	nodes := replicaCluster(t)
	b := nodes["b"]
	ctx := context.Background()
	// b's targets are both other nodes (cluster.replicas 2 of 2 peers);
	// a, the master, gets its copy through the push route.
	if got := b.rep.targets("b"); !slices.Equal(got, []string{"a", "c"}) {
		t.Fatalf("targets of b: %v", got)
	}
	path, h := stateFile(t, t.TempDir(), 3, "j%2Fwin.1.state")
	if err := b.rep.push(ctx, "a", replicaJobName, 1<<32+1, 3, path, h); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"b", "c"} {
		if !nodes[id].holds(t, 3, h) {
			t.Errorf("node %s holds no copy of %s after the push", id, h.File)
		}
	}
	a := nodes["a"]
	a.mu.Lock()
	holders := a.got[h.File]
	a.mu.Unlock()
	if holders != "a,b,c" {
		t.Errorf("the master got holders %q, want a,b,c", holders)
	}

	// c refuses its copy: the push fails, naming it, before the master
	// hears of the file.
	c := nodes["c"]
	c.mu.Lock()
	c.fail = true
	c.mu.Unlock()
	path2, h2 := stateFile(t, t.TempDir(), 4, "j%2Fwin.2.state")
	err := b.rep.push(ctx, "a", replicaJobName, 1<<32+1, 4, path2, h2)
	if !errors.Is(err, cluster.ErrReplication) || !strings.Contains(err.Error(), `"c"`) {
		t.Fatalf("push with a failing target: %v, want ErrReplication naming c", err)
	}
	a.mu.Lock()
	_, reached := a.got[h2.File]
	a.mu.Unlock()
	if reached {
		t.Errorf("the master got %s after its replication failed", h2.File)
	}
}

// A replica peer that stops answering while it leaves the cluster (a
// drained node stopping; it left the membership just before) does not
// fail the checkpoint: its copy goes to the next peer of the ranking, the
// job master learns the holders that have it, and the metadata and the
// committed mark need no copy on it. Before, the copy's failure declined
// the checkpoint and the job restarted. A peer that fails and is still a
// member fails the push, as before (TestReplicasPushCopiesBeforeTheAck).
func TestReplicasPeerThatLeftDuringTheCopyIsReplaced(t *testing.T) {
	nodes := replicaCluster(t, "a", "b", "c", "d")
	a, b := nodes["a"], nodes["b"]
	ctx := context.Background()
	// a is the job master; gone is the target of b (other than a) that
	// shuts down, spare the peer that is no target of b's yet.
	var gone, spare *replicaNode
	targets := b.rep.targets("b")
	for _, id := range []string{"a", "c", "d"} {
		switch {
		case id != "a" && gone == nil && slices.Contains(targets, id):
			gone = nodes[id]
		case !slices.Contains(targets, id):
			spare = nodes[id]
		}
	}
	if gone == nil || spare == nil {
		t.Fatalf("targets of b %v: want a target other than a and a peer that is none", targets)
	}
	gone.mu.Lock()
	gone.down = true
	gone.mu.Unlock()
	// The membership drops the node once it left; the failing call is
	// asked about after that, as in a drained node's stop.
	alive := func() []string {
		if gone.refused() {
			return slices.DeleteFunc([]string{"a", "b", "c", "d"}, func(id string) bool { return id == gone.id })
		}
		return []string{"a", "b", "c", "d"}
	}
	for _, rn := range nodes {
		rn.rep.alive = alive
	}
	path, h := stateFile(t, t.TempDir(), 5, "j%2Fwin.1.state")
	if err := b.rep.push(ctx, "a", replicaJobName, 1<<32+1, 5, path, h); err != nil {
		t.Fatalf("push while %s left: %v", gone.id, err)
	}
	if !gone.refused() {
		t.Fatalf("%s was never asked for its copy: the test missed the path it names", gone.id)
	}
	if !spare.holds(t, 5, h) {
		t.Errorf("%s, the next peer of the ranking, holds no copy", spare.id)
	}
	want := []string{"a", "b", spare.id}
	slices.Sort(want)
	a.mu.Lock()
	holders := a.got[h.File]
	a.mu.Unlock()
	if holders != strings.Join(want, ",") {
		t.Errorf("the master got holders %q, want %q", holders, strings.Join(want, ","))
	}

	// The metadata and the committed mark: the node that went down
	// while they were sent needs neither.
	master := a.store(t)
	if _, err := master.Begin(snapshot.Trigger{Checkpoint: 5}); err != nil {
		t.Fatal(err)
	}
	f, _ := os.Open(path)
	err := master.Import(5, h.File, h.Size, h.Checksum, f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	a.rep.hold(replicaJobName, 5, h.File, want)
	md := &snapshot.Metadata{Checkpoint: 5, Kind: snapshot.KindCheckpoint,
		Operators: []snapshot.Operator{{UID: "j/win", Parallelism: 1, Subtasks: []snapshot.Handle{h}}}}
	if _, err := master.Commit(md); err != nil {
		t.Fatal(err)
	}
	// Every node is alive again to the publisher, until the one going
	// down refuses.
	gone.mu.Lock()
	gone.downs = 0
	gone.mu.Unlock()
	if err := a.rep.publish(ctx, 1<<32+1, md); err != nil {
		t.Fatalf("publish while %s left: %v", gone.id, err)
	}
	if !gone.refused() {
		t.Fatalf("%s was never sent the metadata", gone.id)
	}
	gone.mu.Lock()
	gone.downs = 0
	gone.mu.Unlock()
	if err := a.rep.markCommitted(ctx, 1<<32+1, replicaJobName, 5); err != nil {
		t.Fatalf("committed mark while %s left: %v", gone.id, err)
	}
	if !gone.refused() {
		t.Fatalf("%s was never sent the committed mark", gone.id)
	}
}

// The job master's own files go to its targets; the metadata of a
// completed checkpoint is then on every live node, naming the holders of
// each file, and each node's store keeps the checkpoints the master's
// retention keeps. A node can complete any retained checkpoint from the
// holders and restore it from its own disk.
//
// The nodes saw epoch 7 of term 1 (another job's), and every publication
// is of this job's epoch 1 of that term.
func TestReplicasMetadataOnEveryNode(t *testing.T) {
	nodes := replicaCluster(t)
	a, b, c := nodes["a"], nodes["b"], nodes["c"]
	ctx := context.Background()
	master := a.store(t)
	var mds []*snapshot.Metadata
	for id := snapshot.ID(1); id <= 3; id++ {
		if _, err := master.Begin(snapshot.Trigger{Checkpoint: id}); err != nil {
			t.Fatal(err)
		}
		md := &snapshot.Metadata{Checkpoint: id, Kind: snapshot.KindCheckpoint,
			Operators: []snapshot.Operator{{UID: "j/win", Parallelism: 3, Subtasks: make([]snapshot.Handle, 3)}}}
		for i, w := range []*replicaNode{a, b, c} {
			path, h := stateFile(t, t.TempDir(), id, fmt.Sprintf("j%%2Fwin.%d.state", i))
			if err := w.rep.push(ctx, "a", replicaJobName, 1<<32+1, id, path, h); err != nil {
				t.Fatal(err)
			}
			// The master's tasks write into its store; its push route is
			// faked: it stores what a worker pushed, as ReceiveFile does.
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
		if _, err := master.Commit(md); err != nil {
			t.Fatal(err)
		}
		if err := a.rep.publish(ctx, 1<<32+1, md); err != nil {
			t.Fatal(err)
		}
		mds = append(mds, md)
	}
	for _, rn := range []*replicaNode{b, c} {
		got, err := rn.store(t).Completed()
		if err != nil {
			t.Fatal(err)
		}
		var ids []snapshot.ID
		for _, md := range got {
			ids = append(ids, md.Checkpoint)
		}
		if !slices.Equal(ids, []snapshot.ID{3, 2}) {
			t.Errorf("node %s has the metadata of checkpoints %v, want [3 2] (retain 2)", rn.id, ids)
		}
		if _, err := os.Stat(rn.store(t).CheckpointDir(1)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("node %s still keeps checkpoint 1: %v", rn.id, err)
		}
	}
	st := b.rep.status()
	if len(st) != 2 || st[0].Checkpoint != 3 || len(st[0].Files) != 3 {
		t.Fatalf("status of b: %+v", st)
	}
	for _, f := range st[0].Files {
		// Every file on its writer, the master and one more: a's on b and
		// c; b's and c's on all three.
		if !slices.Equal(f.Nodes, []string{"a", "b", "c"}) {
			t.Errorf("file %s held by %v, want [a b c]", f.File, f.Nodes)
		}
	}
	// Node c restores checkpoint 3 from its own disk once complete.
	latest, err := c.store(t).Completed()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.rep.complete(ctx, latest[0]); err != nil {
		t.Fatal(err)
	}
	md, err := c.store(t).Latest()
	if err != nil || md.Checkpoint != 3 {
		t.Fatalf("latest on c: %v, %v", md, err)
	}
	// A master of an older term than the node saw is refused.
	if err := a.rep.publish(ctx, 9, mds[2]); !errors.Is(err, cluster.ErrReplication) || !strings.Contains(err.Error(), ErrStaleMaster.Error()) {
		t.Errorf("publish of a stale master: %v", err)
	}
	// Epochs count each job's attempts: the nodes saw epoch 7 of the
	// master's term (another job's, restarted more often), and this
	// job's epoch 1 of that term is taken, as is its stop savepoint's
	// committed mark.
	if err := a.rep.markCommitted(ctx, 1<<32+1, replicaJobName, 3); err != nil {
		t.Errorf("committed mark of another job's older epoch of the same term: %v", err)
	}
}

// A copy of a state file damaged on a holder's disk is detected there (its
// size or CRC32C) and never served; the reader counts it, logs it and
// reads the next holder's copy. Bytes damaged in transit are caught by the
// reader's own check.
func TestReplicasCorruptCopyAnotherHolderUsed(t *testing.T) {
	nodes := replicaCluster(t)
	a, b, c := nodes["a"], nodes["b"], nodes["c"]
	ctx := context.Background()
	// b's file of checkpoint 5 is on b, a and c; c's copy is truncated
	// and a's has a bit flipped.
	path, h := stateFile(t, t.TempDir(), 5, "j%2Fwin.1.state")
	for _, rn := range []*replicaNode{a, b, c} {
		f, _ := os.Open(path)
		err := rn.store(t).ImportReplica(5, h.File, h.Size, h.Checksum, f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	damaged := filepath.Join(a.store(t).CheckpointDir(5), h.File)
	raw, _ := os.ReadFile(damaged)
	raw[10] ^= 0xff
	if err := os.WriteFile(damaged, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	// c's own copy is truncated.
	if err := os.WriteFile(filepath.Join(c.store(t).CheckpointDir(5), h.File), raw[:len(raw)-1], 0o644); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), h.File)
	from, err := c.rep.fetchFirst(ctx, replicaJobName, 5, h, dst, c.rep.sources(replicaJobName, 5, h, true, nil))
	if err != nil || from != "b" {
		t.Fatalf("fetch: from %q, %v; want b's copy", from, err)
	}
	if size, sum, err := snapshot.Checksum(dst); err != nil || size != h.Size || sum != h.Checksum {
		t.Fatalf("fetched copy: %d bytes, crc %08x, %v", size, sum, err)
	}
	// c's own copy is found damaged on c; a's damaged copy is detected
	// on a's side and refused, which c counts too.
	if got := c.rep.bad.Load(); got != 2 {
		t.Errorf("c counted %d unusable copies, want 2", got)
	}
	if got := a.rep.bad.Load(); got != 1 {
		t.Errorf("a counted %d damaged copies, want 1", got)
	}

	// Bytes damaged on the way: the reader's own check refuses them.
	flipped := append([]byte(nil), raw...)
	bad := fetchSource{node: "x", open: func(context.Context) (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(flipped)), nil }}
	good := fetchSource{node: "b", open: func(context.Context) (io.ReadCloser, error) { return os.Open(path) }}
	dst2 := filepath.Join(t.TempDir(), h.File)
	if from, err := c.rep.fetchFirst(ctx, replicaJobName, 5, h, dst2, []fetchSource{bad, good}); err != nil || from != "b" {
		t.Fatalf("fetch after bytes damaged in transit: from %q, %v", from, err)
	}
	// No holder intact: the error says so.
	if _, err := c.rep.fetchFirst(ctx, replicaJobName, 5, h, dst2, []fetchSource{bad}); !errors.Is(err, cluster.ErrNoReplica) {
		t.Fatalf("fetch with no intact copy: %v", err)
	}
}

// The node whose copy a restore read each state file from is kept per
// job: a job that copies in the files of its own snapshot meanwhile (two
// jobs restore at once after a failover or a takeover) leaves another
// job's record as it was.
func TestReplicasReadFromKeptPerJob(t *testing.T) {
	c := replicaCluster(t)["c"]
	ctx := context.Background()
	path, h := stateFile(t, t.TempDir(), 5, "j%2Fwin.1.state")
	src := func(node string) []fetchSource {
		return []fetchSource{{node: node, open: func(context.Context) (io.ReadCloser, error) { return os.Open(path) }}}
	}
	if _, err := c.rep.fetchFirst(ctx, "sensors", 5, h, filepath.Join(t.TempDir(), h.File), src("a")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.rep.fetchFirst(ctx, "alerts", 9, h, filepath.Join(t.TempDir(), h.File), src("b")); err != nil {
		t.Fatal(err)
	}
	if from := c.rep.readFromNode("sensors", 5, h.File); from != "a" {
		t.Errorf("sensors' file of snapshot 5 read from %q, want a", from)
	}
	if from := c.rep.readFromNode("alerts", 9, h.File); from != "b" {
		t.Errorf("alerts' file of snapshot 9 read from %q, want b", from)
	}
	if from := c.rep.readFromNode("alerts", 5, h.File); from != "" {
		t.Errorf("alerts' file of snapshot 5 read from %q, want none", from)
	}
}

// A copy this node cannot write (here its directory is a file; on a
// device, a full or read-only card) is the node's fault, not its
// holder's: the intact holders are not blamed, counted or tried one
// after the other, and the error names the node's own path. Before, each
// holder was logged as serving an unusable copy and counted in
// replica_errors_total, and the error said no holder had an intact one.
func TestReplicasFetchThisNodeCannotStore(t *testing.T) {
	c := replicaCluster(t)["c"]
	ctx := context.Background()
	path, h := stateFile(t, t.TempDir(), 5, "j%2Fwin.1.state")
	var opened []string
	src := func(node string) fetchSource {
		return fetchSource{node: node, open: func(context.Context) (io.ReadCloser, error) {
			opened = append(opened, node)
			return os.Open(path)
		}}
	}
	notDir := filepath.Join(t.TempDir(), "data")
	if err := os.WriteFile(notDir, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(notDir, "staging", h.File)
	before := c.rep.bad.Load()
	_, err := c.rep.fetchFirst(ctx, replicaJobName, 5, h, dst, []fetchSource{src("a"), src("b")})
	if err == nil {
		t.Fatal("a copy into a directory that is a file succeeded")
	}
	if errors.Is(err, cluster.ErrNoReplica) || !strings.Contains(err.Error(), "this node cannot store a copy at "+dst) {
		t.Errorf("error %q: want this node's path named, not a missing replica", err)
	}
	if len(opened) != 1 {
		t.Errorf("holders tried: %v, want a alone", opened)
	}
	if bad := c.rep.bad.Load() - before; bad != 0 {
		t.Errorf("%d copies counted unusable, want none: the holders' copies are intact", bad)
	}
	// A writable path: the first holder serves it.
	if from, err := c.rep.fetchFirst(ctx, replicaJobName, 5, h, filepath.Join(t.TempDir(), h.File), []fetchSource{src("a"), src("b")}); err != nil || from != "a" {
		t.Fatalf("fetch: from %q, %v", from, err)
	}
}
