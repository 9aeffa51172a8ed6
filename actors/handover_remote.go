package actors

import (
	"context"
	"encoding/binary"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/edgedio/edged/snapshot"
)

// Handovers across processes. The job master drives every step of a
// handover (handover.go) on each node: a host in the master's process by
// a direct call, a host in another process (a Worker's) by a command on
// its control channel, which the host answers on its own:
//
//   - ctlHandover (the subtasks moving at checkpoint Checkpoint's
//     barrier), answered by ctlPrepared once every task of the host heard
//     of it. The master triggers the handover's savepoint only when every
//     host answered, and triggers no other checkpoint meanwhile: a
//     barrier that crosses from one node to another can never reach a
//     task before the handover does.
//   - ctlHandoverStep (retire, open the channels from the new instance,
//     adopt, re-point), answered by ctlStepDone with the step's result or
//     its failure. To adopt, the new node fetches the moved subtask's
//     state files of the savepoint through its SnapshotFiles, as it
//     fetches those of a snapshot its deployment restores.
//
// Every message names the job and the deployment's epoch; one of
// another epoch is dropped and counted. A host that does not answer
// within the control timeout (the adopt step: hoAdoptTimeouts times it,
// as it copies state files) fails the handover, as a failed step does:
// the job fails with ErrHandover and restarts from its latest
// checkpoint or savepoint with the placement from before the handover.

// hoAdoptTimeouts is how many control timeouts a node in another process
// has to fetch the moved subtask's state files, restore and spawn it.
const hoAdoptTimeouts = 6

// moveLink is the master's side of the handovers it drives across
// processes.
type moveLink struct {
	// preparing is set from a handover's start until its savepoint is
	// triggered: the master triggers no other checkpoint meanwhile, so
	// that the handover's id stays the next one. Master loop only.
	preparing bool
	// hold is set while a handover runs, from its start to its end: the
	// master triggers no other checkpoint meanwhile (the handover's
	// savepoint still expires at the checkpoint timeout). No barrier but
	// the handover's then crosses a channel parked or replaced by the
	// handover: a moved source split would send none between its old
	// instance's handover barrier and its new instance's start, and a
	// checkpoint triggered right behind the handover's savepoint was seen
	// to stall at a moved subtask's new instance until it expired.
	// Master loop only.
	hold bool
	// trigger carries a prepared handover's request for its savepoint to
	// the master loop.
	trigger chan moveTrigger
	// replies carries the hosts' answers (ctlPrepared, ctlStepDone) to
	// the handover goroutine.
	replies chan controlMsg
	// md is the metadata of the savepoint of the handover in progress,
	// once it completed: nodes in other processes fetch the moved
	// subtasks' state files from it (OpenRestoreFile).
	md atomic.Pointer[snapshot.Metadata]
}

func newMoveLink() moveLink {
	return moveLink{trigger: make(chan moveTrigger), replies: make(chan controlMsg, 256)}
}

// moveTrigger asks the master loop to trigger the savepoint of a prepared
// handover.
type moveTrigger struct {
	id    snapshot.ID
	reply chan moveTriggered
}

// moveTriggered is the master loop's answer: where the savepoint's result
// comes, or why it was not triggered.
type moveTriggered struct {
	sp  <-chan savepointResult
	err error
	// harmless: the handover's id was aborted, no task ever meets its
	// barrier: the job goes on.
	harmless bool
}

// triggerMove triggers the savepoint of a prepared handover, on the
// master loop, and returns the coordinator's actions.
func (r *Runner) triggerMove(now time.Time, mt moveTrigger) []snapshot.Action {
	r.mv.preparing = false
	if next := r.coord.Progress().NextID; next != mt.id {
		mt.reply <- moveTriggered{err: fmt.Errorf("handover savepoint %d: checkpoint %d came first", mt.id, next)}
		return nil
	}
	acts := r.coord.Step(now, snapshot.TriggerSavepoint{})
	sp := savepointReq{reply: make(chan savepointResult, 1)}
	triggered := false
	for _, a := range acts {
		switch a := a.(type) {
		case snapshot.Trigger:
			triggered = triggered || a.Checkpoint == mt.id
		case snapshot.Abort:
			if a.Checkpoint == mt.id {
				// No barrier of that id will come: the tasks never use
				// the handover they heard of.
				mt.reply <- moveTriggered{err: fmt.Errorf("handover savepoint %d: %w", mt.id, a.Reason), harmless: true}
				return acts
			}
		}
	}
	if !triggered {
		mt.reply <- moveTriggered{err: fmt.Errorf("handover savepoint %d was not triggered", mt.id)}
		return acts
	}
	r.waiting[mt.id] = sp
	mt.reply <- moveTriggered{sp: sp.reply}
	return acts
}

