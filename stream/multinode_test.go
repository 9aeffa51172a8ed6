package stream_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/cluster"
	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/stream"
)

// testCluster is one job's nodes in this process: each with its own task
// host and actor system, joined only by a transport.
type testCluster struct {
	*actors.Cluster
	nets []*cluster.Network
	mem  *cluster.MemoryNetwork     // nil over protoactor remote
	trs  []*cluster.RemoteTransport // nil over the in-memory transport
}

func testChannelConfig() cluster.ChannelConfig {
	cfg := cluster.DefaultChannelConfig()
	cfg.AckInterval = 50 * time.Millisecond
	return cfg
}

// memoryCluster returns n nodes over an in-memory network with the
// seeded fault schedule f, pumped until the test ends.
func memoryCluster(t testing.TB, n int, seed uint64, f cluster.Faults) *testCluster {
	return memoryClusterWith(t, n, seed, f, testChannelConfig())
}

// memoryClusterWith is memoryCluster with the channels configured by cfg.
func memoryClusterWith(t testing.TB, n int, seed uint64, f cluster.Faults, cfg cluster.ChannelConfig) *testCluster {
	cfgs := make([]cluster.ChannelConfig, n)
	for i := range cfgs {
		cfgs[i] = cfg
	}
	return memoryClusterOf(t, seed, f, cfgs)
}

// memoryClusterOf is memoryCluster with node i's channels configured by
// cfgs[i].
func memoryClusterOf(t testing.TB, seed uint64, f cluster.Faults, cfgs []cluster.ChannelConfig) *testCluster {
	c := &testCluster{Cluster: &actors.Cluster{}, mem: cluster.NewMemoryNetwork(seed, f)}
	for i, cfg := range cfgs {
		id := fmt.Sprintf("node-%d", i)
		nw := cluster.NewNetwork(id, cfg, nil)
		nw.Attach(c.mem.Node(id, nw.Endpoint()))
		c.nets = append(c.nets, nw)
		c.Nodes = append(c.Nodes, actors.Node{ID: id, Network: nw})
	}
	p := cluster.NewPump(c.mem, 5*time.Millisecond, c.nets...)
	p.Start()
	t.Cleanup(p.Stop)
	return c
}

// remoteCluster returns n nodes over protoactor remote on loopback.
func remoteCluster(t testing.TB, n int) *testCluster {
	c := &testCluster{Cluster: &actors.Cluster{}}
	for i := range n {
		id := fmt.Sprintf("node-%d", i)
		nw := cluster.NewNetwork(id, testChannelConfig(), nil)
		tr := cluster.NewRemoteTransport(cluster.DefaultRemoteConfig(), nw.Endpoint())
		if err := tr.Start(); err != nil {
			t.Fatal(err)
		}
		nw.Attach(tr)
		nw.Start(20 * time.Millisecond)
		t.Cleanup(func() {
			nw.Stop()
			tr.Stop(context.Background(), false)
		})
		c.trs = append(c.trs, tr)
		c.nets = append(c.nets, nw)
		c.Nodes = append(c.Nodes, actors.Node{ID: id, Network: nw})
	}
	for _, nw := range c.nets {
		for i, tr := range c.trs {
			nw.SetPeer(c.Nodes[i].ID, tr.Addr())
		}
	}
	return c
}

// spread places the subtasks of env's plan on the nodes round robin, in
// plan order, so that every kind of edge crosses nodes.
func (c *testCluster) spread(t testing.TB, env *stream.Environment) {
	t.Helper()
	plan, err := env.Plan()
	if err != nil {
		t.Fatal(err)
	}
	c.Placement = make(map[actors.TaskKey]string)
	k := 0
	for _, ch := range plan.Chains {
		for sub := range ch.Head().Parallelism {
			c.Placement[actors.TaskKey{UID: ch.Head().UID, Subtask: sub}] = c.Nodes[k%len(c.Nodes)].ID
			k++
		}
	}
}

