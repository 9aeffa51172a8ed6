package actors

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/edgedio/edged/snapshot"
)

// DefaultControlTimeout bounds each step of a deployment's control
// handshake (every host registered, every host deployed) when
// Cluster.ControlTimeout is 0.
const DefaultControlTimeout = 10 * time.Second

// ctlSender is the sending end of a control channel: it encodes messages
// and sends them one at a time (the channel's Send is for one caller).
type ctlSender struct {
	mu  sync.Mutex
	out RemoteSender
}

func (s *ctlSender) send(ctx context.Context, m *controlMsg) error {
	body, err := appendControl(nil, m)
	if err != nil {
		return err
	}
	if max := s.out.MaxBody(); len(body) > max {
		return fmt.Errorf("%w: control message of %d bytes exceeds the frame body cap %d", ErrControlFailed, len(body), max)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.out.Send(ctx, FrameBatch, 0, body)
}

func (s *ctlSender) close() { s.out.Close() }

// controlKey returns the key of the control channel between the master
// and host node index i, up or down.
func controlKey(job string, epoch uint64, i int, up bool) ChannelKey {
	if up {
		return ChannelKey{Job: job, Epoch: epoch, Edge: ControlEdgeUp, From: i, To: MasterIndex}
	}
	return ChannelKey{Job: job, Epoch: epoch, Edge: ControlEdgeDown, From: MasterIndex, To: i}
}

// hostCtl is a host's end of its control channels with the master.
type hostCtl struct {
	up   *ctlSender
	down RemoteReceiver
	// deploys wakes the host's serve goroutine for a deploy command.
	deploys chan struct{}
	// handover queues the master's handover commands for the host's
	// handover goroutine (handover_remote.go).
	handover chan controlMsg
	// parts are the parts of an adopt step's metadata received so far;
	// the handover goroutine's only.
	parts adoptParts
	// started is the host's started channel, closed on the start command:
	// every task of the job, on every node, is spawned.
	started   chan struct{}
	startOnce sync.Once
	// serving tracks the host's control goroutines; none starts once
	// stopped is set.
	serving sync.WaitGroup
	mu      sync.Mutex // guards stopped
	stopped bool
	closed  sync.Once
}

// wait waits for the host's control goroutines, and lets none start.
func (c *hostCtl) wait() {
	c.mu.Lock()
	c.stopped = true
	c.mu.Unlock()
	c.serving.Wait()
}

// openControl opens the host's control channels with the master on node
// master, sends its registration and starts the goroutine that deploys
// its tasks when told.
func (h *host) openControl(index int, master string, fingerprint string, started chan struct{}) error {
	c := &hostCtl{deploys: make(chan struct{}, 1), handover: make(chan controlMsg, 64), started: started}
	out, err := h.net.OpenSender(controlKey(h.job.Name, h.epoch, index, true), master, h.controlFailed)
	if err != nil {
		return fmt.Errorf("actors: node %q: open control channel: %w", h.node, err)
	}
	c.up = &ctlSender{out: out}
	var in RemoteReceiver
	in, err = h.net.OpenReceiver(controlKey(h.job.Name, h.epoch, index, false), master, func(f RemoteFrame) {
		h.onControl(f, in)
	}, h.controlFailed)
	if err != nil {
		out.Close()
		return fmt.Errorf("actors: node %q: open control channel: %w", h.node, err)
	}
	c.down = in
	h.ctl = c
	c.serving.Add(2)
	go h.serve()
	go h.serveHandovers()
	return h.ctlSend(&controlMsg{Kind: ctlRegister, Fingerprint: fingerprint})
}

// ctlSend sends m to the master with the host's job, epoch and node.
func (h *host) ctlSend(m *controlMsg) error {
	m.Job, m.Epoch, m.Node = h.job.Name, h.epoch, h.node
	err := h.ctl.up.send(h.ctx, m)
	if err != nil && !h.stopping() {
		h.log.Error("control message to the job master not sent", "kind", m.Kind, "err", err)
	}
	return err
}

// controlFailed handles the failure of one of the host's control
// channels: the host cannot hear the master (or be heard), so its tasks
// stop. It tells the master on the other channel when it still can; the
// master sees the failed channel itself otherwise (a gap, a missing
// acknowledgement or a lost connection), and restarts the job. Called
// from the network's goroutine: it does not block.
func (h *host) controlFailed(err error) {
	if h.stopping() {
		return
	}
	h.log.Error("control channel with the job master failed; stopping the node's tasks", "epoch", h.epoch, "err", err)
	c := h.ctl
	c.mu.Lock()
	if !c.stopped {
		c.serving.Add(1)
		go func() {
			defer c.serving.Done()
			_ = h.ctlSend(&controlMsg{Kind: ctlFailed, Err: toWire(fmt.Errorf("%w: %w", ErrControlFailed, err))})
			h.cancelTasks()
		}()
	}
	c.mu.Unlock()
}

// cancelTasks unblocks the host's tasks; the master stops them.
func (h *host) cancelTasks() {
	h.stopOnce.Do(func() {
		close(h.done)
		h.cancel()
	})
}

// onControl handles a message of the master, on the network's goroutine.
func (h *host) onControl(f RemoteFrame, in RemoteReceiver) {
	m, err := decodeControl(f.Body)
	if in != nil {
		in.Processed(f.Seq)
	}
	if err != nil {
		h.controlFailed(err)
		return
	}
	if m.Job != h.job.Name || m.Epoch != h.epoch {
		h.stale.Add(1)
		h.log.Debug("control message of another epoch dropped", "epoch", m.Epoch, "host_epoch", h.epoch, "kind", m.Kind)
		return
	}
	switch m.Kind {
	case ctlDeploy:
		select {
		case h.ctl.deploys <- struct{}{}:
		default:
		}
	case ctlStart:
		h.ctl.startOnce.Do(func() { close(h.ctl.started) })
		h.start()
	case ctlTrigger:
		h.stage(m.Checkpoint, true)
		h.command(m.Epoch, triggerMsg{id: m.Checkpoint, stop: m.Flag})
	case ctlComplete:
		h.command(m.Epoch, completeMsg{id: m.Checkpoint, ack: m.Flag})
		h.stage(m.Checkpoint, false)
	case ctlAbort:
		h.command(m.Epoch, abortMsg{id: m.Checkpoint})
		h.stage(m.Checkpoint, false)
	case ctlCancel:
		h.cancelTasks()
	case ctlHandover, ctlHandoverStep:
		h.queueHandover(m)
	default:
		h.controlFailed(fmt.Errorf("%w: %d is not a command", errControlMsg, m.Kind))
	}
}

// serve deploys the host's tasks when the master says so: it builds and
// spawns them and reports deployed, or the failure.
func (h *host) serve() {
	defer h.ctl.serving.Done()
	select {
	case <-h.ctl.deploys:
	case <-h.done:
		return
	}
	err := h.build(h.pl)
	if err == nil && !h.stopping() {
		err = h.spawn()
	}
	if err != nil {
		_ = h.ctlSend(&controlMsg{Kind: ctlFailed, Err: toWire(err)})
		return
	}
	_ = h.ctlSend(&controlMsg{Kind: ctlDeployed})
}

// sendReport sends a report to the master over the control channel.
func (h *host) sendReport(rep hostReport) {
	m := controlMsg{}
	switch rep.kind {
	case reportFinished:
		m.Kind = ctlFinished
	case reportFailed:
		m.Kind, m.Err = ctlFailed, toWire(rep.err)
		// The control message carries a panic's text, not its stack:
		// log the stack here, on the node where the panic happened.
		var te *TaskError
		if errors.As(rep.err, &te) && te.Panic && len(te.Stack) > 0 {
			h.log.Error("task panicked; the job master gets the panic without its stack",
				"operator", te.Operator, "uid", te.UID, "subtask", te.Subtask, "panic", te.Err, "stack", string(te.Stack))
		}
	case reportNotified:
		m.Kind = ctlNotified
	case reportInput:
		switch in := rep.input.(type) {
		case snapshot.Ack:
			m.Kind, m.Checkpoint, m.Task, m.State, m.Alignment = ctlAck, int64(in.Checkpoint), in.Task, in.State.Operators, in.AlignmentTime
		case snapshot.Decline:
			m.Kind, m.Checkpoint, m.Task, m.Err = ctlDecline, int64(in.Checkpoint), in.Task, toWire(in.Reason)
		case snapshot.OutputHeld:
			m.Kind, m.Task = ctlOutputHeld, in.Task
		default:
			h.log.Error("report not sent: unknown checkpoint input", "type", fmt.Sprintf("%T", in))
			return
		}
	}
	_ = h.ctlSend(&m)
}

// closeControl closes the host's control channels once its goroutine
// ended.
func (h *host) closeControl() {
	if h.ctl == nil {
		return
	}
	h.ctl.wait()
	h.ctl.closed.Do(func() {
		h.ctl.up.close()
		h.ctl.down.Close()
	})
}

// masterCtl is the master's end of the control channels, one pair per
// node.
type masterCtl struct {
	// nodesMu guards down, up and ids: a handover invites nodes into the
	// running deployment (handover_remote.go), and a control channel's
	// failure reads them, also while openControl adds them.
	nodesMu sync.RWMutex
	down    []*ctlSender
	up      []RemoteReceiver
	// ids are the nodes' ids, by index: Cluster.Nodes, then the nodes
	// invited since.
	ids []string
	// released are the indexes of the nodes that left the running
	// deployment (Runner.Release): their channels are closed, they get
	// no command, and their channels' failures are not the job's.
	released map[int]bool
	// pending counts the goroutines handing reports to a busy master;
	// none starts once stopped is set.
	pending sync.WaitGroup
	mu      sync.Mutex // guards stopped
	stopped bool
	closed  sync.Once
}

// openControl opens the master's ends of every node's control channels,
// on the first node's network.
func (r *Runner) openControl() error {
	c := r.cfg.Cluster
	net, master := c.Nodes[0].Network, c.Nodes[0].ID
	r.ctl = &masterCtl{}
	r.ctlOpen.Store(true)
	for i, n := range c.Nodes {
		node := n.ID
		fail := func(err error) { r.controlFailed(node, err) }
		out, err := net.OpenSender(controlKey(r.job.Name, r.epoch, i, false), node, fail)
		if err != nil {
			return fmt.Errorf("actors: job master on node %q: open control channel to %q: %w", master, node, err)
		}
		// Under nodesMu: a channel opened before may fail meanwhile, and
		// its failure reads the nodes (controlFailed).
		r.ctl.nodesMu.Lock()
		r.ctl.down = append(r.ctl.down, &ctlSender{out: out})
		r.ctl.nodesMu.Unlock()
		var in RemoteReceiver
		in, err = net.OpenReceiver(controlKey(r.job.Name, r.epoch, i, true), node, func(f RemoteFrame) {
			r.onControl(node, f, in)
		}, fail)
		if err != nil {
			return fmt.Errorf("actors: job master on node %q: open control channel from %q: %w", master, node, err)
		}
		r.ctl.nodesMu.Lock()
		r.ctl.up = append(r.ctl.up, in)
		r.ctl.ids = append(r.ctl.ids, node)
		r.ctl.nodesMu.Unlock()
	}
	return nil
}

// senders returns the master's senders on the down channels, with their
// nodes' ids.
func (c *masterCtl) senders() ([]*ctlSender, []string) {
	c.nodesMu.RLock()
	defer c.nodesMu.RUnlock()
	return slices.Clone(c.down), slices.Clone(c.ids)
}

// live returns the master's senders on the down channels of the nodes
// in the deployment (not released), with their ids and indexes.
func (c *masterCtl) live() (down []*ctlSender, ids []string, index []int) {
	c.nodesMu.RLock()
	defer c.nodesMu.RUnlock()
	for i, id := range c.ids {
		if !c.released[i] {
			down, ids, index = append(down, c.down[i]), append(ids, id), append(index, i)
		}
	}
	return down, ids, index
}

// left reports whether node left the deployment: released, and not in
// it under another index.
func (c *masterCtl) left(node string) bool {
	c.nodesMu.RLock()
	defer c.nodesMu.RUnlock()
	gone := false
	for i, id := range c.ids {
		if id == node {
			if !c.released[i] {
				return false
			}
			gone = true
		}
	}
	return gone
}

// sender returns the sender on node index i's down channel.
func (c *masterCtl) sender(i int) *ctlSender {
	c.nodesMu.RLock()
	defer c.nodesMu.RUnlock()
	return c.down[i]
}

// closeControl closes the master's control channels.
func (r *Runner) closeControl() {
	if r.ctl == nil {
		return
	}
	r.ctl.mu.Lock()
	r.ctl.stopped = true
	r.ctl.mu.Unlock()
	// The job is over: the pending goroutines give up.
	r.stopOnce.Do(func() { close(r.done) })
	r.ctl.pending.Wait()
	r.ctl.closed.Do(func() {
		r.ctl.nodesMu.RLock()
		defer r.ctl.nodesMu.RUnlock()
		for i, s := range r.ctl.down {
			if !r.ctl.released[i] {
				s.close()
			}
		}
		for i, in := range r.ctl.up {
			if !r.ctl.released[i] {
				in.Close()
			}
		}
	})
}

// controlFailed fails the deployment for the failure of a control channel
// with node.
func (r *Runner) controlFailed(node string, err error) {
	if r.ctl != nil && r.ctl.left(node) {
		// A node released from the deployment closes its channels.
		r.log.Debug("control channel of a released node closed", "node", node, "err", err)
		return
	}
	r.deliver(hostReport{epoch: r.epoch, node: node, kind: reportFailed,
		err: fmt.Errorf("%w: job %q epoch %d: node %q: %w", ErrControlFailed, r.job.Name, r.epoch, node, err)})
}

// fail ends the deployment with err, as a failure report would; a
// command being sent to the hosts gives up, and this node's tasks stop
// taking input at once (cancelLocal): not once the master's loop hears
// the failure, nor once the other nodes are told, which may wait on a
// node that cannot be reached (a leader cut off from the majority).
func (r *Runner) fail(err error) {
	r.failed.CompareAndSwap(nil, &err)
	r.cancelLocal()
	defer r.cmdCancel()
	if r.ctlOpen.Load() {
		r.deliver(hostReport{epoch: r.epoch, kind: reportFailed, err: err})
		return
	}
	select {
	case r.reports <- hostReport{epoch: r.epoch, kind: reportFailed, err: err}:
	case <-r.done:
	}
}

// cause returns the error the deployment was failed with (fail), if it
// was, else err: what the failure cut short fails with an error of its
// own, which must not hide why the attempt ended.
func (r *Runner) cause(err error) error {
	if p := r.failed.Load(); p != nil {
		return *p
	}
	return err
}

// deliver hands a report to the master's loop without blocking the
// network's goroutine: when the inbox is full, a goroutine waits for room
// or the job's end.
func (r *Runner) deliver(rep hostReport) {
	select {
	case r.reports <- rep:
		return
	case <-r.done:
		return
	default:
	}
	c := r.ctl
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return
	}
	c.pending.Add(1)
	go func() {
		defer c.pending.Done()
		select {
		case r.reports <- rep:
		case <-r.done:
		}
	}()
}

