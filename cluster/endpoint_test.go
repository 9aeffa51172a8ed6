package cluster

import (
	"errors"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/edgedio/edged/internal/testutil"
)

// A sender blocked on credit is woken by acknowledgements stepped on the
// transport's goroutine, not its own: it never holds more batches in
// flight than its credits, and every batch arrives once, in order.
func TestEndpointBlockedSenderSeesAcks(t *testing.T) {
	testutil.Burn(t, 2)
	const batches, credits = 500, 2
	cfg := DefaultChannelConfig()
	cfg.Credits = credits
	net := NewMemoryNetwork(1, Faults{})
	a, b := NewEndpoint(cfg, nil, nil), NewEndpoint(cfg, nil, nil)
	a.Attach(net.Node("a", a))
	b.Attach(net.Node("b", b))
	id := ChannelID{Job: "j", Epoch: 1, Edge: 0, From: 0, To: 1}
	out := a.OpenSender(id, "b")
	var got []byte
	var in *InChannel
	in = b.OpenReceiver(id, "a", func(f Frame) {
		if f.Kind == KindBatch {
			got = append(got, f.Body[0])
			if h := in.Stats().Batches - int64(len(got)); h > 0 {
				t.Errorf("delivered %d batches ahead", h)
			}
			in.Processed(f.Seq)
		}
	})
	var done atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the transport's goroutine: delivers frames and acks
		defer wg.Done()
		for !done.Load() || net.Pending() > 0 {
			if net.Step() == 0 {
				runtime.Gosched()
			}
		}
	}()
	for i := range batches {
		if err := out.Send(t.Context(), Send{Kind: KindBatch, Body: []byte{byte(i)}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := out.Send(t.Context(), Send{Kind: KindEndOfStream}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 0, "end of stream acknowledged", out.Done)
	done.Store(true)
	wg.Wait()
	if out.Waits() == 0 {
		t.Fatal("the sender never waited for credit: the path under test was not reached")
	}
	if m := out.Stats().MaxInFlight; m > credits {
		t.Fatalf("%d batches in flight, credits %d", m, credits)
	}
	if len(got) != batches {
		t.Fatalf("%d batches delivered, want %d", len(got), batches)
	}
	for i, v := range got {
		if v != byte(i) {
			t.Fatalf("batch %d carries %d", i, v)
		}
	}
}

// A frame the transport refuses fails the channel at once, instead of
// leaving the peer to find a gap.
func TestEndpointTransportRefusalFails(t *testing.T) {
	net := NewMemoryNetwork(1, Faults{})
	var failures []error
	a := NewEndpoint(DefaultChannelConfig(), nil, func(_ ChannelID, err error) { failures = append(failures, err) })
	ta := net.Node("a", a)
	a.Attach(ta)
	net.Node("b", NewEndpoint(DefaultChannelConfig(), nil, nil))
	out := a.OpenSender(ChannelID{Job: "j", Epoch: 1}, "b")
	if err := out.Send(t.Context(), Send{Kind: KindBatch, Body: []byte{1}}); err != nil {
		t.Fatal(err)
	}
	if err := ta.Close(); err != nil {
		t.Fatal(err)
	}
	err := out.Send(t.Context(), Send{Kind: KindBatch, Body: []byte{2}})
	if !errors.Is(err, ErrChannelFailed) || len(failures) != 1 {
		t.Fatalf("Send on a closed transport: %v, %d failures reported; want ErrChannelFailed, 1", err, len(failures))
	}
	if err := out.Send(t.Context(), Send{Kind: KindBatch, Body: []byte{3}}); !errors.Is(err, ErrChannelFailed) || len(failures) != 1 {
		t.Fatalf("Send after the failure: %v, %d failures; want the same failure, reported once", err, len(failures))
	}
}

// A frame that arrives before its channel's receiving end is open is
// dropped, and the gap the receiver then finds at its start still fails
// the channel loudly, with an error that says frames of the channel came
// before the receiving end was open: the gap is not the network's.
func TestEndpointGapAfterFramesBeforeOpenSaysSo(t *testing.T) {
	cfg := DefaultChannelConfig()
	net := NewMemoryNetwork(1, Faults{})
	var failed error
	a := NewEndpoint(cfg, nil, nil)
	b := NewEndpoint(cfg, nil, func(_ ChannelID, err error) { failed = err })
	a.Attach(net.Node("a", a))
	b.Attach(net.Node("b", b))
	id := ChannelID{Job: "j", Epoch: 2, Edge: 0, From: 0, To: 1}
	// The link's receiver of the epoch before is still open: it drops
	// the newer frame too.
	old := b.OpenReceiver(ChannelID{Job: "j", Epoch: 1, Edge: 0, From: 0, To: 1}, "a", func(Frame) {})
	out := a.OpenSender(id, "b")
	step := func() {
		for net.Pending() > 0 {
			net.Step()
		}
	}
	if err := out.Send(t.Context(), Send{Kind: KindWatermark, Value: 7}); err != nil {
		t.Fatal(err)
	}
	step()
	if got := old.Stats().EpochDropped; got != 1 {
		t.Fatalf("the older epoch's receiver dropped %d frames, want 1", got)
	}
	b.CloseEnd(old.ID(), false)
	if err := out.Send(t.Context(), Send{Kind: KindStatus, Value: 1}); err != nil {
		t.Fatal(err)
	}
	step()
	if got := b.Unrouted(); got != 1 {
		t.Fatalf("%d frames unrouted, want 1", got)
	}
	var delivered int
	in := b.OpenReceiver(id, "a", func(Frame) { delivered++ })
	if err := out.Send(t.Context(), Send{Kind: KindBatch, Body: []byte{1}}); err != nil {
		t.Fatal(err)
	}
	step()
	if delivered != 0 || !errors.Is(in.Err(), ErrGap) {
		t.Fatalf("delivered %d, receiver error %v; want none delivered and a gap", delivered, in.Err())
	}
	if !errors.Is(failed, ErrChannelFailed) || !errors.Is(failed, ErrGap) {
		t.Fatalf("reported failure %v, want a failed channel for a gap", failed)
	}
	const want = "expected seq 1, got batch seq 3 (2 frames of the channel arrived before its receiving end was open, and dropped)"
	if !strings.Contains(failed.Error(), want) {
		t.Fatalf("reported failure %q, want it to say %q", failed, want)
	}
}
