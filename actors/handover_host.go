package actors

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/edgedio/edged/snapshot"
)

// The host's part of a handover (see handover.go): the job master's
// handover goroutine calls these methods one at a time, while the host's
// other tasks run. They take h.mu for the task and channel lists.

// prepareHandover tells every task of the host that checkpoint id's
// barrier hands the subtasks in moved over. The message is in every
// task's mailbox before the checkpoint is triggered, so before its
// barrier.
func (h *host) prepareHandover(id int64, moved map[TaskKey]bool) {
	for _, t := range h.taskList() {
		h.system.Root.Send(t.pid, handoverMsg{id: id, moved: moved})
	}
}

// localTask returns the host's task of subtask key, nil if it has none.
func (h *host) localTask(key TaskKey) *task {
	for _, t := range h.taskList() {
		if t.chain.Head().UID == key.UID && t.subtask == key.Subtask {
			return t
		}
	}
	return nil
}

// retire stops the host's task of subtask key, handed over at the
// barrier: once it handled what was sent to it before (the notification
// that the handover's savepoint completed, so its sinks committed), its
// actor stops, its remote channel ends close and its operators and state
// backends are closed. It returns when the task was handed over, and
// whether its sinks delivered everything the savepoint holds, waiting up
// to wait for those that deliver in the background (retireMsg).
func (h *host) retire(ctx context.Context, key TaskKey, id int64, wait time.Duration) (handedAt int64, committed bool, err error) {
	t := h.localTask(key)
	if t == nil {
		return 0, false, fmt.Errorf("node %q runs no subtask %s", h.node, key)
	}
	if !t.handed.Load() {
		return 0, false, fmt.Errorf("subtask %s on node %q was not handed over at the barrier", key, h.node)
	}
	done := make(chan bool, 1)
	h.system.Root.Send(t.pid, retireMsg{id: id, wait: wait, done: done})
	select {
	case committed = <-done:
	case <-ctx.Done():
		return 0, false, ctx.Err()
	case <-h.done:
		return 0, false, fmt.Errorf("node %q stopped", h.node)
	}
	_ = h.system.Root.StopFuture(t.pid).Wait()
	if t.gone != nil {
		close(t.gone)
	}
	h.mu.Lock()
	h.tasks = slices.DeleteFunc(h.tasks, func(x *task) bool { return x == t })
	h.chans = slices.DeleteFunc(h.chans, func(c *channel) bool { return c.to == t })
	h.mu.Unlock()
	for _, ch := range t.inChans {
		ch.closeRemote()
	}
	for _, ch := range t.outChans {
		ch.closeRemote()
	}
	// The channels a handover re-pointed replaced some of outChans in
	// the task's routers (parkMoved): their remote senders are closed
	// here too, or the last frame the task sent on one, which its reader
	// took before swapping to the new instance's channel and never
	// acknowledged, would fail the job at the channel's ack_timeout. So
	// is the sender a still parked channel replaced (unpark closes it),
	// which is in neither when it was itself a re-pointed channel.
	for _, ch := range t.parked {
		if ch.park != nil {
			ch.park.replaced.closeRemote()
		}
	}
	for _, r := range t.routers {
		for _, ch := range r.channels() {
			ch.closeRemote()
		}
	}
	var errs []error
	for i := len(t.ops) - 1; i >= 0; i-- {
		if t.ops[i] != nil {
			if err := h.closeOperator(t, i); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for _, c := range t.closers {
		if err := c(); err != nil {
			errs = append(errs, err)
		}
	}
	t.closers = nil
	for _, err := range errs {
		h.log.Warn("close handed-over subtask", "task", key.String(), "err", err)
	}
	h.handovers.Add(1)
	return t.handedAt.Load(), committed, nil
}

// openFromMoved opens, for every task of the host reading from subtask
// key, which now runs on node to (another node), the receiving end of
// the channel of generation gen from the new instance, and gives the task
// its new channel. The task takes it after the old channel's barrier.
func (h *host) openFromMoved(key TaskKey, gen int, to string) error {
	h.mu.Lock()
	var olds []*channel
	for _, ch := range h.chans {
		if ch.from == key && ch.to != nil {
			olds = append(olds, ch)
		}
	}
	h.mu.Unlock()
	for _, old := range olds {
		// The handover's savepoint completed: the reader passed the old
		// channel's barrier, and nothing more comes on it.
		old.superseded.Store(true)
		d := old.to
		nc := newChannel(old.index, d, nil)
		nc.gate, nc.toName, nc.toSub, nc.from, nc.dest = old.gate, old.toName, old.toSub, old.from, old.dest
		nc.key = old.key
		nc.key.Gen = gen
		in, err := h.net.OpenReceiver(nc.key, to, h.deliverer(d, nc), h.onFailure(d, nc))
		if err != nil {
			return fmt.Errorf("open channel %v from node %q: %w", nc.key, to, err)
		}
		nc.in = in
		h.mu.Lock()
		h.replaceChan(old, nc)
		h.remotes = append(h.remotes, nc.closeRemote)
		h.mu.Unlock()
		h.system.Root.Send(d.pid, swapMsg{ch: nc})
	}
	return nil
}

// replaceChan puts nc in old's place in the host's channel list. The
// caller holds h.mu.
func (h *host) replaceChan(old, nc *channel) {
	for i, c := range h.chans {
		if c == old {
			h.chans[i] = nc
			return
		}
	}
	h.chans = append(h.chans, nc)
}

// adopt builds, restores from savepoint md, and spawns subtask key on
// this node, with its channels of generation gen: to the tasks it sends
// to (their hosts opened the receiving ends first, openFromMoved) and
// from the tasks that send to it (parked on this node, or remote ones
// whose receiving ends it opens last, before they are re-pointed).
// nodeOf says where every other subtask runs.
func (h *host) adopt(key TaskKey, md *snapshot.Metadata, gen int, nodeOf func(c *Chain, sub int) string) (*task, error) {
	var c *Chain
	for _, ch := range h.plan.Chains {
		if ch.Head().UID == key.UID {
			c = ch
		}
	}
	if c == nil || key.Subtask < 0 || key.Subtask >= c.Head().Parallelism {
		return nil, fmt.Errorf("the plan has no subtask %s", key)
	}
	edgeIndex := make(map[*Edge]int, len(h.job.Edges))
	for i, e := range h.job.Edges {
		edgeIndex[e] = i
	}
	tailOf := make(map[*Vertex]*Chain)
	headOf := make(map[*Vertex]*Chain)
	for _, ch := range h.plan.Chains {
		tailOf[ch.Tail()] = ch
		headOf[ch.Head()] = ch
	}
	j := key.Subtask
	t := &task{run: h, chain: c, subtask: j, gone: make(chan struct{})}
	t.stats.Chain, t.stats.Subtask = c.Name(), j
	t.live.watermark.Store(math.MinInt64)
	name := fmt.Sprintf("task-g%d-%s-%d", gen, key.UID, j)
	t.pid = h.system.NewLocalPID(name)

	// Input channels, numbered as build numbers them.
	type remoteIn struct {
		ch   *channel
		node string
	}
	var remoteIns []remoteIn
	// fromParked records the inputs taken from senders on this node (their
	// parked channels): the host's record of who reads from whom, so that
	// a later handover of such a sender re-points them (openFromMoved).
	var fromParked []*channel
	for _, e := range c.In {
		from := tailOf[e.From]
		for i := range from.Head().Parallelism {
			if e.Partition == Forward && i != j {
				continue
			}
			k0 := ChannelKey{Job: h.job.Name, Epoch: h.epoch, Edge: edgeIndex[e], From: i, To: j}
			idx := t.nIn
			t.nIn++
			if node := nodeOf(from, i); node != h.node {
				ch := newChannel(idx, t, nil)
				ch.gate, ch.toName, ch.toSub = e.Input, c.Name(), j
				ch.key = k0
				ch.key.Gen = gen
				ch.from = TaskKey{UID: from.Head().UID, Subtask: i}
				ch.dest = key
				t.inChans = append(t.inChans, ch)
				remoteIns = append(remoteIns, remoteIn{ch, node})
				continue
			}
			h.mu.Lock()
			p := h.parked[k0]
			h.mu.Unlock()
			if p == nil {
				return nil, fmt.Errorf("channel %v: its sender on node %q did not park it at the barrier", k0, h.node)
			}
			// The sender's host numbered the channel as it saw it; the
			// index is the receiver's, and the sender does not read it.
			p.ch.index = idx
			t.inChans = append(t.inChans, p.ch)
			// The parked channel's fields are its sender's once it is
			// re-pointed: the record is a channel of its own.
			rec := newChannel(idx, t, nil)
			rec.gate, rec.toName, rec.toSub, rec.key = e.Input, c.Name(), j, k0
			rec.from, rec.dest = TaskKey{UID: from.Head().UID, Subtask: i}, key
			fromParked = append(fromParked, rec)
		}
	}

	// Output channels, by edge and target subtask.
	out := make(map[*Edge][]*channel)
	crosses := make(map[*Edge]bool)
	var opened []*channel
	var swaps [][2]*channel // old and new channels to tasks of this node
	fail := func(err error) (*task, error) {
		for _, ch := range opened {
			ch.closeRemote()
		}
		return nil, err
	}
	for _, e := range c.Out {
		to := headOf[e.To]
		crosses[e] = true
		for jj := range to.Head().Parallelism {
			if e.Partition == Forward && jj != j {
				continue
			}
			k := ChannelKey{Job: h.job.Name, Epoch: h.epoch, Edge: edgeIndex[e], From: j, To: jj, Gen: gen}
			dest := TaskKey{UID: to.Head().UID, Subtask: jj}
			var ch *channel
			if node := nodeOf(to, jj); node != h.node {
				ch = newChannel(0, nil, nil)
				ch.credits = 1
				ch.free = append(ch.free, &wireBatch{ch: ch})
				ch.toName, ch.toSub, ch.key, ch.from, ch.dest = to.Name(), jj, k, key, dest
				o, err := h.net.OpenSender(k, node, h.onFailure(t, ch))
				if err != nil {
					return fail(fmt.Errorf("open channel %v to node %q: %w", k, node, err))
				}
				ch.out = o
				opened = append(opened, ch)
			} else {
				d := h.localTask(dest)
				if d == nil {
					return fail(fmt.Errorf("node %q runs no subtask %s", h.node, dest))
				}
				var old *channel
				h.mu.Lock()
				for _, x := range h.chans {
					if x.to == d && x.from == key && x.key.Edge == k.Edge {
						old = x
					}
				}
				h.mu.Unlock()
				if old == nil {
					return fail(fmt.Errorf("subtask %s on node %q has no channel from %s", dest, h.node, key))
				}
				ch = newChannel(old.index, d, nil)
				ch.gate, ch.toName, ch.toSub, ch.key, ch.from, ch.dest = old.gate, old.toName, old.toSub, k, key, dest
				ch.credits = h.cfg.Credits
				for range h.cfg.Credits {
					ch.free = append(ch.free, &wireBatch{ch: ch})
				}
				swaps = append(swaps, [2]*channel{old, ch})
			}
			out[e] = append(out[e], ch)
			t.outChans = append(t.outChans, ch)
		}
	}
	if err := h.buildTask(t, out, crosses, md); err != nil {
		for i := len(t.ops) - 1; i >= 0; i-- {
			if t.ops[i] != nil {
				_ = h.closeOperator(t, i)
			}
		}
		for _, cl := range t.closers {
			_ = cl()
		}
		t.ops = nil
		return fail(err)
	}
	// The readers on this node take the new channels after the old ones'
	// barrier; the message is in their mailbox before anything the new
	// task sends.
	for _, ch := range t.outChans {
		if ch.to != nil {
			h.system.Root.Send(ch.to.pid, swapMsg{ch: ch})
		}
	}
	h.mu.Lock()
	h.tasks = append(h.tasks, t)
	h.chans = append(h.chans, fromParked...)
	for _, sw := range swaps {
		// The handover's savepoint completed: the reader here passed the
		// old channel's barrier (as openFromMoved marks those of the
		// other nodes).
		sw[0].superseded.Store(true)
		h.replaceChan(sw[0], sw[1])
	}
	for _, ch := range t.outChans {
		if ch.out != nil {
			h.chans = append(h.chans, ch)
			h.remotes = append(h.remotes, ch.closeRemote)
		}
	}
	h.mu.Unlock()
	props := actor.PropsFromProducer(func() actor.Actor { return t })
	if _, err := h.system.Root.SpawnNamed(props, name); err != nil {
		return nil, fmt.Errorf("spawn subtask %s: %w", key, err)
	}
	if t.source != nil {
		// A source split goes on from the position it snapshotted at the
		// barrier; its readers took its new channels already.
		h.system.Root.Send(t.pid, startMsg{})
	}
	for _, ri := range remoteIns {
		ch := ri.ch
		in, err := h.net.OpenReceiver(ch.key, ri.node, h.deliverer(t, ch), h.onFailure(t, ch))
		if err != nil {
			return nil, fmt.Errorf("open channel %v from node %q: %w", ch.key, ri.node, err)
		}
		ch.in = in
		h.mu.Lock()
		h.chans = append(h.chans, ch)
		h.remotes = append(h.remotes, ch.closeRemote)
		h.mu.Unlock()
	}
	h.handovers.Add(1)
	return t, nil
}

// repoint gives the host's parked channels to subtask key, now on node
// to, their route: the new task t when it runs on this node, else a
// sender of generation gen to its node. It returns how many channels it
// re-pointed.
func (h *host) repoint(key TaskKey, to string, gen int, t *task) (int, error) {
	h.mu.Lock()
	var ps []*parking
	for k, p := range h.parked {
		if p.ch.dest == key {
			ps = append(ps, p)
			delete(h.parked, k)
		}
	}
	h.mu.Unlock()
	for _, p := range ps {
		// The handover's savepoint completed: the old instance had
		// everything sent before the barrier, and nothing more goes on
		// the channel the parked one replaced.
		p.replaced.superseded.Store(true)
		rt := &route{}
		if to == h.node {
			if t == nil {
				return 0, fmt.Errorf("subtask %s does not run on node %q", key, h.node)
			}
			rt.to = t
		} else {
			k := p.ch.key
			k.Gen = gen
			owner := p.owner
			o, err := h.net.OpenSender(k, to, h.onFailure(owner, p.ch))
			if err != nil {
				return 0, fmt.Errorf("open channel %v to node %q: %w", k, to, err)
			}
			once := &onceSender{RemoteSender: o}
			rt.out = once
			h.mu.Lock()
			h.remotes = append(h.remotes, once.Close)
			h.mu.Unlock()
		}
		ch := p.ch
		ch.mu.Lock()
		p.route = rt
		ring := ch.waiting
		ch.waiting = false
		ch.mu.Unlock()
		if ring {
			select {
			case ch.wake <- struct{}{}:
			default:
			}
		}
		h.system.Root.Send(p.owner.pid, repointMsg{})
	}
	return len(ps), nil
}

// onceSender closes its sender once, whoever closes it first: the task
// that replaces the channel at a later handover, or the host when it
// stops.
type onceSender struct {
	RemoteSender
	once sync.Once
}

// Close closes the sender the first time.
func (s *onceSender) Close() { s.once.Do(s.RemoteSender.Close) }