// onControl handles a host's message, on the network's goroutine.
func (r *Runner) onControl(node string, f RemoteFrame, in RemoteReceiver) {
	m, err := decodeControl(f.Body)
	if in != nil {
		in.Processed(f.Seq)
	}
	if err != nil {
		r.controlFailed(node, err)
		return
	}
	if m.Job != r.job.Name {
		r.stale.Add(1)
		return
	}
	rep := hostReport{epoch: m.Epoch, node: node}
	switch m.Kind {
	case ctlRegister, ctlDeployed:
		select {
		case <-r.started:
			// A node invited into the running deployment
			// (handover_remote.go).
			r.handoverReply(node, m)
			return
		default:
		}
	}
	switch m.Kind {
	case ctlRegister:
		rep.kind, rep.fingerprint = reportRegister, m.Fingerprint
	case ctlDeployed:
		rep.kind = reportDeployed
	case ctlFinished:
		rep.kind = reportFinished
	case ctlFailed:
		rep.kind, rep.err = reportFailed, m.Err.toError(node)
		if rep.err == nil {
			rep.err = &RemoteError{Node: node, Msg: "failed without an error"}
		}
	case ctlNotified:
		rep.kind = reportNotified
	case ctlPrepared, ctlStepDone:
		r.handoverReply(node, m)
		return
	case ctlAck:
		rep.kind = reportInput
		rep.input = snapshot.Ack{Checkpoint: snapshot.ID(m.Checkpoint), Task: m.Task,
			State: snapshot.TaskState{Operators: m.State}, AlignmentTime: m.Alignment}
	case ctlDecline:
		reason := m.Err.toError(node)
		if reason == nil {
			reason = &RemoteError{Node: node, Msg: "declined without a reason"}
		}
		rep.kind = reportInput
		rep.input = snapshot.Decline{Checkpoint: snapshot.ID(m.Checkpoint), Task: m.Task, Reason: reason}
	case ctlOutputHeld:
		rep.kind, rep.input = reportInput, snapshot.OutputHeld{Task: m.Task}
	default:
		r.controlFailed(node, fmt.Errorf("%w: %d is not a report", errControlMsg, m.Kind))
		return
	}
	r.deliver(rep)
}

