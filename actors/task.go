package actors

import (
	"errors"
	"fmt"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/edgedio/edged/operators"
)

// startMsg tells a source task to start polling.
type startMsg struct{}

// pollMsg tells a source task to poll again.
type pollMsg struct{}

// task runs one subtask of a chain. It is the actor: protoactor calls
// Receive one message at a time, and no other goroutine touches its fields
// except pending (atomic) and the stats read after the job ended.
type task struct {
	run     *Runner
	chain   *Chain
	subtask int
	pid     *actor.PID

	ops     []operators.Operator
	ctxs    []*operators.Context
	inputs  []input // by input channel index
	inChans []*channel
	routers []router
	source  sourceDriver

	// current is the index in ops of the operator running, for errors.
	current int32
	// pending counts data messages sent to this task and not yet received.
	pending atomic.Int64
	// openSince is when the oldest open output batch was opened (zero when
	// none is).
	openSince time.Time
	ended     int  // input channels that delivered end-of-stream
	done      bool // finished or failed: ignore further messages

	stats TaskStats
}

// TaskStats counts what one task did.
type TaskStats struct {
	Chain      string
	Subtask    int
	BatchesIn  int64
	RecordsIn  int64
	BatchesOut int64
}

// Receive handles one message. It never lets a panic escape to protoactor.
func (t *task) Receive(c actor.Context) {
	if t.done || t.run.stopping() {
		return
	}
	defer t.recover()
	switch m := c.Message().(type) {
	case *endOfStream:
		t.pending.Add(-1)
		t.ended++
		if t.ended == len(t.inChans) {
			t.finish()
		}
	case message:
		t.pending.Add(-1)
		t.onData(m)
	case pollMsg, startMsg:
		t.poll()
	}
}

func (t *task) onData(m message) {
	ch := m.channel()
	t.current = 0
	t.stats.BatchesIn++
	t.stats.RecordsIn += int64(t.inputs[ch.index].process(m))
	ch.release(m)
	if t.pending.Load() == 0 {
		t.flush()
	} else {
		t.lingerCheck()
	}
}

func (t *task) poll() {
	t.current = 0
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
		t.run.await(t.source.available(), t.pid)
	case operators.EndOfInput:
		t.finish()
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
		r.endOfStream()
	}
	t.done = true
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
}

// sendData sends a data message to the task at the end of ch.
func (t *task) sendData(ch *channel, m message) {
	if _, eos := m.(*endOfStream); !eos {
		ch.noteSent()
		t.stats.BatchesOut++
	}
	ch.to.pending.Add(1)
	t.run.system.Root.Send(ch.to.pid, m)
}

// recover turns a panic in Receive into the failure of the task; a task
// unwound by cancellation just stops.
func (t *task) recover() {
	r := recover()
	if r == nil {
		return
	}
	t.done = true
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
	var f *operators.Failure
	switch x := r.(type) {
	case *operators.Failure:
		f = x
		te.Err = f.Err
	case error:
		te.Panic, te.Err, te.Stack = true, x, debug.Stack()
	default:
		te.Panic, te.Err, te.Stack = true, fmt.Errorf("%v", x), debug.Stack()
	}
	t.run.report(t, te)
}