// sent returns what crossed nodes: frames, batches and bytes.
func (c *testCluster) sent() cluster.SenderStats {
	var s cluster.SenderStats
	for _, nw := range c.nets {
		x := nw.Sent()
		s.Frames += x.Frames
		s.Batches += x.Batches
		s.Bytes += x.Bytes
		s.MaxInFlight = max(s.MaxInFlight, x.MaxInFlight)
	}
	return s
}

// checkCrossed fails the test if a job on more than one node sent no batch
// between nodes: the path under test was not reached.
func (c *testCluster) checkCrossed(t testing.TB) {
	t.Helper()
	s := c.sent()
	if len(c.Nodes) > 1 && s.Batches == 0 {
		t.Fatal("no batch crossed nodes")
	}
	// Acknowledgements are the credits: no channel ever had more batches
	// unacknowledged than its credits.
	if credits := testChannelConfig().Credits; s.MaxInFlight > credits {
		t.Fatalf("%d batches in flight on a channel between nodes, credits %d", s.MaxInFlight, credits)
	}
	// The job master and the hosts talked only by control messages over
	// the transport.
	var ctl int64
	for _, nw := range c.nets {
		ctl += nw.ControlSent().Batches
	}
	if want := int64(4 * len(c.Nodes)); ctl < want {
		t.Fatalf("%d control messages between the job master and %d hosts, want at least %d (register, deploy, deployed, start)", ctl, len(c.Nodes), want)
	}
	t.Logf("%d nodes: %d frames, %d batches, %d bytes between nodes, at most %d batches in flight; %d control messages", len(c.Nodes), s.Frames, s.Batches, s.Bytes, s.MaxInFlight, ctl)
}

type clusterMaker func(t testing.TB, n int) *testCluster

func overMemory(t testing.TB, n int) *testCluster { return memoryCluster(t, n, 1, cluster.Faults{}) }

// testMultiNodeRolling runs a keyed rolling aggregate on 1, 2 and 3 nodes
// and compares each key's result with a plain loop.
func testMultiNodeRolling(t *testing.T, mk clusterMaker) {
	const n, keys = 200_000, 500
	want := expected(n, keys)
	for _, nodes := range []int{1, 2, 3} {
		t.Run(fmt.Sprintf("nodes=%d", nodes), func(t *testing.T) {
			c := mk(t, nodes)
			sink := newLastPerKey(func(c countSum) string { return c.ID }, false)
			env := rollingJob(n, keys, 3, sink, stream.WithCluster(c.Cluster))
			c.spread(t, env)
			if err := execute(t, env); err != nil {
				t.Fatal(err)
			}
			c.checkCrossed(t)
			if len(sink.last) != keys {
				t.Fatalf("got %d keys, want %d", len(sink.last), keys)
			}
			for k, w := range want {
				if got := sink.last[k]; got != w {
					t.Fatalf("key %s: got %+v, want %+v", k, got, w)
				}
			}
		})
	}
}

// A keyed rolling aggregate gives the same per-key results on 1, 2 and 3
// nodes joined by the in-memory transport as in one process.
func TestMultiNodeKeyedRollingIsExact(t *testing.T) { testMultiNodeRolling(t, overMemory) }

// The same over protoactor remote on loopback.
func TestRemoteMultiNodeKeyedRollingIsExact(t *testing.T) { testMultiNodeRolling(t, remoteCluster) }

