package actors

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/edgedio/edged/snapshot"
)

// A handover moves subtasks of a running job to other nodes while every
// other subtask keeps running (Runner.Move): keyed subtasks, other
// subtasks whose inputs are serialised, and source splits:
//
//  1. The job master waits until the checkpoints in progress when the
//     move was asked have ended, tells every task which subtasks move at
//     the barrier of the savepoint it triggers next (on nodes in other
//     processes over their control channels, waiting for their answers:
//     handover_remote.go), and triggers that savepoint.
//  2. At the barrier, each task sending to a moved subtask parks that
//     channel (what it sends after the barrier waits, bounded by the
//     channel's credits); the moved subtask snapshots and stops
//     processing (a moved source split snapshots its position, emits the
//     barrier and nothing after it); the others snapshot and go on
//     (asynchronously, as for any checkpoint).
//  3. Once the savepoint is complete, for each move: the old node retires
//     the subtask (its sinks committed the savepoint; its actor, channels,
//     operators and state backends are closed; it answers whether its
//     sinks delivered everything the savepoint holds, waiting up to half
//     the control timeout for those that publish in the background); the
//     nodes reading from it open the channels from its new node; the new
//     node builds it, restores its key groups from the savepoint (as
//     committed when the old instance's sinks delivered all of it: its
//     write-ahead sinks publish none of it again, where they would publish
//     it again under the same ids otherwise) and spawns it; the nodes
//     sending to it re-point their parked channels to it. Re-pointed
//     channels have a new generation (ChannelKey.Gen): nothing of the old
//     channel reaches the new one. A reader takes the new channel only
//     after the old one's barrier, and takes it active (as a restored
//     task takes its inputs): the new instance says again if it is idle.
//     A moved source split starts polling from its snapshotted position
//     once it is spawned.
//
// A failure after the barrier (a node failing, a step failing, the
// savepoint failing) fails the job with ErrHandover and ErrControlFailed:
// the restart strategy restores the whole job from its latest checkpoint
// or savepoint under a new epoch, with the placement from before the
// handover. The job never runs half moved.

// Move asks for one subtask to move: subtask Subtask of the chain with
// the vertex of uid UID (any vertex of the chain) to node To.
type Move struct {
	UID     string
	Subtask int
	To      string
}

// HandoverStep names a step of a handover on one node, for
// Cluster.HandoverHook.
type HandoverStep string

// The steps of a handover that run on one node.
const (
	// HandoverRetire: the old node retires the handed-over subtask.
	HandoverRetire HandoverStep = "retire"
	// HandoverRestore: the new node builds and restores the subtask.
	HandoverRestore HandoverStep = "restore"
	// HandoverRepoint: a node re-points its parked channels.
	HandoverRepoint HandoverStep = "repoint"
)

// MoveResult is what a handover did.
type MoveResult struct {
	// Savepoint is the savepoint taken at the handover's barrier, and Path
	// where it was written.
	Savepoint snapshot.ID
	Path      string
	// Waited is set when the handover waited for a checkpoint in
	// progress before it began.
	Waited bool
	// Moved lists the subtasks moved, in the order asked.
	Moved []MovedSubtask
	// Took is the time from the handover's start (its savepoint
	// triggered) to its end.
	Took time.Duration
}

// MovedSubtask is one subtask a handover moved.
type MovedSubtask struct {
	// Task names the subtask by its chain's head vertex.
	Task     TaskKey
	From, To string
	// Pause is how long the subtask processed nothing: from its
	// handover barrier to the moment every channel to its new instance
	// was re-pointed.
	Pause time.Duration
	// Inputs counts the channels re-pointed to the new instance.
	Inputs int
}

// moveReq asks the master loop for a handover.
type moveReq struct {
	moves []Move
	// after is the newest checkpoint in progress when the request came:
	// the handover starts once every checkpoint up to it ended. Later
	// ones do not hold it back, or periodic checkpoints would starve it.
	after  snapshot.ID
	waited bool
	reply  chan moveResult
	// release, when set, asks instead that this node leave the running
	// deployment (Runner.Release).
	release string
}

type moveResult struct {
	res MoveResult
	err error
}

// plannedMove is a checked move.
type plannedMove struct {
	key      TaskKey
	chain    *Chain
	from, to string
}

