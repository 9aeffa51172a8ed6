package actors

import (
	"sync"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"
)

// taskThroughput is how many messages a task's mailbox processes before
// it yields its goroutine (protoactor's default).
const taskThroughput = 300

// dispatcher runs the mailboxes of a host's task actors on goroutines it
// keeps between runs.
//
// protoactor's default dispatcher starts a goroutine for every run of a
// mailbox (every time a task's mailbox goes from empty to not empty), and
// each of them grows its stack anew, by copying, as the run goes down the
// task's operator chain: 5–6 % of edged's CPU on an MQTT pipeline at
// 30,000 messages/s. A kept goroutine keeps its grown stack for the next
// run.
//
// A run that finds no kept goroutine idle starts a new one, which is kept
// in turn: a run never waits for another (a task waiting for credit in
// its mailbox holds up no other task), and the goroutines kept are at
// most the runs that were under way at once, at most one per task.
// stop lets them end; runs scheduled after it still run.
type dispatcher struct {
	idle     chan func()
	quit     chan struct{}
	stopOnce sync.Once
	// spawned counts the goroutines started, waiting those idle.
	spawned, waiting atomic.Int64
}

var _ actor.Dispatcher = (*dispatcher)(nil)

func newDispatcher() *dispatcher {
	return &dispatcher{idle: make(chan func()), quit: make(chan struct{})}
}

// Schedule runs fn on an idle kept goroutine, or on a new one.
func (d *dispatcher) Schedule(fn func()) {
	select {
	case d.idle <- fn:
	default:
		d.spawned.Add(1)
		go d.work(fn)
	}
}

// Throughput implements actor.Dispatcher.
func (d *dispatcher) Throughput() int { return taskThroughput }

// work runs fn, then the runs handed to it while it is idle, until stop.
func (d *dispatcher) work(fn func()) {
	for ok := true; ok; fn, ok = d.next() {
		fn()
	}
}

// next waits for the next run handed to an idle goroutine; false after
// stop.
func (d *dispatcher) next() (func(), bool) {
	d.waiting.Add(1)
	defer d.waiting.Add(-1)
	select {
	case fn := <-d.idle:
		return fn, true
	case <-d.quit:
		return nil, false
	}
}

// stop ends the idle goroutines, and the others once their run ends.
func (d *dispatcher) stop() {
	d.stopOnce.Do(func() { close(d.quit) })
}
