package daemon

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/cluster"
	"github.com/edgedio/edged/internal/fsutil"
	"github.com/edgedio/edged/pipeline"
	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/stream"
)

// clusterNode is the node's part in a cluster (the config's cluster
// block): its transport and network, and either the job masters (on the
// node with the lowest id) or a worker hosting the tasks the masters
// place on it.
type clusterNode struct {
	// pauseIngest, when set, pauses (true) or resumes the node's embedded
	// broker's readings: a node out of the membership reads none.
	pauseIngest func(paused bool)
	// hostsFn, when set (tests), replaces inDeployment: whether a drained
	// node may host subtasks of a job.
	hostsFn func(node string) bool

	cfg *pipeline.ClusterConfig
	log *slog.Logger
	// api is the address this node's REST API listens on (its own
	// member's api in GET /cluster).
	api    string
	net    *cluster.Network
	tr     *cluster.RemoteTransport
	peers  *peerClient
	master bool
	// worker hosts the node's tasks; nil on the master's node.
	worker *actors.Worker
	// fingerprint identifies the node's pipelines (gossiped in its
	// membership metadata).
	fingerprint string
	// nodesDigest identifies the node ids its config names and the
	// channel settings every node must share (gossiped in its membership
	// metadata; see liveView.differs).
	nodesDigest string
	// epochBase makes the epochs of this start of the master newer than
	// those of any earlier start.
	epochBase uint64
	// live follows the membership; nil without cluster.gossip.
	live *liveView
	// placedMu guards placed: by job, the members' runs at its latest
	// placement (cluster_splithome.go).
	placedMu sync.Mutex
	placed   map[string]placedRuns
	// rep keeps the node's copies of the jobs' snapshots.
	rep *replicas
	// lead is what the node knows of the leader; takeover makes the node
	// the job masters' node (set with cluster.gossip).
	lead     leaderState
	takeover func(dead string) error
	// hb hands the leadership back to a lower node (set with
	// cluster.gossip); handing is set while a hand-back stops the jobs
	// and steps down; redeployMu keeps hand-backs and rebalances apart.
	hb         *handback
	handing    atomic.Bool
	redeployMu sync.Mutex
	// startMu serialises a takeover's start of the jobs with shutdown.
	startMu sync.Mutex
	// dataDir is the node's data directory; its cluster/ subdirectory
	// keeps the start counter and the highest epoch seen.
	dataDir string
	// seen is the highest deployment epoch the node saw (persisted).
	seen    atomic.Uint64
	epochMu sync.Mutex // serialises sawEpoch

	mu    sync.Mutex // guards execs and invited
	execs []*actors.Execution
	// invited is, by job, the highest epoch this node's job master
	// invited a node into: a job started again in the same term numbers
	// its epochs above it (jobEpochBase).
	invited map[string]uint64

	// rb queues and runs rebalances (cluster_drain.go); its loop runs on
	// the master's node only.
	rb      *rebalancer
	homesMu sync.Mutex // guards homes
	homes   map[string]jobHome
	// tally counts every rebalance recorded, for the metrics.
	tally rebalanceTally
}

// executions returns the job masters' executions of the node.
func (c *clusterNode) executions() []*actors.Execution {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.execs)
}

// addExecution records a job master's execution.
func (c *clusterNode) addExecution(e *actors.Execution) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.execs = append(c.execs, e)
}

