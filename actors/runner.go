package actors

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/state"
)

// Runner executes one job: it is the job master of one deployment. It
// owns the checkpoint coordinator, the checkpoint metadata and the
// deployment's epoch; a task host per node (one without a Cluster) builds
// and runs the tasks placed there and reports to the runner by messages
// that carry the epoch. Make it with NewRunner, call Run once.
type Runner struct {
	job   *Job
	cfg   Config
	plan  *Plan
	maxP  int
	log   *slog.Logger
	epoch uint64
	// want is the plan fingerprint every node must register with.
	want string

	hosts []*host
	// local holds the hosts once Run made them, for fail, which may be
	// called from another goroutine: it stops their tasks at once.
	local atomic.Pointer[[]*host]
	// ctl is the master's end of the control channels, in a cluster.
	ctl *masterCtl
	// ctlOpen is set once ctl is (fail reads ctl only then: it may be
	// called from another goroutine while Run opens the channels).
	ctlOpen atomic.Bool
	// ctx ends when Run returns.
	ctx context.Context
	// cmdCtx ends when Run returns or the deployment fails (fail): the
	// commands to hosts are sent under it, so that the master loop,
	// blocked on a send to a node that cannot be reached (cut off, say),
	// hears the failure at once and stops this node's tasks.
	cmdCtx    context.Context
	cmdCancel context.CancelFunc

	// done is closed when the job stops (finished, failed or cancelled).
	done     chan struct{}
	stopOnce sync.Once
	// started is closed once every task is built and spawned.
	started chan struct{}
	// reports receives the hosts' reports: tasks finished or failed,
	// checkpoint acknowledgements and declines, notifications handled.
	reports chan hostReport
	// stale counts reports of another epoch, dropped.
	stale atomic.Int64
	// failed holds the first error fail was called with: the attempt
	// ends with it, not with what the failure cut short (a checkpoint
	// whose publication it gave up).
	failed atomic.Pointer[error]

	// Checkpointing, when the config has a checkpoint directory.
	store      *snapshot.Store
	coord      *snapshot.Coordinator
	savepoints chan savepointReq
	waiting    map[snapshot.ID]savepointReq
	paths      map[snapshot.ID]string
	// closing is the checkpoint whose completion ends the job (the final
	// checkpoint or a stop-with-savepoint), 0 before; acked counts the
	// tasks that handled its notification.
	closing snapshot.ID
	acked   int
	// final is closing when it is the final checkpoint of a job whose
	// input ended (not a stop-with-savepoint), 0 otherwise.
	final   snapshot.ID
	histMu  sync.Mutex // guards history
	history []snapshot.Stats
	// inflight are the checkpoints triggered and not yet completed or
	// aborted.
	inflight map[snapshot.ID]bool
	// metas holds the metadata of the savepoints asked for, from their
	// commit to their notification.
	metas map[snapshot.ID]*snapshot.Metadata

	// Handovers (handover.go): requests, those waiting for a checkpoint
	// or another handover, whether one runs, and the goroutine that
	// completes it.
	moves     chan *moveReq
	moveQueue []*moveReq
	queued    atomic.Int32 // len(moveQueue), for PendingMoves
	moving    bool
	moveEnded chan struct{}
	moveSeq   int
	moveCtx   context.Context
	moveWG    sync.WaitGroup
	placeMu   sync.Mutex // guards moved
	// moved is where handovers moved subtasks, by chain head.
	moved map[TaskKey]string
	// mv carries handovers across processes (handover_remote.go).
	mv moveLink
	// held says the coordinator holds its triggers (Coordinator.Hold)
	// while a handover runs; master loop only.
	held bool
}

// NewRunner validates the job and the config and plans the job's tasks. It
// starts nothing.
func NewRunner(job *Job, cfg Config) (*Runner, error) {
	return newRunner(job, cfg, 1)
}

