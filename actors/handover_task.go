package actors

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/edgedio/edged/operators"
)

// The task's part of a handover (see handover.go). Before the handover's
// savepoint is triggered, every task hears of it (handoverMsg), so that
// its barrier finds each task ready:
//
//   - a task sending to a moved subtask forwards the barrier on the old
//     channel and parks the channel: what it sends after the barrier
//     waits in the parked channel, bounded by the channel's credits,
//     until the channel is re-pointed to the new instance (repointMsg);
//   - the moved subtask snapshots at the barrier and then handles
//     nothing more but the notifications of checkpoints (its sinks
//     commit), until its host retires it;
//   - a task reading from a moved subtask takes the old channel up to the
//     barrier, and the new channel (swapMsg) only after it: what the new
//     instance sends first waits until then.

// handoverMsg tells a task that checkpoint id's barrier hands the subtasks
// in moved over to other nodes.
type handoverMsg struct {
	id    int64
	moved map[TaskKey]bool
}

// swapMsg gives a task the channel that replaces its input channel of the
// same index, from the new instance of a moved subtask.
type swapMsg struct{ ch *channel }

// repointMsg tells a task that some of its parked channels have a route.
type repointMsg struct{}

// retireMsg asks a handed-over task to answer on done once its operators
// were notified that checkpoint id (the handover's savepoint) completed:
// its sinks committed what the savepoint covers. It answers true when
// the operators that deliver in the background (operators.CommitWaiter)
// also delivered all of it within wait: the new instance then restores
// the savepoint as committed (operators.Context.RestoredCommitted) and
// publishes none of it again. It answers false when one of them failed
// or took longer (a broker down): closing the task cuts its delivery
// short, and the new instance publishes what the savepoint holds again,
// under the same ids.
type retireMsg struct {
	id   int64
	wait time.Duration
	done chan bool // buffered: one answer
}

// answerRetire answers m once the task's operators were notified of
// m.id's completion.
func (t *task) answerRetire(m *retireMsg) {
	m.done <- t.handedCommitted(m.id, m.wait)
}

// handedCommitted waits, up to wait, until the task's operators that
// deliver in the background delivered what checkpoint id commits, and
// reports whether they all did. The wait runs beside the actor, which
// handles nothing else meanwhile; a wait cut short ends when the
// retired task's operators are closed.
func (t *task) handedCommitted(id int64, wait time.Duration) bool {
	var ws []operators.CommitWaiter
	for _, op := range t.ops {
		if w, ok := op.(operators.CommitWaiter); ok {
			ws = append(ws, w)
		}
	}
	if len(ws) == 0 {
		return true
	}
	res := make(chan error, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				res <- fmt.Errorf("panic: %v", r)
			}
		}()
		var errs []error
		for _, w := range ws {
			if err := w.WaitCommitted(id); err != nil {
				errs = append(errs, err)
			}
		}
		res <- errors.Join(errs...)
	}()
	timer := t.run.cfg.Clock.NewTimer(wait)
	defer timer.Stop()
	var err error
	select {
	case err = <-res:
	case <-timer.Chan():
		err = fmt.Errorf("not delivered within %s", wait)
	}
	if err != nil {
		t.run.log.Warn("handover: the handed-over subtask's sinks did not deliver what its savepoint holds; the new instance publishes it again",
			"task", t.stats.Chain, "subtask", t.subtask, "checkpoint_id", id, "err", err)
		return false
	}
	return true
}

// taskHandover is what a task knows of the handover in progress.
type taskHandover struct {
	id    int64
	moved map[TaskKey]bool
	// moving: the task itself is handed over at the barrier.
	moving bool
	// swaps are the input channels from moved subtasks, by index.
	swaps map[int]*inSwap
}

// inSwap replaces one input channel: old delivers up to the handover's
// barrier, new after it.
type inSwap struct {
	old, new *channel
	oldDone  bool
	held     []message
}

