package actors

import (
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/watermark"
)

// startMsg tells a task that every task of the job is spawned: a source
// starts polling, and the task's processing-time timers are armed.
type startMsg struct{}

// pollMsg tells a source task to poll again.
type pollMsg struct{}

// timerMsg tells a task that its processing-time timer for at fired.
type timerMsg struct{ at int64 }

// task runs one subtask of a chain. It is the actor: protoactor calls
// Receive one message at a time, and no other goroutine touches its fields
// except pending (atomic) and the stats read after the job ended.
type task struct {
	run     *host
	chain   *Chain
	subtask int
	pid     *actor.PID
	// remote is the node the task runs on when that is not its host's
	// node: the host builds channels to it, not the task.
	remote string
	// nIn counts the input channels numbered so far while building.
	nIn int

	ops      []operators.Operator
	ctxs     []*operators.Context
	inputs   []input // by input channel index
	inChans  []*channel
	outChans []*channel // the channels this task sends on
	routers  []router
	source   sourceDriver
	// gone is closed once the task is retired (handed over to another
	// node): a goroutine awaiting its source's data gives up.
	gone chan struct{}

	// time is the timestamp of the record in the chain, shared by the
	// operators and read by the routers.
	time operators.TaskTime
	// merger combines the watermarks of the input channels.
	merger *watermark.Merger
	// idle is whether the task told its outputs it is idle.
	idle bool
	// heldWM is the latest watermark the task's operators emitted while
	// its output was idle, not sent (if holding): it goes out when the
	// output is active again.
	heldWM  int64
	holding bool
	// restoredTime is set when the merger was restored from a checkpoint
	// and the operators have not been given its watermark yet.
	restoredTime bool
	// procFloor is the least processing time (ms) the task reads: one
	// past the latest processing time of the snapshot it was restored
	// from, so that its processing time does not go back across a
	// restore (a clock behind the old node's, or the same millisecond),
	// and a timer that fired before the snapshot is behind it; 0 when not
	// restored.
	procFloor int64
	// replaying is set while replayTime gives the operators the restored
	// watermark: they take it by RestoreWatermark.
	replaying bool
	// timers are the processing-time callbacks of the operators.
	timers procTimers

	// current is the index in ops of the operator running, for errors.
	current int32
	// keying is the key-by edge whose key function is running, for
	// errors; nil when none is.
	keying *Edge
	// pending counts data messages sent to this task and not yet received.
	pending atomic.Int64
	// openSince is when the oldest open output batch was opened (zero when
	// none is).
	openSince time.Time
	started   bool // the actor and its host have started: timers may be armed
	ended     int  // input channels that delivered end-of-stream
	done      bool // finished or failed: no more input
	failed    bool // failed: ignore every message

	// aligner aligns checkpoint barriers (tasks with inputs); held is the
	// input held back on blocked channels, in arrival order.
	aligner *Aligner
	held    []message
	// stopSource is the stop-with-savepoint whose barrier a source sent,
	// 0 if none: the source emits nothing more unless it is aborted.
	stopSource int64
	// lastSnap is the last checkpoint the task snapshotted; triggered
	// lists the newer checkpoints triggered while it ran without a
	// source: their barriers come on its inputs, or else every upstream
	// task snapshotted them finished and the task snapshots them when it
	// finishes.
	lastSnap  int64
	triggered []int64

	// closers release what the task's operators hold (state backends).
	closers []func() error
	// flushers are the indices in ops of the operators that buffer what
	// they write (operators.Flusher): flushed whenever the task has no
	// more input waiting.
	flushers []int32

	stats TaskStats
	// live are the counters others may read while the task runs.
	live taskCounters

	// handoverState is the task's part in a handover.
	handoverState
}

// taskCounters are a task's counters, updated per batch by the task and
// read by anyone.
type taskCounters struct {
	recordsIn, recordsOut atomic.Int64
	batchesIn, batchesOut atomic.Int64
	watermark             atomic.Int64
}