// startCluster starts the node's transport and network.
func startCluster(cfg *pipeline.ClusterConfig, dataDir, token string, log *slog.Logger) (*clusterNode, error) {
	host, port, err := net.SplitHostPort(cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("cluster.listen: %w", err)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return nil, fmt.Errorf("cluster.listen: port %q: %w", port, err)
	}
	log = log.With("node", cfg.Node)
	c := &clusterNode{cfg: cfg, log: log, master: cfg.Master() == cfg.Node, dataDir: dataDir}
	seen, err := readEpoch(filepath.Join(dataDir, "cluster", "epoch"))
	if err != nil {
		return nil, err
	}
	c.seen.Store(seen)
	gate, err := cluster.NewRebalanceGate(cluster.DefaultGateConfig())
	if err != nil {
		return nil, err
	}
	c.live = &liveView{c: c, stop: make(chan struct{}), gate: gate, joining: map[string]bool{}}
	c.rb = c.newRebalancer()
	// A rebalance never runs beside a hand-back, nor on a node that
	// handed the leadership over meanwhile.
	run := c.rb.exec
	c.rb.exec = func(ctx context.Context, s cluster.Start) error {
		c.redeployMu.Lock()
		defer c.redeployMu.Unlock()
		if !c.isMaster() {
			return fmt.Errorf("%w: node %q no longer runs the job masters; ask node %q", cluster.ErrRefused, c.cfg.Node, c.leader())
		}
		return run(ctx, s)
	}
	c.peers = &peerClient{cfg: cfg, token: token, http: &http.Client{}}
	cc := cfg.ChannelConfig()
	c.net = cluster.NewNetwork(cfg.Node, cc, log)
	rc := cluster.DefaultRemoteConfig()
	rc.Host, rc.Port, rc.Logger, rc.MaxFrameBytes = host, p, log, cc.MaxFrameBytes
	c.tr = cluster.NewRemoteTransport(rc, c.net.Endpoint())
	if err := c.tr.Start(); err != nil {
		return nil, fmt.Errorf("cluster: transport on %s: %w", cfg.Listen, err)
	}
	c.net.Attach(c.tr)
	for _, peer := range cfg.Peers {
		c.net.SetPeer(peer.ID, peer.Address)
	}
	c.net.SetPeer(cfg.Node, c.tr.Addr())
	c.net.Start(100 * time.Millisecond)
	// The loop runs on every node: only a master (at start, or after a
	// takeover) queues rebalances.
	c.rb.start()
	log.Info("cluster transport listening", "addr", c.tr.Addr(), "nodes", cfg.Nodes())
	return c, nil
}

// stop leaves the membership and stops the worker, the network and the
// transport.
func (c *clusterNode) stop() {
	c.rb.close()
	if c.live != nil {
		c.live.stopGossip()
	}
	if c.worker != nil {
		c.worker.Close()
	}
	c.net.Stop()
	c.tr.Stop(context.Background(), true)
}

// nextEpochBase reads and advances the master's start counter in dir: the
// epochs of the n-th start begin at n<<32, above every attempt of the
// starts before; n is also above the start of seen, the highest epoch the
// node saw deployed by any master, so that a node that becomes master
// deploys epochs newer than every other master's. Of the cluster's nodes
// (ids in order, self among them), each takes only the terms equal to
// its rank modulo their number: two nodes that take over at once from
// the same epochs seen (their views of the membership differ for a
// moment) start in different terms, and the workers that saw the newer
// one refuse the older one's deployments, instead of hosting both
// masters' deployments of one term.
func nextEpochBase(dir string, seen uint64, nodes []string, self string) (uint64, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, fmt.Errorf("cluster: %w", err)
	}
	path := filepath.Join(dir, "starts")
	var n uint64
	switch b, err := os.ReadFile(path); {
	case err == nil:
		if n, err = strconv.ParseUint(strings.TrimSpace(string(b)), 10, 32); err != nil {
			return 0, fmt.Errorf("cluster: %s: %w", path, err)
		}
	case !errors.Is(err, os.ErrNotExist):
		return 0, fmt.Errorf("cluster: %w", err)
	}
	n = max(n, seen>>32) + 1
	if rank := slices.Index(nodes, self); rank >= 0 {
		n += uint64((rank - int(n%uint64(len(nodes))) + len(nodes)) % len(nodes))
	}
	if n >= 1<<32 {
		return 0, fmt.Errorf("cluster: %s: start counter %d exhausted", path, n)
	}
	if err := writeCounter(path, n); err != nil {
		return 0, err
	}
	return n << 32, nil
}

// writeCounter writes n to path durably: temporary file, fsync, rename,
// fsync of the directory.
func writeCounter(path string, n uint64) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	if err := fsutil.WriteFile(path, []byte(strconv.FormatUint(n, 10)+"\n")); err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	return nil
}

// readEpoch reads the highest epoch seen from path; 0 when there is none.
func readEpoch(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("cluster: %w", err)
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("cluster: %s: %w", path, err)
	}
	return n, nil
}

