package stream_test

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/cluster"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/stream"
	"github.com/edgedio/edged/watermark"
)

// deployHold is a node's transport handler that holds the control
// messages the job master sends it in each epoch (the first is the deploy
// command) until a data frame of that epoch reaches the node, or for at
// most bound: it delays the node's deployment past the moment the other
// nodes spawned their tasks, and counts the data frames that reached the
// node before its deploy command, which its channels, not yet open, drop.
type deployHold struct {
	ep    *cluster.Endpoint
	bound time.Duration

	// mu guards held and released; it is held while held frames are
	// handed on, so that frames keep their order.
	mu       sync.Mutex
	held     map[uint64][][]byte // by epoch
	released map[uint64]bool
	early    atomic.Int64
}

func (h *deployHold) HandleFrame(data []byte) {
	f, err := cluster.DecodeFrame(data)
	h.mu.Lock()
	if h.held == nil {
		h.held, h.released = make(map[uint64][][]byte), make(map[uint64]bool)
	}
	e := f.Channel.Epoch
	if err != nil || h.released[e] {
		h.mu.Unlock()
		h.ep.HandleFrame(data)
		return
	}
	early := false
	switch {
	case f.Channel.Edge == actors.ControlEdgeDown && f.Kind == cluster.KindBatch:
		if len(h.held[e]) == 0 {
			time.AfterFunc(h.bound, func() { h.release(e) })
		}
		h.held[e] = append(h.held[e], data)
		h.mu.Unlock()
		return
	case f.Channel.Edge != actors.ControlEdgeDown && f.Channel.Edge != actors.ControlEdgeUp && len(h.held[e]) > 0:
		h.early.Add(1)
		early = true
	}
	h.mu.Unlock()
	h.ep.HandleFrame(data)
	if early {
		h.release(e)
	}
}

// release hands the held frames of epoch e on, once.
func (h *deployHold) release(e uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.released[e] {
		return
	}
	h.released[e] = true
	for _, data := range h.held[e] {
		h.ep.HandleFrame(data)
	}
	delete(h.held, e)
}

func (h *deployHold) HandleDisconnect(node string, err error) { h.ep.HandleDisconnect(node, err) }

// holdCluster returns two nodes over an in-memory network, node-1's
// deploy commands held by the returned deployHold.
func holdCluster(t *testing.T) (*testCluster, *deployHold) {
	c := &testCluster{Cluster: &actors.Cluster{}, mem: cluster.NewMemoryNetwork(1, cluster.Faults{})}
	var hold *deployHold
	for i, id := range []string{"node-0", "node-1"} {
		nw := cluster.NewNetwork(id, testChannelConfig(), nil)
		var h cluster.Handler = nw.Endpoint()
		if i == 1 {
			hold = &deployHold{ep: nw.Endpoint(), bound: time.Second}
			h = hold
		}
		nw.Attach(c.mem.Node(id, h))
		c.nets = append(c.nets, nw)
		c.Nodes = append(c.Nodes, actors.Node{ID: id, Network: nw})
	}
	p := cluster.NewPump(c.mem, 5*time.Millisecond, c.nets...)
	p.Start()
	t.Cleanup(p.Stop)
	return c, hold
}

// periodicGen emits a higher watermark every time it is asked, records or
// not (a clock-driven generator).
type periodicGen struct{ wm int64 }

func (g *periodicGen) OnEvent(int64) {}

func (g *periodicGen) OnPeriodicEmit() (int64, bool) {
	g.wm++
	return g.wm, true
}

// No task sends anything on a channel to another node before the master's
// start command, which follows every node's report that its tasks (and
// their channels' receiving ends) are deployed. A timestamp assigner's
// periodic emit is a processing-time timer set up in Open: were it armed
// when its task is spawned, it could fire, and send a watermark on a
// channel to another node, while that node has not yet opened the
// channel's receiving end (its deploy command still on its way): the
// frame would be dropped and the receiver would find a gap at the next
// one (`expected seq 1, got batch seq 2`), failing the deployment. Here
// node-1's deploy command is held back until a data frame reaches node-1
// (or 1 s passed): none must, and the job runs once, exactly.
func TestMultiNodeNothingSentBeforeStart(t *testing.T) {
	const n, keys = 20_000, 50
	c, hold := holdCluster(t)
	env := stream.NewEnvironment("prestart", stream.WithParallelism(1), stream.WithCluster(c.Cluster))
	src := stream.FromSource(env, "generator", generator(n, keys)).UID("generator")
	strategy := watermark.ForGenerator(func(r operators.SensorReading) int64 { return r.Timestamp * 1000 },
		func() watermark.Generator { return &periodicGen{} }).WithInterval(5 * time.Millisecond)
	stamped := src.AssignTimestampsAndWatermarks("stamped", strategy)
	var keyed atomic.Int64
	stream.KeyBy(stamped, bySensor).Stream().ForEach("keyed", func(operators.SensorReading) error { keyed.Add(1); return nil })
	c.spread(t, env)
	if err := execute(t, env); err != nil {
		t.Fatal(err)
	}
	if e := hold.early.Load(); e > 0 {
		t.Fatalf("%d data frames reached node-1 before its deploy command", e)
	}
	if keyed.Load() != n {
		t.Fatalf("%d records keyed, want %d", keyed.Load(), n)
	}
	c.checkCrossed(t)
}

// The same after restores: the exactly-once job (a monotonous timestamp
// assigner, restored with the largest timestamp it saw, so that its first
// periodic emit after a restore has a watermark to send) fails twice and
// restarts from its latest checkpoint; node-1's deploy command is held
// back in every epoch. No data frame reaches node-1 before its deploy
// command, and what the sinks committed equals the failure-free run.
func TestMultiNodeNothingSentBeforeStartAfterRestores(t *testing.T) {
	c, hold := holdCluster(t)
	testMultiNodeExactlyOnce(t, c, 2, 200_000, 500)
	if e := hold.early.Load(); e > 0 {
		t.Fatalf("%d data frames reached node-1 before its deploy command", e)
	}
}