// TaskStats counts what one task did.
type TaskStats struct {
	Chain      string
	Subtask    int
	BatchesIn  int64
	RecordsIn  int64
	BatchesOut int64
	// RecordsOut is TaskMetrics.RecordsOut when the task ended.
	RecordsOut int64
	// Watermark is the task's input watermark when it ended.
	Watermark int64
}

// Receive handles one message. It never lets a panic escape to protoactor.
func (t *task) Receive(c actor.Context) {
	if t.failed || t.run.stopping() {
		return
	}
	defer t.recover()
	if t.handed.Load() {
		t.receiveHanded(c)
		return
	}
	if t.restoredTime {
		t.replayTime()
	}
	switch m := c.Message().(type) {
	case message:
		t.pending.Add(-1)
		if t.holdSwapped(m) {
			return
		}
		if !t.done {
			t.dispatch(m)
		}
	case handoverMsg:
		t.prepareHandover(m)
	case swapMsg:
		t.installSwap(m.ch)
	case repointMsg:
		t.unparkAll()
	case retireMsg:
		// Not handed over: nothing to wait for.
		m.done <- false
	case triggerMsg:
		t.onTrigger(m)
	case completeMsg:
		t.notify(m.id, true)
		if m.ack {
			t.waitCommitted(m.id)
			t.run.notified()
		}
	case abortMsg:
		t.notify(m.id, false)
	case *actor.Started:
		// Operators may have asked for processing-time callbacks in Open;
		// the clock timer is armed once every task of the job is spawned
		// (the host started: see startTimers), at once for a task spawned
		// in a running job (a handover).
		select {
		case <-t.run.started:
			t.startTimers()
		default:
		}
	case timerMsg:
		t.timers.fired(m.at)
		if !t.done {
			t.fireTimers()
		}
	case startMsg:
		t.startTimers()
		if t.source != nil && !t.done && t.stopSource == 0 {
			t.poll()
		}
	case pollMsg:
		if !t.done && t.stopSource == 0 {
			t.poll()
		}
	}
}

// dispatch handles a message from an input channel, or holds it back while
// its channel is blocked by barrier alignment.
func (t *task) dispatch(m message) {
	ch := m.channel()
	if t.aligner != nil && t.aligner.Blocked(ch.index) {
		t.held = append(t.held, m)
		return
	}
	switch m := m.(type) {
	case *endOfStream:
		if t.aligner != nil {
			t.align(t.aligner.EndOfStream(t.run.cfg.Clock.Now(), ch.index))
		}
		t.ended++
		if t.ended == len(t.inChans) {
			t.finish()
		}
	case *watermarkMsg:
		wm, ok := t.merger.Watermark(ch.index, m.wm)
		t.inputTime(wm, ok)
	case *statusMsg:
		wm, ok := t.merger.SetIdle(ch.index, m.idle)
		t.inputTime(wm, ok)
	case *barrierMsg:
		t.align(t.aligner.Barrier(t.run.cfg.Clock.Now(), ch.index, m.id))
		t.oldBarrier(ch, m.id)
	default:
		t.onData(m)
	}
}

// align carries out what the aligner decided: snapshot and forward a
// barrier, then process the input held back, in the order it came.
func (t *task) align(act AlignAction) {
	if act.Aborted != 0 {
		t.run.log.Debug("alignment aborted", "checkpoint_id", act.Aborted, "task", t.stats.Chain, "subtask", t.subtask)
	}
	if act.Snapshot != 0 {
		// The barrier may have come from another node before the
		// trigger reached this one.
		t.run.stage(act.Snapshot, true)
		t.barrier(act.Snapshot)
		hand := t.ho != nil && t.ho.moving && act.Snapshot == t.ho.id
		if hand {
			t.handed.Store(true)
		}
		t.checkpoint(act.Snapshot, act.Alignment)
		if hand {
			t.handOver()
			return
		}
	}
	if act.Release && len(t.held) > 0 {
		held := t.held
		t.held = nil
		for _, m := range held {
			if t.done {
				return
			}
			t.dispatch(m)
		}
	}
}

// barrier sends checkpoint id's barrier on every output, after the records
// sent before it.
func (t *task) barrier(id int64) {
	for _, r := range t.routers {
		r.broadcast(func(ch *channel) message { return &barrierMsg{ch: ch, id: id} })
	}
	if t.ho != nil && id == t.ho.id {
		t.parkMoved()
	}
}

