package actors

import "sync/atomic"

// channel joins one sending subtask to one receiving subtask. Its credits
// are the batch buffers it owns: a sender takes one before filling it and
// the receiver returns it once processed, so at most cap(credits) batches
// are filled, queued or being processed at any time.
type channel struct {
	// index is the channel's input index at the receiving task.
	index int
	// to is the receiving task.
	to *task
	// credits holds the free buffers (*batch[T] or *wireBatch).
	credits chan any
	// sent counts batches sent; processed counts batches the receiver
	// finished. Both only grow.
	sent, processed atomic.Int64
	// maxInFlight is the largest sent-processed seen when sending.
	maxInFlight atomic.Int64
}

// newChannel returns a channel with room for credits buffers; the caller
// puts them in.
func newChannel(index int, to *task, credits int) *channel {
	return &channel{index: index, to: to, credits: make(chan any, credits)}
}

// acquire takes a free buffer, blocking until one is free or done closes.
// On done it panics with errCancelled to unwind the task.
func (c *channel) acquire(done <-chan struct{}) any {
	select {
	case b := <-c.credits:
		return b
	default:
	}
	select {
	case b := <-c.credits:
		return b
	case <-done:
		panic(errCancelled)
	}
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

// release returns a processed buffer to the sender.
func (c *channel) release(b any) {
	c.processed.Add(1)
	c.credits <- b
}

// wireBatch is a batch encoded with the element type's codec, used on
// serialised edges.
type wireBatch struct {
	ch   *channel
	data []byte
}

// batch is a batch of records of type T sent on ch.
type batch[T any] struct {
	ch    *channel
	items []T
}

// message is a data message on a channel.
type message interface {
	channel() *channel
}

func (b *batch[T]) channel() *channel  { return b.ch }
func (b *wireBatch) channel() *channel { return b.ch }

// endOfStream follows the last batch of a channel.
type endOfStream struct{ ch *channel }

func (e *endOfStream) channel() *channel { return e.ch }