func newRunner(job *Job, cfg Config, epoch uint64) (*Runner, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("actors: config: %w", err)
	}
	plan, err := BuildPlan(job)
	if err != nil {
		return nil, err
	}
	if cfg.Cluster != nil {
		if err := cfg.Cluster.validate(job); err != nil {
			return nil, fmt.Errorf("actors: config: %w", err)
		}
	}
	if md := cfg.Restore; md != nil {
		if err := checkRestore(job, md, cfg.AllowNonRestoredState); err != nil {
			return nil, err
		}
	}
	if cfg.SerializeKeyBy {
		var errs []error
		for _, e := range job.Edges {
			if e.Partition == KeyBy {
				if err := e.From.Out.hasCodec(); err != nil {
					errs = append(errs, fmt.Errorf("edge %q -> %q: %w", e.From.Name, e.To.Name, err))
				}
			}
		}
		if err := errors.Join(errs...); err != nil {
			return nil, err
		}
	}
	cmdCtx, cmdCancel := context.WithCancel(context.Background())
	return &Runner{
		job:        job,
		cfg:        cfg,
		plan:       plan,
		maxP:       job.maxParallelism(),
		log:        cfg.Logger.With("job", job.Name),
		epoch:      epoch,
		done:       make(chan struct{}),
		started:    make(chan struct{}),
		reports:    make(chan hostReport, 2*plan.Tasks()+64),
		savepoints: make(chan savepointReq),
		waiting:    make(map[snapshot.ID]savepointReq),
		paths:      make(map[snapshot.ID]string),
		inflight:   make(map[snapshot.ID]bool),
		metas:      make(map[snapshot.ID]*snapshot.Metadata),
		moves:      make(chan *moveReq),
		moveEnded:  make(chan struct{}, 1),
		moved:      make(map[TaskKey]string),
		mv:         newMoveLink(),
		cmdCtx:     cmdCtx,
		cmdCancel:  cmdCancel,
	}, nil
}

// Started returns a channel closed once Run has built and spawned every
// task; the runner's tasks and channels do not change after that.
func (r *Runner) Started() <-chan struct{} { return r.started }

// Plan returns the job's execution plan.
func (r *Runner) Plan() *Plan { return r.plan }

// Epoch returns the deployment's epoch: 1 for a runner made by
// NewRunner, the attempt's number under an Execution.
func (r *Runner) Epoch() uint64 { return r.epoch }

// StaleMessages returns the number of messages of another epoch dropped:
// reports the master received and commands its hosts received.
func (r *Runner) StaleMessages() int64 {
	n := r.stale.Load()
	for _, h := range r.hostList() {
		n += h.stale.Load()
	}
	return n
}

// hostList returns the hosts once they exist (after started), else nil.
func (r *Runner) hostList() []*host {
	select {
	case <-r.started:
		return r.hosts
	default:
		return nil
	}
}

// newProtoSystem returns an actor system logging to the runtime's logger.
func (r *Runner) newProtoSystem() *actor.ActorSystem {
	return newProtoSystem(r.cfg.Logger)
}

// deadLetterThrottle is the protoactor systems' dead-letter throttle
// interval. The throttle runs a goroutine for one interval after each
// dead letter that opens it (the Stop and Watch messages a failing job's
// teardown sends to tasks stopped already), and protoactor logs dead
// letters at Info, below the Warn the systems log at: with its default
// of 1 s that goroutine outlived Execute by up to a second.
const deadLetterThrottle = time.Millisecond

// newProtoSystem returns an actor system logging to logger, from Warn up.
func newProtoSystem(logger *slog.Logger) *actor.ActorSystem {
	return actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(minLevel{logger.Handler(), slog.LevelWarn}).With("component", "protoactor")
	}), actor.WithDeadLetterThrottleInterval(deadLetterThrottle))
}