// sawEpoch records a deployment epoch the node took part in: the highest
// is kept, durably, so that the node refuses what an older master sends
// and, as master, deploys newer epochs.
func (c *clusterNode) sawEpoch(e uint64) {
	if err := c.raiseEpoch(e); err != nil {
		c.log.Warn("cluster: record the highest epoch seen", "epoch", e, "err", err)
	}
}

// raiseEpoch keeps e if it is the highest epoch the node has seen, and
// writes it to data_dir/cluster/epoch: the node deploys and accepts only
// newer epochs from then on. An error means it is not durable (it is
// kept in memory all the same).
func (c *clusterNode) raiseEpoch(e uint64) error {
	c.epochMu.Lock()
	defer c.epochMu.Unlock()
	if e <= c.seen.Load() {
		return nil
	}
	c.seen.Store(e)
	return writeCounter(filepath.Join(c.dataDir, "cluster", "epoch"), e)
}

// invite asks node to host its tasks of deployment d, which this node,
// the job master's, deploys: the node records d's epoch as one it
// deployed (sawEpoch), so that the highest epoch it reports, keeps and
// compares with other masters' stays at least that after the job stops.
// Every deployment of a cluster invites a node (a majority has more than
// the master's).
func (c *clusterNode) invite(ctx context.Context, node string, d actors.Deployment) error {
	c.sawEpoch(d.Epoch)
	c.mu.Lock()
	if c.invited == nil {
		c.invited = map[string]uint64{}
	}
	c.invited[d.Job] = max(c.invited[d.Job], d.Epoch)
	c.mu.Unlock()
	d.Boots = c.placedBoots(d.Job) // the members' runs at the job's placement
	return c.peers.invite(ctx, node, d)
}

// describePeer names the addresses this node's config gives peer id, for
// an error about a node that does not answer: a wrong one there is a
// common cause.
func (c *clusterNode) describePeer(id string) string {
	p, ok := c.cfg.Peer(id)
	if !ok {
		return ""
	}
	return fmt.Sprintf("this node's cluster.peers give it transport address %s, api %s", p.Address, p.API)
}

// jobEpochBase returns the epoch base of a job started now: the term's
// (epochBase), or, for a job started again in the same term (a takeover
// retried after this job failed to start or ended), the highest epoch an
// earlier start of it invited a node into, so that the new start's
// epochs are newer than every one the workers saw of the job.
func (c *clusterNode) jobEpochBase(job string) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.invited[job]; e>>32 == c.epochBase>>32 && e > c.epochBase {
		return e
	}
	return c.epochBase
}

// jobCluster returns the placement of a job built in env on the cluster's
// nodes: subtask i of every operator on node i modulo the number of nodes
// (in id order), unless the config pins it; the MQTT source has one
// subtask per node, so each reads its own node's log.
func (c *clusterNode) jobCluster(env *stream.Environment) (*actors.Cluster, error) {
	job, err := env.Graph()
	if err != nil {
		return nil, err
	}
	ids := c.cfg.Nodes()
	ac := &actors.Cluster{Placement: map[actors.TaskKey]string{}, Invite: c.invite, EpochBase: c.jobEpochBase(job.Name),
		Files: c.peers, Publish: c.rep.publish, Committed: c.rep.markCommitted, NextCheckpoint: c.nextCheckpoint(),
		RetryInterval: c.cfg.LeadershipConfig().DeployRetry, Describe: c.describePeer}
	for _, id := range masterFirst(ids, c.cfg.Node) {
		n := actors.Node{ID: id}
		if id == c.cfg.Node {
			n.Network = c.net
		}
		ac.Nodes = append(ac.Nodes, n)
	}
	for _, v := range job.Vertices {
		for i := range v.Parallelism {
			ac.Placement[actors.TaskKey{UID: v.UID, Subtask: i}] = ids[i%len(ids)]
		}
	}
	// The chains of the job's graph (env.Plan would validate the cluster
	// being made here).
	plan, err := actors.BuildPlan(job)
	if err != nil {
		return nil, err
	}
	if err := pinPlacement(job.Name, plan, ac.Placement, c.cfg.Placement); err != nil {
		return nil, err
	}
	c.setHome(job, ac.Placement)
	if v := c.live; v != nil {
		pinned := splitsPinnedAway(job, ids, ac.Placement)
		home := &actors.Cluster{Nodes: ac.Nodes, Placement: ac.Placement}
		ac.Update = func() ([]actors.Node, map[actors.TaskKey]string, error) {
			// The runs seen before the placement: a node that joins
			// meanwhile is placed at home or counts as back.
			boots := v.liveBoots()
			nodes, placement, err := v.update(home)
			if err == nil {
				c.recordPlaced(job.Name, 0, withPinnedAway(boots, pinned), true)
			}
			return nodes, placement, err
		}
	}
	return ac, nil
}

