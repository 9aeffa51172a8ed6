package cluster

import (
	"bytes"
	"runtime"
	"sync"
	"testing"

	"github.com/edgedio/edged/internal/testutil"
)

// retainingHandler is a RetainingHandler that checks every frame's body
// against want (by sequence number, from 1) and releases its buffer at
// once.
type retainingHandler struct {
	want   []Frame
	mu     sync.Mutex // guards got, copied and bad
	got    int
	copied int // frames that came without a receive buffer
	bad    []uint64
}

func (h *retainingHandler) HandleFrame(b []byte) { h.handle(b, false) }

func (h *retainingHandler) HandleFrameRetained(b []byte, r Releaser) {
	h.handle(b, true)
	r.Release()
}

func (h *retainingHandler) handle(b []byte, retained bool) {
	f, err := DecodeFrame(b)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.got++
	if !retained {
		h.copied++
	}
	if err != nil || f.Seq < 1 || f.Seq > uint64(len(h.want)) || !bytes.Equal(f.Body, h.want[f.Seq-1].Body) {
		h.bad = append(h.bad, f.Seq)
	}
}

func (h *retainingHandler) HandleDisconnect(string, error) {}

func (h *retainingHandler) received() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.got
}

// Frames cross between two nodes without a new buffer of their size on
// either side: the sender encodes each into a pooled buffer and the
// message batch carrying them into another, which gRPC recycles once it
// has written it; the receiver reads the message into a pooled buffer,
// recycled once its frames were handled. What the two nodes allocate is
// a small part of the bytes they carry.
func TestRemoteTransportCarriesFramesInRecycledBuffers(t *testing.T) {
	id := ChannelID{Job: "alloc", Epoch: 1, Edge: 0, From: 0, To: 1}
	const warm, n, window = 500, 4000, 100
	frames := make([]Frame, warm+n)
	size := 0
	for i := range frames {
		frames[i] = Frame{Channel: id, Seq: uint64(i + 1), Kind: KindBatch, Body: frameBody(i + 1)}
		if i >= warm {
			size += len(frames[i].Body)
		}
	}
	h := &retainingHandler{want: frames}
	a, b := startRemote(t, &countingHandler{}, nil), startRemote(t, h, nil)
	// Sends frames from..to-1, window frames at a time, as a channel's
	// credits let them go: the pools hold about one window.
	send := func(from, to int) {
		for from < to {
			end := min(from+window, to)
			for i := from; i < end; i++ {
				if err := a.SendFrame(b.Addr(), &frames[i]); err != nil {
					t.Fatal(err)
				}
			}
			testutil.Eventually(t, 0, "every frame at b", func() bool { return h.received() == end })
			from = end
		}
	}
	// Fills the pools and opens the connection.
	send(0, warm)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	send(warm, warm+n)
	runtime.ReadMemStats(&after)
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.bad) > 0 {
		t.Fatalf("%d frames corrupt, first seq %d", len(h.bad), h.bad[0])
	}
	if h.copied > 0 {
		t.Fatalf("%d of %d frames were not read into a recycled buffer", h.copied, h.got)
	}
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("%d frames of %d bytes in all: %d bytes allocated (%.3f per frame byte)", n, size, alloc, float64(alloc)/float64(size))
	if alloc > uint64(size)/4 {
		t.Fatalf("%d bytes allocated to carry %d frames of %d bytes in all: %.2f per frame byte, want at most 0.25",
			alloc, n, size, float64(alloc)/float64(size))
	}
}