// parking holds what a task sends on a channel to a subtask being handed
// over, until the channel's route is set.
type parking struct {
	ch    *channel
	owner *task
	// replaced is the channel the parked one replaced: its remote end is
	// closed once the parked one is re-pointed.
	replaced *channel
	// route is the channel's new end; set by the host under ch.mu.
	route *route
	// queue is what the owner sent while parked, in order; owner's
	// goroutine only. A batch joins the batch queued before it while
	// their bodies fit in merge bytes, so that the parked channel holds
	// up to credits times merge bytes of records, however small the
	// batches the owner sends.
	queue []message
	merge int
}

// defaultParkMerge caps the body of a parked batch when the replaced
// channel had no remote end to tell its cap.
const defaultParkMerge = 64 << 10

// parkSend queues m on parked channel ch.
func (t *task) parkSend(ch *channel, m message) {
	p := ch.park
	if w, ok := m.(*wireBatch); ok {
		if n := len(p.queue); n > 0 {
			if last, ok := p.queue[n-1].(*wireBatch); ok && len(last.data)+len(w.data) <= p.merge {
				last.data = append(last.data, w.data...)
				w.data = w.data[:0]
				ch.release(w)
				return
			}
		}
	}
	p.queue = append(p.queue, m)
}

// route is where a parked channel leads: a task of the same node, or a
// remote sender to the new instance's node.
type route struct {
	to  *task
	out RemoteSender
}

// unpark sends what waits in p's channel once its route is set.
func (p *parking) unpark() { p.owner.unpark(p.ch) }

// handoverState holds a task's handover fields.
type handoverState struct {
	ho *taskHandover
	// parked are the task's parked channels.
	parked []*channel
	// handed is set once the task was handed over at the barrier: it
	// handles nothing but checkpoint notifications from then on.
	handed atomic.Bool
	// handedAt is when it was handed over (UnixNano).
	handedAt atomic.Int64
	// notified is the latest checkpoint whose completion the handed-over
	// task's operators were notified of; retiring waits for its host's
	// retire request until then.
	notified int64
	retiring *retireMsg
}

// receiveHanded handles a message of a task that was handed over.
func (t *task) receiveHanded(c actor.Context) {
	switch m := c.Message().(type) {
	case message:
		t.pending.Add(-1)
	case completeMsg:
		t.notify(m.id, true)
		if m.ack {
			t.run.notified()
		}
		t.notified = max(t.notified, m.id)
		if t.retiring != nil && t.notified >= t.retiring.id {
			t.answerRetire(t.retiring)
			t.retiring = nil
		}
	case abortMsg:
		t.notify(m.id, false)
	case retireMsg:
		if t.notified >= m.id {
			t.answerRetire(&m)
			return
		}
		t.retiring = &m
	}
}

// prepareHandover readies the task for handover m.
func (t *task) prepareHandover(m handoverMsg) {
	self := TaskKey{UID: t.chain.Head().UID, Subtask: t.subtask}
	ho := &taskHandover{id: m.id, moved: m.moved, moving: m.moved[self], swaps: make(map[int]*inSwap)}
	for _, ch := range t.inChans {
		if m.moved[ch.from] {
			ho.swaps[ch.index] = &inSwap{old: ch}
		}
	}
	t.ho = ho
}

// holdSwapped holds m back when it came on the new channel of an input
// whose old channel has not delivered the handover's barrier yet.
func (t *task) holdSwapped(m message) bool {
	if t.ho == nil || len(t.ho.swaps) == 0 {
		return false
	}
	ch := m.channel()
	sw := t.ho.swaps[ch.index]
	if sw == nil || ch == sw.old {
		return false
	}
	if sw.new == nil {
		sw.new = ch
	}
	sw.held = append(sw.held, m)
	return true
}

// oldBarrier is called after the barrier of checkpoint id on input ch was
// dispatched: the handover's barrier ends an old channel.
func (t *task) oldBarrier(ch *channel, id int64) {
	if t.ho == nil || id != t.ho.id {
		return
	}
	sw := t.ho.swaps[ch.index]
	if sw == nil || sw.old != ch {
		return
	}
	sw.oldDone = true
	if sw.new != nil {
		t.completeSwap(ch.index, sw)
	}
}

