package cluster

import (
	"context"
	"encoding/binary"
	"errors"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/edgedio/edged/internal/testutil"
)

// countingHandler checks that frames numbered 0, 1, 2... arrive in order.
type countingHandler struct {
	mu      sync.Mutex // guards next, bad and discs
	next    uint64
	bad     []uint64
	discs   []string
	frames  atomic.Int64
	onFrame func([]byte)
}

func (h *countingHandler) HandleFrame(b []byte) {
	if h.onFrame != nil {
		h.onFrame(b)
		h.frames.Add(1)
		return
	}
	h.mu.Lock()
	n := binary.BigEndian.Uint64(b)
	if n != h.next {
		h.bad = append(h.bad, n)
	}
	h.next = n + 1
	h.mu.Unlock()
	h.frames.Add(1)
}

func (h *countingHandler) HandleDisconnect(node string, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.discs = append(h.discs, node)
}

func startRemote(t testing.TB, h Handler, mutate func(*RemoteConfig)) *RemoteTransport {
	t.Helper()
	cfg := DefaultRemoteConfig()
	if mutate != nil {
		mutate(&cfg)
	}
	tr := NewRemoteTransport(cfg, h)
	if err := tr.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Stop(context.Background(), false) })
	return tr
}

// 100k frames between two actor systems in one process arrive in order.
func TestRemoteLoopback100k(t *testing.T) {
	const n = 100_000
	ha, hb := &countingHandler{}, &countingHandler{}
	a, b := startRemote(t, ha, nil), startRemote(t, hb, nil)
	for i := range uint64(n) {
		frame := make([]byte, 64)
		binary.BigEndian.PutUint64(frame, i)
		if err := a.Send(b.Addr(), frame); err != nil {
			t.Fatal(err)
		}
	}
	testutil.Eventually(t, 0, "100k frames at b", func() bool { return hb.frames.Load() == n })
	hb.mu.Lock()
	defer hb.mu.Unlock()
	if len(hb.bad) > 0 || hb.next != n {
		t.Fatalf("frames out of order: %d misplaced (first %v), last %d", len(hb.bad), hb.bad[:min(5, len(hb.bad))], hb.next-1)
	}
}

// The writer batch size keeps batch x largest frame under gRPC's limit:
// large frames at full speed all arrive. With protoactor's default batch
// of 1000 they overflow the 4 MiB message and are lost.
func TestRemoteLargeFrames(t *testing.T) {
	const n = 400
	cfg := DefaultRemoteConfig()
	if got := cfg.WriterBatchSize(); got*(cfg.MaxFrameBytes+envelopeOverhead) > cfg.MaxMessageBytes {
		t.Fatalf("writer batch %d x frame %d exceeds %d", got, cfg.MaxFrameBytes, cfg.MaxMessageBytes)
	}
	ha, hb := &countingHandler{}, &countingHandler{}
	a, b := startRemote(t, ha, nil), startRemote(t, hb, nil)
	for i := range uint64(n) {
		frame := make([]byte, cfg.MaxFrameBytes)
		binary.BigEndian.PutUint64(frame, i)
		if err := a.Send(b.Addr(), frame); err != nil {
			t.Fatal(err)
		}
	}
	testutil.Eventually(t, 0, "large frames at b", func() bool { return hb.frames.Load() == n })
	if err := a.Send(b.Addr(), make([]byte, cfg.MaxFrameBytes+1)); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("Send of an oversized frame: %v, want ErrFrameTooLarge", err)
	}
}

// Killing one side's actor system fails the channel on the other, loudly:
// the receiver's side when the sender's node dies, and the sender's side
// when the receiver's node dies.
func TestRemoteKillFailsChannel(t *testing.T) {
	for _, kill := range []string{"receiver", "sender"} {
		t.Run("kill "+kill, func(t *testing.T) {
			testutil.Burn(t, 2)
			cfg := DefaultChannelConfig()
			var failed atomic.Pointer[error]
			onFail := func(_ ChannelID, err error) { failed.CompareAndSwap(nil, &err) }
			// The survivor reports failures; the victim is stopped.
			var epS, epR *Endpoint
			if kill == "receiver" {
				epS, epR = NewEndpoint(cfg, nil, onFail), NewEndpoint(cfg, nil, nil)
			} else {
				epS, epR = NewEndpoint(cfg, nil, nil), NewEndpoint(cfg, nil, onFail)
			}
			ts := NewRemoteTransport(DefaultRemoteConfig(), epS)
			tr := NewRemoteTransport(DefaultRemoteConfig(), epR)
			for _, tt := range []*RemoteTransport{ts, tr} {
				if err := tt.Start(); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { tt.Stop(context.Background(), false) })
			}
			epS.Attach(ts)
			epR.Attach(tr)
			id := ChannelID{Job: "j", Epoch: 1, Edge: 0, From: 0, To: 0}
			out := epS.OpenSender(id, tr.Addr())
			var got atomic.Int64
			var in *InChannel
			in = epR.OpenReceiver(id, ts.Addr(), func(f Frame) {
				got.Add(1)
				in.Processed(f.Seq)
			})
			ctx := t.Context()
			for range 10 {
				if err := out.Send(ctx, Send{Kind: KindBatch, Body: []byte{1, 2, 3}}); err != nil {
					t.Fatal(err)
				}
			}
			testutil.Eventually(t, 0, "10 batches acknowledged", func() bool {
				return got.Load() == 10 && out.Stats().Batches == 10 && out.Ready() && out.InFlight() == 0
			})
			victim := map[string]*RemoteTransport{"receiver": tr, "sender": ts}[kill]
			victim.Stop(context.Background(), false)
			testutil.Eventually(t, 0, "the survivor's channel to fail", func() bool { return failed.Load() != nil })
			err := *failed.Load()
			if !errors.Is(err, ErrChannelFailed) || !errors.Is(err, ErrDisconnected) {
				t.Fatalf("channel failed with %v, want ErrChannelFailed and ErrDisconnected", err)
			}
			if kill == "receiver" {
				if serr := out.Send(ctx, Send{Kind: KindBatch, Body: []byte{4}}); !errors.Is(serr, ErrChannelFailed) {
					t.Fatalf("Send after the failure: %v, want the channel's failure", serr)
				}
			} else if in.Err() == nil {
				t.Fatal("receiver reported a failure but has none")
			}
		})
	}
}

