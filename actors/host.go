package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/edgedio/edged/keygroup"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/state"
	"github.com/edgedio/edged/watermark"
)

// reportKind says what a host reports to the job master.
type reportKind int

const (
	// reportFinished: a task finished its input.
	reportFinished reportKind = iota
	// reportFailed: a task (or one of its channels) failed with err.
	reportFailed
	// reportInput: a checkpoint acknowledgement or decline, in input.
	reportInput
	// reportNotified: a task handled the notification of the checkpoint
	// that ends the job.
	reportNotified
	// reportRegister: a host registered, with its plan's fingerprint.
	reportRegister
	// reportDeployed: a host built and spawned its tasks.
	reportDeployed
)

// hostReport is a message from a task host to the job master. It carries
// the epoch of the deployment it belongs to: the master drops and counts
// reports of another epoch.
type hostReport struct {
	epoch uint64
	node  string
	kind  reportKind
	err   error
	input snapshot.Input
	// fingerprint is a registering host's plan fingerprint.
	fingerprint string
}

// host is the task host of one node for one deployment (epoch) of a job:
// it builds the tasks placed on its node, wires their channels (local ones
// as buffers shared with the receiving task, remote ones through the
// node's Network), writes their snapshot files, and reports to the job
// master only by hostReport messages. Tasks reach their host, never the
// master.
type host struct {
	node   string
	epoch  uint64
	job    *Job
	plan   *Plan
	cfg    Config
	maxP   int
	log    *slog.Logger
	net    Network
	system *actor.ActorSystem
	// reports is the master's inbox.
	reports chan<- hostReport
	// started is closed once every host of the deployment spawned its
	// tasks.
	started <-chan struct{}
	// store is where snapshot files are written; set before started.
	store *snapshot.Store
	// ctl is the host's end of its control channels with the master, in a
	// cluster; nil in a single process, where reports go to the master's
	// inbox directly.
	ctl *hostCtl
	// pl is where the plan's tasks run.
	pl placement
	// files, on a node in another process than the job master's (on
	// master), pushes each state file the host writes to the master before
	// the acknowledgement; store is then the node's own staging store,
	// where checkpoints begin when their trigger arrives.
	files  SnapshotFiles
	master string
	// staging is set on a worker's host, whose store is its own staging
	// store: checkpoints begin there when their trigger arrives. On the
	// master's node the runner begins them in the job's store.
	staging bool
	// seen, when set, is raised to every checkpoint id triggered here.
	seen *atomic.Int64
	// staged says which checkpoints were begun (true) or ended (false)
	// in the staging store, above stageFloor: those at or below it count
	// as ended. stageMu guards both and serialises the begins.
	stageMu    sync.Mutex
	staged     map[int64]bool
	stageFloor int64

	// mu guards tasks, chans and remotes once the host is started: a
	// handover replaces a task while the others run (handover_host.go).
	mu      sync.Mutex
	tasks   []*task
	chans   []*channel
	remotes []func() // close the remote ends of channels
	// parked are the channels the host's tasks parked at a handover
	// barrier, by the key of the channel they replace (generation 0 of
	// it); guarded by mu.
	parked map[ChannelKey]*parking
	// handovers counts the tasks handed over to another node or taken
	// over from one.
	handovers atomic.Int64

	// done is closed when the host stops; tasks blocked on credit unwind.
	done     chan struct{}
	stopOnce sync.Once
	// ctx ends with done, for the remote senders.
	ctx    context.Context
	cancel context.CancelFunc
	// waiters tracks the goroutines awaiting source availability.
	waiters sync.WaitGroup
	// snapshots tracks the goroutines writing snapshots.
	snapshots sync.WaitGroup
	// stale counts master commands of another epoch, dropped.
	stale atomic.Int64
}

func newHost(node string, epoch uint64, job *Job, plan *Plan, cfg Config, net Network, reports chan<- hostReport, started <-chan struct{}) *host {
	ctx, cancel := context.WithCancel(context.Background())
	log := cfg.Logger.With("job", job.Name)
	if node != "" {
		log = log.With("node", node)
	}
	return &host{
		node: node, epoch: epoch, job: job, plan: plan, cfg: cfg, maxP: job.maxParallelism(), log: log, net: net,
		reports: reports, started: started,
		done: make(chan struct{}), ctx: ctx, cancel: cancel,
	}
}