// commandAll sends a command of the current epoch to every host. A host
// that cannot be reached fails its control channel, which fails the
// deployment.
func (r *Runner) commandAll(ctx context.Context, m controlMsg) {
	m.Job, m.Epoch = r.job.Name, r.epoch
	down, ids, _ := r.ctl.live()
	for i, s := range down {
		if err := s.send(ctx, &m); err != nil && ctx.Err() == nil {
			r.controlFailed(ids[i], err)
		}
	}
}

// controlTimeout returns the bound of each handshake step.
func (r *Runner) controlTimeout() time.Duration {
	if d := r.cfg.Cluster.ControlTimeout; d > 0 {
		return d
	}
	return DefaultControlTimeout
}

// await collects one report of kind from every node, within the control
// timeout; check is called on each. A failure report, the timeout or
// ctx's end ends it with an error.
func (r *Runner) await(ctx context.Context, kind reportKind, what string, check func(hostReport) error) error {
	nodes := r.cfg.Cluster.Nodes
	got := make(map[string]bool, len(nodes))
	timer := r.cfg.Clock.NewTimer(r.controlTimeout())
	defer timer.Stop()
	for len(got) < len(nodes) {
		select {
		case rep := <-r.reports:
			if rep.epoch != r.epoch {
				r.stale.Add(1)
				continue
			}
			switch rep.kind {
			case reportFailed:
				return rep.err
			case kind:
				if got[rep.node] {
					return fmt.Errorf("%w: job %q: node %q %s twice", ErrControlFailed, r.job.Name, rep.node, what)
				}
				got[rep.node] = true
				if check != nil {
					if err := check(rep); err != nil {
						return err
					}
				}
			default:
				return fmt.Errorf("%w: job %q: node %q sent report %d before every node %s", ErrControlFailed, r.job.Name, rep.node, rep.kind, what)
			}
		case <-timer.Chan():
			var missing, where []string
			for _, n := range nodes {
				if !got[n.ID] {
					missing = append(missing, n.ID)
					if d := r.cfg.Cluster.Describe; d != nil {
						if s := d(n.ID); s != "" {
							where = append(where, fmt.Sprintf("%s: %s", n.ID, s))
						}
					}
				}
			}
			err := fmt.Errorf("%w: job %q epoch %d: nodes %q not %s within %s", ErrControlTimeout, r.job.Name, r.epoch, missing, what, r.controlTimeout())
			if len(where) > 0 {
				err = fmt.Errorf("%w (%s)", err, strings.Join(where, "; "))
			}
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// deployRemote registers every host (checking its plan fingerprint) and
// deploys its tasks, over the control channels.
func (r *Runner) deployRemote(ctx context.Context, want string) error {
	err := r.await(ctx, reportRegister, "registered", func(rep hostReport) error {
		if rep.fingerprint != want {
			return planMismatch(r.job.Name, rep.node, rep.fingerprint, want)
		}
		return nil
	})
	if err != nil {
		return err
	}
	r.commandAll(r.cmdCtx, controlMsg{Kind: ctlDeploy})
	return r.await(ctx, reportDeployed, "deployed", nil)
}
