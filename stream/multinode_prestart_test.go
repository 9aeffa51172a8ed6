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

// deployHold is a node's transport handler that holds the first control
// message the job master sends it (the deploy command) until a data frame
// reaches the node, or for at most bound: it delays the node's deployment
// past the moment the other nodes spawned their tasks, and counts the
// data frames that reached the node before its deploy command, which its
// channels, not yet open, drop.
type deployHold struct {
	ep    *cluster.Endpoint
	bound time.Duration

	mu       sync.Mutex // guards held, released and timer; held while the held frames are handed on, so that frames keep their order
	held     [][]byte
	released bool
	timer    *time.Timer
	early    atomic.Int64
}

func (h *deployHold) HandleFrame(data []byte) {
	f, err := cluster.DecodeFrame(data)
	h.mu.Lock()
	if err != nil || h.released {
		h.mu.Unlock()
		h.ep.HandleFrame(data)
		return
	}
	switch {
	case f.Channel.Edge == actors.ControlEdgeDown && f.Kind == cluster.KindBatch:
		h.held = append(h.held, data)
		if h.timer == nil {
			h.timer = time.AfterFunc(h.bound, h.release)
		}
		h.mu.Unlock()
		return
	case f.Channel.Edge != actors.ControlEdgeDown && f.Channel.Edge != actors.ControlEdgeUp && len(h.held) > 0:
		h.early.Add(1)
	}
	h.mu.Unlock()
	h.ep.HandleFrame(data)
	if h.early.Load() > 0 {
		h.release()
	}
}

// release hands the held frames on, once.
func (h *deployHold) release() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.released {
		return
	}
	h.released = true
	if h.timer != nil {
		h.timer.Stop()
	}
	for _, data := range h.held {
		h.ep.HandleFrame(data)
	}
	h.held = nil
}

func (h *deployHold) HandleDisconnect(node string, err error) { h.ep.HandleDisconnect(node, err) }

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
	c := &testCluster{Cluster: &actors.Cluster{}, mem: cluster.NewMemoryNetwork(1, cluster.Faults{})}
	var hold *deployHold
	for i := range 2 {
		id := []string{"node-0", "node-1"}[i]
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