// hoNode is one node of the deployment as a handover sees it: its host
// when it runs in the master's process, else its index in Cluster.Nodes
// for its control channels.
type hoNode struct {
	id    string
	index int
	h     *host
	// adopted is the task the host adopted, for its re-pointing.
	adopted *task
}

// hoNodes returns every node of the deployment.
func (r *Runner) hoNodes() []*hoNode {
	var out []*hoNode
	_, ids, index := r.ctl.live()
	for k, id := range ids {
		hn := &hoNode{id: id, index: index[k]}
		for _, h := range r.hosts {
			if h.node == id {
				hn.h = h
			}
		}
		out = append(out, hn)
	}
	return out
}

// nodeByID returns the node named id.
func nodeByID(nodes []*hoNode, id string) (*hoNode, error) {
	for _, n := range nodes {
		if n.id == id {
			return n, nil
		}
	}
	return nil, fmt.Errorf("no node %q in the deployment", id)
}

// handoverReply hands a host's answer to the handover goroutine; called
// on the network's goroutine.
func (r *Runner) handoverReply(node string, m controlMsg) {
	if m.Epoch != r.epoch {
		r.stale.Add(1)
		return
	}
	m.Node = node
	select {
	case r.mv.replies <- m:
	default:
		r.controlFailed(node, fmt.Errorf("%w: handover answers overflow", ErrControlFailed))
	}
}

// prepareMove tells every host that checkpoint id's barrier hands the
// subtasks in moved over (the master's own hosts directly, the others
// over their control channels, waiting for their answers), then has the
// master loop trigger the handover's savepoint.
func (r *Runner) prepareMove(ctx context.Context, nodes []*hoNode, moved map[TaskKey]bool, id snapshot.ID) (<-chan savepointResult, bool, error) {
	keys := make([]PlacedTask, 0, len(moved))
	for k := range moved {
		keys = append(keys, PlacedTask{UID: k.UID, Subtask: k.Subtask})
	}
	slices.SortFunc(keys, func(a, b PlacedTask) int {
		if c := strings.Compare(a.UID, b.UID); c != 0 {
			return c
		}
		return a.Subtask - b.Subtask
	})
	want := make(map[string]bool)
	for _, n := range nodes {
		if n.h != nil {
			n.h.prepareHandover(int64(id), moved)
			continue
		}
		m := controlMsg{Kind: ctlHandover, Job: r.job.Name, Epoch: r.epoch, Checkpoint: int64(id), Keys: keys}
		if err := r.ctl.sender(n.index).send(ctx, &m); err != nil {
			return nil, false, fmt.Errorf("node %q: announce the handover: %w", n.id, err)
		}
		want[n.id] = true
	}
	if len(want) > 0 {
		began := time.Now()
		timer := r.cfg.Clock.NewTimer(r.controlTimeout())
		defer timer.Stop()
		for len(want) > 0 {
			select {
			case m := <-r.mv.replies:
				if m.Kind == ctlPrepared && m.Checkpoint == int64(id) && want[m.Node] {
					delete(want, m.Node)
				}
			case <-timer.Chan():
				return nil, false, fmt.Errorf("%w: nodes %q did not prepare the handover within %s", ErrControlTimeout, slices.Sorted(maps.Keys(want)), r.controlTimeout())
			case <-ctx.Done():
				return nil, false, ctx.Err()
			}
		}
		r.log.Debug("handover: every node prepared", "checkpoint_id", id, "took", time.Since(began))
	}
	mt := moveTrigger{id: id, reply: make(chan moveTriggered, 1)}
	select {
	case r.mv.trigger <- mt:
	case <-ctx.Done():
		return nil, false, ctx.Err()
	}
	select {
	case a := <-mt.reply:
		return a.sp, a.harmless, a.err
	case <-ctx.Done():
		return nil, false, ctx.Err()
	}
}