// Move moves subtasks of the running job (keyed ones, unkeyed ones whose
// input edges are serialised, and source splits) to other nodes at a
// savepoint barrier, while every other subtask keeps running (see the
// handover steps above). It waits for the checkpoints in progress when
// it is asked to end (not for those triggered later), and for the
// handover to complete. A subtask that finished its input is not handed
// over: a move that meets one falls back to a restart, as a failure
// does. A move the job cannot make while it
// runs returns ErrMoveUnsupported and changes nothing; a handover that
// fails after its barrier returns an error wrapping ErrHandover, and the
// job restarts from its latest checkpoint or savepoint.
func (r *Runner) Move(ctx context.Context, moves []Move) (MoveResult, error) {
	if r.cfg.Checkpoint.Dir == "" {
		return MoveResult{}, ErrNoCheckpointStore
	}
	if len(moves) == 0 {
		return MoveResult{}, fmt.Errorf("%w: no subtask to move", ErrMoveUnsupported)
	}
	req := &moveReq{moves: slices.Clone(moves), reply: make(chan moveResult, 1)}
	select {
	case <-r.started:
	case <-r.done:
		return MoveResult{}, fmt.Errorf("%w before the move", ErrJobEnded)
	case <-ctx.Done():
		return MoveResult{}, ctx.Err()
	}
	select {
	case r.moves <- req:
	case <-r.done:
		return MoveResult{}, fmt.Errorf("%w before the move", ErrJobEnded)
	case <-ctx.Done():
		return MoveResult{}, ctx.Err()
	}
	select {
	case res := <-req.reply:
		return res.res, res.err
	case <-ctx.Done():
		return MoveResult{}, ctx.Err()
	}
}

// Handovers returns how many subtasks the job's hosts retired or took
// over by handovers.
func (r *Runner) Handovers() int64 {
	var n int64
	for _, h := range r.hostList() {
		n += h.handovers.Load()
	}
	return n
}

// PendingMoves returns how many handovers wait for a checkpoint in
// progress or for another handover to end.
func (r *Runner) PendingMoves() int { return int(r.queued.Load()) }

// currentNode returns the node subtask sub of chain c runs on now.
func (r *Runner) currentNode(c *Chain, sub int) string {
	r.placeMu.Lock()
	n, ok := r.moved[TaskKey{UID: c.Head().UID, Subtask: sub}]
	r.placeMu.Unlock()
	if ok {
		return n
	}
	return r.cfg.Cluster.nodeOf(c, sub)
}

// wasMoved reports whether subtask key was moved by a handover of this
// attempt: its output channels are serialised.
func (r *Runner) wasMoved(key TaskKey) bool {
	r.placeMu.Lock()
	defer r.placeMu.Unlock()
	_, ok := r.moved[key]
	return ok
}

