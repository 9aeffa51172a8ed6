package actors

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/edgedio/edged/snapshot"
)

// ErrStaleDeployment is returned by Worker.Deploy for a deployment whose
// epoch is not newer than the one the worker hosts for the same job.
var ErrStaleDeployment = errors.New("actors: stale deployment")

// ErrEvicted is returned by Worker.Deploy for a deployment that was in
// progress when the worker was evicted or closed: it hosts nothing.
var ErrEvicted = errors.New("actors: deployment ended by the worker's eviction")

// Deployment is the job master's invitation to a node running in another
// process: host your tasks of epoch Epoch of job Job. The node builds the
// job graph itself, from its own config or code; the master checks its
// plan's fingerprint when the node's host registers.
type Deployment struct {
	// Job is the job's name.
	Job string `json:"job"`
	// Epoch is the deployment's epoch.
	Epoch uint64 `json:"epoch"`
	// Index is the node's index in Nodes: it names the node's control
	// channels.
	Index int `json:"index"`
	// Master is the node of the job master.
	Master string `json:"master"`
	// Nodes are the ids of every node of the deployment, in order.
	Nodes []string `json:"nodes"`
	// Placement is the placement table.
	Placement []PlacedTask `json:"placement"`
	// Fingerprint is the master's plan fingerprint: a node whose plan
	// differs refuses the deployment at once.
	Fingerprint string `json:"fingerprint"`
	// Checkpointing says whether the job takes checkpoints; Mode is their
	// consistency.
	Checkpointing bool          `json:"checkpointing"`
	Mode          snapshot.Mode `json:"mode"`
	// Restore is the encoded metadata of the snapshot the deployment
	// restores (snapshot.EncodeMetadata), nil when it restores none. The
	// node fetches the state files it needs from the master.
	Restore []byte `json:"restore,omitempty"`
	// RestoreCommitted says that every sink committed the restored
	// snapshot before the job stopped (snapshot.Metadata.Committed, which
	// the encoding leaves out): the node's sinks publish none of its output
	// again.
	RestoreCommitted bool `json:"restore_committed,omitempty"`
	// Boots are the runs (cluster.Meta.Boot) of the nodes the master saw
	// alive when it placed the job's tasks, filled in by the caller of
	// Cluster.Invite. A node back since in another run is one the
	// placement left out because it was gone: a source split placed away
	// from it waits for it. Nil: not known (a split away is idle).
	Boots map[string]string `json:"boots,omitempty"`
}

// PlacedTask is one row of a placement table.
type PlacedTask struct {
	UID     string `json:"uid"`
	Subtask int    `json:"subtask"`
	Node    string `json:"node"`
}

// SnapshotFiles moves state files between a node in another process and
// the job master's node: a host pushes each file it wrote for a
// checkpoint before it acknowledges it, so that the master's checkpoint
// directory holds every file of a completed checkpoint, and fetches the
// files of the snapshot its deployment restores.
type SnapshotFiles interface {
	// Push copies the state file at path, described by h, of checkpoint id
	// of deployment (job, epoch) to the job master on node master. It
	// returns once the master stored it durably.
	Push(ctx context.Context, master, job string, epoch uint64, id snapshot.ID, path string, h snapshot.Handle) error
	// Fetch copies state file h of snapshot id that deployment (job,
	// epoch) restores to path, checked against h's size and checksum:
	// from the job master on node master, or from another node that
	// holds a copy.
	Fetch(ctx context.Context, master, job string, epoch uint64, id snapshot.ID, h snapshot.Handle, path string) error
}

// WorkerConfig configures a Worker.
type WorkerConfig struct {
	// Node is the worker's node id.
	Node string
	// Network carries the node's channels.
	Network Network
	// Dir is where the node stages the state files it writes and fetches,
	// one directory per deployment, removed when the deployment ends.
	// The worker owns it: NewWorker removes what an earlier run of the
	// node left there (a deployment a kill -9 or a power loss ended
	// without its teardown), which nothing reads again.
	Dir string
	// Logger receives the worker's logs; default discards.
	Logger *slog.Logger
	// Jobs builds the job graph of a job by name, from the node's own
	// config or code, with the node's runtime config for it (batch size,
	// credits, state backend, logger, clock; its checkpoint directory is
	// not used: the master's is where checkpoints complete).
	Jobs func(name string) (*Job, Config, error)
	// Files moves state files to and from the job master.
	Files SnapshotFiles
}