// remoteStep runs step m on node n in another process and returns its
// result.
func (r *Runner) remoteStep(ctx context.Context, n *hoNode, m controlMsg, timeout time.Duration) (int64, error) {
	a, err := r.remoteAnswer(ctx, n, m, timeout)
	return a.Value, err
}

// remoteAnswer is remoteStep returning the node's whole answer.
func (r *Runner) remoteAnswer(ctx context.Context, n *hoNode, m controlMsg, timeout time.Duration) (controlMsg, error) {
	m.Kind, m.Job, m.Epoch = ctlHandoverStep, r.job.Name, r.epoch
	if err := r.ctl.sender(n.index).send(ctx, &m); err != nil {
		return controlMsg{}, fmt.Errorf("send step %d: %w", m.Step, err)
	}
	timer := r.cfg.Clock.NewTimer(timeout)
	defer timer.Stop()
	for {
		select {
		case a := <-r.mv.replies:
			if a.Kind != ctlStepDone || a.Node != n.id || a.Step != m.Step || a.Task != m.Task || a.Checkpoint != m.Checkpoint {
				r.stale.Add(1)
				continue
			}
			if a.Err != nil {
				return controlMsg{}, a.Err.toError(n.id)
			}
			return a, nil
		case <-timer.Chan():
			return controlMsg{}, fmt.Errorf("%w: node %q did not answer handover step %d for %s within %s", ErrControlTimeout, n.id, m.Step, m.Task.Vertex, timeout)
		case <-ctx.Done():
			return controlMsg{}, ctx.Err()
		}
	}
}

func taskID(k TaskKey) snapshot.TaskID { return snapshot.TaskID{Vertex: k.UID, Subtask: k.Subtask} }

// retireOn retires subtask key on node n, and returns when it was handed
// over and whether its sinks delivered what savepoint id holds (host.retire).
// The node waits up to half the control timeout for them (the request's
// Value), so that it answers within the step's timeout.
func (r *Runner) retireOn(ctx context.Context, n *hoNode, key TaskKey, id snapshot.ID) (int64, bool, error) {
	wait := r.controlTimeout() / 2
	if n.h != nil {
		return n.h.retire(ctx, key, int64(id), wait)
	}
	a, err := r.remoteAnswer(ctx, n, controlMsg{Step: hoRetire, Checkpoint: int64(id), Task: taskID(key), Value: int64(wait)}, r.controlTimeout())
	return a.Value, a.Flag, err
}

// openFromOn opens on node n the channels from subtask key, now on node
// to.
func (r *Runner) openFromOn(ctx context.Context, n *hoNode, key TaskKey, id snapshot.ID, gen int, to string) error {
	if n.h != nil {
		return n.h.openFromMoved(key, gen, to)
	}
	_, err := r.remoteStep(ctx, n, controlMsg{Step: hoOpenFrom, Checkpoint: int64(id), Task: taskID(key), Gen: gen, To: to}, r.controlTimeout())
	return err
}