// mount adds the cluster's routes to the API: deployments (on a worker),
// state files pushed and fetched (on the master).
func (c *clusterNode) mount(mux *http.ServeMux, n *node) {
	mux.HandleFunc("POST /cluster/deployments", c.handleDeploy)
	mux.HandleFunc("POST /cluster/leave", c.handleLeave)
	mux.HandleFunc("PUT /cluster/jobs/{job}/epochs/{epoch}/checkpoints/{id}/files/{name}", func(w http.ResponseWriter, r *http.Request) {
		c.handlePush(w, r, n)
	})
	mux.HandleFunc("GET /cluster/jobs/{job}/epochs/{epoch}/restore/{name}", func(w http.ResponseWriter, r *http.Request) {
		c.handleFetch(w, r, n)
	})
	mux.HandleFunc("POST /cluster/handback", c.handleHandback)
	c.rep.mount(mux)
	mux.HandleFunc("GET /cluster/worker", func(w http.ResponseWriter, r *http.Request) {
		var jobs []actors.WorkerJob
		if c.worker != nil {
			jobs = c.worker.Jobs()
		}
		writeJSON(w, http.StatusOK, workerReply{Node: c.cfg.Node, Master: c.leader(), Followed: c.following(), Epoch: c.highestEpoch(),
			Checkpoints: c.latestCheckpoints(), Jobs: jobs, DeadLetters: n.deadCounts.report()})
	})
}

func (c *clusterNode) handleDeploy(w http.ResponseWriter, r *http.Request) {
	if c.worker == nil || c.isMaster() {
		clusterError(w, http.StatusConflict, fmt.Errorf("%w: node %q runs the job masters and takes no deployments", ErrStaleMaster, c.cfg.Node))
		return
	}
	var d actors.Deployment
	var bodies *peerBodies
	if c.rep != nil {
		bodies = c.rep.bodies
	}
	if status, err := bodies.decode(r, 64<<20, &d); err != nil {
		clusterError(w, status, fmt.Errorf("deployment: %w", err))
		return
	}
	// A master of an older term than one the node saw (one cut off by
	// a partition, whose term a newer leader superseded meanwhile) runs
	// nothing here, hosted or not. A deployment of the same term older
	// than one of its job hosted here is the worker's to refuse.
	if seen := c.seen.Load(); staleTerm(d.Epoch, seen) {
		clusterError(w, http.StatusConflict, fmt.Errorf("%w: deployment of job %q in epoch %d by %q, the node saw epoch %d",
			ErrStaleMaster, d.Job, d.Epoch, d.Master, seen))
		return
	}
	c.sawEpoch(d.Epoch)
	c.recordPlaced(d.Job, d.Epoch, d.Boots, false)
	if err := c.worker.Deploy(r.Context(), d); err != nil {
		status := http.StatusInternalServerError
		switch {
		case errors.Is(err, actors.ErrStaleDeployment) || errors.Is(err, actors.ErrPlanMismatch):
			status = http.StatusConflict
		case errors.Is(err, actors.ErrEvicted):
			// The node lost the majority or is shutting down meanwhile.
			status = http.StatusServiceUnavailable
		}
		clusterError(w, status, err)
		return
	}
	c.followed(d.Master)
	writeJSON(w, http.StatusOK, map[string]any{"job": d.Job, "epoch": d.Epoch, "node": c.cfg.Node})
}

// clusterJob returns the execution of the job a cluster request names
// (waiting for a job being started: its workers fetch from it at once),
// or the status to answer and why.
func (n *node) clusterJob(r *http.Request) (*actors.Execution, uint64, int, error) {
	epoch, err := strconv.ParseUint(r.PathValue("epoch"), 10, 64)
	if err != nil {
		return nil, 0, http.StatusBadRequest, fmt.Errorf("epoch %q: %w", r.PathValue("epoch"), err)
	}
	j, err := n.job(r.Context(), r.PathValue("job"))
	if err != nil {
		return nil, 0, statusOf(err), err
	}
	return j.run.Execution(), epoch, http.StatusOK, nil
}