// makeHosts creates the task hosts of the deployment: one for the whole
// job in a single process, else one per node, each registered with the
// master after its plan fingerprint was checked.
func (r *Runner) makeHosts() ([]*host, []placement, error) {
	c := r.cfg.Cluster
	if c == nil {
		h := newHost("", r.epoch, r.job, r.plan, r.cfg, nil, r.reports, r.started)
		h.system = r.newProtoSystem()
		return []*host{h}, []placement{localPlacement()}, nil
	}
	want, err := c.Nodes[0].Network.Fingerprint(r.job)
	if err != nil {
		return nil, nil, fmt.Errorf("actors: fingerprint of job %q: %w", r.job.Name, err)
	}
	r.want = want
	// The master's ends first, so that no registration finds the master
	// not listening.
	if err := r.openControl(); err != nil {
		return nil, nil, err
	}
	var hosts []*host
	var pls []placement
	var remote []int
	for i, n := range c.Nodes {
		if n.Network == nil {
			remote = append(remote, i)
			continue
		}
		job := r.job
		if n.Job != nil {
			job = n.Job
		}
		// The host registers with its plan's fingerprint; the master
		// refuses a node running another version of the job.
		got, err := n.Network.Fingerprint(job)
		if err != nil {
			return hosts, nil, fmt.Errorf("actors: node %q: fingerprint of job %q: %w", n.ID, job.Name, err)
		}
		plan, err := BuildPlan(job)
		if err != nil {
			return hosts, nil, fmt.Errorf("actors: node %q: %w", n.ID, err)
		}
		// The host shares no channel with the master: it reports over its
		// control channels and learns that every task of the job is
		// spawned from the master's start command.
		started := make(chan struct{})
		h := newHost(n.ID, r.epoch, job, plan, r.cfg, n.Network, nil, started)
		h.system = r.newProtoSystem()
		h.pl = clusterPlacement(c, plan)
		if c.Files != nil {
			// The master's own state files are replicated to its peers
			// before its tasks' acknowledgements count.
			h.files, h.master = c.Files, n.ID
		}
		hosts = append(hosts, h)
		pls = append(pls, h.pl)
		if err := h.openControl(i, c.Nodes[0].ID, got, started); err != nil {
			return hosts, nil, err
		}
	}
	if len(remote) > 0 {
		if err := r.invite(remote); err != nil {
			return hosts, nil, err
		}
	}
	return hosts, pls, nil
}