// adoptOn builds, restores and spawns subtask key of chain c on node n
// from savepoint md, and returns its number of inputs. committed says that
// the retired instance's sinks delivered everything md holds for it: the
// new instance restores md as committed (publishing none of it again).
func (r *Runner) adoptOn(ctx context.Context, n *hoNode, c *Chain, key TaskKey, md *snapshot.Metadata, gen int, committed bool) (int, error) {
	nodeOf := func(c *Chain, sub int) string { return r.currentNode(c, sub) }
	if n.h != nil {
		own := *md
		own.Committed = md.Committed || committed
		t, err := n.h.adopt(key, &own, gen, nodeOf)
		if err != nil {
			return 0, err
		}
		n.adopted = t
		return len(t.inChans), nil
	}
	// The node restores from the chain's operators' files only.
	part := &snapshot.Metadata{Job: md.Job, MaxParallelism: md.MaxParallelism, Checkpoint: md.Checkpoint,
		Kind: md.Kind, Timestamp: md.Timestamp, Finished: md.Finished}
	for _, v := range c.Vertices {
		if op, ok := md.Operator(v.UID); ok {
			part.Operators = append(part.Operators, *op)
		}
	}
	slices.SortFunc(part.Operators, func(a, b snapshot.Operator) int { return strings.Compare(a.UID, b.UID) })
	blob, err := snapshot.EncodeMetadata(part)
	if err != nil {
		return 0, fmt.Errorf("encode the savepoint's metadata: %w", err)
	}
	var keys []PlacedTask
	for _, ch := range r.plan.Chains {
		for i := range ch.Head().Parallelism {
			keys = append(keys, PlacedTask{UID: ch.Head().UID, Subtask: i, Node: r.currentNode(ch, i)})
		}
	}
	v, err := r.sendAdopt(ctx, n, controlMsg{Step: hoAdopt, Checkpoint: int64(md.Checkpoint), Task: taskID(key), Gen: gen, Blob: blob, Keys: keys,
		Flag: md.Committed || committed})
	return int(v), err
}

// sendAdopt runs adopt step m on node n. Metadata too large for one
// control frame goes ahead in parts (hoAdoptPart steps), each answered,
// and the node joins them to the last one, in m.
func (r *Runner) sendAdopt(ctx context.Context, n *hoNode, m controlMsg) (int64, error) {
	limit := r.ctl.sender(n.index).out.MaxBody()
	size := func(m controlMsg) (int, error) {
		m.Kind, m.Job, m.Epoch = ctlHandoverStep, r.job.Name, r.epoch
		b, err := appendControl(nil, &m)
		return len(b), err
	}
	part := controlMsg{Step: hoAdoptPart, Checkpoint: m.Checkpoint, Task: m.Task}
	overhead, err := size(part)
	if err != nil {
		return 0, err
	}
	// The varint of a part's length and of its offset.
	overhead += 2 * binary.MaxVarintLen64
	blob := m.Blob
	sent, parts := 0, 0
	for {
		m.Blob = blob[sent:]
		total, err := size(m)
		if err != nil {
			return 0, err
		}
		if total <= limit {
			break
		}
		k := min(len(blob)-sent, limit-overhead)
		if k <= 0 {
			return 0, fmt.Errorf("%w: the placement table of the adopt step for %s does not fit in a control frame of %d bytes", ErrControlFailed, m.Task.Vertex, limit)
		}
		part.Value, part.Blob = int64(sent), blob[sent:sent+k]
		if _, err := r.remoteStep(ctx, n, part, r.controlTimeout()); err != nil {
			return 0, fmt.Errorf("send part %d of the savepoint's metadata: %w", parts+1, err)
		}
		sent += k
		parts++
	}
	if parts > 0 {
		r.log.Debug("handover: savepoint metadata sent in parts", "node", n.id, "task", m.Task.Vertex, "parts", parts+1, "bytes", len(blob))
	}
	return r.remoteStep(ctx, n, m, hoAdoptTimeouts*r.controlTimeout())
}

// repointOn re-points node n's parked channels to subtask key, now on
// node to.
func (r *Runner) repointOn(ctx context.Context, n *hoNode, key TaskKey, id snapshot.ID, gen int, to string) (int, error) {
	if n.h != nil {
		var t *task
		if n.id == to {
			t = n.adopted
		}
		return n.h.repoint(key, to, gen, t)
	}
	v, err := r.remoteStep(ctx, n, controlMsg{Step: hoRepoint, Checkpoint: int64(id), Task: taskID(key), Gen: gen, To: to}, r.controlTimeout())
	return int(v), err
}