// stopping reports whether the host stopped.
func (h *host) stopping() bool {
	select {
	case <-h.done:
		return true
	default:
		return false
	}
}

// send delivers a report to the master, unless the host stopped first.
func (h *host) send(rep hostReport) {
	rep.epoch, rep.node = h.epoch, h.node
	if h.ctl != nil {
		h.sendReport(rep)
		return
	}
	select {
	case h.reports <- rep:
	case <-h.done:
	}
}

// report tells the master that t ended: nil when it finished, its error
// when it failed. Called from the task's goroutine.
func (h *host) report(_ *task, err error) {
	if err != nil {
		h.send(hostReport{kind: reportFailed, err: err})
		return
	}
	h.send(hostReport{kind: reportFinished})
}

// notified tells the master that a task handled the notification of the
// checkpoint that ends the job; called from the task's goroutine.
func (h *host) notified() { h.send(hostReport{kind: reportNotified}) }

// input hands a checkpoint acknowledgement or decline to the master;
// called from the tasks' snapshot writers. On a node in another process
// than the master's, the state files of an acknowledgement are pushed to
// the master first: the acknowledgement counts only once they are there;
// a file that cannot be pushed declines the checkpoint.
func (h *host) input(in snapshot.Input) {
	if ack, ok := in.(snapshot.Ack); ok && h.files != nil {
		if err := h.push(ack); err != nil {
			in = snapshot.Decline{Checkpoint: ack.Checkpoint, Task: ack.Task, Reason: err}
		}
	}
	h.send(hostReport{kind: reportInput, input: in})
}

// push copies the state files of ack to the job master (and, through
// SnapshotFiles, to the peers that keep replicas of them).
func (h *host) push(ack snapshot.Ack) error {
	for uid, hd := range ack.State.Operators {
		if hd.File == "" {
			continue
		}
		path := h.store.FilePath(ack.Checkpoint, hd.File)
		if err := h.files.Push(h.ctx, h.master, h.job.Name, h.epoch, ack.Checkpoint, path, hd); err != nil {
			return fmt.Errorf("push state file of %q[%d] of checkpoint %d to the job master on %q: %w", uid, ack.Task.Subtask, ack.Checkpoint, h.master, err)
		}
	}
	return nil
}

// stage begins checkpoint id in the node's staging store, on a node in
// another process than the master's, before its tasks hear the trigger;
// after a checkpoint's end, its staged files are removed.
func (h *host) stage(id int64, begin bool) {
	if begin && h.seen != nil {
		for cur := h.seen.Load(); id > cur && !h.seen.CompareAndSwap(cur, id); cur = h.seen.Load() {
		}
	}
	if !h.staging || h.store == nil {
		return
	}
	if begin {
		// A task may meet a checkpoint's barrier, from a task on
		// another node, before the trigger reaches its host: the first
		// of the two begins the checkpoint here. One begun or ended
		// before is not begun again. With several checkpoints in
		// progress, a newer one may begin first: an older one is still
		// begun when its trigger comes.
		h.stageMu.Lock()
		defer h.stageMu.Unlock()
		if _, ok := h.staged[id]; ok || id <= h.stageFloor {
			return
		}
		if h.staged == nil {
			h.staged = make(map[int64]bool)
		}
		h.staged[id] = true
		if _, err := h.store.Begin(snapshot.Trigger{Checkpoint: snapshot.ID(id)}); err != nil {
			// The tasks' snapshots then fail to create their files and
			// decline the checkpoint.
			h.log.Warn("stage checkpoint", "checkpoint_id", id, "err", err)
		}
		return
	}
	h.endStaged(id)
	if err := h.store.Discard(snapshot.ID(id)); err != nil {
		h.log.Warn("remove staged checkpoint", "checkpoint_id", id, "err", err)
	}
}

// maxStaged bounds the checkpoints a host remembers as begun or ended:
// beyond it the oldest ended ones are forgotten, and every id up to them
// counts as ended.
const maxStaged = 128

// endStaged records that checkpoint id ended.
func (h *host) endStaged(id int64) {
	h.stageMu.Lock()
	defer h.stageMu.Unlock()
	if id <= h.stageFloor {
		// Below the floor it counts as ended already; one begun before
		// the floor rose past it is forgotten now.
		delete(h.staged, id)
		return
	}
	if h.staged == nil {
		h.staged = make(map[int64]bool)
	}
	h.staged[id] = false
	if len(h.staged) <= maxStaged {
		return
	}
	ended := make([]int64, 0, len(h.staged))
	for k, begun := range h.staged {
		if !begun {
			ended = append(ended, k)
		}
	}
	slices.Sort(ended)
	for _, k := range ended[:len(ended)/2] {
		delete(h.staged, k)
		h.stageFloor = max(h.stageFloor, k)
	}
}

