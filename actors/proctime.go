package actors

import (
	"container/heap"
	"math"
	"time"

	"github.com/jonboulle/clockwork"
)

// procCallback is a processing-time callback of one operator of a task.
type procCallback struct {
	at        int64 // processing time in ms
	seq       uint64
	op        int
	fn        func(now int64) error
	cancelled bool
	index     int
}

// procTimers holds a task's processing-time callbacks, earliest first, and
// the one clock timer armed for the earliest. Used from the task's
// goroutine only; the clock timer's function only sends a message to the
// task.
type procTimers struct {
	h     procHeap
	seq   uint64
	timer clockwork.Timer
	armed int64 // deadline of timer, valid when timer != nil
}

type procHeap []*procCallback

func (h procHeap) Len() int { return len(h) }
func (h procHeap) Less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].seq < h[j].seq
}
func (h procHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *procHeap) Push(x any) {
	c := x.(*procCallback)
	c.index = len(*h)
	*h = append(*h, c)
}
func (h *procHeap) Pop() any {
	old := *h
	c := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	c.index = -1
	return c
}

// add registers fn to run at processing time at, for operator op.
func (p *procTimers) add(t *task, op int, at int64, fn func(now int64) error) func() {
	p.seq++
	c := &procCallback{at: at, seq: p.seq, op: op, fn: fn}
	heap.Push(&p.h, c)
	p.arm(t)
	return func() {
		if !c.cancelled && c.index >= 0 {
			c.cancelled = true
			heap.Remove(&p.h, c.index)
		}
	}
}

// popDue removes and returns the earliest callback due by now.
func (p *procTimers) popDue(now int64) (*procCallback, bool) {
	for len(p.h) > 0 && p.h[0].at <= now {
		c := heap.Pop(&p.h).(*procCallback)
		if !c.cancelled {
			return c, true
		}
	}
	return nil, false
}

// arm makes sure the clock timer fires no later than the earliest
// callback.
func (p *procTimers) arm(t *task) {
	if len(p.h) == 0 || !t.started {
		return
	}
	next := p.h[0].at
	if p.timer != nil && p.armed <= next {
		return
	}
	if p.timer != nil {
		p.timer.Stop()
	}
	clock := t.run.cfg.Clock
	d := procDelay(next, t.procNow())
	pid := t.pid
	run := t.run
	p.armed = next
	fire := func() {
		if !run.stopping() {
			run.system.Root.Send(pid, timerMsg{at: next})
		}
	}
	p.timer = clock.AfterFunc(max(d, 0), fire)
	// The clock may have moved between reading the time and registering
	// the timer (a fake clock advanced by another goroutine meanwhile):
	// the timer is then due later than next, and a fake clock advanced no
	// further would never fire it. Fire it now instead.
	if d > 0 && t.procNow() >= next {
		p.timer.Stop()
		p.timer = clock.AfterFunc(0, fire)
	}
}

// maxProcDelay is the longest delay a time.Duration holds, in whole
// milliseconds (about 292 years).
const maxProcDelay = math.MaxInt64 / int64(time.Millisecond)

// procDelay returns how long from now (ms) until at (ms): 0 for a time
// not in the future, and at most maxProcDelay ms for one beyond what a
// time.Duration holds (a timer at math.MaxInt64, "never"). The clock
// timer of such a one fires long after the process ends; a popDue before
// its time finds nothing due and arms it again. Before, (at-now)*1e6
// wrapped: a timer at math.MaxInt64 armed the clock timer at once, over
// and over, and the task spun on its own timer messages (3.45 s of CPU
// in 3 s).
func procDelay(at, now int64) time.Duration {
	if at <= now {
		return 0
	}
	if at-now < 0 || at-now > maxProcDelay { // at-now < 0: it overflowed
		return time.Duration(maxProcDelay) * time.Millisecond
	}
	return time.Duration(at-now) * time.Millisecond
}

// fired is called when a timer for at fired: if it is the armed one, the
// next arm must set a new one.
func (p *procTimers) fired(at int64) {
	if p.timer != nil && p.armed == at {
		p.timer = nil
	}
}

// stop cancels the clock timer.
func (p *procTimers) stop() {
	if p.timer != nil {
		p.timer.Stop()
		p.timer = nil
	}
}

// service is the operators.ProcessingTimeService of operator op of t.
type procService struct {
	t  *task
	op int
}

func (s procService) Now() int64 { return s.t.procNow() }

// procNow returns the task's processing time in ms: the clock's, and never
// less than procFloor.
func (t *task) procNow() int64 { return max(t.run.cfg.Clock.Now().UnixMilli(), t.procFloor) }

func (s procService) At(at int64, fn func(now int64) error) func() {
	return s.t.timers.add(s.t, s.op, at, fn)
}