// onTrigger starts checkpoint id at a source: its barrier goes out and its
// state is snapshotted. A task that finished only snapshots (its final
// state: it emits nothing more) and acknowledges. A running task without
// a source waits for the barriers on its inputs, and snapshots at its end
// what none came for.
func (t *task) onTrigger(m triggerMsg) {
	switch {
	case m.id <= t.lastSnap:
	case t.done:
		t.checkpoint(m.id, 0)
	case t.source != nil:
		t.flush()
		t.barrier(m.id)
		if m.stop {
			// Stop with a savepoint: emit nothing after the barrier.
			t.stopSource = m.id
		}
		// A source split handed over at this barrier snapshots its
		// position and emits nothing more: its new instance goes on
		// from that position.
		hand := t.ho != nil && t.ho.moving && m.id == t.ho.id
		if hand {
			t.handed.Store(true)
		}
		t.checkpoint(m.id, 0)
		if hand {
			t.handOver()
		}
	default:
		t.triggered = append(t.triggered, m.id)
	}
}

// notify tells the operators that checkpoint id completed (or was
// aborted); an aborted alignment releases what it held.
func (t *task) notify(id int64, complete bool) {
	if !complete && t.aligner != nil {
		t.align(t.aligner.Abort(id))
	}
	if !complete {
		t.triggered = slices.DeleteFunc(t.triggered, func(x int64) bool { return x == id })
		if t.stopSource == id {
			// The stop failed: the job keeps running.
			t.stopSource = 0
			t.run.system.Root.Send(t.pid, pollMsg{})
		}
	}
	for i, op := range t.ops {
		l, ok := op.(operators.CheckpointListener)
		if !ok {
			continue
		}
		t.current = int32(i)
		var err error
		if complete {
			err = l.NotifyCheckpointComplete(id)
		} else {
			err = l.NotifyCheckpointAborted(id)
		}
		if err != nil {
			operators.Fail(err)
		}
	}
}

// waitCommitted waits until the operators that deliver in the background
// delivered what checkpoint id (one that ends the job) commits; a failure
// fails the task, so the job is not marked committed.
func (t *task) waitCommitted(id int64) {
	for i, op := range t.ops {
		w, ok := op.(operators.CommitWaiter)
		if !ok {
			continue
		}
		t.current = int32(i)
		if err := w.WaitCommitted(id); err != nil {
			operators.Fail(err)
		}
	}
}

// inputTime passes on what a watermark or status message changed: the
// task's watermark after its status when the task became active, before
// it when the task became idle. The call that makes the task idle can
// also advance its watermark (to the largest of its idle inputs'): that
// watermark goes out while the output is still active, so that the
// windows downstream fire whichever input went idle last, and the idle
// status after it (a watermark out of an idle output is held until it is
// active again).
func (t *task) inputTime(wm int64, advanced bool) {
	idle, changed := t.merger.StatusChanged()
	if changed && !idle {
		t.status(false)
	}
	if advanced {
		t.watermark(0, wm)
	}
	if changed && idle {
		t.status(true)
	}
	t.afterMessage()
}

func (t *task) onData(m message) {
	ch := m.channel()
	t.current = 0
	t.live.batchesIn.Add(1)
	t.live.recordsIn.Add(int64(t.inputs[ch.index].process(m)))
	ch.release(m)
	t.afterMessage()
}

// afterMessage flushes the outputs when the mailbox is empty or the linger
// time has passed.
func (t *task) afterMessage() {
	if t.pending.Load() == 0 {
		t.flush()
	} else {
		t.lingerCheck()
	}
}

func (t *task) poll() {
	t.current = 0
	t.time.Timestamp = operators.NoTimestamp
	st, err := t.source.poll(t.run.cfg.BatchSize)
	if err != nil {
		operators.Fail(err)
	}
	switch st {
	case operators.MoreAvailable:
		t.lingerCheck()
		t.run.system.Root.Send(t.pid, pollMsg{})
	case operators.NothingAvailable:
		t.flush()
		ready := t.source.available()
		if ready == nil {
			operators.Fail(ErrNilAvailable)
		}
		t.run.await(ready, t)
	case operators.EndOfInput:
		// A bounded source ends with the final watermark, so that every
		// event-time window and timer downstream fires.
		t.watermark(1, watermark.MaxWatermark)
		t.finish()
	}
}