// Worker hosts the tasks that job masters in other processes place on its
// node: one task host per job, replaced by each newer deployment.
type Worker struct {
	cfg WorkerConfig
	log *slog.Logger

	mu     sync.Mutex // guards hosts, closed, latest and deploying
	hosts  map[string]*workerHost
	closed bool
	// latest is, per job, the epoch of the newest deployment the worker
	// was asked to host; deploying is the Deploy call in progress for it.
	latest    map[string]uint64
	deploying map[string]*deployCall

	// handovers counts those of the hosts that ended; guarded by mu.
	handovers int64

	// checkpoint is the highest checkpoint id triggered on the worker.
	checkpoint atomic.Int64
}

// HighestCheckpoint returns the highest checkpoint id a job master
// triggered on the worker's hosts since it was made (0 if none): a node
// that becomes the job master numbers its checkpoints above it.
func (w *Worker) HighestCheckpoint() snapshot.ID {
	return snapshot.ID(w.checkpoint.Load())
}

// workerHost is a running deployment on a worker.
type workerHost struct {
	h       *host
	stopped chan struct{} // closed once the host is torn down
}

// NewWorker returns a worker. It starts nothing.
func NewWorker(cfg WorkerConfig) *Worker {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	w := &Worker{cfg: cfg, log: cfg.Logger.With("node", cfg.Node), hosts: make(map[string]*workerHost),
		latest: make(map[string]uint64), deploying: make(map[string]*deployCall)}
	w.removeStaged()
	return w
}

// removeStaged removes what an earlier run of the node left in the
// staging directory: the directories of deployments a kill -9 or a power
// loss ended without their teardown, each with the copies of the state
// files its restore fetched and the files of its checkpoints in
// progress. A deployment stages into a directory of its own, which it
// fills anew (its restore fetches every file again), so nothing there is
// read again; without this a worker killed again and again filled its
// card with them. Best effort: what cannot be removed is logged.
func (w *Worker) removeStaged() {
	if w.cfg.Dir == "" {
		return
	}
	entries, err := os.ReadDir(w.cfg.Dir)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			w.log.Warn("cannot list the staging directory", "dir", w.cfg.Dir, "err", err)
		}
		return
	}
	for _, e := range entries {
		path := filepath.Join(w.cfg.Dir, e.Name())
		if err := os.RemoveAll(path); err != nil {
			w.log.Warn("cannot remove what an earlier run of the node staged", "path", path, "err", err)
			continue
		}
		w.log.Info("removed what an earlier run of the node staged", "path", path)
	}
}

// deployCall is a Deploy call in progress.
type deployCall struct {
	cancel context.CancelFunc
	done   chan struct{} // closed once the call returned
	// ended is why Evict or Close ended the call (nil if they did not);
	// guarded by the worker's mu.
	ended error
}

// WorkerJob is what a worker hosts for one job.
type WorkerJob struct {
	Job    string `json:"job"`
	Epoch  uint64 `json:"epoch"`
	Master string `json:"master"`
	// Tasks are the subtasks the node runs, with what they did.
	Tasks []TaskMetrics `json:"tasks"`
}

// Jobs returns what the worker hosts, by job name.
func (w *Worker) Jobs() []WorkerJob {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []WorkerJob
	for name, wh := range w.hosts {
		j := WorkerJob{Job: name, Epoch: wh.h.epoch, Master: wh.h.master}
		select {
		case <-wh.h.started:
			// The tasks exist; a handover replaces some of them.
			j.Tasks = taskMetrics(wh.h.taskList())
		default:
		}
		out = append(out, j)
	}
	slices.SortFunc(out, func(a, b WorkerJob) int { return strings.Compare(a.Job, b.Job) })
	return out
}