// command delivers a message of the master's deployment epoch to every
// task of the host; one of another epoch is dropped and counted.
func (h *host) command(epoch uint64, m any) {
	if epoch != h.epoch {
		h.stale.Add(1)
		h.log.Debug("command of another epoch dropped", "epoch", epoch, "host_epoch", h.epoch)
		return
	}
	for _, t := range h.taskList() {
		h.system.Root.Send(t.pid, m)
	}
}

// taskList returns the host's tasks.
func (h *host) taskList() []*task {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.tasks)
}

// await sends pollMsg to source task t once ready is ready, unless the
// host stops or t is retired (handed over to another node) first.
func (h *host) await(ready <-chan struct{}, t *task) {
	h.waiters.Add(1)
	go func() {
		defer h.waiters.Done()
		select {
		case <-ready:
			h.system.Root.Send(t.pid, pollMsg{})
		case <-h.done:
		case <-t.gone:
		}
	}()
}

// spawn starts an actor per task.
func (h *host) spawn() error {
	for i, t := range h.tasks {
		props := actor.PropsFromProducer(func() actor.Actor { return t })
		if _, err := h.system.Root.SpawnNamed(props, fmt.Sprintf("task-%d", i)); err != nil {
			return fmt.Errorf("actors: spawn task %d: %w", i, err)
		}
	}
	return nil
}

// start tells the host's tasks that every task of the job is spawned:
// the sources start polling, and every task arms its processing-time
// timers.
func (h *host) start() {
	for _, t := range h.taskList() {
		h.system.Root.Send(t.pid, startMsg{})
	}
}

// stop unblocks every task, stops every actor, waits for the goroutines
// the host started and closes the remote ends of its channels.
func (h *host) stop() {
	h.cancelTasks()
	if h.ctl != nil {
		// The control goroutines end before the tasks are stopped.
		h.ctl.wait()
	}
	for _, t := range h.taskList() {
		if t.pid != nil && h.system != nil {
			_ = h.system.Root.StopFuture(t.pid).Wait()
		}
	}
	h.waiters.Wait()
	h.snapshots.Wait()
	h.mu.Lock()
	remotes := h.remotes
	h.remotes = nil
	h.mu.Unlock()
	for _, c := range remotes {
		c()
	}
	h.closeControl()
}

// channelFailed fails the job for a cross-node channel's failure: the
// master restarts it by its restart strategy.
func (h *host) channelFailed(t *task, err error) {
	v := t.chain.Head()
	h.send(hostReport{kind: reportFailed, err: &TaskError{
		Job: h.job.Name, Operator: v.Name, UID: v.UID, Subtask: t.subtask, Parallelism: v.Parallelism, Err: err,
	}})
}