// queueHandover hands a handover command of the master to the host's
// handover goroutine; called on the network's goroutine.
func (h *host) queueHandover(m controlMsg) {
	select {
	case h.ctl.handover <- m:
	default:
		h.controlFailed(fmt.Errorf("%w: handover commands overflow", ErrControlFailed))
	}
}

// serveHandovers runs the master's handover commands one at a time, and
// answers each, until the host stops.
func (h *host) serveHandovers() {
	defer h.ctl.serving.Done()
	for {
		select {
		case m := <-h.ctl.handover:
			h.runHandover(m)
		case <-h.done:
			return
		}
	}
}

// runHandover runs one handover command and answers it.
func (h *host) runHandover(m controlMsg) {
	if m.Kind == ctlHandover {
		moved := make(map[TaskKey]bool, len(m.Keys))
		for _, k := range m.Keys {
			moved[TaskKey{UID: k.UID, Subtask: k.Subtask}] = true
		}
		h.prepareHandover(m.Checkpoint, moved)
		h.log.Debug("handover prepared", "checkpoint_id", m.Checkpoint, "moves", len(moved))
		_ = h.ctlSend(&controlMsg{Kind: ctlPrepared, Checkpoint: m.Checkpoint})
		return
	}
	began := time.Now()
	v, flag, err := h.handoverStep(m)
	key := TaskKey{UID: m.Task.Vertex, Subtask: m.Task.Subtask}
	if err != nil {
		h.log.Warn("handover step failed", "step", m.Step, "task", key.String(), "checkpoint_id", m.Checkpoint, "err", err)
	} else {
		h.log.Info("handover step done", "step", m.Step, "task", key.String(), "checkpoint_id", m.Checkpoint, "took", time.Since(began))
	}
	_ = h.ctlSend(&controlMsg{Kind: ctlStepDone, Checkpoint: m.Checkpoint, Step: m.Step, Task: m.Task, Value: v, Flag: flag, Err: toWire(err)})
}

// handoverStep runs a handover step on the host, and returns its result
// and flag (a retire's: the retired instance's sinks delivered everything
// the savepoint holds).
func (h *host) handoverStep(m controlMsg) (int64, bool, error) {
	key := TaskKey{UID: m.Task.Vertex, Subtask: m.Task.Subtask}
	switch m.Step {
	case hoRetire:
		return h.retire(h.ctx, key, m.Checkpoint, time.Duration(m.Value))
	case hoOpenFrom:
		return 0, false, h.openFromMoved(key, m.Gen, m.To)
	case hoAdoptPart:
		return 0, false, h.adoptPart(m)
	case hoAdopt:
		m, err := h.ctl.parts.join(m)
		if err != nil {
			return 0, false, err
		}
		n, err := h.adoptRemote(key, m)
		return int64(n), false, err
	case hoRepoint:
		var t *task
		if m.To == h.node {
			if t = h.localTask(key); t == nil {
				return 0, false, fmt.Errorf("node %q did not adopt %s", h.node, key)
			}
		}
		n, err := h.repoint(key, m.To, m.Gen, t)
		return int64(n), false, err
	default:
		return 0, false, fmt.Errorf("%w: handover step %d", errControlMsg, m.Step)
	}
}

// adoptParts are the parts of an adopt step's metadata received so far
// (hoAdoptPart), on the host's handover goroutine.
type adoptParts struct {
	checkpoint int64
	task       snapshot.TaskID
	blob       []byte
}

// join returns adopt step m with the parts received before it joined to
// its metadata, and forgets them.
func (p *adoptParts) join(m controlMsg) (controlMsg, error) {
	q := *p
	*p = adoptParts{}
	if q.blob == nil {
		return m, nil
	}
	if q.checkpoint != m.Checkpoint || q.task != m.Task {
		return m, fmt.Errorf("%w: adopt step for %s of savepoint %d after metadata parts for %s of savepoint %d", errControlMsg, m.Task.Vertex, m.Checkpoint, q.task.Vertex, q.checkpoint)
	}
	m.Blob = append(q.blob, m.Blob...)
	return m, nil
}

// adoptPart keeps one part of the metadata of the adopt step that
// follows.
func (h *host) adoptPart(m controlMsg) error { return h.ctl.parts.add(m) }

