package cluster

import (
	"math/bits"
	"sync"
	"unsafe"
)

// The buffers frames are encoded into on their way to a peer, and the
// copies of batches waiting for credit, are recycled: without it every
// frame allocated (and zeroed) a buffer of its size, and the garbage
// collector ran several times per million records.
//
// Buffers are pooled by power-of-two capacity, from 1<<minPoolShift to
// 1<<maxPoolShift bytes; smaller and larger ones are left to the
// collector.
const (
	minPoolShift = 10 // 1 KiB
	maxPoolShift = 24 // 16 MiB
)

var bufPools [maxPoolShift - minPoolShift + 1]sync.Pool

// minPooled is the smallest buffer getBuf takes from a pool.
const minPooled = 1 << minPoolShift

// getBuf returns an empty buffer with room for n bytes: a recycled one
// when n is in the pooled range.
func getBuf(n int) []byte {
	if n < minPooled || n > 1<<maxPoolShift {
		return make([]byte, 0, n)
	}
	shift := bits.Len(uint(n - 1)) // 1<<shift >= n
	if p, _ := bufPools[shift-minPoolShift].Get().(*[]byte); p != nil {
		return (*p)[:0]
	}
	return make([]byte, 0, 1<<shift)
}

// putBuf recycles b, which nothing may use afterwards.
func putBuf(b []byte) {
	c := cap(b)
	if c < minPooled {
		return
	}
	shift := min(bits.Len(uint(c))-1, maxPoolShift) // 1<<shift <= c
	b = b[:0]
	bufPools[shift-minPoolShift].Put(&b)
}

// lentBufs are the pooled buffers of frames that protoactor serialized
// (a wireFrame's Marshal hands its encoding over as the envelope's
// bytes) and the transport's codec (frameCodec) has not yet copied into
// the message gRPC writes: the codec recycles each once it has. A frame whose
// envelope is never marshalled leaves its buffer here; past
// maxLentBufs the table is dropped and those buffers are left to the
// collector, so that a peer that never takes its frames costs no memory.
type lentBufs struct {
	mu sync.Mutex // guards m, lends and releases
	m  map[*byte][]byte
	// lends and releases count the buffers lent and recycled.
	lends, releases int64
}

const maxLentBufs = 4096

var lent = lentBufs{m: map[*byte][]byte{}}

// lend records b as handed over to protoactor.
func (l *lentBufs) lend(b []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.m) >= maxLentBufs {
		l.m = map[*byte][]byte{}
	}
	l.m[unsafe.SliceData(b)] = b
	l.lends++
}

// release recycles the buffer data starts, if it was lent.
func (l *lentBufs) release(data []byte) {
	if cap(data) < minPooled {
		return
	}
	p := unsafe.SliceData(data)
	l.mu.Lock()
	b, ok := l.m[p]
	if ok {
		delete(l.m, p)
		l.releases++
	}
	l.mu.Unlock()
	if ok {
		putBuf(b)
	}
}

// counts returns the buffers lent and released so far.
func (l *lentBufs) counts() (lends, releases int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lends, l.releases
}
