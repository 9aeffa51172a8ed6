package cluster

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/internal/testutil"
)

// Every in-sequence frame kind of package actors crosses a Network with
// its kind, value and body; the receiver's processed report returns the
// sender's credit; the sender's totals are added up when it closes.
func TestNetworkCarriesEveryKind(t *testing.T) {
	mem := NewMemoryNetwork(1, Faults{})
	cfg := DefaultChannelConfig()
	cfg.Credits = 1
	a, b := NewNetwork("a", cfg, nil), NewNetwork("b", cfg, nil)
	a.Attach(mem.Node("a", a.Endpoint()))
	b.Attach(mem.Node("b", b.Endpoint()))
	p := NewPump(mem, time.Millisecond, a, b)
	p.Start()
	defer p.Stop()
	key := actors.ChannelKey{Job: "j", Epoch: 3, Edge: 1, From: 0, To: 1}
	got := make(chan actors.RemoteFrame, 16)
	in, err := b.OpenReceiver(key, "a", func(f actors.RemoteFrame) { got <- f }, func(err error) { t.Errorf("receiver failed: %v", err) })
	if err != nil {
		t.Fatal(err)
	}
	out, err := a.OpenSender(key, "b", func(err error) { t.Errorf("sender failed: %v", err) })
	if err != nil {
		t.Fatal(err)
	}
	sent := []actors.RemoteFrame{
		{Kind: actors.FrameBatch, Body: []byte("one")},
		{Kind: actors.FrameWatermark, Value: -7},
		{Kind: actors.FrameStatus, Value: 1},
		{Kind: actors.FrameBarrier, Value: 42},
		{Kind: actors.FrameBatch, Body: []byte("two")}, // waits for the first batch's credit
		{Kind: actors.FrameEnd},
	}
	go func() {
		for _, f := range sent {
			if err := out.Send(t.Context(), f.Kind, f.Value, f.Body); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	for i, want := range sent {
		var f actors.RemoteFrame
		select {
		case f = <-got:
		case <-time.After(10 * time.Second):
			t.Fatalf("frame %d never arrived", i)
		}
		if f.Seq != uint64(i+1) || f.Kind != want.Kind || f.Value != want.Value || string(f.Body) != string(want.Body) {
			t.Fatalf("frame %d: %+v, want %+v", i, f, want)
		}
		if f.Kind == actors.FrameBatch || f.Kind == actors.FrameEnd {
			in.Processed(f.Seq)
		}
	}
	testutil.Eventually(t, 0, "end of stream acknowledged", func() bool { return a.Endpoint().outs("")[0].Done() })
	out.Close()
	in.Close()
	if s := a.Sent(); s.Batches != 2 || s.Frames != 6 || s.MaxInFlight != 1 {
		t.Fatalf("sent %+v, want 2 batches in 6 frames, at most 1 in flight", s)
	}
}

// A channel's failure reaches the callback given when it was opened, once;
// a closed channel's does not.
func TestNetworkFailureCallback(t *testing.T) {
	mem := NewMemoryNetwork(1, Faults{})
	a := NewNetwork("a", DefaultChannelConfig(), nil)
	a.Attach(mem.Node("a", a.Endpoint()))
	mem.Node("b", NewEndpoint(DefaultChannelConfig(), nil, nil))
	var fails []error
	key := actors.ChannelKey{Job: "j", Epoch: 1}
	if _, err := a.OpenSender(key, "b", func(err error) { fails = append(fails, err) }); err != nil {
		t.Fatal(err)
	}
	closed, err := a.OpenSender(actors.ChannelKey{Job: "j", Epoch: 1, Edge: 1}, "b", func(err error) { fails = append(fails, err) })
	if err != nil {
		t.Fatal(err)
	}
	closed.Close()
	a.Endpoint().HandleDisconnect("b", errors.New("gone"))
	a.Endpoint().HandleDisconnect("b", errors.New("gone again"))
	if len(fails) != 1 || !errors.Is(fails[0], ErrChannelFailed) || !errors.Is(fails[0], ErrDisconnected) {
		t.Fatalf("failures %v, want one ErrDisconnected", fails)
	}
}

// Both ends of one channel may be open on one node (a host's control
// channels on the job master's node): each end keeps its own failure
// callback, messages reach the node itself, and closing one end leaves
// the other open.
func TestNetworkBothEndsOfAChannelOnOneNode(t *testing.T) {
	mem := NewMemoryNetwork(1, Faults{})
	a := NewNetwork("a", DefaultChannelConfig(), nil)
	a.Attach(mem.Node("a", a.Endpoint()))
	p := NewPump(mem, time.Millisecond, a)
	p.Start()
	defer p.Stop()
	key := actors.ChannelKey{Job: "j", Epoch: 1, Edge: actors.ControlEdgeUp, From: 0, To: actors.MasterIndex}
	got := make(chan actors.RemoteFrame, 4)
	var in actors.RemoteReceiver
	var inFails, outFails []error
	var mu sync.Mutex
	in, err := a.OpenReceiver(key, "a", func(f actors.RemoteFrame) { got <- f; in.Processed(f.Seq) }, func(err error) {
		mu.Lock()
		inFails = append(inFails, err)
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	out, err := a.OpenSender(key, "a", func(err error) {
		mu.Lock()
		outFails = append(outFails, err)
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := out.Send(t.Context(), actors.FrameBatch, 0, []byte("register")); err != nil {
		t.Fatal(err)
	}
	select {
	case f := <-got:
		if string(f.Body) != "register" {
			t.Fatalf("got %q", f.Body)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the message never reached the node itself")
	}
	testutil.Eventually(t, 0, "the message acknowledged", func() bool { return a.Endpoint().outs("")[0].InFlight() == 0 })
	out.Close()
	if len(a.Endpoint().ins("")) != 1 {
		t.Fatal("closing the sender closed the receiver too")
	}
	// The receiver's failure goes to the receiver's callback only.
	a.Endpoint().ins("")[0].step(Disconnected{Reason: errors.New("gone")})
	mu.Lock()
	defer mu.Unlock()
	if len(inFails) != 1 || len(outFails) != 0 {
		t.Fatalf("receiver failures %v, sender failures %v: want one at the receiver", inFails, outFails)
	}
	in.Close()
}
