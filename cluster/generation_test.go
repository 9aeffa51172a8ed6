package cluster

import (
	"errors"
	"testing"
	"time"

	"github.com/edgedio/edged/actors"
)

// The edge number carries a re-pointed channel's generation: both parts
// come back, a generation out of range is refused, and no generation
// reaches the control channels' edges.
func TestChannelGenerationInEdge(t *testing.T) {
	for _, c := range []struct{ edge, gen int }{{0, 0}, {3, 0}, {0, 1}, {7, 2}, {1<<genShift - 1, MaxGeneration}} {
		e, err := edgeWithGen(c.edge, c.gen)
		if err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
		id := ChannelID{Edge: e}
		if id.EdgeOf() != c.edge || id.GenerationOf() != c.gen {
			t.Fatalf("%+v: edge %d gives edge %d generation %d", c, e, id.EdgeOf(), id.GenerationOf())
		}
		if e >= actors.ControlEdgeDown {
			t.Fatalf("%+v: edge %d collides with the control channels", c, e)
		}
	}
	for _, c := range []struct{ edge, gen int }{{1 << genShift, 1}, {0, MaxGeneration + 1}, {0, -1}} {
		if _, err := edgeWithGen(c.edge, c.gen); !errors.Is(err, ErrCorruptFrame) {
			t.Fatalf("%+v: %v, want ErrCorruptFrame", c, err)
		}
	}
	if id := (ChannelID{Edge: actors.ControlEdgeUp}); id.EdgeOf() != actors.ControlEdgeUp || id.GenerationOf() != 0 {
		t.Fatalf("control edge read as edge %d generation %d", id.EdgeOf(), id.GenerationOf())
	}
}

// A channel of a new generation between the same subtasks is a separate
// channel: its frames never reach the receiver of generation 0, and both
// are open at once.
func TestNetworkGenerationsAreSeparateChannels(t *testing.T) {
	mem := NewMemoryNetwork(1, Faults{})
	cfg := DefaultChannelConfig()
	a, b := NewNetwork("a", cfg, nil), NewNetwork("b", cfg, nil)
	a.Attach(mem.Node("a", a.Endpoint()))
	b.Attach(mem.Node("b", b.Endpoint()))
	p := NewPump(mem, time.Millisecond, a, b)
	p.Start()
	defer p.Stop()
	old := actors.ChannelKey{Job: "j", Epoch: 3, Edge: 1, From: 0, To: 1}
	nw := old
	nw.Gen = 1
	got := map[int]chan actors.RemoteFrame{0: make(chan actors.RemoteFrame, 4), 1: make(chan actors.RemoteFrame, 4)}
	for _, k := range []actors.ChannelKey{old, nw} {
		ch := got[k.Gen]
		if _, err := b.OpenReceiver(k, "a", func(f actors.RemoteFrame) { ch <- f }, nil); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range []actors.ChannelKey{old, nw} {
		out, err := a.OpenSender(k, "b", nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := out.Send(t.Context(), actors.FrameBarrier, int64(10+k.Gen), nil); err != nil {
			t.Fatal(err)
		}
	}
	for gen, ch := range got {
		select {
		case f := <-ch:
			if f.Value != int64(10+gen) || f.Seq != 1 {
				t.Fatalf("generation %d got %+v", gen, f)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("generation %d: nothing arrived", gen)
		}
	}
	bad := old
	bad.Gen = MaxGeneration + 1
	if _, err := a.OpenSender(bad, "b", nil); !errors.Is(err, ErrCorruptFrame) {
		t.Fatalf("generation out of range: %v", err)
	}
}