// watermark passes wm to the operators from index from on: the first one
// that handles watermarks takes it (and forwards what it decides with
// EmitWatermark); if none does, it goes out on every output channel.
func (t *task) watermark(from int, wm int64) {
	for i := from; i < len(t.ops); i++ {
		if h, ok := t.ops[i].(operators.WatermarkHandler); ok {
			prev := t.current
			t.current = int32(i)
			var err error
			if r, ok := h.(operators.WatermarkRestorer); ok && t.replaying {
				err = r.RestoreWatermark(wm)
			} else {
				err = h.ProcessWatermark(wm)
			}
			if err != nil {
				operators.Fail(err)
			}
			t.current = prev
			return
		}
	}
	// A watermark out of a task whose output is idle is held until the
	// output is active again (as Flink's outputs drop watermarks while
	// idle): it must not make the output active, since nothing would
	// mark it idle again. A split away from its dead node, idle for good,
	// would otherwise hold every window back at the watermark its
	// restored timestamp assigner emits once. The final watermark (end of
	// input) makes the output active and goes out.
	if t.idle {
		if wm != watermark.MaxWatermark {
			if !t.holding || wm > t.heldWM {
				t.heldWM, t.holding = wm, true
			}
			return
		}
		t.status(false)
	}
	t.emitWatermark(wm)
}

// emitWatermark sends wm on every output channel.
func (t *task) emitWatermark(wm int64) {
	t.live.watermark.Store(wm)
	for _, r := range t.routers {
		r.broadcast(func(ch *channel) message { return &watermarkMsg{ch: ch, wm: wm} })
	}
}

// status tells the downstream tasks that this task's output is idle or
// active again; active again, the watermark held while it was idle goes
// out after the status.
func (t *task) status(idle bool) {
	if t.idle == idle {
		return
	}
	t.idle = idle
	for _, r := range t.routers {
		r.broadcast(func(ch *channel) message { return &statusMsg{ch: ch, idle: idle} })
	}
	if !idle && t.holding {
		t.holding = false
		if t.heldWM > t.live.watermark.Load() {
			t.emitWatermark(t.heldWM)
		}
	}
}

// finish runs when all input has ended: every operator finishes, head
// first, then end-of-stream goes out on every channel.
func (t *task) finish() {
	for i, op := range t.ops {
		t.current = int32(i)
		if err := op.Finish(); err != nil {
			operators.Fail(fmt.Errorf("finish: %w", err))
		}
	}
	t.current = int32(len(t.ops) - 1)
	for _, r := range t.routers {
		r.broadcast(func(ch *channel) message { return &endOfStream{ch: ch} })
	}
	t.timers.stop()
	t.done = true
	// Checkpoints triggered while the task ran whose barrier came on no
	// input: every upstream task snapshotted them after it finished, so
	// they cover all the input, and the task's final state goes with them.
	pending := t.triggered
	t.triggered = nil
	for _, id := range pending {
		if id > t.lastSnap {
			t.checkpoint(id, 0)
		}
	}
	t.run.report(t, nil)
}

// noteOpened is called by a router that opened its first batch.
func (t *task) noteOpened() {
	if t.openSince.IsZero() {
		t.openSince = t.run.cfg.Clock.Now()
	}
}

func (t *task) lingerCheck() {
	if !t.openSince.IsZero() && t.run.cfg.Clock.Since(t.openSince) >= t.run.cfg.Linger {
		t.flush()
	}
}

func (t *task) flush() {
	for _, r := range t.routers {
		if r.opened() {
			r.flush()
		}
	}
	t.openSince = time.Time{}
	if t.done || len(t.ops) == 0 {
		return
	}
	for _, i := range t.flushers {
		t.current = i
		if err := t.ops[i].(operators.Flusher).Flush(); err != nil {
			operators.Fail(err)
		}
	}
}