// invite asks the nodes in other processes (by index in Cluster.Nodes) to
// host their tasks of the deployment, all at once, within the control
// timeout.
func (r *Runner) invite(nodes []int) error {
	c := r.cfg.Cluster
	d := Deployment{
		Job: r.job.Name, Epoch: r.epoch, Master: c.Nodes[0].ID, Fingerprint: r.want,
		Checkpointing: r.cfg.Checkpoint.Dir != "", Mode: r.cfg.Checkpoint.Mode,
	}
	for _, n := range c.Nodes {
		d.Nodes = append(d.Nodes, n.ID)
	}
	for k, node := range c.Placement {
		d.Placement = append(d.Placement, PlacedTask{UID: k.UID, Subtask: k.Subtask, Node: node})
	}
	slices.SortFunc(d.Placement, func(a, b PlacedTask) int {
		if a.UID != b.UID {
			return strings.Compare(a.UID, b.UID)
		}
		return a.Subtask - b.Subtask
	})
	if md := r.cfg.Restore; md != nil {
		b, err := snapshot.EncodeMetadata(md)
		if err != nil {
			return fmt.Errorf("actors: deployment %d of job %q: encode restore metadata: %w", r.epoch, r.job.Name, err)
		}
		d.Restore, d.RestoreCommitted = b, md.Committed
	}
	ctx, cancel := context.WithTimeout(r.cmdCtx, r.controlTimeout())
	defer cancel()
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for k, i := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := d
			d.Index = i
			if err := c.Invite(ctx, c.Nodes[i].ID, d); err != nil {
				errs[k] = fmt.Errorf("%w: job %q epoch %d: invite node %q: %w", ErrControlFailed, r.job.Name, r.epoch, c.Nodes[i].ID, err)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// ReceiveFile stores a state file that a host in another process wrote
// for checkpoint id of deployment epoch, before it acknowledges the
// checkpoint (see SnapshotFiles.Push): the file's size bytes are read
// from body and kept only when they match size and checksum.
func (r *Runner) ReceiveFile(epoch uint64, id snapshot.ID, name string, size int64, checksum uint32, body io.Reader) error {
	if epoch != r.epoch {
		r.stale.Add(1)
		return fmt.Errorf("%w: job %q: state file of epoch %d, the job runs epoch %d", ErrStaleDeployment, r.job.Name, epoch, r.epoch)
	}
	select {
	case <-r.started:
		// Checkpointing is open: r.store is set for good.
	default:
		return fmt.Errorf("%w: job %q epoch %d is not started", ErrStaleDeployment, r.job.Name, epoch)
	}
	if r.store == nil {
		return fmt.Errorf("actors: job %q takes no checkpoints", r.job.Name)
	}
	return r.store.Import(id, name, size, checksum, body)
}

// OpenRestoreFile opens state file name of the snapshot deployment epoch
// restores, for a host in another process (see SnapshotFiles.Fetch).
func (r *Runner) OpenRestoreFile(epoch uint64, name string) (*os.File, snapshot.Handle, error) {
	if epoch != r.epoch {
		return nil, snapshot.Handle{}, fmt.Errorf("%w: job %q: restore file of epoch %d, the job runs epoch %d", ErrStaleDeployment, r.job.Name, epoch, r.epoch)
	}
	// The snapshot the deployment restores, or the savepoint of the
	// handover in progress, whose moved subtasks' files the new nodes
	// fetch.
	md := r.mv.md.Load()
	if md == nil {
		md = r.cfg.Restore
	}
	if md == nil {
		return nil, snapshot.Handle{}, fmt.Errorf("actors: job %q epoch %d restores no snapshot", r.job.Name, epoch)
	}
	for _, m := range []*snapshot.Metadata{md, r.cfg.Restore} {
		if m == nil {
			continue
		}
		for _, op := range m.Operators {
			for _, h := range op.Subtasks {
				if h.File == name && name != "" {
					f, err := os.Open(m.FilePath(h))
					return f, h, err
				}
			}
		}
	}
	return nil, snapshot.Handle{}, fmt.Errorf("actors: job %q epoch %d: snapshot %s has no state file %q: %w", r.job.Name, epoch, md.Dir, name, os.ErrNotExist)
}

// Run executes the job until every task has finished (bounded sources),
// a task fails, or ctx is cancelled. It returns nil, the first task's
// *TaskError, or ctx's error. Every goroutine it started has ended when it
// returns.
func (r *Runner) Run(ctx context.Context) (err error) {
	// Whatever happens, the job is over when Run returns: wake whoever
	// waits for it.
	defer r.stopOnce.Do(func() { close(r.done) })
	// A deployment failed on purpose (fail: a redeployment, say) ends
	// with that cause, not with what it cut short (an invitation, a
	// checkpoint's publication).
	defer func() {
		if err != nil {
			err = r.cause(err)
		}
	}()
	var cancel, cancelMoves context.CancelFunc
	r.ctx, cancel = context.WithCancel(ctx)
	defer context.AfterFunc(r.ctx, r.cmdCancel)()
	defer cancel()
	r.moveCtx, cancelMoves = context.WithCancel(r.ctx)
	defer cancelMoves()
	defer r.closeControl()

	hosts, pls, err := r.makeHosts()
	r.hosts = hosts
	r.local.Store(&hosts)
	if r.failed.Load() != nil {
		// Failed while the hosts were being made: fail found none.
		r.cancelLocal()
	}
	defer func() {
		for _, h := range r.hosts {
			h.system.Shutdown()
		}
	}()
	if err != nil {
		r.stop()
		return err
	}
	if md := r.cfg.Restore; md != nil && md.Finished {
		return r.runFinished(md, pls)
	}
	if r.ctl != nil {
		// Every host registers and deploys its tasks over its control
		// channels.
		if err := r.deployRemote(ctx, r.want); err != nil {
			r.cancelHosts()
			r.stop()
			r.closeOperators()
			return err
		}
	} else {
		for i, h := range r.hosts {
			if err := h.build(pls[i]); err != nil {
				r.stop()
				r.closeOperators()
				return err
			}
		}
		for _, h := range r.hosts {
			if err := h.spawn(); err != nil {
				r.stop()
				r.closeOperators()
				return err
			}
		}
	}
	r.log.Info("job starting", "tasks", r.plan.Tasks(), "chains", len(r.plan.Chains), "nodes", len(r.hosts), "epoch", r.epoch)
	if err := r.openCheckpointing(); err != nil {
		r.stop()
		r.closeOperators()
		return err
	}
	// A deployment failed once every host had deployed (a redeployment
	// that landed after the last deployed report, which ended the
	// handshake, say) is not started: its failure report waits in the
	// inbox behind the handshake, and a start would run its sources for
	// an attempt already given up.
	if p := r.failed.Load(); p != nil {
		r.cancelHosts()
		r.stop()
		r.closeOperators()
		return *p
	}
	close(r.started)
	if r.ctl != nil {
		r.commandAll(r.cmdCtx, controlMsg{Kind: ctlStart})
	} else {
		for _, h := range r.hosts {
			h.start()
		}
	}

	clock := r.cfg.Clock
	timer, tick := r.coordinatorTimer(clock, nil)
	remaining := r.plan.Tasks()
wait:
	for !r.over(remaining) {
		var acts []snapshot.Action
		// While a handover runs no other checkpoint is triggered; the
		// handover's savepoint still expires at the checkpoint timeout.
		tickC, spC := tick, r.savepoints
		if r.coord != nil && r.mv.hold != r.held {
			r.held = r.mv.hold
			r.coord.Hold(r.held)
			timer, tick = r.coordinatorTimer(clock, timer)
			tickC = tick
		}
		if r.mv.preparing {
			tickC = nil
		}
		if r.mv.preparing || r.mv.hold {
			spC = nil
		}
		select {
		case rep := <-r.reports:
			if rep.epoch != r.epoch {
				r.stale.Add(1)
				r.log.Debug("report of another epoch dropped", "epoch", rep.epoch, "node", rep.node)
				continue
			}
			switch rep.kind {
			case reportFailed:
				err = rep.err
				break wait
			case reportFinished:
				remaining--
				if remaining == 0 && r.coord != nil {
					// Every task finished its input: the final checkpoint
					// commits the sinks' last results, then the job ends.
					r.log.Info("input ended; taking the final checkpoint")
					acts = r.coord.Step(clock.Now(), snapshot.EndOfData{})
				}
			case reportNotified:
				r.acked++
			case reportInput:
				acts = r.coord.Step(clock.Now(), rep.input)
			}
		case req := <-spC:
			acts = r.coord.Step(clock.Now(), snapshot.TriggerSavepoint{Path: req.path, Stop: req.stop})
			for _, a := range acts {
				switch a := a.(type) {
				case snapshot.Trigger:
					if a.Savepoint {
						r.waiting[a.Checkpoint] = req
					}
				case snapshot.Abort:
					if a.Savepoint {
						r.waiting[a.Checkpoint] = req
					}
				}
			}
		case req := <-r.moves:
			r.onMove(req)
		case mt := <-r.mv.trigger:
			acts = r.triggerMove(clock.Now(), mt)
		case <-r.moveEnded:
			r.moving = false
			r.mv.preparing = false
			r.mv.hold = false
		case <-tickC:
			acts = r.coord.Tick(clock.Now())
		case <-ctx.Done():
			err = ctx.Err()
			break wait
		}
		if len(acts) > 0 {
			if ferr := r.handle(clock.Now(), acts); ferr != nil {
				err = r.cause(ferr)
				break wait
			}
			timer, tick = r.coordinatorTimer(clock, timer)
		}
		if acts := r.startMove(clock.Now()); len(acts) > 0 {
			if ferr := r.handle(clock.Now(), acts); ferr != nil {
				err = r.cause(ferr)
				break wait
			}
			timer, tick = r.coordinatorTimer(clock, timer)
		}
	}
	if timer != nil {
		timer.Stop()
	}
	if err == nil && r.closing != 0 && r.closing != r.final && r.paths[r.closing] != "" && r.acked == r.plan.Tasks() {
		// A stop-with-savepoint every task was notified of: every sink
		// committed it, and a job resumed from it publishes none of its
		// output again. Marked before the caller hears of it, which may
		// resume the job at once. A savepoint not marked is restored as
		// any other, its output committed again.
		if merr := r.markCommitted(r.paths[r.closing]); merr != nil {
			r.log.Warn("stop-with-savepoint not marked committed; a job resumed from it publishes its held output again",
				"checkpoint_id", r.closing, "path", r.paths[r.closing], "err", merr)
		} else if c := r.cfg.Cluster; c != nil && c.Committed != nil {
			// The other nodes' copies too: a node that takes the job
			// masters over restores its own copy.
			ctx, cancel := context.WithTimeout(context.Background(), r.controlTimeout())
			if merr := c.Committed(ctx, r.epoch, r.job.Name, r.closing); merr != nil {
				r.log.Warn("stop-with-savepoint not marked committed on every node; a node that restores its own copy publishes its held output again",
					"checkpoint_id", r.closing, "err", merr)
			}
			cancel()
		}
	}
	if req, ok := r.waiting[r.closing]; ok && err == nil && r.closing != 0 {
		// A stop-with-savepoint: every sink committed it.
		req.reply <- savepointResult{path: r.paths[r.closing]}
		delete(r.waiting, r.closing)
	}
	for id, req := range r.waiting {
		if err != nil {
			req.reply <- savepointResult{err: fmt.Errorf("savepoint %d: the job failed first: %w", id, err)}
			continue
		}
		req.reply <- savepointResult{err: fmt.Errorf("savepoint %d: the job ended first", id)}
	}
	// A handover in progress gives up; queued ones never start.
	cancelMoves()
	r.moveWG.Wait()
	for _, req := range r.moveQueue {
		req.reply <- moveResult{err: fmt.Errorf("%w before the move", ErrJobEnded)}
	}
	r.moveQueue = nil
	// The nodes of other processes hear that the deployment is over while
	// this node's tasks stop: a node that cannot be reached (cut off, say)
	// holds its send up to the control timeout, and this node's tasks
	// must not run on meanwhile. A failed deployment (fail) stopped them
	// already, whatever held the loop.
	cancelled := make(chan struct{})
	go func() {
		defer close(cancelled)
		r.cancelHosts()
	}()
	r.stop()
	<-cancelled
	if cerr := r.closeOperators(); err == nil {
		err = cerr
	}
	if err == nil && r.final != 0 && r.final == r.closing && r.paths[r.final] != "" {
		// Every task handled the final checkpoint's notification: the
		// sinks committed it. A start on it later runs nothing.
		err = r.markCommitted(r.paths[r.final])
	}
	if err != nil {
		r.log.Warn("job stopped", "err", err)
	} else {
		r.log.Info("job finished")
	}
	return err
}

// markCommitted marks the final checkpoint or stop-with-savepoint in dir
// committed by every sink (snapshot.MarkCommitted).
func (r *Runner) markCommitted(dir string) error {
	if err := snapshot.MarkCommitted(dir); err != nil {
		return fmt.Errorf("actors: job %q: %w", r.job.Name, err)
	}
	r.log.Debug("snapshot committed by every sink", "path", dir)
	return nil
}

// over reports whether the job is over: every task finished and, with
// checkpoints, the final checkpoint (or a stop-with-savepoint) completed
// and every task handled its notification.
func (r *Runner) over(remaining int) bool {
	if r.closing != 0 {
		return r.acked == r.plan.Tasks()
	}
	return remaining == 0 && r.coord == nil
}

// command sends a message of the current epoch to every host.
func (r *Runner) command(m any) {
	if r.ctl != nil {
		var c controlMsg
		switch m := m.(type) {
		case triggerMsg:
			c = controlMsg{Kind: ctlTrigger, Checkpoint: m.id, Flag: m.stop}
		case completeMsg:
			c = controlMsg{Kind: ctlComplete, Checkpoint: m.id, Flag: m.ack}
		case abortMsg:
			c = controlMsg{Kind: ctlAbort, Checkpoint: m.id}
		default:
			r.log.Error("command has no control message; not sent", "type", fmt.Sprintf("%T", m))
			return
		}
		r.commandAll(r.cmdCtx, c)
		return
	}
	for _, h := range r.hosts {
		h.command(r.epoch, m)
	}
}

// runFinished handles a restore from the final checkpoint of a job that
// finished. When every sink committed that checkpoint (md.Committed) and
// the job runs on this process alone, nothing is built or restored (the
// mark is the master's: on several nodes the hosts still restore, as
// before the mark). Otherwise (the process died between its
// metadata and the commits) the operators are built and restored, told
// that checkpoint completed, so the sinks commit what it holds, and
// closed, and (on this process alone) the checkpoint is marked committed;
// nothing runs and nothing new is emitted.
func (r *Runner) runFinished(md *snapshot.Metadata, pls []placement) error {
	if md.Committed && r.ctl == nil {
		r.log.Debug("job already finished and its final checkpoint committed; nothing runs",
			"checkpoint_id", md.Checkpoint, "path", md.Dir)
		r.stop()
		return nil
	}
	r.log.Debug("job already finished: committing what its final checkpoint holds; nothing runs",
		"checkpoint_id", md.Checkpoint, "path", md.Dir)
	var err error
	if r.ctl != nil {
		// Every host builds (and so restores) its tasks over its control
		// channels; none starts.
		err = r.deployRemote(r.ctx, r.want)
		r.cancelHosts()
	} else {
		for i, h := range r.hosts {
			if err = h.build(pls[i]); err != nil {
				break
			}
		}
		// The restored checkpoint is complete: the sinks finish
		// committing it before they are closed.
		for _, h := range r.hosts {
			if err != nil {
				break
			}
			err = h.commitRestored(int64(md.Checkpoint))
		}
	}
	r.stop()
	if cerr := r.closeOperators(); err == nil {
		err = cerr
	}
	if err == nil && md.Dir != "" && r.ctl == nil {
		err = r.markCommitted(md.Dir)
	}
	return err
}

// cancelHosts tells every host that the deployment is over, within the
// control timeout: its tasks stop taking input.
func (r *Runner) cancelHosts() {
	if r.ctl == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.controlTimeout())
	defer cancel()
	m := controlMsg{Kind: ctlCancel, Job: r.job.Name, Epoch: r.epoch}
	down, _, _ := r.ctl.live()
	for _, s := range down {
		_ = s.send(ctx, &m)
	}
}

// cancelLocal stops the tasks of this node's hosts taking input at once
// (host.cancelTasks), without waiting for them or for anything else: a
// task blocked sending unwinds, and every message that reaches a task
// after it is dropped. Called from any goroutine.
func (r *Runner) cancelLocal() {
	if p := r.local.Load(); p != nil {
		for _, h := range *p {
			h.cancelTasks()
		}
	}
}

// stop stops every host.
func (r *Runner) stop() {
	r.stopOnce.Do(func() { close(r.done) })
	for _, h := range r.hosts {
		h.stop()
	}
}

// closeOperators closes the operators of every host.
func (r *Runner) closeOperators() error {
	var errs []error
	for _, h := range r.hosts {
		errs = append(errs, h.closeOperators())
	}
	return errors.Join(errs...)
}

// tasks returns every task built, host by host.
func (r *Runner) tasks() []*task {
	var ts []*task
	for _, h := range r.hostList() {
		ts = append(ts, h.taskList()...)
	}
	return ts
}

// Stats returns what every task did. Call it after Run has returned.
func (r *Runner) Stats() Stats {
	var s Stats
	for _, t := range r.tasks() {
		st := t.stats
		st.BatchesIn, st.RecordsIn, st.BatchesOut = t.live.batchesIn.Load(), t.live.recordsIn.Load(), t.live.batchesOut.Load()
		st.Watermark, st.RecordsOut = t.live.watermark.Load(), t.live.recordsOut.Load()
		s.Tasks = append(s.Tasks, st)
	}
	for _, h := range r.hostList() {
		h.mu.Lock()
		chans := slices.Clone(h.chans)
		h.mu.Unlock()
		for _, ch := range chans {
			s.Channels = append(s.Channels, ChannelStats{
				To:          ch.toName,
				ToSubtask:   ch.toSub,
				Batches:     ch.sent.Load(),
				MaxInFlight: ch.maxInFlight.Load(),
				Credits:     ch.credits,
				Halved:      ch.halved.Load(),
			})
		}
	}
	return s
}

// TaskMetrics are the live counters of one task (a chain's subtask).
type TaskMetrics struct {
	Chain     string
	Subtask   int
	Operators []string
	// Parallelism of the chain.
	Parallelism int
	RecordsIn   int64
	// RecordsOut counts the records the chain emitted: those it sent to
	// other tasks (a broadcast record once per target) and, for a chain
	// ending in a sink, those its last operator before the sink passed to
	// the sink.
	RecordsOut int64
	BatchesIn  int64
	BatchesOut int64
	// Watermark is the last watermark the task sent on (MinInt64 before
	// the first).
	Watermark int64
	// Backpressure is how long the task waited for credit to send.
	Backpressure time.Duration
	// Queued is the number of messages in its mailbox.
	Queued int64
}

// Metrics returns the live counters of every task that takes input; nil
// before the job is built. The tasks of a host that stopped (the
// deployment failed or ended) are left out, though Run may still be
// waiting for the other nodes or for an operator call under way: they
// take no more input. Safe to call from any goroutine while the job runs.
func (r *Runner) Metrics() []TaskMetrics {
	select {
	case <-r.started:
	default:
		return nil
	}
	var ts []*task
	for _, h := range r.hosts {
		if !h.stopping() {
			ts = append(ts, h.taskList()...)
		}
	}
	return taskMetrics(ts)
}

// taskMetrics returns the live counters of tasks.
func taskMetrics(tasks []*task) []TaskMetrics {
	out := make([]TaskMetrics, 0, len(tasks))
	for _, t := range tasks {
		m := TaskMetrics{
			Chain:       t.stats.Chain,
			Subtask:     t.subtask,
			Parallelism: t.chain.Head().Parallelism,
			RecordsIn:   t.live.recordsIn.Load(),
			RecordsOut:  t.live.recordsOut.Load(),
			BatchesIn:   t.live.batchesIn.Load(),
			BatchesOut:  t.live.batchesOut.Load(),
			Watermark:   t.live.watermark.Load(),
			Queued:      t.pending.Load(),
		}
		for _, v := range t.chain.Vertices {
			m.Operators = append(m.Operators, v.Name)
		}
		var blocked int64
		for _, ch := range t.outChans {
			for c := ch; c != nil; c = c.next.Load() {
				blocked += c.blocked.Load()
			}
		}
		m.Backpressure = time.Duration(blocked)
		out = append(out, m)
	}
	return out
}

// Stats are the counters of a finished job.
type Stats struct {
	Tasks    []TaskStats
	Channels []ChannelStats
}

// ChannelStats counts what one channel carried.
type ChannelStats struct {
	To          string
	ToSubtask   int
	Batches     int64
	MaxInFlight int64
	Credits     int
	// Halved counts the batches to another node whose encoding was over
	// the channel's frame cap, sent in halves (encoded again).
	Halved int64
}

// checkRestore matches a snapshot to the job: the same number of key
// groups, and every operator with state in the snapshot still in the job
// unless allowNonRestored.
func checkRestore(job *Job, md *snapshot.Metadata, allowNonRestored bool) error {
	if md.MaxParallelism != job.maxParallelism() {
		return fmt.Errorf("actors: restore from %s: it has %d key groups, the job %d: max parallelism is fixed for the life of a job's state", md.Dir, md.MaxParallelism, job.maxParallelism())
	}
	uids := make(map[string]bool, len(job.Vertices))
	for _, v := range job.Vertices {
		uids[v.UID] = true
	}
	var missing []string
	for _, op := range md.Operators {
		if !uids[op.UID] && hasStateFile(op) {
			missing = append(missing, op.UID)
		}
	}
	if len(missing) > 0 && !allowNonRestored {
		return fmt.Errorf("actors: restore from %s: the job has no operator with uid %q; allow non-restored state to skip it (edged run --allow-non-restored; stream.WithSavepoint(path, true))", md.Dir, missing)
	}
	for _, v := range job.Vertices {
		op, ok := md.Operator(v.UID)
		if ok && settingsDiffer(op.Settings, v.StateSettings) && hasStateFile(*op) {
			return fmt.Errorf("actors: restore from %s: operator %q keeps state shaped by other settings than the job's (snapshot %q, job %q): %w; start it without this snapshot, or with the settings it was taken with",
				md.Dir, v.UID, op.Settings, v.StateSettings, state.ErrIncompatibleState)
		}
	}
	return nil
}

// recordSettings records each operator's StateSettings in md.
func (j *Job) recordSettings(md *snapshot.Metadata) {
	for i := range md.Operators {
		if v := j.vertexByUID(md.Operators[i].UID); v != nil {
			md.Operators[i].Settings = v.StateSettings
		}
	}
}

// vertexByUID returns the vertex of uid, or nil.
func (j *Job) vertexByUID(uid string) *Vertex {
	for _, v := range j.Vertices {
		if v.UID == uid {
			return v
		}
	}
	return nil
}