// Batches over a channel's byte cap are sent in halves, encoded again:
// the strings the whole batch numbered are numbered by the halves instead
// (the receiver never sees the whole batch). With frames of a few hundred
// bytes every batch of sensor readings is halved several times, and the
// per-key results are still exact.
func TestMultiNodeBatchesHalvedKeepTheirStrings(t *testing.T) {
	const n, keys = 20_000, 300
	cfg := testChannelConfig()
	cfg.MaxFrameBytes = 2 * cluster.FrameOverhead
	cfg.MaxMergeBytes = cfg.MaxBatchBytes()
	c := memoryClusterWith(t, 2, 1, cluster.Faults{}, cfg)
	sink := newLastPerKey(func(c countSum) string { return c.ID }, false)
	env := rollingJob(n, keys, 2, sink, stream.WithCluster(c.Cluster))
	c.spread(t, env)
	if err := execute(t, env); err != nil {
		t.Fatal(err)
	}
	c.checkCrossed(t)
	s := c.sent()
	if per := float64(n) / float64(s.Batches); per > 40 {
		t.Fatalf("%.0f records per batch crossing nodes: batches were not halved", per)
	}
	want := expected(n, keys)
	if len(sink.last) != keys {
		t.Fatalf("got %d keys, want %d", len(sink.last), keys)
	}
	for k, w := range want {
		if got := sink.last[k]; got != w {
			t.Fatalf("key %s: got %+v, want %+v", k, got, w)
		}
	}
}

// Records crossing nodes go in batches of the wire batch size, not of the
// node's batch size. Records too large for a frame at that size are
// halved, and the channel's later batches are cut to what fitted: a few
// batches are halved, not every one.
func TestMultiNodeWireBatches(t *testing.T) {
	const n, batch, wire = 20_000, 16, 128
	run := func(t *testing.T, cfg cluster.ChannelConfig, wire int) (cluster.SenderStats, int64) {
		c := memoryClusterWith(t, 2, 1, cluster.Faults{}, cfg)
		var got atomic.Int64
		env := stream.NewEnvironment("wire-batches", stream.WithParallelism(2), stream.WithBatchSize(batch),
			stream.WithWireBatchSize(wire), stream.WithLinger(time.Hour), stream.WithCluster(c.Cluster))
		src := stream.FromSource(env, "generator", generator(n, 100)).UID("generator")
		stream.KeyBy(src, bySensor).Stream().ForEach("count", func(operators.SensorReading) error {
			got.Add(1)
			return nil
		}).UID("count")
		// Every record crosses: the generators on node-0, the
		// counters on node-1.
		c.Placement = make(map[actors.TaskKey]string)
		for sub := range 2 {
			c.Placement[actors.TaskKey{UID: "generator", Subtask: sub}] = "node-0"
			c.Placement[actors.TaskKey{UID: "count", Subtask: sub}] = "node-1"
		}
		if err := execute(t, env); err != nil {
			t.Fatal(err)
		}
		c.checkCrossed(t)
		if got.Load() != n {
			t.Fatalf("counted %d records, want %d", got.Load(), n)
		}
		var halved int64
		for _, ch := range env.Stats().Channels {
			halved += ch.Halved
		}
		return c.sent(), halved
	}
	// No merging under backpressure: every batch crosses alone.
	cfg := testChannelConfig()
	cfg.MaxMergeBytes = 0
	t.Run("size", func(t *testing.T) {
		s, halved := run(t, cfg, wire)
		// Full batches but the last of each of the four channels.
		if lo, hi := int64(n/wire), int64(n/wire+4); s.Batches < lo || s.Batches > hi {
			t.Fatalf("%d batches crossed for %d records in batches of %d (%d within a node): want %d to %d", s.Batches, n, wire, batch, lo, hi)
		}
		if halved != 0 {
			t.Fatalf("%d batches halved under the default frame cap", halved)
		}
	})
	t.Run("halved", func(t *testing.T) {
		cfg := cfg
		cfg.MaxFrameBytes = cluster.FrameOverhead + 600 // about 50 readings
		s, halved := run(t, cfg, 1024)
		if per := float64(n) / float64(s.Batches); per > 64 || per < batch {
			t.Fatalf("%.0f records per batch crossing nodes, want what fits a frame of about 50", per)
		}
		// Each of the four channels halves its first batch down to what
		// fits (1024 -> 32: 31 halvings), and then rarely.
		if halved == 0 || halved > 4*31+20 {
			t.Fatalf("%d batches halved: want the first of each channel's, not every one (%d batches)", halved, s.Batches)
		}
		t.Logf("%d batches, %d halved", s.Batches, halved)
	})
}