// checkMoves checks moves against the running deployment.
func (r *Runner) checkMoves(moves []Move) ([]plannedMove, error) {
	c := r.cfg.Cluster
	if c == nil || r.ctl == nil {
		return nil, fmt.Errorf("%w: the job runs in a single process", ErrMoveUnsupported)
	}
	nodes := make(map[string]bool)
	_, ids, _ := r.ctl.live()
	for _, id := range ids {
		nodes[id] = true
	}
	// A node outside the deployment is invited into it first, when the
	// cluster invites nodes and decides the placement of later attempts.
	invites := c.Invite != nil && c.Update != nil
	chainOf := make(map[string]*Chain)
	tailOf := make(map[*Vertex]*Chain)
	for _, ch := range r.plan.Chains {
		tailOf[ch.Tail()] = ch
		for _, v := range ch.Vertices {
			chainOf[v.UID] = ch
		}
	}
	crosses := clusterPlacement(c, r.plan).crosses
	var out []plannedMove
	var errs []error
	seen := make(map[TaskKey]bool)
	for _, m := range moves {
		ch := chainOf[m.UID]
		switch {
		case ch == nil:
			errs = append(errs, fmt.Errorf("move %s[%d]: the job has no operator with uid %q", m.UID, m.Subtask, m.UID))
			continue
		case m.Subtask < 0 || m.Subtask >= ch.Head().Parallelism:
			errs = append(errs, fmt.Errorf("move %s[%d]: operator %q has %d subtasks", m.UID, m.Subtask, m.UID, ch.Head().Parallelism))
			continue
		case !nodes[m.To] && !invites:
			errs = append(errs, fmt.Errorf("move %s[%d]: no node %q in the deployment", m.UID, m.Subtask, m.To))
			continue
		case m.To == "":
			errs = append(errs, fmt.Errorf("move %s[%d]: no node named", m.UID, m.Subtask))
			continue
		}
		key := TaskKey{UID: ch.Head().UID, Subtask: m.Subtask}
		from := r.currentNode(ch, m.Subtask)
		if from == m.To {
			errs = append(errs, fmt.Errorf("move %s: it runs on node %q already", key, m.To))
			continue
		}
		if seen[key] {
			errs = append(errs, fmt.Errorf("move %s: asked twice", key))
			continue
		}
		seen[key] = true
		for _, e := range ch.In {
			if crosses[e] || r.cfg.SerializeKeyBy && e.Partition == KeyBy {
				continue
			}
			// The senders on an edge that crossed no node when the job
			// was deployed batch for a local reader: they cannot park
			// their channel, unless a handover built them (its subtasks
			// send on serialised channels only).
			from := tailOf[e.From]
			for i := range from.Head().Parallelism {
				if e.Partition == Forward && i != m.Subtask || r.wasMoved(TaskKey{UID: from.Head().UID, Subtask: i}) {
					continue
				}
				errs = append(errs, fmt.Errorf("%w: move %s: edge %q -> %q is not serialised (it crossed no node when the job was deployed): move %s[%d] first",
					ErrMoveUnsupported, key, e.From.Name, e.To.Name, from.Head().UID, i))
				break
			}
		}
		for _, e := range ch.Out {
			if err := e.Type().hasCodec(); err != nil {
				errs = append(errs, fmt.Errorf("%w: move %s: edge %q -> %q: %w", ErrMoveUnsupported, key, e.From.Name, e.To.Name, err))
			}
		}
		out = append(out, plannedMove{key: key, chain: ch, from: from, to: m.To})
	}
	for _, a := range out {
		for _, b := range out {
			for _, e := range b.chain.In {
				if tailOf[e.From] == a.chain {
					errs = append(errs, fmt.Errorf("%w: moves %s and %s: subtasks joined by an edge do not move together", ErrMoveUnsupported, a.key, b.key))
				}
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return out, nil
}

// onMove queues a handover request; it starts once nothing else runs.
func (r *Runner) onMove(req *moveReq) {
	if req.release != "" {
		if err := r.checkRelease(req.release); err != nil {
			req.reply <- moveResult{err: err}
			return
		}
		r.moveQueue = append(r.moveQueue, req)
		r.queued.Store(int32(len(r.moveQueue)))
		return
	}
	if _, err := r.checkMoves(req.moves); err != nil {
		req.reply <- moveResult{err: err}
		return
	}
	for id := range r.inflight {
		req.after = max(req.after, id)
	}
	r.moveQueue = append(r.moveQueue, req)
	r.queued.Store(int32(len(r.moveQueue)))
}

// startMove starts the next queued handover when no checkpoint and no
// other handover is in progress, on its own goroutine (runMove): every
// task, on every node, hears of it, then the master loop triggers its
// savepoint (triggerMove) and no other checkpoint before. It returns the
// coordinator's actions (none).
func (r *Runner) startMove(now time.Time) []snapshot.Action {
	if r.moving || len(r.moveQueue) == 0 || r.coord == nil {
		return nil
	}
	if r.closing != 0 {
		return nil
	}
	for id := range r.inflight {
		if id <= r.moveQueue[0].after {
			r.moveQueue[0].waited = true
			return nil
		}
	}
	req := r.moveQueue[0]
	r.moveQueue = r.moveQueue[1:]
	r.queued.Store(int32(len(r.moveQueue)))
	if req.release != "" {
		r.moving = true
		r.moveWG.Add(1)
		go r.runRelease(r.moveCtx, req)
		return nil
	}
	planned, err := r.checkMoves(req.moves)
	if err != nil {
		req.reply <- moveResult{err: err}
		return nil
	}
	id := r.coord.Progress().NextID
	r.moveSeq++
	gen := r.moveSeq
	r.moving = true
	r.mv.preparing = true
	r.mv.hold = true
	r.log.Info("handover starting", "checkpoint_id", id, "moves", len(planned), "waited", req.waited)
	r.moveWG.Add(1)
	go r.runMove(r.moveCtx, req, planned, id, gen, now)
	return nil
}

// runMove runs a handover on its own goroutine: it prepares every node,
// has its savepoint triggered, and completes the handover once the
// savepoint completes. A failure fails the job.
func (r *Runner) runMove(ctx context.Context, req *moveReq, planned []plannedMove, id snapshot.ID, gen int, began time.Time) {
	defer r.moveWG.Done()
	defer func() { r.moveEnded <- struct{}{} }()
	for _, p := range planned {
		if r.inDeployment(p.to) {
			continue
		}
		if err := r.addNode(ctx, p.to); err != nil {
			// Nothing changed: no task heard of the handover.
			r.log.Warn("handover: node not invited; nothing moved", "node", p.to, "err", err)
			req.reply <- moveResult{err: fmt.Errorf("move %s: %w", p.key, err)}
			return
		}
	}
	nodes := r.hoNodes()
	moved := make(map[TaskKey]bool, len(planned))
	for _, p := range planned {
		moved[p.key] = true
	}
	prep := time.Now()
	sp, harmless, err := r.prepareMove(ctx, nodes, moved, id)
	if err != nil && harmless {
		req.reply <- moveResult{err: err}
		return
	}
	var res MoveResult
	if err == nil {
		r.log.Info("handover: savepoint triggered", "checkpoint_id", id, "prepare", time.Since(prep))
		res, err = r.handOver(ctx, nodes, planned, id, gen, sp)
	}
	r.mv.md.Store(nil)
	if err != nil {
		err = fmt.Errorf("%w: %w: job %q epoch %d: savepoint %d: %w", ErrControlFailed, ErrHandover, r.job.Name, r.epoch, id, err)
		if ctx.Err() == nil && r.cmdCtx.Err() == nil {
			r.log.Warn("handover failed; the job restarts from its latest checkpoint or savepoint", "checkpoint_id", id, "err", err)
			r.fail(err)
		}
		req.reply <- moveResult{err: err}
		return
	}
	res.Waited = req.waited
	res.Took = r.cfg.Clock.Since(began)
	r.log.Info("handover done", "checkpoint_id", id, "moves", len(res.Moved), "took", res.Took)
	req.reply <- moveResult{res: res}
}

// hook runs the cluster's handover hook for step on node.
func (r *Runner) hook(step HandoverStep, node string) error {
	if f := r.cfg.Cluster.HandoverHook; f != nil {
		if err := f(step, node); err != nil {
			return fmt.Errorf("node %q: %s: %w", node, step, err)
		}
	}
	return nil
}

// handOver carries out the steps after the barrier, on every node.
func (r *Runner) handOver(ctx context.Context, nodes []*hoNode, planned []plannedMove, id snapshot.ID, gen int, sp <-chan savepointResult) (MoveResult, error) {
	var spr savepointResult
	select {
	case spr = <-sp:
	case <-ctx.Done():
		return MoveResult{}, ctx.Err()
	}
	if spr.err != nil {
		return MoveResult{}, spr.err
	}
	md := spr.md
	if md == nil {
		var err error
		if md, err = snapshot.Load(spr.path); err != nil {
			return MoveResult{}, err
		}
	}
	if md.Dir == "" {
		c := *md
		c.Dir = spr.path
		md = &c
	}
	// Nodes in other processes fetch the moved subtasks' files from it.
	r.mv.md.Store(md)
	res := MoveResult{Savepoint: id, Path: spr.path}
	// The attempt may end while a step runs (a cancel, a stop, a
	// failure, a redeployment): the steps on this node's hosts do not
	// wait on ctx, so each step checks it first, and the handover gives
	// up rather than report subtasks moved in an attempt that is over.
	// A failed attempt (Runner.fail: a redeployment, say) ends its
	// commands' context at once, before its master loop stops.
	ended := func() error {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("the attempt ended during the handover: %w", err)
		}
		if err := r.cmdCtx.Err(); err != nil {
			return fmt.Errorf("the attempt failed during the handover: %w", err)
		}
		return nil
	}
	for _, p := range planned {
		step := time.Now()
		old, err := nodeByID(nodes, p.from)
		if err != nil {
			return res, err
		}
		nw, err := nodeByID(nodes, p.to)
		if err != nil {
			return res, err
		}
		if err := r.hook(HandoverRetire, p.from); err != nil {
			return res, err
		}
		if err := ended(); err != nil {
			return res, err
		}
		handedAt, committed, err := r.retireOn(ctx, old, p.key, id)
		if err != nil {
			return res, fmt.Errorf("retire %s on node %q: %w", p.key, p.from, err)
		}
		r.log.Info("handover: subtask retired", "task", p.key.String(), "node", p.from, "committed", committed, "took", time.Since(step))
		step = time.Now()
		for _, n := range nodes {
			if err := ended(); err != nil {
				return res, err
			}
			if n != nw {
				if err := r.openFromOn(ctx, n, p.key, id, gen, p.to); err != nil {
					return res, fmt.Errorf("node %q: %w", n.id, err)
				}
			}
		}
		r.log.Info("handover: channels from the new node opened", "task", p.key.String(), "node", p.to, "took", time.Since(step))
		step = time.Now()
		if err := r.hook(HandoverRestore, p.to); err != nil {
			return res, err
		}
		if err := ended(); err != nil {
			return res, err
		}
		inputs, err := r.adoptOn(ctx, nw, p.chain, p.key, md, gen, committed)
		if err != nil {
			return res, fmt.Errorf("restore %s on node %q: %w", p.key, p.to, err)
		}
		r.log.Info("handover: subtask restored", "task", p.key.String(), "node", p.to, "took", time.Since(step))
		step = time.Now()
		n := 0
		for _, nd := range nodes {
			if err := r.hook(HandoverRepoint, nd.id); err != nil {
				return res, err
			}
			if err := ended(); err != nil {
				return res, err
			}
			k, err := r.repointOn(ctx, nd, p.key, id, gen, p.to)
			if err != nil {
				return res, fmt.Errorf("node %q: re-point channels to %s: %w", nd.id, p.key, err)
			}
			n += k
		}
		if n != inputs {
			return res, fmt.Errorf("re-pointed %d channels to %s, it has %d inputs", n, p.key, inputs)
		}
		pause := time.Duration(0)
		if handedAt != 0 {
			pause = time.Since(time.Unix(0, handedAt))
		}
		res.Moved = append(res.Moved, MovedSubtask{Task: p.key, From: p.from, To: p.to, Pause: pause, Inputs: n})
		r.log.Info("handover: subtask moved", "task", p.key.String(), "from", p.from, "to", p.to, "pause", pause,
			"repoint", time.Since(step), "checkpoint_id", id)
	}
	r.placeMu.Lock()
	for _, p := range planned {
		r.moved[p.key] = p.to
	}
	r.placeMu.Unlock()
	return res, nil
}

// Move moves subtasks of the running attempt to other nodes while
// its other subtasks keep running (Runner.Move), waiting for an attempt
// to run. Once moved, later attempts (after a failure) place the moved
// subtasks on their new nodes, unless Cluster.Update decides the
// placement.
func (e *Execution) Move(ctx context.Context, moves []Move) (MoveResult, error) {
	for {
		r, changed := e.Runner()
		if r != nil {
			res, err := r.Move(ctx, moves)
			if err == nil {
				e.mu.Lock()
				if e.moved == nil {
					e.moved = make(map[TaskKey]string)
				}
				for _, m := range res.Moved {
					e.moved[m.Task] = m.To
				}
				e.mu.Unlock()
			}
			return res, err
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return MoveResult{}, ctx.Err()
		}
	}
}

// placed returns c with the moves made so far applied to its placement.
func (e *Execution) placed(c *Cluster) *Cluster {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.moved) == 0 || c.Update != nil {
		return c
	}
	u := *c
	u.Placement = make(map[TaskKey]string, len(c.Placement)+len(e.moved))
	for k, n := range c.Placement {
		u.Placement[k] = n
	}
	for k, n := range e.moved {
		u.Placement[k] = n
	}
	return &u
}
