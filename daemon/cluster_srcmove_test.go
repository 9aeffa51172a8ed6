package daemon

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/cluster"
	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/pipeline"
	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/stream"
)

// Rebalances by handover of a job running on an in-memory cluster of
// nodes a (the job masters'), b and c: a join that moves a source split
// back to its node, and a drain that moves every subtask off node c and
// lets it leave the running deployment.

const moveKeys = 50

// moveJob is generator (two splits, paced) -> rebalance -> pass (sets
// each reading's count to 1) -> key by sensor -> running count ->
// exactly-once file sink of "sensor,count" lines, at parallelism 2.
//
// A non-nil hold keeps each generator split from ending its input until
// hold is closed, so that a test's rebalances meet a running job however
// slowly the machine runs it.
func moveJob(n int64, rate float64, dir string, hold <-chan struct{}, opts ...stream.Option) *stream.Environment {
	env := stream.NewEnvironment("moves", append([]stream.Option{stream.WithParallelism(2)}, opts...)...)
	src := stream.FromSource(env, "generator", func() operators.Source[operators.SensorReading] {
		g := operators.SensorGenerator(operators.GeneratorConfig{Count: n, Keys: moveKeys, Rate: rate})
		if hold == nil {
			return g
		}
		return &heldGenerator[operators.SensorReading]{Generator: g, holdAt: n, released: hold}
	}).UID("generator")
	ones := stream.Map(src.Rebalance(), "pass", func(r operators.SensorReading) (operators.SensorReading, error) {
		r.Temperature = 1
		return r, nil
	}).UID("pass")
	stream.KeyBy(ones, func(r operators.SensorReading) string { return r.ID }).
		Reduce("count", func(acc, v operators.SensorReading) (operators.SensorReading, error) {
			acc.Temperature += v.Temperature
			return acc, nil
		}).UID("count").
		To("files", func() operators.Sink[operators.SensorReading] {
			return operators.NewFileSink(dir, func(r operators.SensorReading) string { return fmt.Sprintf("%s,%d", r.ID, int64(r.Temperature)) })
		}).UID("files")
	return env
}

// checkCounts checks that the sink in dir committed, for every sensor,
// each running count from 1 to n/moveKeys exactly once.
func checkCounts(t *testing.T, dir string, n int64) {
	t.Helper()
	parts, err := operators.CommittedParts(dir)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	lines := 0
	for _, p := range parts {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if seen[sc.Text()]++; seen[sc.Text()] > 1 {
				f.Close()
				t.Fatalf("line %q committed twice", sc.Text())
			}
			lines++
		}
		f.Close()
	}
	per := n / moveKeys
	if int64(lines) != n {
		t.Fatalf("%d lines committed, want %d", lines, n)
	}
	for s := range moveKeys {
		if seen[fmt.Sprintf("sensor_%d,%d", s, per)] != 1 {
			t.Fatalf("sensor_%d: no total of %d committed", s, per)
		}
	}
}

// moveCluster is the job-master node a of cluster a, b, c (no gossip:
// every configured node is alive), its job running on an in-memory
// cluster with placement, node c's API on a test server.
type moveCluster struct {
	c     *clusterNode
	mem   *cluster.MemoryNetwork
	job   *stream.Job
	n     int64
	out   string
	left  atomic.Int32 // POST /cluster/leave answered by c
	nodes []actors.Node
	// hold keeps the generator from ending its input until release.
	hold    chan struct{}
	release func()
}

