package cluster

import (
	"sync"
	"sync/atomic"
	"unsafe"
)

// A received message's buffer is recycled once nothing uses it: the
// codec (until it has decoded the message) and every frame in it that
// aliases it (until the frame was handled, or, for a batch delivered to a
// task, until the task reported that very batch processed). Without this
// the server kept every message in a buffer of its own, which the
// collector then freed: the largest allocation of a remote channel, with
// the protobuf marshal of the sending side.
//
// The pieces, in the order a message meets them:
//
//   - frameCodec.Unmarshal copies the message gRPC received (pieces from
//     gRPC's own pool, which it takes back once the codec returns) into a
//     pooled buffer (rxBuf, one reference: the codec's) and notes it in a
//     ring of recent buffers (rxRing).
//   - It takes one reference for every envelope that stays a slice of
//     the buffer (see decodeEnvelope), then drops its own.
//   - frameProcess claims each frame's reference by the frame's address
//     (rxRing.claim) and hands it, with the frame, to a RetainingHandler;
//     the Endpoint releases it when the frame was not delivered, or when
//     the task reports the batch processed (InChannel.Processed).
//
// A reference never released (a frame protoactor dropped before it
// reached the handler, a channel closed with batches unprocessed) only
// leaves its buffer to the collector: a buffer is recycled when its count
// reaches zero, never earlier.

// Releaser releases the buffer a received frame aliases.
type Releaser interface {
	// Release says the frame's bytes are no longer used. Called once.
	Release()
}

// RetainingHandler is a Handler that can keep a received frame's bytes
// past HandleFrameRetained and say when it is done with them: the
// transport then reads frames into recycled buffers.
type RetainingHandler interface {
	Handler
	// HandleFrameRetained is HandleFrame for a frame whose bytes are
	// recycled once r is released: the handler calls r.Release exactly
	// once, when nothing uses the bytes any more.
	HandleFrameRetained(frame []byte, r Releaser)
}

// rxBuf is a pooled buffer a message was received into.
type rxBuf struct {
	buf []byte
	// refs counts the references: the codec's, and one per aliasing
	// frame.
	refs atomic.Int32
	// unclaimed counts the aliasing frames not yet claimed.
	unclaimed atomic.Int32
}

// Release drops one reference, recycling the buffer at the last.
func (b *rxBuf) Release() {
	switch n := b.refs.Add(-1); {
	case n == 0:
		rxStats.recycled.Add(1)
		putBuf(b.buf)
	case n < 0:
		panic("cluster: receive buffer released once too often")
	}
}

// contains reports whether p points into b's bytes.
func (b *rxBuf) contains(p *byte) bool {
	start := uintptr(unsafe.Pointer(unsafe.SliceData(b.buf)))
	q := uintptr(unsafe.Pointer(p))
	return q >= start && q < start+uintptr(len(b.buf))
}

// rxRingSize bounds the buffers the ring remembers: many more than the
// messages being decoded at once (one per peer connection).
const rxRingSize = 64

// rxRing remembers the most recent receive buffers, so that a frame's
// buffer is found by the frame's address.
type rxRing struct {
	mu   sync.Mutex
	bufs [rxRingSize]*rxBuf
	next int
}

var rxBufs rxRing

// rxStats counts what the receive buffers did, for tests.
var rxStats struct {
	taken, recycled, claimed atomic.Int64
}

// add remembers b as the newest buffer.
func (r *rxRing) add(b *rxBuf) {
	r.mu.Lock()
	r.bufs[r.next] = b
	r.next = (r.next + 1) % rxRingSize
	r.mu.Unlock()
}

// claim returns the newest buffer frame lies in that has an unclaimed
// aliasing frame, taking that frame's reference over; nil if there is
// none (the frame was copied, or came another way).
func (r *rxRing) claim(frame []byte) *rxBuf {
	if len(frame) == 0 {
		return nil
	}
	p := unsafe.SliceData(frame)
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range rxRingSize {
		b := r.bufs[(r.next-1-i+2*rxRingSize)%rxRingSize]
		if b != nil && b.contains(p) && b.unclaimed.Load() > 0 {
			b.unclaimed.Add(-1)
			rxStats.claimed.Add(1)
			return b
		}
	}
	return nil
}

// newRxBuf returns a pooled buffer of length n holding one reference,
// the caller's, noted as the newest receive buffer; nil if n is out of
// the pooled range.
func newRxBuf(n int) *rxBuf {
	if n < minPooled || n > 1<<maxPoolShift {
		return nil
	}
	b := &rxBuf{buf: getBuf(n)[:n]}
	b.refs.Store(1)
	rxBufs.add(b)
	rxStats.taken.Add(1)
	return b
}