func (c *clusterNode) handlePush(w http.ResponseWriter, r *http.Request, n *node) {
	exec, epoch, status, err := n.clusterJob(r)
	if err != nil {
		clusterError(w, status, err)
		return
	}
	id, err1 := strconv.ParseUint(r.PathValue("id"), 10, 64)
	size, err2 := strconv.ParseInt(r.Header.Get("X-Edged-Size"), 10, 64)
	sum, err3 := strconv.ParseUint(r.Header.Get("X-Edged-Checksum"), 16, 32)
	if err := errors.Join(err1, err2, err3); err != nil {
		clusterError(w, http.StatusBadRequest, fmt.Errorf("state file: %w", err))
		return
	}
	if err := exec.ReceiveFile(epoch, snapshot.ID(id), r.PathValue("name"), size, uint32(sum), r.Body); err != nil {
		status := http.StatusInternalServerError
		if errors.Is(err, actors.ErrStaleDeployment) {
			status = http.StatusConflict
		}
		clusterError(w, status, err)
		return
	}
	if h := r.Header.Get(holdersHeader); h != "" {
		c.rep.hold(exec.Name(), snapshot.ID(id), r.PathValue("name"), strings.Split(h, ","))
	}
	writeJSON(w, http.StatusOK, map[string]any{"stored": r.PathValue("name")})
}

func (c *clusterNode) handleFetch(w http.ResponseWriter, r *http.Request, n *node) {
	exec, epoch, status, err := n.clusterJob(r)
	if err != nil {
		clusterError(w, status, err)
		return
	}
	f, h, err := exec.OpenRestoreFile(epoch, r.PathValue("name"))
	if err != nil {
		status := http.StatusInternalServerError
		switch {
		case errors.Is(err, actors.ErrStaleDeployment):
			status = http.StatusConflict
		case errors.Is(err, os.ErrNotExist):
			status = http.StatusNotFound
		}
		clusterError(w, status, err)
		return
	}
	defer f.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(h.Size, 10))
	w.Header().Set("X-Edged-Checksum", strconv.FormatUint(uint64(h.Checksum), 16))
	io.Copy(w, io.LimitReader(f, h.Size))
}

// peerClient talks to the other nodes' APIs: it invites them to host
// deployments and moves state files (actors.SnapshotFiles).
type peerClient struct {
	cfg   *pipeline.ClusterConfig
	token string
	http  *http.Client
	// rep replicates the state files pushed and finds copies to fetch.
	rep *replicas
}

var _ actors.SnapshotFiles = (*peerClient)(nil)

func (p *peerClient) url(node, path string) (string, error) {
	peer, ok := p.cfg.Peer(node)
	if !ok {
		return "", fmt.Errorf("no peer %q in cluster.peers", node)
	}
	return "http://" + peer.API + path, nil
}

// Backoff of a peer call that the peer refused because its budget for
// request bodies was taken (ErrBodiesBusy): the call is sent again after
// bodiesBusyBackoff, doubling up to maxBodiesBusyBackoff, until its
// context ends.
const (
	bodiesBusyBackoff    = 20 * time.Millisecond
	maxBodiesBusyBackoff = time.Second
)

// do calls the peer node. A call whose body the peer refused for now
// (503, ErrBodiesBusy: other large bodies were being read) is sent again
// until ctx ends, when its body is a *bytes.Reader (what the calls with
// such bodies send): each try reads a copy of it from where it was given,
// since the transport may still be writing a refused body after the
// answer came back (the peer answers before it reads the body), and
// reads it until it closes it (http.RoundTripper). A try that ctx ends
// returns the refusal before it, not ctx's error: the peer refused the
// call, and the caller must learn that (actors.ErrNotPlaced) whether ctx
// ended in the backoff or while the next try was on its way.
func (p *peerClient) do(ctx context.Context, method, node, path string, body io.Reader, hdr http.Header) (*http.Response, error) {
	br, again := body.(*bytes.Reader)
	var start bytes.Reader
	if again {
		start = *br
	}
	backoff := bodiesBusyBackoff
	var refused error
	for {
		if again {
			r := start
			body = &r
		}
		resp, err := p.doOnce(ctx, method, node, path, body, hdr)
		if err != nil && refused != nil && ctx.Err() != nil {
			return nil, refused
		}
		var ae *APIError
		if !again || !errors.As(err, &ae) || ae.StatusCode != http.StatusServiceUnavailable || !strings.Contains(ae.Msg, ErrBodiesBusy.Error()) {
			return resp, err
		}
		refused = err
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, err
		case <-t.C:
		}
		backoff = min(2*backoff, maxBodiesBusyBackoff)
	}
}