func startMoveCluster(t *testing.T, n int64, placement func(plan *actors.Plan) map[actors.TaskKey]string) *moveCluster {
	t.Helper()
	mc := &moveCluster{n: n, out: t.TempDir(), mem: cluster.NewMemoryNetwork(1, cluster.Faults{}), hold: make(chan struct{})}
	mc.release = sync.OnceFunc(func() { close(mc.hold) })
	t.Cleanup(mc.release)
	ids := []string{"a", "b", "c"}
	var nets []*cluster.Network
	ccfg := cluster.DefaultChannelConfig()
	ccfg.AckInterval = 50 * time.Millisecond
	for _, id := range ids {
		nw := cluster.NewNetwork(id, ccfg, nil)
		nw.Attach(mc.mem.Node(id, nw.Endpoint()))
		nets = append(nets, nw)
		mc.nodes = append(mc.nodes, actors.Node{ID: id, Network: nw})
	}
	p := cluster.NewPump(mc.mem, 5*time.Millisecond, nets...)
	p.Start()
	t.Cleanup(p.Stop)

	mux := http.NewServeMux()
	mux.HandleFunc("GET /ingest", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, IngestList{})
	})
	mux.HandleFunc("POST /cluster/leave", func(w http.ResponseWriter, r *http.Request) {
		// Node c leaves: its links go down, as when it stops.
		mc.left.Add(1)
		mc.mem.Cut("c", "a")
		mc.mem.Cut("c", "b")
		writeJSON(w, http.StatusOK, map[string]any{"node": "c", "left": true})
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	cfg := &pipeline.ClusterConfig{Node: "a", Listen: "127.0.0.1:1"}
	for _, id := range ids[1:] {
		cfg.Peers = append(cfg.Peers, pipeline.PeerConfig{ID: id, Address: "127.0.0.1:1", API: strings.TrimPrefix(srv.URL, "http://")})
	}
	gate, err := cluster.NewRebalanceGate(cluster.DefaultGateConfig())
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	c := &clusterNode{cfg: cfg, log: log, master: true}
	c.live = &liveView{c: c, stop: make(chan struct{}), gate: gate, joining: map[string]bool{}, deployed: slices.Clone(ids)}
	c.peers = &peerClient{cfg: cfg, http: srv.Client()}
	mc.c = c

	cp := snapshot.DefaultConfig()
	cp.Dir = t.TempDir()
	cp.Interval = 50 * time.Millisecond
	cp.Mode = snapshot.ExactlyOnce
	ac := &actors.Cluster{Nodes: mc.nodes, ControlTimeout: 3 * time.Second}
	env := moveJob(n, 50_000, mc.out, mc.hold,
		stream.WithCheckpointing(cp),
		stream.WithRestartStrategy(&snapshot.FixedDelay{Attempts: 3}),
		stream.WithCredits(256),
		stream.WithCluster(ac),
		stream.WithLogger(log))
	plan, err := env.Plan()
	if err != nil {
		t.Fatal(err)
	}
	// Home placement: subtasks spread over a, b, c in plan order.
	home := map[actors.TaskKey]string{}
	k := 0
	for _, ch := range plan.Chains {
		for sub := range ch.Head().Parallelism {
			home[actors.TaskKey{UID: ch.Head().UID, Subtask: sub}] = ids[k%len(ids)]
			k++
		}
	}
	job, err := env.Graph()
	if err != nil {
		t.Fatal(err)
	}
	c.setHome(job, home)
	ac.Placement = placement(plan)
	if ac.Placement == nil {
		ac.Placement = home
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	if mc.job, err = env.ExecuteAsync(ctx); err != nil {
		t.Fatal(err)
	}
	c.addExecution(mc.job.Execution())
	testutil.Eventually(t, 0, "the job runs", func() bool {
		r, _ := mc.job.Execution().Runner()
		if r == nil {
			return false
		}
		for _, m := range r.Metrics() {
			if len(m.Operators) > 0 && m.Operators[0] == "count" && m.RecordsIn > 0 {
				return true
			}
		}
		return false
	})
	return mc
}

// lastRebalance returns the latest rebalance recorded.
func (mc *moveCluster) lastRebalance(t *testing.T) cluster.Rebalance {
	t.Helper()
	v := mc.c.live
	v.mu.Lock()
	defer v.mu.Unlock()
	if len(v.rebalances) == 0 {
		t.Fatal("no rebalance recorded")
	}
	return v.rebalances[len(v.rebalances)-1]
}

// A node joins again after its source split ran on another node while it
// was away: the join moves the split back to it by handover (mode
// handover, the same attempt), not by redeploying the job, and the
// counts committed are exact.
func TestJoinMovesASourceSplitByHandover(t *testing.T) {
	testutil.Burn(t, 1)
	const n = 200_000
	split := actors.TaskKey{UID: "generator", Subtask: 0}
	mc := startMoveCluster(t, n, func(plan *actors.Plan) map[actors.TaskKey]string {
		// Home placement but the split, whose home is a: it runs on b,
		// as it did while a was away.
		p := map[actors.TaskKey]string{}
		k := 0
		for _, ch := range plan.Chains {
			for sub := range ch.Head().Parallelism {
				p[actors.TaskKey{UID: ch.Head().UID, Subtask: sub}] = []string{"a", "b", "c"}[k%3]
				k++
			}
		}
		if p[split] != "a" {
			t.Fatalf("the split's home is %q, want a", p[split])
		}
		p[split] = "b"
		return p
	})
	r0, _ := mc.job.Execution().Runner()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := mc.c.runRebalance(ctx, cluster.Start{Triggers: []cluster.Trigger{cluster.TriggerJoin}}); err != nil {
		t.Fatal(err)
	}
	rec := mc.lastRebalance(t)
	t.Logf("rebalance %+v", rec)
	if rec.Trigger != cluster.TriggerJoin || rec.Outcome != cluster.RebalanceDone || rec.Mode != cluster.RebalanceHandover {
		t.Fatalf("the join: trigger %s outcome %s mode %s (%s), want a join done by handover", rec.Trigger, rec.Outcome, rec.Mode, rec.Error)
	}
	if _, ok := rec.PauseMS["moves/generator/0"]; !ok || len(rec.PauseMS) != 1 {
		t.Fatalf("pauses %v, want the split's alone", rec.PauseMS)
	}
	r1, _ := mc.job.Execution().Runner()
	if r1 != r0 || mc.job.Attempts() != 1 {
		t.Fatalf("the job restarted: %d attempts", mc.job.Attempts())
	}
	if got := r1.NodeOf(split.UID, split.Subtask); got != "a" {
		t.Fatalf("the split runs on %q, want a", got)
	}
	mc.release() // the rebalances are done: the input may end
	if err := mc.job.Wait(); err != nil {
		t.Fatal(err)
	}
	if mc.job.Attempts() != 1 {
		t.Fatalf("%d attempts", mc.job.Attempts())
	}
	checkCounts(t, mc.out, n)
}

// A drained node's subtasks move away by handover, then it leaves the
// running deployment and the membership: its links going down is no
// failure (the same attempt runs on), the rebalance is recorded as a
// drain by handover, the latest deployment no longer names it, and the
// counts committed are exact.
func TestDrainMovesByHandoverAndTheNodeLeaves(t *testing.T) {
	testutil.Burn(t, 1)
	const n = 200_000
	mc := startMoveCluster(t, n, func(*actors.Plan) map[actors.TaskKey]string { return nil })
	r0, _ := mc.job.Execution().Runner()
	var onC []string
	for _, ch := range r0.Plan().Chains {
		for sub := range ch.Head().Parallelism {
			if r0.NodeOf(ch.Head().UID, sub) == "c" {
				onC = append(onC, fmt.Sprintf("%s[%d]", ch.Head().UID, sub))
			}
		}
	}
	if len(onC) < 2 {
		t.Fatalf("node c runs %v: want subtasks of two chains", onC)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := mc.c.runRebalance(ctx, cluster.Start{Triggers: []cluster.Trigger{cluster.TriggerDrain}, Drain: []string{"c"}}); err != nil {
		t.Fatal(err)
	}
	rec := mc.lastRebalance(t)
	t.Logf("rebalance %+v; c ran %v", rec, onC)
	if rec.Trigger != cluster.TriggerDrain || rec.Outcome != cluster.RebalanceDone || rec.Mode != cluster.RebalanceHandover {
		t.Fatalf("the drain: trigger %s outcome %s mode %s (%s), want a drain done by handover", rec.Trigger, rec.Outcome, rec.Mode, rec.Error)
	}
	if len(rec.PauseMS) != len(onC) {
		t.Fatalf("pauses %v, want one per subtask c ran (%v)", rec.PauseMS, onC)
	}
	if mc.left.Load() != 1 {
		t.Fatalf("node c was asked to leave %d times", mc.left.Load())
	}
	r1, _ := mc.job.Execution().Runner()
	if r1 != r0 || mc.job.Attempts() != 1 {
		t.Fatalf("the job restarted: %d attempts", mc.job.Attempts())
	}
	if slices.Contains(r1.Nodes(), "c") {
		t.Fatalf("node c is still in the running deployment %v", r1.Nodes())
	}
	mc.c.live.mu.Lock()
	deployed := slices.Clone(mc.c.live.deployed)
	mc.c.live.mu.Unlock()
	if slices.Contains(deployed, "c") || len(deployed) != 2 {
		t.Fatalf("the latest deployment is %v, want a and b", deployed)
	}
	for _, ch := range r1.Plan().Chains {
		for sub := range ch.Head().Parallelism {
			if r1.NodeOf(ch.Head().UID, sub) == "c" {
				t.Fatalf("%s[%d] still runs on c", ch.Head().UID, sub)
			}
		}
	}
	mc.release() // the rebalances are done: the input may end
	if err := mc.job.Wait(); err != nil {
		t.Fatal(err)
	}
	if mc.job.Attempts() != 1 {
		t.Fatalf("the job restarted after c left: %d attempts", mc.job.Attempts())
	}
	checkCounts(t, mc.out, n)
}

// Moves of subtasks joined by an edge go in successive handovers,
// upstream first; moves of chains not joined share one.
func TestHandoverWaves(t *testing.T) {
	env := moveJob(10, 0, t.TempDir(), nil)
	plan, err := env.Plan()
	if err != nil {
		t.Fatal(err)
	}
	mv := func(uid string, sub int) actors.Move { return actors.Move{UID: uid, Subtask: sub, To: "x"} }
	for _, tc := range []struct {
		moves []actors.Move
		want  string
	}{
		{[]actors.Move{mv("count", 1), mv("pass", 0), mv("generator", 1)}, "[[{generator 1 x}] [{pass 0 x}] [{count 1 x}]]"},
		{[]actors.Move{mv("count", 1), mv("generator", 0)}, "[[{count 1 x} {generator 0 x}]]"},
		{[]actors.Move{mv("count", 0), mv("count", 1)}, "[[{count 0 x} {count 1 x}]]"},
		{[]actors.Move{mv("pass", 1), mv("count", 0)}, "[[{pass 1 x}] [{count 0 x}]]"},
		{nil, "[]"},
	} {
		if got := fmt.Sprint(handoverWaves(plan, tc.moves)); got != tc.want {
			t.Errorf("waves of %v: %s, want %s", tc.moves, got, tc.want)
		}
	}
}

// A subtask moves to the node of a subtask it reads from (pass[0] to a,
// where generator[0] runs: their channel goes on within node a), and then
// the subtask it reads from moves away (generator[0] to b): the reader on
// a takes the channel from generator[0]'s new instance as it does any
// channel from a moved subtask. Both rebalances hand over in the same
// attempt and the counts committed are exact.
func TestMoveAwayFromAReaderThatJoinedItsSender(t *testing.T) {
	testutil.Burn(t, 1)
	const n = 200_000
	mc := startMoveCluster(t, n, func(*actors.Plan) map[actors.TaskKey]string { return nil })
	r0, _ := mc.job.Execution().Runner()
	gen0, pass0 := actors.TaskKey{UID: "generator", Subtask: 0}, actors.TaskKey{UID: "pass", Subtask: 0}
	if r0.NodeOf(gen0.UID, 0) != "a" || r0.NodeOf(pass0.UID, 0) != "c" {
		t.Fatalf("generator[0] on %q, pass[0] on %q: want a and c", r0.NodeOf(gen0.UID, 0), r0.NodeOf(pass0.UID, 0))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i, step := range []struct {
		task actors.TaskKey
		to   string
	}{{pass0, "a"}, {gen0, "b"}} {
		placement := map[string]map[actors.TaskKey]string{"moves": {step.task: step.to}}
		rec, err := mc.c.rebalanceJobs(ctx, cluster.TriggerManual, "test", placement, nil)
		if err != nil {
			t.Fatalf("rebalance %d (%s to %s): %v", i+1, step.task, step.to, err)
		}
		if rec.Outcome != cluster.RebalanceDone || rec.Mode != cluster.RebalanceHandover {
			t.Fatalf("rebalance %d: outcome %s mode %s (%s), want done by handover", i+1, rec.Outcome, rec.Mode, rec.Error)
		}
		if r, _ := mc.job.Execution().Runner(); r != r0 || r.NodeOf(step.task.UID, step.task.Subtask) != step.to {
			t.Fatalf("rebalance %d: %s not moved to %s in the same attempt (%d attempts)", i+1, step.task, step.to, mc.job.Attempts())
		}
	}
	mc.release() // the rebalances are done: the input may end
	if err := mc.job.Wait(); err != nil {
		t.Fatal(err)
	}
	if mc.job.Attempts() != 1 {
		t.Fatalf("the job restarted: %d attempts", mc.job.Attempts())
	}
	checkCounts(t, mc.out, n)
}