// add keeps part m.
func (p *adoptParts) add(m controlMsg) error {
	if m.Value == 0 {
		*p = adoptParts{checkpoint: m.Checkpoint, task: m.Task, blob: []byte{}}
	}
	if p.blob == nil || p.checkpoint != m.Checkpoint || p.task != m.Task || int64(len(p.blob)) != m.Value {
		have := 0
		if p.blob != nil {
			have = len(p.blob)
		}
		*p = adoptParts{}
		return fmt.Errorf("%w: metadata part at offset %d for %s of savepoint %d, %d bytes received", errControlMsg, m.Value, m.Task.Vertex, m.Checkpoint, have)
	}
	p.blob = append(p.blob, m.Blob...)
	return nil
}

// adoptRemote fetches the state files the moved subtask restores from
// (every file of its chain's operators in the savepoint), then adopts it.
func (h *host) adoptRemote(key TaskKey, m controlMsg) (int, error) {
	md, err := snapshot.DecodeMetadata(m.Blob)
	if err != nil {
		return 0, fmt.Errorf("savepoint metadata: %w", err)
	}
	if h.files == nil || h.cfg.Checkpoint.Dir == "" {
		return 0, fmt.Errorf("node %q cannot fetch state files: it has no checkpoint staging directory", h.node)
	}
	// The mark travels in the step (it is a file beside the metadata):
	// set when the retired instance's sinks delivered all of it.
	md.Committed = m.Flag
	md.Dir = filepath.Join(h.cfg.Checkpoint.Dir, fmt.Sprintf("handover-%d-%s-%d", md.Checkpoint, key.UID, key.Subtask))
	defer os.RemoveAll(md.Dir)
	if err := os.MkdirAll(md.Dir, 0o755); err != nil {
		return 0, err
	}
	var c *Chain
	for _, ch := range h.plan.Chains {
		if ch.Head().UID == key.UID {
			c = ch
		}
	}
	if c == nil || key.Subtask < 0 || key.Subtask >= c.Head().Parallelism {
		return 0, fmt.Errorf("the plan has no subtask %s", key)
	}
	need, err := restoreFiles(md, c, key.Subtask)
	if err != nil {
		return 0, fmt.Errorf("savepoint %d: %w", md.Checkpoint, err)
	}
	began := time.Now()
	var bytes, skipped int64
	files := 0
	for _, op := range md.Operators {
		for _, hd := range op.Subtasks {
			if hd.File == "" {
				continue
			}
			if !need[hd.File] {
				skipped += hd.Size
				continue
			}
			if err := h.files.Fetch(h.ctx, h.master, h.job.Name, h.epoch, md.Checkpoint, hd, filepath.Join(md.Dir, hd.File)); err != nil {
				return 0, fmt.Errorf("fetch state file %s of savepoint %d: %w", hd.File, md.Checkpoint, err)
			}
			bytes += hd.Size
			files++
		}
	}
	h.log.Info("handover: state files fetched", "task", key.String(), "checkpoint_id", md.Checkpoint, "files", files, "bytes", bytes, "not_needed_bytes", skipped, "took", time.Since(began))
	placed := make(map[TaskKey]string, len(m.Keys))
	for _, k := range m.Keys {
		placed[TaskKey{UID: k.UID, Subtask: k.Subtask}] = k.Node
	}
	nodeOf := func(c *Chain, sub int) string {
		if n, ok := placed[TaskKey{UID: c.Head().UID, Subtask: sub}]; ok {
			return n
		}
		return h.pl.nodeOf(c, sub)
	}
	t, err := h.adopt(key, md, m.Gen, nodeOf)
	if err != nil {
		return 0, err
	}
	return len(t.inChans), nil
}

// inDeployment reports whether node is a node of the running deployment.
func (r *Runner) inDeployment(node string) bool {
	_, ids, _ := r.ctl.live()
	return slices.Contains(ids, node)
}

