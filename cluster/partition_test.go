package cluster

import (
	"fmt"
	"slices"
	"testing"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/codec"
	"github.com/edgedio/edged/keygroup"
)

// Every partitioner can cross nodes: with the subtasks of every operator
// spread over two nodes, the channels PlanChannels derives carry each
// edge's records, routed by forward, rebalance, key-by and broadcast, to
// the subtasks that own them, whole and in order.
func TestEveryPartitionerCrossesNodes(t *testing.T) {
	const records = 300
	j := testJob()
	ids, err := PlanChannels(j, 1)
	if err != nil {
		t.Fatal(err)
	}
	// Subtask s of vertex v runs on node (v+s) mod 2.
	node := func(v *actors.Vertex, subtask int) string { return fmt.Sprintf("n%d", (v.ID+subtask)%2) }
	cfg := DefaultChannelConfig()
	net := NewMemoryNetwork(3, Faults{Duplicate: 0.2})
	eps := map[string]*Endpoint{}
	for _, n := range []string{"n0", "n1"} {
		ep := NewEndpoint(cfg, nil, func(id ChannelID, err error) { t.Errorf("channel %s failed: %v", id, err) })
		ep.Attach(net.Node(n, ep))
		eps[n] = ep
	}
	c := codec.For[int64]()
	outs := map[Link]*OutChannel{}
	got := map[Link][]int64{}
	crossing := map[actors.Partition]int{}
	for _, id := range ids {
		e := j.Edges[id.Edge]
		from, to := node(e.From, id.From), node(e.To, id.To)
		if from != to {
			crossing[e.Partition]++
		}
		outs[id.Link()] = eps[from].OpenSender(id, to)
		var in *InChannel
		in = eps[to].OpenReceiver(id, from, func(f Frame) {
			if f.Kind == KindBatch {
				_, items, err := DecodeBatch(c, nil, nil, f.Body)
				if err != nil {
					t.Fatal(err)
				}
				got[id.Link()] = append(got[id.Link()], items...)
			}
			in.Processed(f.Seq)
		})
	}
	for _, p := range []actors.Partition{actors.Forward, actors.Rebalance, actors.KeyBy, actors.Broadcast} {
		if crossing[p] == 0 {
			t.Fatalf("no %s channel crosses nodes: %v", p, crossing)
		}
	}
	// Route every source subtask's records as the runtime's router does,
	// one batch per channel per step.
	maxP := keygroup.DefaultMaxParallelism
	want := map[Link][]int64{}
	for ei, e := range j.Edges {
		n := e.To.Parallelism
		for from := range e.From.Parallelism {
			next := from % n // round robin starts at a different target per subtask
			for v := range int64(records) {
				var targets []int
				switch e.Partition {
				case actors.Forward:
					targets = []int{from}
				case actors.Rebalance:
					targets = []int{next}
					next = (next + 1) % n
				case actors.KeyBy:
					targets = []int{keygroup.Subtask(keygroup.Of(keygroup.HashUint64(uint64(v)), maxP), n, maxP)}
				case actors.Broadcast:
					targets = Targets(actors.Broadcast, from, n)
				}
				for _, to := range targets {
					l := Link{Job: j.Name, Edge: ei, From: from, To: to}
					want[l] = append(want[l], v)
				}
			}
		}
	}
	for l, vs := range want {
		out := outs[l]
		if out == nil {
			t.Fatalf("records routed to %v, which has no channel", l)
		}
		for chunk := range slices.Chunk(vs, 50) {
			e := NewBatchEncoder(c, 50, cfg.MaxBatchBytes())
			for _, v := range chunk {
				if ok, err := e.Add(0, v); !ok || err != nil {
					t.Fatal(ok, err)
				}
			}
			for !out.Ready() {
				net.Step()
			}
			if err := out.Send(t.Context(), Send{Kind: KindBatch, Body: e.Flush(nil)}); err != nil {
				t.Fatal(err)
			}
		}
		if err := out.Send(t.Context(), Send{Kind: KindEndOfStream}); err != nil {
			t.Fatal(err)
		}
	}
	for range 1000 {
		if net.Step() == 0 && net.Pending() == 0 {
			break
		}
	}
	for l, vs := range want {
		if !slices.Equal(got[l], vs) {
			t.Errorf("channel %v: got %d records, want %d, in order", l, len(got[l]), len(vs))
		}
		if !outs[l].Done() {
			t.Errorf("channel %v not done", l)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d channels carried records, want %d", len(got), len(want))
	}
}