// Handovers returns how many subtasks the worker's hosts retired or took
// over by handovers (Runner.Move) since it was made.
func (w *Worker) Handovers() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.handovers + w.live()
}

// live returns the handovers of the hosts still running; w.mu held.
func (w *Worker) live() int64 {
	var n int64
	for _, wh := range w.hosts {
		n += wh.h.handovers.Load()
	}
	return n
}

// Deploy hosts the node's tasks of deployment d: it stops the host of an
// older deployment of the same job, fetches the state files d restores,
// opens the control channels with the master and registers. The master
// then deploys and starts the tasks over the control channels. A
// deployment not newer than the hosted one, or older than one the worker
// was asked to host, is refused with ErrStaleDeployment.
//
// Calls for one job run one at a time, and the newest wins: a call for a
// newer epoch cancels one in progress for an older one and waits for it
// to return. Otherwise an older deployment whose files were slow to come
// could be hosted after a newer one, hiding it from the worker (its
// tasks ran on, and the older host waited for a master long gone).
func (w *Worker) Deploy(ctx context.Context, d Deployment) error {
	job, cfg, err := w.cfg.Jobs(d.Job)
	if err != nil {
		return fmt.Errorf("actors: node %q: job %q: %w", w.cfg.Node, d.Job, err)
	}
	fp, err := w.cfg.Network.Fingerprint(job)
	if err != nil {
		return fmt.Errorf("actors: node %q: fingerprint of job %q: %w", w.cfg.Node, d.Job, err)
	}
	if d.Fingerprint != "" && fp != d.Fingerprint {
		return planMismatch(d.Job, w.cfg.Node, fp, d.Fingerprint)
	}
	if d.Index < 0 || d.Index >= len(d.Nodes) || d.Nodes[d.Index] != w.cfg.Node {
		return fmt.Errorf("actors: node %q: deployment %d of job %q names node index %d of %q", w.cfg.Node, d.Epoch, d.Job, d.Index, d.Nodes)
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("actors: node %q: job %q: config: %w", w.cfg.Node, d.Job, err)
	}
	if d.Checkpointing && w.cfg.Dir == "" {
		return fmt.Errorf("actors: node %q: job %q takes checkpoints and the node has no staging directory", w.cfg.Node, d.Job)
	}

	ctx, call, release, err := w.begin(ctx, d)
	if err != nil {
		return err
	}
	defer release()
	w.mu.Lock()
	if err := w.refusedLocked(d, call); err != nil {
		w.mu.Unlock()
		return err
	}
	old := w.hosts[d.Job]
	if old != nil && old.h.epoch >= d.Epoch {
		w.mu.Unlock()
		return fmt.Errorf("%w: job %q epoch %d: the node hosts epoch %d", ErrStaleDeployment, d.Job, d.Epoch, old.h.epoch)
	}
	delete(w.hosts, d.Job)
	w.mu.Unlock()
	if old != nil {
		w.log.Info("replacing deployment", "job", d.Job, "epoch", old.h.epoch, "new_epoch", d.Epoch)
		old.h.cancelTasks()
		<-old.stopped
	}

	plan, err := BuildPlan(job)
	if err != nil {
		return err
	}
	c := &Cluster{Placement: make(map[TaskKey]string, len(d.Placement))}
	for _, id := range d.Nodes {
		c.Nodes = append(c.Nodes, Node{ID: id})
	}
	for _, p := range d.Placement {
		c.Placement[TaskKey{UID: p.UID, Subtask: p.Subtask}] = p.Node
	}
	cfg.Cluster = c
	cfg.Checkpoint.Mode = d.Mode
	cfg.Checkpoint.Dir = ""
	cfg.Restore = nil
	var staging string
	if d.Checkpointing {
		staging = filepath.Join(w.cfg.Dir, job.Name+"-"+strconv.FormatUint(d.Epoch, 10))
		cfg.Checkpoint.Dir = staging
		if err := os.RemoveAll(staging); err != nil {
			return fmt.Errorf("actors: node %q: %w", w.cfg.Node, err)
		}
	}
	pl := clusterPlacement(c, plan)
	if d.Restore != nil {
		md, err := snapshot.DecodeMetadata(d.Restore)
		if err != nil {
			return fmt.Errorf("actors: node %q: deployment %d of job %q: restore metadata: %w", w.cfg.Node, d.Epoch, d.Job, err)
		}
		if staging == "" {
			return fmt.Errorf("actors: node %q: job %q restores a snapshot and the node has no checkpoint directory", w.cfg.Node, d.Job)
		}
		md.Dir = filepath.Join(staging, "restore")
		md.Committed = d.RestoreCommitted
		if err := w.fetch(ctx, d, plan, pl, md); err != nil {
			os.RemoveAll(staging)
			w.mu.Lock()
			if rerr := w.refusedLocked(d, call); rerr != nil {
				err = rerr
			}
			w.mu.Unlock()
			return err
		}
		cfg.Restore = md
	}

	started := make(chan struct{})
	h := newHost(w.cfg.Node, d.Epoch, job, plan, cfg, w.cfg.Network, nil, started)
	h.system = newProtoSystem(cfg.Logger)
	h.pl = pl
	h.master = d.Master
	h.files = w.cfg.Files
	h.staging = true
	h.seen = &w.checkpoint
	if staging != "" {
		if h.store, err = snapshot.OpenStore(staging, job.Name, job.maxParallelism(), cfg.Logger); err != nil {
			h.system.Shutdown()
			os.RemoveAll(staging)
			return fmt.Errorf("actors: node %q: %w", w.cfg.Node, err)
		}
	}
	wh := &workerHost{h: h, stopped: make(chan struct{})}
	w.mu.Lock()
	if err = w.refusedLocked(d, call); err != nil {
		w.mu.Unlock()
		h.system.Shutdown()
		os.RemoveAll(staging)
		return err
	}
	w.hosts[d.Job] = wh
	w.mu.Unlock()
	go w.teardown(wh, staging)
	if err := h.openControl(d.Index, d.Master, fp, started); err != nil {
		h.cancelTasks()
		return err
	}
	w.log.Info("deployment hosted", "job", d.Job, "epoch", d.Epoch, "master", d.Master, "tasks", len(pl.local(plan, w.cfg.Node)), "restore", cfg.Restore != nil)
	return nil
}