// addNode invites node, in another process, into the running deployment
// with no subtask placed on it (Cluster.Invite), so that a handover can
// move subtasks to it: it opens the master's ends of the node's control
// channels, invites it, checks its plan's fingerprint when it registers,
// has it deploy (nothing) and start, and from then on sends it the
// checkpoint commands as to every node. Nothing of the running job
// changes if it fails.
func (r *Runner) addNode(ctx context.Context, node string) (err error) {
	c := r.cfg.Cluster
	began := time.Now()
	_, ids := r.ctl.senders()
	i := len(ids)
	net, master := c.Nodes[0].Network, c.Nodes[0].ID
	fail := func(err error) { r.controlFailed(node, err) }
	out, err := net.OpenSender(controlKey(r.job.Name, r.epoch, i, false), node, func(err error) {
		if r.inDeployment(node) {
			fail(err)
		}
	})
	if err != nil {
		return fmt.Errorf("open control channel to %q: %w", node, err)
	}
	down := &ctlSender{out: out}
	var in RemoteReceiver
	in, err = net.OpenReceiver(controlKey(r.job.Name, r.epoch, i, true), node, func(f RemoteFrame) {
		r.onControl(node, f, in)
	}, func(err error) {
		if r.inDeployment(node) {
			fail(err)
		}
	})
	if err != nil {
		out.Close()
		return fmt.Errorf("open control channel from %q: %w", node, err)
	}
	added := false
	defer func() {
		if !added {
			cctx, cancel := context.WithTimeout(context.Background(), r.controlTimeout())
			_ = down.send(cctx, &controlMsg{Kind: ctlCancel, Job: r.job.Name, Epoch: r.epoch})
			cancel()
			down.close()
			in.Close()
		}
	}()
	d := Deployment{
		Job: r.job.Name, Epoch: r.epoch, Index: i, Master: master, Nodes: append(ids, node), Fingerprint: r.want,
		Checkpointing: r.cfg.Checkpoint.Dir != "", Mode: r.cfg.Checkpoint.Mode,
	}
	for _, ch := range r.plan.Chains {
		for sub := range ch.Head().Parallelism {
			d.Placement = append(d.Placement, PlacedTask{UID: ch.Head().UID, Subtask: sub, Node: r.currentNode(ch, sub)})
		}
	}
	ictx, cancel := context.WithTimeout(ctx, r.controlTimeout())
	defer cancel()
	if err := c.Invite(ictx, node, d); err != nil {
		return fmt.Errorf("%w: invite node %q into epoch %d: %w", ErrControlFailed, node, r.epoch, err)
	}
	await := func(kind ctlKind, what string) (controlMsg, error) {
		for {
			select {
			case m := <-r.mv.replies:
				if m.Node == node && m.Kind == kind {
					return m, nil
				}
				r.stale.Add(1)
			case <-ictx.Done():
				return controlMsg{}, fmt.Errorf("%w: node %q not %s within %s: %w", ErrControlTimeout, node, what, r.controlTimeout(), ictx.Err())
			}
		}
	}
	reg, err := await(ctlRegister, "registered")
	if err != nil {
		return err
	}
	if reg.Fingerprint != r.want {
		return planMismatch(r.job.Name, node, reg.Fingerprint, r.want)
	}
	if err := down.send(ictx, &controlMsg{Kind: ctlDeploy, Job: r.job.Name, Epoch: r.epoch}); err != nil {
		return err
	}
	if _, err := await(ctlDeployed, "deployed"); err != nil {
		return err
	}
	// Started before it joins the node list: a node that does not start
	// is cancelled and closed by the deferred cleanup, and the job's
	// commands never reach it.
	if err := down.send(ictx, &controlMsg{Kind: ctlStart, Job: r.job.Name, Epoch: r.epoch}); err != nil {
		return err
	}
	r.ctl.nodesMu.Lock()
	r.ctl.down = append(r.ctl.down, down)
	r.ctl.up = append(r.ctl.up, in)
	r.ctl.ids = append(r.ctl.ids, node)
	r.ctl.nodesMu.Unlock()
	added = true
	r.log.Info("handover: node invited into the running deployment", "node", node, "index", i, "epoch", r.epoch, "took", time.Since(began))
	return nil
}
