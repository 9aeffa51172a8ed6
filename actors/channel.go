package actors

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgedio/edged/codec"
)

// channel joins one sending subtask to one receiving subtask. Its credits
// are the batch buffers it owns: a sender takes one before filling it and
// the receiver returns it once processed, so at most Credits batches are
// filled, queued or being processed at any time.
//
// A sender that finds no free buffer sleeps until half of them are free
// again, not just one: waking a goroutine costs more than filling a batch,
// and a sender woken per batch would run in lock step with its receiver
// instead of beside it.
type channel struct {
	// index is the channel's input index at the receiving task.
	index int
	// gate is the input of the receiving operator the channel feeds (0, or
	// 1 for the second input of a two-input operator).
	gate int
	// to is the receiving task; nil on the sending node of a channel
	// whose receiver runs on another node.
	to *task
	// toName and toSub name the receiving chain and subtask.
	toName string
	toSub  int
	// out is the remote end of a channel whose receiver runs on another
	// node (on the sending node); in that of a channel whose sender runs
	// on another node (on the receiving node). Both nil for a local
	// channel.
	out RemoteSender
	in  RemoteReceiver
	// credits is the number of buffers the channel owns.
	credits int
	// key names the channel (its generation is that of the deployment or
	// of the handover that opened it); from and dest name its sending and
	// receiving subtasks by head vertex UID.
	key        ChannelKey
	from, dest TaskKey
	// park is set on a sending task's channel to a subtask that is being
	// handed over (see handover_task.go): what the task sends waits in
	// it until the channel is re-pointed to the new instance. Read and
	// cleared on the sending task's goroutine only.
	park *parking
	// txDict numbers the strings of the wire batches sent on the
	// channel, on the sending task's goroutine only; rxDict those
	// received, on the receiving task's only (codec.DictEncoder). A
	// channel that replaces another (a handover's) starts both anew, as
	// do the channels of every deployment.
	txDict *codec.DictEncoder
	rxDict *codec.DictDecoder
	// closeOnce closes the remote end (in or out) once.
	closeOnce sync.Once
	// superseded is set once a handover's savepoint completed and the
	// channel was replaced by one to or from the moved subtask's new
	// instance: nothing more crosses it, and the failure of its remote
	// end (the old node stopping before the owner closed it) is not the
	// job's.
	superseded atomic.Bool

	mu sync.Mutex // guards free, waiting and park's route
	// free holds the free buffers (*batch[T] or *wireBatch).
	free []any
	// waiting is set while the sender sleeps on wake.
	waiting bool
	// wake (capacity 1) is rung when enough buffers are free again.
	wake chan struct{}

	// sent counts batches sent; processed counts batches the receiver
	// finished. Both only grow.
	sent, processed atomic.Int64
	// maxInFlight is the largest sent-processed seen when sending.
	maxInFlight atomic.Int64
	// halved counts the batches to another node encoded over its frame
	// cap and sent in halves.
	halved atomic.Int64
	// blocked is the time the sender spent waiting for credit, in ns:
	// backpressure.
	blocked atomic.Int64
	// next is the channel that replaced this one in its sender's router
	// when a handover re-pointed it (parkMoved): the sender's
	// backpressure goes on there.
	next atomic.Pointer[channel]
}

// newChannel returns a channel owning the buffers bufs.
func newChannel(index int, to *task, bufs []any) *channel {
	return &channel{index: index, to: to, credits: len(bufs), free: bufs, wake: make(chan struct{}, 1)}
}

// resumeAt is how many free buffers wake a waiting sender.
func (c *channel) resumeAt() int { return max(1, c.credits/2) }

// acquire takes a free buffer, blocking until one is free or done closes.
// On done it panics with errCancelled to unwind the task.
func (c *channel) acquire(done <-chan struct{}) any {
	for {
		c.mu.Lock()
		if n := len(c.free); n > 0 {
			b := c.free[n-1]
			c.free[n-1] = nil
			c.free = c.free[:n-1]
			c.mu.Unlock()
			return b
		}
		if p := c.park; p != nil && p.route != nil {
			// Parked and re-pointed: send what waits, which frees the
			// buffers it holds.
			c.mu.Unlock()
			p.unpark()
			continue
		}
		c.waiting = true
		c.mu.Unlock()
		start := time.Now()
		select {
		case <-c.wake:
			c.blocked.Add(int64(time.Since(start)))
		case <-done:
			panic(errCancelled)
		}
	}
}

// release returns a processed buffer to the sender; on the receiving
// node of a remote channel, it reports the batch processed, which
// returns its credit to the sender.
func (c *channel) release(b any) {
	c.processed.Add(1)
	if c.in != nil {
		c.in.Processed(b.(*wireBatch).seq)
		return
	}
	c.mu.Lock()
	c.free = append(c.free, b)
	ring := c.waiting && len(c.free) >= c.resumeAt()
	if ring {
		c.waiting = false
	}
	c.mu.Unlock()
	if ring {
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
}

// bodyCap is the largest batch body the channel's remote end carries, 0
// when it has none.
func (c *channel) bodyCap() int {
	if c.out != nil {
		return c.out.MaxBody()
	}
	if c.park != nil && c.park.replaced.out != nil {
		return c.park.replaced.out.MaxBody()
	}
	return 0
}

// onFailure returns the callback of the remote end of ch, owned by task t:
// a failure fails the job, unless ch was superseded by a handover.
func (h *host) onFailure(t *task, ch *channel) func(error) {
	return func(err error) {
		if ch.superseded.Load() {
			h.log.Debug("replaced channel failed after the handover", "channel", ch.key, "err", err)
			return
		}
		h.channelFailed(t, err)
	}
}

// closeRemote closes the channel's remote end, if any, once.
func (c *channel) closeRemote() {
	c.closeOnce.Do(func() {
		if c.out != nil {
			c.out.Close()
		}
		if c.in != nil {
			c.in.Close()
		}
	})
}

// noteSent records one more batch in flight.
func (c *channel) noteSent() {
	n := c.sent.Add(1) - c.processed.Load()
	for {
		m := c.maxInFlight.Load()
		if n <= m || c.maxInFlight.CompareAndSwap(m, n) {
			return
		}
	}
}

// wireBatch is a batch encoded with the element type's codec, used on
// serialised edges.
type wireBatch struct {
	ch   *channel
	data []byte
	// seq is the batch's sequence number on a remote channel.
	seq uint64
}

// batch is a batch of records of type T sent on ch, with the event
// timestamp of each (operators.NoTimestamp where there is none).
type batch[T any] struct {
	ch    *channel
	items []T
	ts    []int64
}

// message is a data message on a channel.
type message interface {
	channel() *channel
}

func (b *batch[T]) channel() *channel  { return b.ch }
func (b *wireBatch) channel() *channel { return b.ch }

// isBatch marks the messages that carry records and hold a credit.
func (b *batch[T]) isBatch()  {}
func (b *wireBatch) isBatch() {}

// endOfStream follows the last batch of a channel.
type endOfStream struct{ ch *channel }

// watermarkMsg carries a channel's event-time watermark, in order with its
// records.
type watermarkMsg struct {
	ch *channel
	wm int64
}

// statusMsg says that a channel became idle or active again.
type statusMsg struct {
	ch   *channel
	idle bool
}

func (e *endOfStream) channel() *channel  { return e.ch }
func (w *watermarkMsg) channel() *channel { return w.ch }
func (s *statusMsg) channel() *channel    { return s.ch }