// begin makes d the newest deployment of its job the worker was asked
// to host, unless a newer one was asked for, cancels the Deploy call in
// progress for an older one and waits for it to return. release ends d's
// call; ctx ends when a newer call, Evict or Close cancels it.
func (w *Worker) begin(ctx context.Context, d Deployment) (_ context.Context, _ *deployCall, release func(), _ error) {
	w.mu.Lock()
	if e := w.latest[d.Job]; e > d.Epoch {
		w.mu.Unlock()
		return nil, nil, nil, fmt.Errorf("%w: job %q epoch %d: the node was asked to host epoch %d", ErrStaleDeployment, d.Job, d.Epoch, e)
	}
	w.latest[d.Job] = d.Epoch
	prev := w.deploying[d.Job]
	ctx, cancel := context.WithCancel(ctx)
	call := &deployCall{cancel: cancel, done: make(chan struct{})}
	w.deploying[d.Job] = call
	w.mu.Unlock()
	if prev != nil {
		prev.cancel()
		<-prev.done
	}
	return ctx, call, func() {
		cancel()
		w.mu.Lock()
		if w.deploying[d.Job] == call {
			delete(w.deploying, d.Job)
		}
		w.mu.Unlock()
		close(call.done)
	}, nil
}

// refusedLocked returns why call, d's Deploy call, may not host d: the
// worker closed, Evict ended the call, or (ErrStaleDeployment) the worker
// was asked to host a newer deployment of d's job since d; w.mu held.
func (w *Worker) refusedLocked(d Deployment, call *deployCall) error {
	if w.closed {
		return fmt.Errorf("actors: node %q: worker closed", w.cfg.Node)
	}
	if call.ended != nil {
		return call.ended
	}
	if e := w.latest[d.Job]; e > d.Epoch {
		return fmt.Errorf("%w: job %q epoch %d: a deployment of epoch %d followed it", ErrStaleDeployment, d.Job, d.Epoch, e)
	}
	return nil
}