// A negative wire batch size is refused before the job starts.
func TestWireBatchSizeRefused(t *testing.T) {
	env := stream.NewEnvironment("wire-refused", stream.WithWireBatchSize(-1))
	stream.FromSource(env, "generator", generator(10, 2)).ForEach("discard", func(operators.SensorReading) error { return nil })
	err := execute(t, env)
	if err == nil || !strings.Contains(err.Error(), "wire_batch_size (-1) must not be negative") {
		t.Fatalf("executing with a wire batch size of -1: %v, want it refused", err)
	}
}

// Every partitioner crosses nodes: forward, rebalance, key-by and
// broadcast edges, each with its subtasks on other nodes, deliver every
// record exactly once (broadcast: once per target).
func TestMultiNodeEveryPartitioner(t *testing.T) {
	const n = 20_000
	c := memoryCluster(t, 3, 1, cluster.Faults{})
	env := stream.NewEnvironment("partitioners", stream.WithParallelism(2), stream.WithCluster(c.Cluster))
	src := stream.FromSource(env, "generator", generator(n, 100)).UID("generator")
	fwd := stream.Map(src, "fwd", func(r operators.SensorReading) (operators.SensorReading, error) { return r, nil }).UID("fwd").DisableChaining()
	var forward, rebalanced, keyed, broadcast atomic.Int64
	fwd.ForEach("forward", func(operators.SensorReading) error { forward.Add(1); return nil })
	stream.Map(fwd.Rebalance(), "reb", func(r operators.SensorReading) (operators.SensorReading, error) { return r, nil }).SetParallelism(3).
		ForEach("rebalanced", func(operators.SensorReading) error { rebalanced.Add(1); return nil })
	stream.KeyBy(fwd, bySensor).Stream().ForEach("keyed", func(operators.SensorReading) error { keyed.Add(1); return nil })
	fwd.Broadcast().ForEach("broadcast", func(operators.SensorReading) error { broadcast.Add(1); return nil })
	c.spread(t, env)
	if err := execute(t, env); err != nil {
		t.Fatal(err)
	}
	c.checkCrossed(t)
	if forward.Load() != n || rebalanced.Load() != n || keyed.Load() != n || broadcast.Load() != 2*n {
		t.Fatalf("forward %d, rebalance %d, key-by %d, broadcast %d; want %d, %d, %d, %d",
			forward.Load(), rebalanced.Load(), keyed.Load(), broadcast.Load(), n, n, n, 2*n)
	}
}

// testMultiNodeWindows runs the tumbling-window job on 2 and 3 nodes.
func testMultiNodeWindows(t *testing.T, mk clusterMaker) {
	const size = int64(10_000)
	readings := outOfOrderReadings(20_000, 50, 1, nil)
	want := naiveWindows(readings, func(ts int64) []operators.Window {
		s := ts - ts%size
		return []operators.Window{{Start: s, End: s + size}}
	})
	for _, nodes := range []int{2, 3} {
		t.Run(fmt.Sprintf("nodes=%d", nodes), func(t *testing.T) {
			c := mk(t, nodes)
			sink := &resultSink{}
			env := windowE2EJob(readings, operators.TumblingEventTimeWindows(10*time.Second), sink, stream.WithCluster(c.Cluster))
			c.spread(t, env)
			if err := execute(t, env); err != nil {
				t.Fatal(err)
			}
			c.checkCrossed(t)
			compareResults(t, "tumbling", sink.sorted(), want)
		})
	}
}

// Event-time windows (watermarks and idleness crossing nodes in sequence
// with the records) give the same results on 2 and 3 nodes.
func TestMultiNodeTumblingWindowIsExact(t *testing.T) { testMultiNodeWindows(t, overMemory) }