// stackHandler records whether a frame was handed over from an actor's
// mailbox.
type stackHandler struct {
	countingHandler
	viaMailbox atomic.Int64
}

func (h *stackHandler) HandleFrame(b []byte) {
	buf := make([]byte, 64<<10)
	if strings.Contains(string(buf[:runtime.Stack(buf, false)]), "actor.(*defaultMailbox)") {
		h.viaMailbox.Add(1)
	}
	h.countingHandler.HandleFrame(b)
}

// A peer's frames reach the Handler on the goroutine that reads the
// connection, not through an actor's mailbox: a mailbox adds a goroutine
// wake-up to every frame and every acknowledgement.
func TestRemoteFramesSkipTheMailbox(t *testing.T) {
	const n = 1000
	ha, hb := &countingHandler{}, &stackHandler{}
	a, b := startRemote(t, ha, nil), startRemote(t, hb, nil)
	for i := range uint64(n) {
		frame := make([]byte, 64)
		binary.BigEndian.PutUint64(frame, i)
		if err := a.Send(b.Addr(), frame); err != nil {
			t.Fatal(err)
		}
	}
	testutil.Eventually(t, 0, "1000 frames at b", func() bool { return hb.frames.Load() == n })
	if got := hb.viaMailbox.Load(); got != 0 {
		t.Fatalf("%d of %d frames went through a mailbox", got, n)
	}
	hb.mu.Lock()
	defer hb.mu.Unlock()
	if len(hb.bad) > 0 {
		t.Fatalf("frames out of order: %v", hb.bad[:min(5, len(hb.bad))])
	}
}

// A frame a node sends itself is handed over from a mailbox, so that the
// Handler may send another frame to itself from HandleFrame (an
// acknowledgement to a sender on the same node) without running into its
// own call.
func TestRemoteSelfFrames(t *testing.T) {
	const n = 100
	h := &countingHandler{}
	var tr *RemoteTransport
	var inHandler atomic.Bool
	var nested atomic.Int64
	h.onFrame = func(b []byte) {
		if inHandler.Swap(true) {
			nested.Add(1)
		}
		defer inHandler.Store(false)
		if b[0] == 0 {
			// Answer every request with a reply, as a receiver acknowledges.
			if err := tr.Send(tr.Addr(), []byte{1}); err != nil {
				t.Error(err)
			}
		}
	}
	tr = startRemote(t, h, nil)
	for range n {
		if err := tr.Send(tr.Addr(), []byte{0}); err != nil {
			t.Fatal(err)
		}
	}
	testutil.Eventually(t, 0, "requests and replies", func() bool { return h.frames.Load() == 2*n })
	if got := nested.Load(); got != 0 {
		t.Fatalf("%d frames handled inside the Handler's own call", got)
	}
}

// A burst of frames goes out in messages of several frames, each written
// in few system calls: gRPC's read and write buffers hold a message, not
// 32 KiB of it. WireStats counts what went out, envelopes included.
func TestRemoteBurstFewWrites(t *testing.T) {
	const n, size = 110, 16 << 10
	ha, hb := &countingHandler{}, &countingHandler{}
	a, b := startRemote(t, ha, nil), startRemote(t, hb, nil)
	// The frames queue while a connects to b; then the endpoint writer
	// packs them into messages of WriterBatchSize frames.
	for i := range uint64(n) {
		frame := make([]byte, size)
		binary.BigEndian.PutUint64(frame, i)
		if err := a.Send(b.Addr(), frame); err != nil {
			t.Fatal(err)
		}
	}
	testutil.Eventually(t, 0, "the burst at b", func() bool { return hb.frames.Load() == n })
	// a counts a write once it returns, which can be after b read it.
	testutil.Eventually(t, 0, "a's count of the burst's bytes", func() bool { return a.WireStats().Bytes >= n*size })
	ws := a.WireStats()
	if ws.Bytes < n*size {
		t.Fatalf("%d bytes on the wire for %d frames of %d bytes", ws.Bytes, n, size)
	}
	if ws.Writes*4 > n {
		t.Fatalf("%d writes for %d frames of %d bytes, want at most one per 4 frames", ws.Writes, n, size)
	}
	t.Logf("%d frames of %d bytes: %d bytes, %d writes", n, size, ws.Bytes, ws.Writes)
	hb.mu.Lock()
	defer hb.mu.Unlock()
	if len(hb.bad) > 0 {
		t.Fatalf("frames out of order: %v", hb.bad[:min(5, len(hb.bad))])
	}
}