// installSwap takes the new channel of an input.
func (t *task) installSwap(ch *channel) {
	var sw *inSwap
	if t.ho != nil {
		sw = t.ho.swaps[ch.index]
	}
	if sw == nil {
		operators.Fail(fmt.Errorf("%w: input channel %d of %s[%d] replaced without a handover", ErrHandover, ch.index, t.stats.Chain, t.subtask))
	}
	sw.new = ch
	if sw.oldDone {
		t.completeSwap(ch.index, sw)
	}
}

// completeSwap makes sw's new channel the input and handles what it held.
func (t *task) completeSwap(idx int, sw *inSwap) {
	delete(t.ho.swaps, idx)
	t.inChans[idx] = sw.new
	sw.old.closeRemote()
	// The new instance starts with its output active, as any restored
	// task does (an idle one says so again once it runs): the input is
	// active from the swap on, at no less than the task's watermark. A
	// source split idle while away and back on its node then holds the
	// watermark again instead of being left out of it.
	if t.merger != nil {
		wm, ok := t.merger.SetIdle(idx, false)
		t.inputTime(wm, ok)
	}
	for _, m := range sw.held {
		if t.done {
			return
		}
		t.dispatch(m)
	}
}

// parkMoved parks the task's channels to subtasks handed over at the
// handover's barrier, which was just sent on them.
func (t *task) parkMoved() {
	if t.ho.moving {
		return
	}
	for _, r := range t.routers {
		for i, ch := range r.channels() {
			if !t.ho.moved[ch.dest] || ch.park != nil {
				continue
			}
			pc := &channel{index: ch.index, gate: ch.gate, toName: ch.toName, toSub: ch.toSub,
				key: ch.key, from: ch.from, dest: ch.dest, credits: t.run.cfg.Credits, wake: make(chan struct{}, 1)}
			for range pc.credits {
				pc.free = append(pc.free, &wireBatch{ch: pc})
			}
			p := &parking{ch: pc, owner: t, replaced: ch, merge: ch.bodyCap()}
			if p.merge <= 0 {
				p.merge = defaultParkMerge
			}
			pc.park = p
			if t.idle {
				// The new instance restores its inputs active: it hears
				// first that this one is idle, as the old one had.
				p.queue = append(p.queue, &statusMsg{ch: pc, idle: true})
			}
			if err := r.replace(i, pc); err != nil {
				operators.Fail(err)
			}
			// The task's backpressure counts pc's sender from now on
			// (outChans, which the metrics read from other goroutines,
			// stays as built).
			ch.next.Store(pc)
			t.parked = append(t.parked, pc)
			h := t.run
			h.mu.Lock()
			if h.parked == nil {
				h.parked = make(map[ChannelKey]*parking)
			}
			k := ch.key
			k.Gen = 0
			h.parked[k] = p
			h.mu.Unlock()
		}
	}
}

// unpark sends what waits in parked channel ch once its route is set, and
// reports whether ch is no longer parked.
func (t *task) unpark(ch *channel) bool {
	p := ch.park
	if p == nil {
		return true
	}
	ch.mu.Lock()
	rt := p.route
	ch.mu.Unlock()
	if rt == nil {
		return false
	}
	ch.park = nil
	ch.to, ch.out = rt.to, rt.out
	queue := p.queue
	p.queue = nil
	for _, m := range queue {
		t.sendData(ch, m)
	}
	p.replaced.closeRemote()
	for k, c := range t.parked {
		if c == ch {
			t.parked = append(t.parked[:k], t.parked[k+1:]...)
			break
		}
	}
	return true
}

// unparkAll sends what waits in every parked channel with a route.
func (t *task) unparkAll() {
	for _, ch := range append([]*channel(nil), t.parked...) {
		t.unpark(ch)
	}
	t.afterMessage()
}

// handOver ends the task's processing after it snapshotted the
// handover's barrier.
func (t *task) handOver() {
	t.timers.stop()
	t.handedAt.Store(time.Now().UnixNano())
	t.run.log.Debug("subtask handed over at the barrier", "checkpoint_id", t.ho.id, "task", t.stats.Chain, "subtask", t.subtask)
}