// teardown waits for a host's end (the master's cancel, a failed control
// channel, a newer deployment or Close), then stops its tasks, closes its
// operators and removes its staged files.
func (w *Worker) teardown(wh *workerHost, staging string) {
	defer close(wh.stopped)
	h := wh.h
	<-h.done
	h.stop()
	if err := h.closeOperators(); err != nil {
		w.log.Warn("close operators", "job", h.job.Name, "epoch", h.epoch, "err", err)
	}
	h.system.Shutdown()
	if staging != "" {
		if err := os.RemoveAll(staging); err != nil {
			w.log.Warn("remove staged state files", "dir", staging, "err", err)
		}
	}
	w.mu.Lock()
	if w.hosts[h.job.Name] == wh {
		delete(w.hosts, h.job.Name)
	}
	w.handovers += h.handovers.Load()
	w.mu.Unlock()
	w.log.Info("deployment ended", "job", h.job.Name, "epoch", h.epoch)
}

// fetch copies (from the master, or another node holding a copy) the state files of md that the node's
// subtasks restore from: every file of an operator with a subtask here.
func (w *Worker) fetch(ctx context.Context, d Deployment, plan *Plan, pl placement, md *snapshot.Metadata) error {
	if err := os.MkdirAll(md.Dir, 0o755); err != nil {
		return err
	}
	done := make(map[string]bool)
	for _, t := range pl.local(plan, w.cfg.Node) {
		for _, v := range t.chain.Vertices {
			op, ok := md.Operator(v.UID)
			if !ok {
				continue
			}
			for _, h := range op.Subtasks {
				if h.File == "" || done[h.File] {
					continue
				}
				done[h.File] = true
				if err := w.cfg.Files.Fetch(ctx, d.Master, d.Job, d.Epoch, md.Checkpoint, h, filepath.Join(md.Dir, h.File)); err != nil {
					return fmt.Errorf("actors: node %q: fetch state file %s of snapshot %d from %q: %w", w.cfg.Node, h.File, md.Checkpoint, d.Master, err)
				}
			}
		}
	}
	return nil
}

// Evict stops every host of the worker (the node may no longer own its
// subtasks: it sees no majority) and waits for them; the Deploy calls in
// progress then return ErrEvicted and host nothing. The worker takes new
// deployments after. It returns how many hosts it stopped.
func (w *Worker) Evict() int {
	return w.stopAll(false)
}

// Close stops every host of the worker and waits for them; the Deploy
// calls in progress host nothing, and later ones are refused.
func (w *Worker) Close() {
	w.stopAll(true)
}

// stopAll ends the Deploy calls in progress and stops every host, for
// Evict or (closing) Close.
func (w *Worker) stopAll(closing bool) int {
	w.mu.Lock()
	if closing {
		w.closed = true
	}
	for job, call := range w.deploying {
		if call.ended == nil {
			call.ended = fmt.Errorf("%w: node %q, job %q", ErrEvicted, w.cfg.Node, job)
		}
		call.cancel()
	}
	hosts := make([]*workerHost, 0, len(w.hosts))
	for _, wh := range w.hosts {
		hosts = append(hosts, wh)
	}
	w.mu.Unlock()
	for _, wh := range hosts {
		wh.h.cancelTasks()
		<-wh.stopped
	}
	return len(hosts)
}

// localTask is a subtask placed on a node.
type localTask struct {
	chain   *Chain
	subtask int
}

// local returns the subtasks of plan placed on node.
func (p placement) local(plan *Plan, node string) []localTask {
	var ts []localTask
	for _, c := range plan.Chains {
		for i := range c.Head().Parallelism {
			if p.nodeOf(c, i) == node {
				ts = append(ts, localTask{c, i})
			}
		}
	}
	return ts
}