// testMultiNodeExactlyOnce runs the exactly-once job with injected task
// failures on nodes nodes and compares what the sinks committed with the
// failure-free run in one process.
func testMultiNodeExactlyOnce(t *testing.T, c *testCluster, fails int64, n int64, keys int, opts ...stream.Option) {
	testutil.Burn(t, 1)
	want := t.TempDir()
	if err := execute(t, eoJob(n, keys, want, nil, stream.WithParallelism(2))); err != nil {
		t.Fatal(err)
	}
	wantLines := committedLines(t, want)

	fail := newFailer(fails)
	got := t.TempDir()
	gen := generator(n, keys)
	if fails > 0 {
		gen = pacedGenerator(n, keys, 2*time.Second)
	}
	env := eoJobFrom(gen, got, fail, append([]stream.Option{
		stream.WithParallelism(2),
		stream.WithCheckpointing(checkpointConfig(t, snapshot.ExactlyOnce)),
		stream.WithRestartStrategy(&snapshot.FixedDelay{Attempts: 30}),
		stream.WithCluster(c.Cluster)}, opts...)...)
	c.spread(t, env)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	job, err := env.ExecuteAsync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := job.Wait(); err != nil {
		t.Fatal(err)
	}
	c.checkCrossed(t)
	t.Logf("%d task failures; %d attempts; restored checkpoints %v", fail.fired.Load(), job.Attempts(), job.Restores())
	gotLines := committedLines(t, got)
	if strings.Join(gotLines, "\n") != strings.Join(wantLines, "\n") {
		t.Fatalf("committed output differs from the failure-free run: %d lines vs %d\n%s", len(gotLines), len(wantLines), diffLines(gotLines, wantLines))
	}
	if fails > 0 && (fail.fired.Load() < 1 || len(job.Restores()) < 1) {
		t.Fatalf("%d failures, restores %v: no failure was followed by a restore", fail.fired.Load(), job.Restores())
	}
}

// Task failures on a job spread over 2 and 3 nodes: every node's tasks
// restart from the latest checkpoint in a new epoch, and what the sinks
// committed equals the failure-free run in one process.
func TestMultiNodeExactlyOnceUnderFailures(t *testing.T) {
	for _, nodes := range []int{2, 3} {
		t.Run(fmt.Sprintf("nodes=%d", nodes), func(t *testing.T) {
			// Long enough that each attempt completes the two checkpoints
			// its failure waits for, also on a loaded machine.
			testMultiNodeExactlyOnce(t, memoryCluster(t, nodes, 1, cluster.Faults{}), 3, 1_000_000, 1000)
		})
	}
}

// The same over protoactor remote on loopback.
func TestRemoteMultiNodeExactlyOnceUnderFailures(t *testing.T) {
	testMultiNodeExactlyOnce(t, remoteCluster(t, 2), 2, 200_000, 500)
}

// Seeded random network faults (lost, duplicated, delayed and reordered
// frames) between the nodes of an exactly-once job: a duplicate is
// dropped, anything else fails the job loudly, and the restarts from the
// latest checkpoint end in exactly the failure-free result. The seed is
// printed; EDGED_SEED reruns one.
func TestMultiNodeFaultSchedules(t *testing.T) {
	seeds := []uint64{rand.Uint64(), rand.Uint64()}
	if s := os.Getenv("EDGED_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("EDGED_SEED: %v", err)
		}
		seeds = []uint64{v}
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			t.Logf("seed %d", seed)
			f := cluster.Faults{Drop: 0.01, Duplicate: 0.01, Delay: 0.005, Reorder: 0.005, MaxDelay: 3, Limit: 8}
			c := memoryCluster(t, 3, seed, f)
			testMultiNodeExactlyOnce(t, c, 0, 200_000, 500)
			st := c.mem.Stats()
			t.Logf("network: %+v", st)
			if st.Dropped+st.Duplicated+st.Delayed+st.Reordered == 0 {
				t.Fatal("no fault was injected: the path under test was not reached")
			}
		})
	}
}