func (p *peerClient) doOnce(ctx context.Context, method, node, path string, body io.Reader, hdr http.Header) (*http.Response, error) {
	u, err := p.url(node, path)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, err
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	if p.token != "" {
		req.Header.Set("Authorization", "Bearer "+p.token)
	}
	resp, err := p.http.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		var e ErrorBody
		if json.Unmarshal(b, &e) != nil || e.Error == "" {
			e.Error = strings.TrimSpace(string(b))
		}
		return nil, &APIError{StatusCode: resp.StatusCode, Msg: fmt.Sprintf("node %q: %s %s: %s", node, method, path, e.Error)}
	}
	return resp, nil
}

// invite asks node to host its tasks of deployment d.
func (p *peerClient) invite(ctx context.Context, node string, d actors.Deployment) error {
	b, err := json.Marshal(d)
	if err != nil {
		return err
	}
	resp, err := p.do(ctx, http.MethodPost, node, "/cluster/deployments", bytes.NewReader(b), http.Header{"Content-Type": {"application/json"}})
	var ae *APIError
	if errors.As(err, &ae) && ae.StatusCode == http.StatusConflict && strings.Contains(ae.Msg, ErrStaleMaster.Error()) {
		// The node follows a newer job master (this one's term is
		// superseded, or it leads too): no deployment of this master's
		// is placed there, and the attempt waits as without a majority
		// until the master yields, without using up the restart
		// strategy.
		return fmt.Errorf("%w: %w", actors.ErrNotPlaced, err)
	}
	if errors.As(err, &ae) && ae.StatusCode == http.StatusServiceUnavailable {
		// The node cannot take a deployment now: it lost the majority,
		// is shutting down (actors.ErrEvicted) or is busy reading other
		// large bodies until the call's deadline. Its state changes, not
		// the job's: the attempt waits as without a majority, without
		// using up the restart strategy.
		return fmt.Errorf("%w: %w", actors.ErrNotPlaced, err)
	}
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

func filePath(job string, epoch uint64, rest string) string {
	return "/cluster/jobs/" + url.PathEscape(job) + "/epochs/" + strconv.FormatUint(epoch, 10) + rest
}

// Push copies a state file the node wrote to the peers that keep
// replicas of it and to the job master's node.
func (p *peerClient) Push(ctx context.Context, master, job string, epoch uint64, id snapshot.ID, path string, h snapshot.Handle) error {
	return p.rep.push(ctx, master, job, epoch, id, path, h)
}

// Fetch copies a state file of the snapshot a deployment restores: from
// the node's own copy, the job master's node, or another node that holds
// one.
func (p *peerClient) Fetch(ctx context.Context, master, job string, epoch uint64, id snapshot.ID, h snapshot.Handle, path string) error {
	fromMaster := fetchSource{node: master, open: func(ctx context.Context) (io.ReadCloser, error) {
		resp, err := p.do(ctx, http.MethodGet, master, filePath(job, epoch, "/restore/"+url.PathEscape(h.File)), nil, nil)
		if err != nil {
			return nil, err
		}
		return resp.Body, nil
	}}
	_, err := p.rep.fetchFirst(ctx, job, id, h, path, p.rep.sources(job, id, h, true, []fetchSource{fromMaster}))
	return err
}

// clusterError answers err with code.
func clusterError(w http.ResponseWriter, code int, err error) {
	writeJSON(w, code, ErrorBody{Error: err.Error()})
}

// joinCluster starts the node's part in the cluster of cfg: the transport,
// and on a node other than the master's the worker that hosts the tasks
// placed on it. api is the address the node's REST API listens on.
func (n *node) joinCluster(cfg *pipeline.Config, api string) error {
	dataDir := cfg.Node.DataDir
	if dataDir == "" {
		dataDir = DefaultDataDir
	}
	c, err := startCluster(cfg.Cluster, dataDir, n.opts.Token, n.log)
	if err != nil {
		return err
	}
	c.api = api
	c.fingerprint = pipelinesFingerprint(cfg.Pipelines)
	c.nodesDigest = nodesDigest(cfg.Cluster.Nodes(), cfg.Cluster.ChannelConfig().Shared())
	c.rep = newReplicas(cfg.Cluster, cfg.Pipelines, c.peers, c.live.alike, c.seen.Load, n.log.With("node", cfg.Cluster.Node))
	c.peers.rep = c.rep
	if cfg.Cluster.Gossip != "" {
		// Leadership stays where it is (see cluster_leader.go): a node
		// that starts follows the leader its peers name.
		c.hb = newHandback(cfg.Cluster.LeadershipConfig())
		c.hb.stop, c.hb.drop, c.hb.cancel, c.hb.recancel = n.stopForHandback, n.dropJobs, n.cancelJobs, n.recancelJobs
		c.lead.id = c.askLeader(n.ctx)
		// A node that saw a deployment before this run belongs to a
		// cluster that ran: with a majority up, it need not wait
		// forever for a leader that does not come back (absence).
		c.lead.before = c.seen.Load() > 0
		c.master = c.lead.id == cfg.Cluster.Node
		c.takeover = func(dead string) error { return n.takeOver(dead, cfg.Pipelines) }
	}
	if c.master {
		if c.epochBase, err = nextEpochBase(filepath.Join(dataDir, "cluster"), c.seen.Load(), cfg.Cluster.Nodes(), cfg.Cluster.Node); err != nil {
			c.stop()
			return err
		}
		// A node that starts as the leader numbers checkpoints from its
		// term's base too (as takeOver does): above every id of an
		// earlier term, whose snapshots may be on other nodes.
		c.lead.mu.Lock()
		c.lead.nextCheckpoint = max(c.lead.nextCheckpoint, snapshot.ID(c.epochBase))
		c.lead.mu.Unlock()
	}
	c.log.Info("cluster: leader", "leader", c.leader(), "master", c.master)
	if !c.master && n.opts.Savepoint != "" {
		// Only the job masters start jobs, and they run on the leader:
		// given to any other node the savepoint would be dropped without
		// a word while the leader's jobs run on from their own snapshots.
		c.stop()
		leader := c.leader()
		if leader == "" {
			leader = "none known"
		}
		return fmt.Errorf("%w: node %q follows the leader (%s), which runs the job masters and starts every job from its own snapshots; "+
			"to start from %s, stop the job on the leader (edged stop), stop every node, the leader last, then start the leader first, with --from-savepoint, and the others after it",
			ErrSavepointNotLeader, cfg.Cluster.Node, leader, n.opts.Savepoint)
	}
	c.pauseIngest = func(paused bool) {
		if n.mqtt == nil || n.mqtt.broker == nil {
			return
		}
		if paused {
			n.mqtt.broker.PauseIngest("this node was drained and left the cluster: it reads no readings until it is undrained or restarts")
		} else {
			n.mqtt.broker.ResumeIngest()
		}
	}
	n.cluster = c
	n.setCluster(c)
	n.inputs.Nodes, n.inputs.Self = cfg.Cluster.Nodes(), cfg.Cluster.Node
	if !c.master || cfg.Cluster.Gossip != "" {
		// With gossip the leader keeps a worker too: it hosts tasks once
		// it hands the leadership back.
		c.worker = n.newWorker(cfg, dataDir)
	}
	if cfg.Cluster.Gossip != "" {
		n.inputs.SplitHome = c.splitHome
		if err := c.startGossip(); err != nil {
			c.stop()
			return err
		}
	}
	return nil
}

// newWorker returns the worker that hosts the tasks the job masters place
// on the node.
func (n *node) newWorker(cfg *pipeline.Config, dataDir string) *actors.Worker {
	c := n.cluster
	byName := make(map[string]pipeline.PipelineConfig, len(cfg.Pipelines))
	for _, pc := range cfg.Pipelines {
		byName[pc.Name] = pc
	}
	return actors.NewWorker(actors.WorkerConfig{
		Node: cfg.Cluster.Node, Network: c.net, Dir: filepath.Join(dataDir, "cluster", "staging"), Logger: n.log, Files: c.peers,
		Jobs: func(name string) (*actors.Job, actors.Config, error) {
			pc, ok := byName[name]
			if !ok {
				return nil, actors.Config{}, fmt.Errorf("%w %q: the node's config has no such pipeline", ErrUnknownJob, name)
			}
			envOpts, err := n.envOptions(pc)
			if err != nil {
				return nil, actors.Config{}, err
			}
			env := stream.NewEnvironment(pc.Name, envOpts...)
			in := n.inputs
			in.Counts = n.deadCounts.hostedCounts(pc.Name)
			pj, err := pipeline.BuildJobWith(pc, env, n.out, in)
			if err != nil {
				return nil, actors.Config{}, err
			}
			n.deadCounts.keep(pc.Name, pj)
			job, err := env.Graph()
			if err == nil && n.graphHook != nil {
				n.graphHook(job)
			}
			return job, env.Config(), err
		},
	})
}

// pipelinesFingerprint returns the fingerprint the node gossips: the
// digest of its pipelines' settings that must be the same on every node
// (pipeline.PipelinesDigest), so nodes that differ only in node-local
// settings (checkpoint.dir, addresses, ...) gossip the same one, and a
// member whose fingerprint differs is one whose job plans the masters
// refuse.
func pipelinesFingerprint(pcs []pipeline.PipelineConfig) string {
	return pipeline.PipelinesDigest(pcs)
}

// nodesDigest returns the digest of the node ids a config names
// (ClusterConfig.Nodes, sorted) and of the channel settings every node
// must share (cluster.ChannelConfig.Shared) that a node gossips beside
// its fingerprint: cluster.MaxNodesLen hex digits. A node whose channel
// credits differ would fail every channel from a node with more, so it
// is placed around as one that names other nodes.
func nodesDigest(nodes []string, shared string) string {
	h := sha256.New()
	for _, id := range nodes {
		io.WriteString(h, id)
		h.Write([]byte{0})
	}
	io.WriteString(h, shared)
	return hex.EncodeToString(h.Sum(nil))[:cluster.MaxNodesLen]
}

// pinPlacement applies to placement, the placement of job's plan, the
// rows of cluster.placement that name job's operators (the others are
// other pipelines'). A row pins its operator's whole chain: the
// operators chained with it run in one task, which runs where the
// chain's first operator is placed, so a row of a chained operator
// alone would not be followed. Two rows that pin one task on different
// nodes, or a row naming no subtask of job, are refused.
func pinPlacement(job string, plan *actors.Plan, placement map[actors.TaskKey]string, pins []pipeline.PlacementConfig) error {
	chainOf := map[string]*actors.Chain{}
	for _, ch := range plan.Chains {
		for _, v := range ch.Vertices {
			chainOf[v.UID] = ch
		}
	}
	pinned := map[actors.TaskKey]int{} // a chain's head subtask → the row pinning it
	for i, p := range pins {
		if !strings.HasPrefix(p.Operator, job+"/") {
			continue
		}
		k := actors.TaskKey{UID: p.Operator, Subtask: p.Subtask}
		ch := chainOf[p.Operator]
		if _, ok := placement[k]; !ok || ch == nil {
			return fmt.Errorf("cluster.placement[%d]: the job %q has no subtask %s", i, job, k)
		}
		head := actors.TaskKey{UID: ch.Head().UID, Subtask: p.Subtask}
		if j, ok := pinned[head]; ok && pins[j].Node != p.Node {
			return fmt.Errorf("cluster.placement[%d]: %s runs in one task with %s (the operators are chained: %s), which cluster.placement[%d] pins on node %q, not %q: pin the operators of a task on one node",
				i, k, actors.TaskKey{UID: pins[j].Operator, Subtask: p.Subtask}, ch.Name(), j, pins[j].Node, p.Node)
		}
		pinned[head] = i
		for _, v := range ch.Vertices {
			placement[actors.TaskKey{UID: v.UID, Subtask: p.Subtask}] = p.Node
		}
	}
	return nil
}