// sendData sends a message to the task at the end of ch.
func (t *task) sendData(ch *channel, m message) {
	if ch.park != nil && !t.unpark(ch) {
		t.parkSend(ch, m)
		return
	}
	if ch.out != nil {
		t.sendRemote(ch, m)
		return
	}
	if _, ok := m.(interface{ isBatch() }); ok {
		ch.noteSent()
		t.live.batchesOut.Add(1)
	}
	ch.to.pending.Add(1)
	t.run.system.Root.Send(ch.to.pid, m)
}

// sendRemote sends a message on a channel whose receiver runs on another
// node, in the channel's sequence. It blocks while the channel has no
// credit; a failed channel fails the task.
func (t *task) sendRemote(ch *channel, m message) {
	var kind FrameKind
	var value int64
	var body []byte
	switch m := m.(type) {
	case *wireBatch:
		// The body is the task's again once Send returns (the network
		// copies what it keeps): the buffer goes back to the channel
		// then, for the next batch to be encoded into.
		kind, body = FrameBatch, m.data
		defer func() {
			m.data = body[:0]
			ch.release(m)
		}()
		ch.sent.Add(1)
		t.live.batchesOut.Add(1)
	case *watermarkMsg:
		kind, value = FrameWatermark, m.wm
	case *statusMsg:
		kind = FrameStatus
		if m.idle {
			value = 1
		}
	case *barrierMsg:
		kind, value = FrameBarrier, m.id
	case *endOfStream:
		kind = FrameEnd
	default:
		operators.Fail(fmt.Errorf("actors: %T cannot cross nodes", m))
	}
	if err := ch.out.Send(t.run.ctx, kind, value, body); err != nil {
		if t.run.stopping() {
			panic(errCancelled)
		}
		operators.Fail(fmt.Errorf("channel to %s[%d]: %w", ch.toName, ch.toSub, err))
	}
}

// startTimers arms the clock timer of the processing-time callbacks the
// operators asked for so far. Not before the host started: a callback
// may send on a channel to another node (a timestamp assigner's periodic
// watermark, a process function's restored timer), and that node opens
// the channel's receiving end when it deploys its tasks, which every node
// reported done only once the host is started. A frame sent before would
// be lost, and the receiver would fail the channel at the next one for
// the gap.
func (t *task) startTimers() {
	if t.started {
		return
	}
	t.started = true
	t.timers.arm(t)
}

// fireTimers runs the processing-time callbacks that are due.
func (t *task) fireTimers() {
	now := t.procNow()
	for {
		cb, ok := t.timers.popDue(now)
		if !ok {
			break
		}
		t.current = int32(cb.op)
		t.time.Timestamp = operators.NoTimestamp
		if err := cb.fn(now); err != nil {
			operators.Fail(err)
		}
	}
	t.timers.arm(t)
	t.afterMessage()
}

// recover turns a panic in Receive into the failure of the task; a task
// unwound by cancellation just stops.
func (t *task) recover() {
	r := recover()
	if r == nil {
		return
	}
	t.done, t.failed = true, true
	t.timers.stop()
	if err, ok := r.(error); ok && errors.Is(err, errCancelled) {
		return
	}
	v := t.chain.Vertices[t.current]
	te := &TaskError{
		Job:         t.run.job.Name,
		Operator:    v.Name,
		UID:         v.UID,
		Subtask:     t.subtask,
		Parallelism: v.Parallelism,
	}
	setCause(te, r)
	if e := t.keying; e != nil {
		te.Err = fmt.Errorf("the key function of the key-by edge %q -> %q: %w", e.From.Name, e.To.Name, te.Err)
	}
	t.run.report(t, te)
}

// setCause sets te's cause from the recovered panic value r: the error
// given to operators.Fail, or the panic itself with its stack.
func setCause(te *TaskError, r any) {
	switch x := r.(type) {
	case *operators.Failure:
		te.Err = x.Err
	case error:
		te.Panic, te.Err, te.Stack = true, x, debug.Stack()
	default:
		te.Panic, te.Err, te.Stack = true, fmt.Errorf("%v", x), debug.Stack()
	}
}