// A partition between two nodes fails the job loudly (every channel
// across it fails) and the restart from the latest checkpoint gives the
// exact result once the link is healed.
func TestMultiNodePartitionFailsLoudlyAndRestores(t *testing.T) {
	c := memoryCluster(t, 2, 1, cluster.Faults{})
	var cut atomic.Bool
	// Cut the link once, after some records have crossed it, and heal it
	// right after the failure.
	go func() {
		for c.mem.Stats().Delivered < 200 {
			time.Sleep(time.Millisecond)
		}
		c.mem.Cut("node-0", "node-1")
		cut.Store(true)
	}()
	t.Cleanup(func() { c.mem.Heal("node-0", "node-1") })
	healed := make(chan struct{})
	go func() {
		defer close(healed)
		for !cut.Load() {
			time.Sleep(time.Millisecond)
		}
		time.Sleep(50 * time.Millisecond)
		c.mem.Heal("node-0", "node-1")
	}()
	testMultiNodeExactlyOnce(t, c, 0, 200_000, 500)
	<-healed
	if !cut.Load() {
		t.Fatal("the link was never cut")
	}
}

// A savepoint taken with the job on 2 nodes resumes on 3 nodes at another
// parallelism with exactly the result of a run without a stop.
func TestMultiNodeSavepointRescale(t *testing.T) {
	const n, keys = 200_000, 100
	var seen atomic.Int64
	want := t.TempDir()
	if err := execute(t, rescaleJob(n, keys, 2, 0, want, &seen)); err != nil {
		t.Fatal(err)
	}
	wantLines := committedLines(t, want)
	out := t.TempDir()
	cfg := snapshot.DefaultConfig()
	cfg.Dir = t.TempDir()
	seen.Store(0)
	two := memoryCluster(t, 2, 1, cluster.Faults{})
	env := rescaleJob(n, keys, 2, 400_000, out, &seen, stream.WithCheckpointing(cfg), stream.WithCluster(two.Cluster))
	two.spread(t, env)
	job, err := env.ExecuteAsync(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 0, "a quarter of the records read", func() bool { return seen.Load() >= n/4 })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	path, err := job.StopWithSavepoint(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := job.Wait(); err != nil {
		t.Fatal(err)
	}
	if seen.Load() >= n {
		t.Fatalf("the job read all %d records before the stop: nothing left to resume", seen.Load())
	}
	two.checkCrossed(t)
	three := memoryCluster(t, 3, 1, cluster.Faults{})
	resumed := rescaleJob(n, keys, 3, 0, out, &seen, stream.WithSavepoint(path, false), stream.WithCheckpointing(cfg), stream.WithCluster(three.Cluster))
	three.spread(t, resumed)
	if err := execute(t, resumed); err != nil {
		t.Fatal(err)
	}
	three.checkCrossed(t)
	got := committedLines(t, out)
	if strings.Join(got, "\n") != strings.Join(wantLines, "\n") {
		t.Fatalf("resumed on 3 nodes: %d lines vs %d\n%s", len(got), len(wantLines), diffLines(got, wantLines))
	}
}

// A node whose job graph differs from the job master's (another
// parallelism here) is refused when it registers, with an error naming
// the node.
func TestMultiNodeFingerprintMismatchRefused(t *testing.T) {
	c := memoryCluster(t, 2, 1, cluster.Faults{})
	sink := newLastPerKey(func(c countSum) string { return c.ID }, false)
	env := rollingJob(1000, 10, 2, sink, stream.WithCluster(c.Cluster))
	other, err := rollingJob(1000, 10, 3, sink).Graph()
	if err != nil {
		t.Fatal(err)
	}
	c.spread(t, env)
	c.Nodes[1].Job = other
	err = execute(t, env)
	if !errors.Is(err, actors.ErrPlanMismatch) || !strings.Contains(err.Error(), `node "node-1"`) {
		t.Fatalf("got %v, want ErrPlanMismatch naming node-1", err)
	}
	t.Log(err)
}