// closeOperators closes every operator that was built, tail first, then
// the state backends.
func (h *host) closeOperators() error {
	var errs []error
	tasks := h.taskList()
	defer func() {
		for _, t := range tasks {
			for _, c := range t.closers {
				if err := c(); err != nil {
					h.log.Warn("close state backend", "err", err)
				}
			}
			t.closers = nil
		}
	}()
	for _, t := range tasks {
		for i := len(t.ops) - 1; i >= 0; i-- {
			if t.ops[i] == nil {
				continue
			}
			if err := h.closeOperator(t, i); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// closeOperator closes operator i of t. Close is user code (a sink's, or
// the Abort of a Transactional a two-phase-commit sink closes): a panic
// in it is returned as a *TaskError naming the operator, with the panic
// and its stack, as a panic while the task runs is, instead of unwinding
// the goroutine that stops the job (the caller of Execute) and leaving
// the other operators unclosed.
func (h *host) closeOperator(t *task, i int) (err error) {
	v := t.chain.Vertices[i]
	defer func() {
		if r := recover(); r != nil {
			te := &TaskError{Job: h.job.Name, Operator: v.Name, UID: v.UID, Subtask: t.subtask, Parallelism: v.Parallelism}
			setCause(te, r)
			err = fmt.Errorf("close operator %q subtask %d: %w", v.Name, t.subtask, te)
		}
	}()
	if err := t.ops[i].Close(); err != nil {
		return fmt.Errorf("close operator %q subtask %d: %w", v.Name, t.subtask, err)
	}
	return nil
}

// commitRestored tells every operator of the host's built (not started)
// tasks that checkpoint id, the one they were restored from, completed,
// and waits for what they deliver in the background
// (operators.CommitWaiter), and returns the first failure of each: a
// write-ahead sink waits there for the re-publish of what it restored,
// which closing it would cut short. For the final checkpoint of a finished job, whose tasks never
// run. Called from the runner's goroutine: no task runs.
func (h *host) commitRestored(id int64) error {
	var errs []error
	for _, t := range h.taskList() {
		for i, op := range t.ops {
			l, ok := op.(operators.CheckpointListener)
			if !ok {
				continue
			}
			if err := h.notifyRestored(t, i, l, id); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// notifyRestored calls l.NotifyCheckpointComplete(id) for operator i of
// t, then its WaitCommitted if it has one, turning a failure or a panic
// into a TaskError.
func (h *host) notifyRestored(t *task, i int, l operators.CheckpointListener, id int64) (err error) {
	v := t.chain.Vertices[i]
	te := &TaskError{Job: h.job.Name, Operator: v.Name, UID: v.UID, Subtask: t.subtask, Parallelism: v.Parallelism}
	defer func() {
		if r := recover(); r != nil {
			setCause(te, r)
			err = te
		}
	}()
	if err := l.NotifyCheckpointComplete(id); err != nil {
		te.Err = err
		return te
	}
	if w, ok := l.(operators.CommitWaiter); ok {
		if err := w.WaitCommitted(id); err != nil {
			te.Err = err
			return te
		}
	}
	return nil
}

// placement says where the tasks of a plan run: nodeOf names a subtask's
// node ("" everywhere in a single process), crosses marks the edges with
// a channel between two nodes.
type placement struct {
	nodeOf  func(c *Chain, sub int) string
	crosses map[*Edge]bool
}

func localPlacement() placement {
	return placement{nodeOf: func(*Chain, int) string { return "" }}
}

func clusterPlacement(c *Cluster, plan *Plan) placement {
	p := placement{nodeOf: c.nodeOf, crosses: make(map[*Edge]bool)}
	tailOf := make(map[*Vertex]*Chain)
	for _, ch := range plan.Chains {
		tailOf[ch.Tail()] = ch
	}
	for _, ch := range plan.Chains {
		for _, e := range ch.In {
			from := tailOf[e.From]
			for j := range ch.Head().Parallelism {
				for i := range from.Head().Parallelism {
					if e.Partition == Forward && i != j {
						continue
					}
					if p.nodeOf(from, i) != p.nodeOf(ch, j) {
						p.crosses[e] = true
					}
				}
			}
		}
	}
	return p
}

// build creates the host's tasks, the channels between them and to other
// nodes, and the operator instances, and opens the operators.
func (h *host) build(pl placement) error {
	edgeIndex := make(map[*Edge]int, len(h.job.Edges))
	for i, e := range h.job.Edges {
		edgeIndex[e] = i
	}
	// Every subtask of the plan, local or not: channels are numbered the
	// same way on every node.
	byChain := make(map[*Chain][]*task)
	for _, c := range h.plan.Chains {
		for i := range c.Head().Parallelism {
			t := &task{run: h, chain: c, subtask: i, gone: make(chan struct{})}
			t.stats.Chain, t.stats.Subtask = c.Name(), i
			t.live.watermark.Store(math.MinInt64)
			if pl.nodeOf(c, i) == h.node {
				t.pid = h.system.NewLocalPID(fmt.Sprintf("task-%d", len(h.tasks)))
				h.tasks = append(h.tasks, t)
			} else {
				t.remote = pl.nodeOf(c, i)
			}
			byChain[c] = append(byChain[c], t)
		}
	}
	tailOf := make(map[*Vertex]*Chain)
	for _, c := range h.plan.Chains {
		tailOf[c.Tail()] = c
	}
	// outChans[task][edge] lists the channels of one outgoing edge by
	// target subtask.
	outChans := make(map[*task]map[*Edge][]*channel)
	for _, c := range h.plan.Chains {
		for _, e := range c.In {
			senders := byChain[tailOf[e.From]]
			crosses := pl.crosses[e]
			if crosses {
				if err := e.Type().hasCodec(); err != nil {
					return fmt.Errorf("edge %q -> %q crosses nodes: %w", e.From.Name, e.To.Name, err)
				}
			}
			wire := h.cfg.SerializeKeyBy && e.Partition == KeyBy || crosses
			for j, recv := range byChain[c] {
				for i, send := range senders {
					if e.Partition == Forward && i != j {
						continue
					}
					if send.remote != "" && recv.remote != "" {
						continue
					}
					// The receiver's input index counts every channel
					// into it, local or remote.
					ch := newChannel(recv.nIn, recv, nil)
					recv.nIn++
					ch.gate = e.Input
					ch.toName, ch.toSub = c.Name(), j
					key := ChannelKey{Job: h.job.Name, Epoch: h.epoch, Edge: edgeIndex[e], From: i, To: j}
					ch.key = key
					ch.from = TaskKey{UID: tailOf[e.From].Head().UID, Subtask: i}
					ch.dest = TaskKey{UID: c.Head().UID, Subtask: j}
					switch {
					case send.remote == "" && recv.remote == "":
						ch.credits = h.cfg.Credits
						for range h.cfg.Credits {
							ch.free = append(ch.free, e.Type().newBuffer(ch, h.cfg.BatchSize, wire))
						}
					case recv.remote != "":
						// The receiver runs on another node: the credits
						// are the network's; one buffer to encode into.
						ch.to = nil
						ch.credits = 1
						ch.free = append(ch.free, e.Type().newBuffer(ch, h.cfg.BatchSize, true))
						s := send
						out, err := h.net.OpenSender(key, recv.remote, h.onFailure(s, ch))
						if err != nil {
							return fmt.Errorf("actors: open channel %v to node %q: %w", key, recv.remote, err)
						}
						ch.out = out
						h.remotes = append(h.remotes, ch.closeRemote)
					default:
						// The sender runs on another node.
						r := recv
						in, err := h.net.OpenReceiver(key, send.remote, h.deliverer(r, ch), h.onFailure(r, ch))
						if err != nil {
							return fmt.Errorf("actors: open channel %v from node %q: %w", key, send.remote, err)
						}
						ch.in = in
						h.remotes = append(h.remotes, ch.closeRemote)
					}
					if recv.remote == "" {
						recv.inChans = append(recv.inChans, ch)
					}
					if send.remote == "" {
						if outChans[send] == nil {
							outChans[send] = make(map[*Edge][]*channel)
						}
						outChans[send][e] = append(outChans[send][e], ch)
						send.outChans = append(send.outChans, ch)
					}
					h.chans = append(h.chans, ch)
				}
			}
		}
	}
	for _, t := range h.tasks {
		if err := h.buildTask(t, outChans[t], pl.crosses, h.cfg.Restore); err != nil {
			return err
		}
	}
	return nil
}

// deliverer returns the function that hands the messages of a remote
// channel into the receiving task's mailbox, in sequence.
func (h *host) deliverer(t *task, ch *channel) func(RemoteFrame) {
	return func(f RemoteFrame) {
		var m message
		switch f.Kind {
		case FrameBatch:
			m = &wireBatch{ch: ch, data: f.Body, seq: f.Seq}
		case FrameWatermark:
			m = &watermarkMsg{ch: ch, wm: f.Value}
		case FrameStatus:
			m = &statusMsg{ch: ch, idle: f.Value == 1}
		case FrameBarrier:
			m = &barrierMsg{ch: ch, id: f.Value}
		case FrameEnd:
			m = &endOfStream{ch: ch}
		default:
			h.channelFailed(t, fmt.Errorf("actors: unknown frame kind %d on channel to %s[%d]", f.Kind, ch.toName, ch.toSub))
			return
		}
		t.pending.Add(1)
		h.system.Root.Send(t.pid, m)
	}
}

// buildTask builds t's operators and routers, restores them from md (when
// not nil) and opens them. An edge in crosses is serialised. A panic in
// user code called here (a source, operator or sink factory, Open,
// RestoreState) fails the task like a panic while it runs: the error is
// a *TaskError naming the operator.
func (h *host) buildTask(t *task, out map[*Edge][]*channel, crosses map[*Edge]bool, md *snapshot.Metadata) (err error) {
	c := t.chain
	// cur is the operator being built, named by a panic.
	cur := c.Head()
	defer func() {
		if r := recover(); r != nil {
			te := &TaskError{Job: h.job.Name, Operator: cur.Name, UID: cur.UID, Subtask: t.subtask, Parallelism: cur.Parallelism}
			setCause(te, r)
			err = te
		}
	}()
	n := len(c.Vertices)
	t.ops = make([]operators.Operator, n)
	t.ctxs = make([]*operators.Context, n)
	t.time.Timestamp = operators.NoTimestamp
	if len(t.inChans) > 0 {
		t.merger = watermark.NewMerger(len(t.inChans))
		t.aligner = NewAligner(len(t.inChans), h.cfg.Checkpoint.Mode != snapshot.AtLeastOnce)
	}

	// The tail's outputs: one router per outgoing edge, the main ones
	// fanned out together and the side outputs by tag.
	tail := c.Tail()
	var mains []any
	sides := make(map[string][]any)
	for _, e := range c.Out {
		rt := e.Type().newRouter(t, e, out[e], crosses[e])
		t.routers = append(t.routers, rt)
		if e.Output == "" {
			mains = append(mains, rt)
		} else {
			sides[e.Output] = append(sides[e.Output], rt)
		}
	}
	var next any
	if tail.Out != nil {
		next = joinOutputs(tail.Out, mains)
	}
	sideOut := make(map[string]any, len(sides))
	for tag, rs := range sides {
		sideOut[tag] = joinOutputs(tail.SideOutputs[tag], rs)
	}

	// Operators from tail to head, each wired to the next one's input.
	for i := n - 1; i >= 0; i-- {
		v := c.Vertices[i]
		cur = v
		ctx, err := h.newContext(t, i)
		if err != nil {
			return h.buildError(v, t.subtask, fmt.Errorf("state backend: %w", err))
		}
		if i == n-1 {
			ctx.SideOutput = func(tag string) any { return sideOut[tag] }
		}
		t.ctxs[i] = ctx
		if v.IsSource() {
			src, err := v.NewSource(ctx)
			if err != nil {
				return h.buildError(v, t.subtask, err)
			}
			if src == nil {
				return h.buildError(v, t.subtask, errors.New("the source factory returned nil"))
			}
			t.ops[i] = src
			if t.source, err = v.Out.newSourceDriver(src, next); err != nil {
				return h.buildError(v, t.subtask, err)
			}
			continue
		}
		op, in, err := v.NewOperator(ctx, next)
		if err != nil {
			return h.buildError(v, t.subtask, err)
		}
		if op == nil || in == nil {
			return h.buildError(v, t.subtask, errors.New("the factory returned nil"))
		}
		t.ops[i] = op
		if i > 0 {
			// Records reaching a sink at the chain's end are the
			// chain's output.
			next = v.In.newTracker(t, i, in, i == n-1 && v.Out == nil)
		} else {
			next = in
		}
	}
	if head := c.Head(); !head.IsSource() {
		cur = head
		t.inputs = make([]input, len(t.inChans))
		for k, ch := range t.inChans {
			typ, in := head.In, next
			if head.In2 != nil {
				ins, ok := next.([2]any)
				if !ok {
					return h.buildError(head, t.subtask, fmt.Errorf("%w: two-input operator returned %T, want [2]any", ErrInvalidJob, next))
				}
				in = ins[ch.gate]
				if ch.gate == 1 {
					typ = head.In2
				}
			}
			input, err := typ.newInput(in, &t.time)
			if err != nil {
				return h.buildError(head, t.subtask, err)
			}
			t.inputs[k] = input
		}
	}
	// Restore keyed and operator state before Open, raw state after.
	raws := make([][][]byte, n)
	oldPs := make([]int, n)
	if md != nil {
		for i, v := range c.Vertices {
			cur = v
			t.ctxs[i].Restored = true
			t.ctxs[i].RestoredCommitted = md.Committed
			var err error
			if raws[i], oldPs[i], err = h.restoreOperator(md, v, t.subtask, t.ctxs[i]); err != nil {
				return h.buildError(v, t.subtask, fmt.Errorf("restore from %s: %w", md.Dir, err))
			}
		}
		if err := h.restoreTime(md, t); err != nil {
			return h.buildError(c.Head(), t.subtask, fmt.Errorf("restore event time from %s: %w", md.Dir, err))
		}
	}
	t.flushers = nil
	for i := n - 1; i >= 0; i-- {
		cur = c.Vertices[i]
		if err := t.ops[i].Open(t.ctxs[i]); err != nil {
			return h.buildError(c.Vertices[i], t.subtask, fmt.Errorf("open: %w", err))
		}
		if _, ok := t.ops[i].(operators.Flusher); ok {
			t.flushers = append(t.flushers, int32(i))
		}
	}
	for i, op := range t.ops {
		if raws[i] == nil {
			continue
		}
		if rs, ok := op.(operators.Restorer); ok {
			cur = c.Vertices[i]
			if err := rs.RestoreState(raws[i], oldPs[i]); err != nil {
				return h.buildError(c.Vertices[i], t.subtask, fmt.Errorf("restore: %w", err))
			}
		}
	}
	return nil
}

// joinOutputs returns the collector feeding every output in outs: the one
// output itself, a fan-out, or a discarding collector when there is none.
func joinOutputs(typ ElemType, outs []any) any {
	if len(outs) == 1 {
		return outs[0]
	}
	return typ.newFanout(outs)
}

func (h *host) buildError(v *Vertex, subtask int, err error) error {
	return &TaskError{Job: h.job.Name, Operator: v.Name, UID: v.UID, Subtask: subtask, Parallelism: v.Parallelism, Err: err}
}

func (h *host) newContext(t *task, i int) (*operators.Context, error) {
	v, subtask := t.chain.Vertices[i], t.subtask
	kg := keygroup.RangeFor(subtask, v.Parallelism, h.maxP)
	ctx := &operators.Context{
		Job:            h.job.Name,
		Operator:       v.Name,
		UID:            v.UID,
		Subtask:        subtask,
		Parallelism:    v.Parallelism,
		MaxParallelism: h.maxP,
		KeyGroups:      kg,
		Logger:         h.log.With("operator", v.Name, "subtask", subtask),
		Clock:          h.cfg.Clock,
		Time:           &t.time,
		OperatorState:  state.NewOperatorStore(),
		ProcessingTime: procService{t: t, op: i},
		EmitWatermark:  func(wm int64) { t.watermark(i+1, wm) },
		EmitIdle:       func(idle bool) { t.status(idle) },
		Done:           h.done,
	}
	// With checkpoints, the final checkpoint commits the sinks' last
	// records, not Finish.
	ctx.FinalCheckpoint = h.cfg.Checkpoint.Dir != ""
	if ctx.FinalCheckpoint {
		ctx.OperatorState.RequireCodecs() // a state it cannot snapshot fails at Open
	}
	if ctx.FinalCheckpoint && h.cfg.Checkpoint.Interval > 0 {
		// An exactly-once sink's first held record brings the run's
		// first checkpoint forward.
		ctx.OutputHeld = func() { h.input(snapshot.OutputHeld{Task: t.taskID()}) }
	}
	if v.Keyed {
		switch h.cfg.StateBackend.Kind {
		case BoltBackend:
			dir := filepath.Join(h.cfg.StateBackend.Dir, jobDirName(h.job.Name))
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return nil, err
			}
			// A declared pipeline's UIDs hold a '/': escaped, as in the
			// snapshots' file names, not a directory that does not exist.
			path := filepath.Join(dir, fmt.Sprintf("%s.%d.db", snapshot.FileName(v.UID), subtask))
			b, err := state.NewBoltBackend(path, kg, h.cfg.Clock, h.cfg.StateBackend.Bolt)
			if err != nil {
				return nil, err
			}
			t.closers = append(t.closers, b.Close)
			ctx.State = b
		default:
			mem := state.NewMemoryBackend(kg, h.cfg.Clock)
			if h.cfg.Checkpoint.Dir != "" {
				mem.RequireCodecs() // a state it cannot snapshot fails at Open
			}
			ctx.State = mem
		}
	}
	return ctx, nil
}

// jobDirName is the directory of a job's bolt files under the backend's
// dir: the job's name escaped as a snapshot file name is, so that a name
// holding a '/' stays one directory and one holding "../" does not lead
// out of the dir, where the backend removes the file it starts afresh.
// The names FileName leaves a directory of no name of its own (empty, "."
// and "..") are spelled so that no other name's escape matches them.
func jobDirName(job string) string {
	switch name := snapshot.FileName(job); name {
	case "":
		return "%"
	case ".", "..":
		return strings.ReplaceAll(name, ".", "%2E")
	default:
		return name
	}
}
