package daemon

import (
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

	"github.com/jonboulle/clockwork"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/cluster"
	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/operators/operatorstest"
	"github.com/edgedio/edged/pipeline"
	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/stream"
	"github.com/edgedio/edged/watermark"
)

// Rebalances by handover driven through the job masters' node: an
// undrain queues a join behind the rebalance gate (on a fake clock), the
// gate opens, runRebalance plans a handover (cluster_handover.go) and
// records it. The three nodes run in this process over the in-memory
// transport: a, the job masters' node, and b and c as workers invited by
// the masters, as nodes in other processes are, moving state files
// through hoFiles as the daemon does over its REST API.

// hoGate is a pass-through operator on the source's node that counts
// what it sees and, while armed, holds its snapshot until released: a
// checkpoint stays in progress as long as a test needs.
type hoGate struct {
	operators.Base
	seen    *atomic.Int64
	armed   *atomic.Bool
	entered chan struct{}
	release chan struct{}
	once    *sync.Once
	out     operators.Collector[operators.SensorReading]
}

func (o *hoGate) Collect(r operators.SensorReading) {
	o.seen.Add(1)
	o.out.Collect(r)
}

func (o *hoGate) SnapshotState(int64) ([]byte, error) {
	if o.armed.Load() {
		o.once.Do(func() { close(o.entered) })
		<-o.release
	}
	return nil, nil
}

// hoSum is one key's count and sum in a window.
type hoSum struct {
	Count int64
	Sum   int64
}

type hoSumAgg struct{}

func (hoSumAgg) CreateAccumulator() hoSum { return hoSum{} }
func (hoSumAgg) Add(r operators.SensorReading, a hoSum) hoSum {
	return hoSum{Count: a.Count + 1, Sum: a.Sum + int64(r.Temperature*100+0.5)}
}
func (hoSumAgg) Result(a hoSum) hoSum { return a }

func hoLine(r operators.WindowResult[string, hoSum]) string {
	return fmt.Sprintf("%s,%d,%d,%d", r.Key, r.Window.Start, r.Value.Count, r.Value.Sum)
}

// hoShape is what every node builds the job from.
type hoShape struct {
	n       int64
	keys    int
	rate    float64
	out     string
	seen    *atomic.Int64
	armed   *atomic.Bool
	entered chan struct{}
	release chan struct{}
	once    *sync.Once
	// input is closed once the rebalance under test ran: the generator
	// holds at three quarters of its input until then.
	input     chan struct{}
	inputOnce *sync.Once
}

func newHoShape(n int64, keys int, rate float64, out string) *hoShape {
	return &hoShape{n: n, keys: keys, rate: rate, out: out, seen: &atomic.Int64{}, armed: &atomic.Bool{},
		entered: make(chan struct{}), release: make(chan struct{}), once: &sync.Once{},
		input: make(chan struct{}), inputOnce: &sync.Once{}}
}

// releaseInput lets the generator read the rest of its input.
func (s *hoShape) releaseInput() { s.inputOnce.Do(func() { close(s.input) }) }

// env builds generator (1 subtask) -> timestamps -> gate (chained) -> key
// by sensor -> 10 s tumbling count+sum (3 subtasks) -> exactly-once file
// sink "out" (chained to the windows). With c drained, the placement puts
// count-sum[2] on b (a worker) and its sink's home unit on a.
func (s *hoShape) env(opts ...stream.Option) *stream.Environment {
	env := stream.NewEnvironment("moved", append([]stream.Option{stream.WithParallelism(3), stream.WithSerializedKeyBy(true),
		stream.WithCredits(256)}, opts...)...)
	src := stream.FromSource(env, "generator", func() operators.Source[operators.SensorReading] {
		return &heldGenerator[operators.SensorReading]{Generator: operators.SensorGenerator(operators.GeneratorConfig{Count: s.n, Keys: s.keys, Rate: s.rate}),
			holdAt: s.n * 3 / 4, released: s.input}
	}).SetParallelism(1).UID("generator").
		AssignTimestampsAndWatermarks("timestamps", watermark.ForMonotonous(func(r operators.SensorReading) int64 { return r.Timestamp * 1000 }))
	gated := stream.Transform(src, "gate", func(out operators.Collector[operators.SensorReading]) operators.OneInput[operators.SensorReading] {
		return &hoGate{seen: s.seen, armed: s.armed, entered: s.entered, release: s.release, once: s.once, out: out}
	}).SetParallelism(1).UID("gate")
	w := stream.Window(stream.KeyBy(gated, func(r operators.SensorReading) string { return r.ID }), operators.TumblingEventTimeWindows(10*time.Second))
	stream.WindowAggregate(w, "count-sum", hoSumAgg{}).UID("count-sum").
		To("out", func() operators.Sink[operators.WindowResult[string, hoSum]] {
			return operators.NewFileSink(s.out, hoLine)
		}).UID("out")
	return env
}

// hoCommitted reads every committed part file of dir, sorted.
func hoCommitted(t *testing.T, dir string) []string {
	t.Helper()
	lines, err := operatorstest.CommittedLines(dir)
	if err != nil {
		t.Fatal(err)
	}
	return lines
}

// hoReference returns the committed lines of the job in one process,
// without a cluster and without a move.
func hoReference(t *testing.T, n int64, keys int) []string {
	t.Helper()
	s := newHoShape(n, keys, 0, t.TempDir())
	s.releaseInput()
	cp := snapshot.DefaultConfig()
	cp.Dir = t.TempDir()
	cp.Interval = 50 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := s.env(stream.WithCheckpointing(cp)).Execute(ctx); err != nil {
		t.Fatal(err)
	}
	lines := hoCommitted(t, s.out)
	if len(lines) == 0 {
		t.Fatal("the reference run committed nothing")
	}
	return lines
}

// hoFiles moves state files between the workers and the job master of
// this process, as the daemon's peerClient does between processes.
type hoFiles struct {
	job     atomic.Pointer[stream.Job]
	fetched atomic.Int64
	// onFetch, when set, runs before each fetch: an error fails it.
	onFetch func(node string) error
	node    string // the worker the files are for
}

func (m *hoFiles) Push(_ context.Context, _, _ string, epoch uint64, id snapshot.ID, path string, h snapshot.Handle) error {
	j := m.job.Load()
	if j == nil {
		return fmt.Errorf("no job master")
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return j.Execution().ReceiveFile(epoch, id, h.File, h.Size, h.Checksum, f)
}

func (m *hoFiles) Fetch(_ context.Context, _, _ string, epoch uint64, id snapshot.ID, h snapshot.Handle, path string) error {
	if m.onFetch != nil {
		if err := m.onFetch(m.node); err != nil {
			return err
		}
	}
	j := m.job.Load()
	if j == nil {
		return fmt.Errorf("no job master")
	}
	f, _, err := j.Execution().OpenRestoreFile(epoch, h.File)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := snapshot.CopyFile(f, h, path); err != nil {
		return err
	}
	m.fetched.Add(1)
	return nil
}

// testLog returns a logger whose lines the test logs if it fails (the
// last 300 of them).
func testLog(t *testing.T) *slog.Logger {
	lb := &testutil.Buffer{}
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		lines := strings.Split(lb.String(), "\n")
		t.Logf("the nodes' log (last lines):\n%s", strings.Join(lines[max(0, len(lines)-300):], "\n"))
	})
	return slog.New(slog.NewTextHandler(lb, nil))
}

// hoCluster is a job running on the three in-process nodes, driven by
// the job masters' clusterNode.
type hoCluster struct {
	c       *clusterNode
	clock   *clockwork.FakeClock
	shape   *hoShape
	job     *stream.Job
	workers map[string]*actors.Worker
	files   map[string]*hoFiles
	home    map[actors.TaskKey]string
	// from is the node count-sum[2] runs on before the rebalance; its
	// home is c, drained when the job starts.
	from string
	// skew is how far (ns) the fake clock ran ahead of real time when
	// the test last asked for a rebalance (syncClock).
	skew atomic.Int64
}

// hoOptions tunes startHoCluster.
type hoOptions struct {
	// hook is the cluster's handover hook.
	hook func(h *hoCluster) func(actors.HandoverStep, string) error
	// interval is the checkpoint interval (default 50 ms).
	interval time.Duration
}

// startHoCluster starts the job with node c drained: count-sum[2], whose
// home is c, runs on a or b. The job masters' node a places every
// attempt as the daemon does (liveView.update over the home placement,
// which jobCluster sets), invites b and c as workers, and runs its
// rebalances from a rebalancer on a fake clock that the test steps.
func startHoCluster(t *testing.T, shape *hoShape, o hoOptions) *hoCluster {
	t.Helper()
	log := testLog(t)
	cfg := &pipeline.ClusterConfig{Node: "a", Listen: "127.0.0.1:1", Peers: []pipeline.PeerConfig{{ID: "b"}, {ID: "c"}}}
	gate, err := cluster.NewRebalanceGate(cluster.DefaultGateConfig())
	if err != nil {
		t.Fatal(err)
	}
	h := &hoCluster{shape: shape, workers: map[string]*actors.Worker{}, files: map[string]*hoFiles{},
		clock: clockwork.NewFakeClockAt(time.Now())}
	c := &clusterNode{cfg: cfg, log: log, master: true}
	t.Cleanup(shape.releaseInput)
	c.live = &liveView{c: c, stop: make(chan struct{}), gate: gate, joining: map[string]bool{}, drained: map[string]bool{"c": true}}
	c.rb = c.newRebalancer()
	c.rb.clock = h.clock
	// The gate holds a request for the checkpoints triggered before it,
	// comparing the request's time on the fake clock with the jobs'
	// checkpoint times, which are real. Once a test advanced the fake
	// clock past the damping interval it runs minutes ahead: every
	// checkpoint of those minutes would count as triggered before a
	// later request and hold it, and on a loaded machine, where
	// checkpoints follow each other with hardly a gap, the gate would
	// not open. The request's time is taken back to real time.
	c.rb.checkpointing = func(since time.Time) bool {
		return c.checkpointing(since.Add(-time.Duration(h.skew.Load())))
	}
	c.peers = &peerClient{cfg: cfg, http: &http.Client{}}
	h.c = c

	mem := cluster.NewMemoryNetwork(1, cluster.Faults{})
	cc := cluster.DefaultChannelConfig()
	cc.AckInterval = 50 * time.Millisecond
	var nets []*cluster.Network
	for _, id := range cfg.Nodes() {
		nw := cluster.NewNetwork(id, cc, nil)
		nw.Attach(mem.Node(id, nw.Endpoint()))
		nets = append(nets, nw)
	}
	pump := cluster.NewPump(mem, 5*time.Millisecond, nets...)
	pump.Start()
	t.Cleanup(pump.Stop)
	c.net = nets[0]

	cp := snapshot.DefaultConfig()
	cp.Dir = t.TempDir()
	cp.Mode = snapshot.ExactlyOnce
	cp.Interval = 50 * time.Millisecond
	if o.interval > 0 {
		cp.Interval = o.interval
	}
	ac := &actors.Cluster{EpochBase: 100, ControlTimeout: 3 * time.Second}
	opts := []stream.Option{stream.WithCheckpointing(cp), stream.WithRestartStrategy(&snapshot.FixedDelay{Attempts: 5}), stream.WithCluster(ac),
		stream.WithLogger(log)}
	for i, id := range cfg.Nodes()[1:] {
		f := &hoFiles{node: id}
		h.files[id] = f
		w := actors.NewWorker(actors.WorkerConfig{Node: id, Network: nets[i+1], Dir: t.TempDir(), Files: f, Logger: log,
			Jobs: func(string) (*actors.Job, actors.Config, error) {
				env := shape.env(opts...)
				j, err := env.Graph()
				return j, env.Config(), err
			}})
		t.Cleanup(w.Close)
		h.workers[id] = w
	}
	ac.Invite = func(ctx context.Context, node string, d actors.Deployment) error {
		w, ok := h.workers[node]
		if !ok {
			return fmt.Errorf("no worker %q", node)
		}
		return w.Deploy(ctx, d)
	}
	if o.hook != nil {
		ac.HandoverHook = o.hook(h)
	}
	env := shape.env(opts...)
	graph, err := env.Graph()
	if err != nil {
		t.Fatal(err)
	}
	// The home placement, as jobCluster makes it: subtask i on the
	// i-th node.
	h.home = map[actors.TaskKey]string{}
	for _, v := range graph.Vertices {
		for i := range v.Parallelism {
			h.home[actors.TaskKey{UID: v.UID, Subtask: i}] = cfg.Nodes()[i%3]
		}
	}
	c.setHome(graph, h.home)
	home := &actors.Cluster{Placement: h.home}
	ac.Update = func() ([]actors.Node, map[actors.TaskKey]string, error) { return c.live.update(home) }

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	job, err := env.ExecuteAsync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	h.job = job
	for _, f := range h.files {
		f.job.Store(job)
	}
	c.addExecution(job.Execution())
	r := h.runner(t)
	h.from = r.NodeOf("count-sum", 2)
	if h.from == "c" || h.from == "" {
		t.Fatalf("count-sum[2] runs on %q with c drained", h.from)
	}
	testutil.Eventually(t, 0, "a quarter of the records read", func() bool { return shape.seen.Load() >= shape.n/4 })
	return h
}

// runner returns the job's running attempt once it has started.
func (h *hoCluster) runner(t *testing.T) *actors.Runner {
	t.Helper()
	var r *actors.Runner
	testutil.Eventually(t, 0, "the job runs", func() bool {
		r, _ = h.job.Execution().Runner()
		if r == nil {
			return false
		}
		select {
		case <-r.Started():
			return true
		default:
			return false
		}
	})
	return r
}

// undrain undrains c from another goroutine (as the API handler does)
// and returns its outcome's channel once its join is queued.
func (h *hoCluster) undrain(t *testing.T) <-chan error {
	t.Helper()
	h.syncClock()
	out := make(chan error, 1)
	go func() { out <- h.c.Undrain(context.Background(), "c") }()
	testutil.Eventually(t, 0, "the join is queued", func() bool {
		h.c.rb.gateMu.Lock()
		defer h.c.rb.gateMu.Unlock()
		return len(h.c.rb.waiters) == 1
	})
	return out
}

// syncClock brings the fake clock up to real time if it is behind, and
// notes how far ahead it is otherwise, before the test asks for a
// rebalance: the gate compares the request's time with the jobs'
// checkpoint times.
func (h *hoCluster) syncClock() {
	if d := time.Since(h.clock.Now()); d > 0 {
		h.clock.Advance(d)
	}
	h.skew.Store(int64(max(0, h.clock.Now().Sub(time.Now()))))
}

// settle advances the fake clock past the join's settle delay.
func (h *hoCluster) settle() {
	h.clock.Advance(cluster.DefaultGateConfig().Settle + rebalancePoll)
}

// step polls the gate once, running the rebalance if it opens.
func (h *hoCluster) step() bool { return h.c.rb.step(context.Background()) }

// open polls the gate as the rebalancer's loop does, a poll interval of
// the fake clock apart, until it opens and the rebalance has run: a
// periodic checkpoint in progress holds it for a moment.
func (h *hoCluster) open(t *testing.T) {
	t.Helper()
	testutil.Eventually(t, 0, "the gate opens and the rebalance runs", func() bool {
		if h.step() {
			return true
		}
		h.clock.Advance(rebalancePoll)
		return false
	})
}

// history returns the rebalances recorded.
// rebalanceThroughGate asks for a rebalance with ask (from another
// goroutine, as the API handler does), lets the gate open (past the
// settle delay and the damping interval) once it is queued, fails t on
// ask's error and returns the rebalance recorded last.
func (h *hoCluster) rebalanceThroughGate(t *testing.T, what string, ask func() error) cluster.Rebalance {
	t.Helper()
	h.syncClock()
	done := make(chan error, 1)
	go func() { done <- ask() }()
	testutil.Eventually(t, 0, what+" is queued", func() bool {
		h.c.rb.gateMu.Lock()
		defer h.c.rb.gateMu.Unlock()
		return len(h.c.rb.waiters) == 1
	})
	h.clock.Advance(cluster.DefaultGateConfig().MaxInterval + cluster.DefaultGateConfig().Settle)
	h.open(t)
	if err := <-done; err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	recs := h.history()
	rec := recs[len(recs)-1]
	t.Logf("%s: %+v", what, rec)
	return rec
}

func (h *hoCluster) history() []cluster.Rebalance {
	h.c.live.mu.Lock()
	defer h.c.live.mu.Unlock()
	return slices.Clone(h.c.live.rebalances)
}

// onlyRebalance returns the one rebalance in the history, logged; it
// fails the test if there is not exactly one.
func (h *hoCluster) onlyRebalance(t *testing.T) cluster.Rebalance {
	t.Helper()
	recs := h.history()
	if len(recs) != 1 {
		t.Fatalf("history %+v", recs)
	}
	t.Logf("rebalance %+v", recs[0])
	return recs[0]
}

// finish waits for the job to end and compares its committed output with
// want.
func (h *hoCluster) finish(t *testing.T, want []string) {
	t.Helper()
	h.shape.releaseInput()
	if err := h.job.Wait(); err != nil {
		t.Fatal(err)
	}
	sameLines(t, "committed output differs from the run without a move", hoCommitted(t, h.shape.out), want)
}

// sameLines fails t unless got equals want.
func sameLines(t *testing.T, what string, got, want []string) {
	t.Helper()
	if strings.Join(got, "\n") == strings.Join(want, "\n") {
		return
	}
	var missing, extra []string
	for _, l := range want {
		if !slices.Contains(got, l) {
			missing = append(missing, l)
		}
	}
	for _, l := range got {
		if !slices.Contains(want, l) {
			extra = append(extra, l)
		}
	}
	t.Fatalf("%s: %d lines vs %d; missing %d %v; extra %d %v", what, len(got), len(want), len(missing), head(missing), len(extra), head(extra))
}

func head(s []string) []string { return s[:min(len(s), 5)] }

// latestCompleted returns the newest completed checkpoint or savepoint
// of r.
func latestCompleted(r *actors.Runner) snapshot.ID {
	var id snapshot.ID
	for _, s := range r.History() {
		if s.Status == snapshot.Completed {
			id = max(id, s.Checkpoint)
		}
	}
	return id
}

// scrapeTally returns the rebalance metrics of the job masters' node.
func (h *hoCluster) scrapeTally(t *testing.T) string {
	t.Helper()
	return scrapeRebalances(t, talliedCluster{fakeCluster: &fakeCluster{status: threeNodes()}, c: h.c})
}

const hoN, hoKeys, hoRate = 150_000, 100, 60_000

// An undrained node's join moves its keyed subtask to it by handover:
// the node is invited into the running deployment, only the moved
// subtask pauses, the job does not restart, the rebalance is recorded
// with mode handover and counted in the metrics, and the output is
// exact.
func TestRebalanceByHandoverJoin(t *testing.T) {
	testutil.Burn(t, 1)
	want := hoReference(t, hoN, hoKeys)
	h := startHoCluster(t, newHoShape(hoN, hoKeys, hoRate, t.TempDir()), hoOptions{})
	r0 := h.runner(t)
	done := h.undrain(t)
	if h.step() {
		t.Fatal("the join ran before its settle delay")
	}
	h.settle()
	h.open(t)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	rec := h.onlyRebalance(t)
	if rec.Mode != cluster.RebalanceHandover || rec.Outcome != cluster.RebalanceDone || rec.Trigger != cluster.TriggerJoin {
		t.Fatalf("rebalance %+v, want a join done by handover", rec)
	}
	if _, ok := rec.PauseMS["moved/count-sum/2"]; !ok || len(rec.PauseMS) != 1 || rec.BytesShipped == 0 {
		t.Fatalf("rebalance %+v: want count-sum[2]'s pause alone, and its bytes", rec)
	}
	if !slices.Equal(rec.Unpaused, []string{"moved/count-sum/0", "moved/count-sum/1"}) {
		t.Fatalf("unpaused %v", rec.Unpaused)
	}
	r1 := h.runner(t)
	if r1 != r0 || h.job.Attempts() != 1 {
		t.Fatalf("the job restarted: %d attempts", h.job.Attempts())
	}
	if got := r1.NodeOf("count-sum", 2); got != "c" {
		t.Fatalf("count-sum[2] runs on %q, want c", got)
	}
	if h.workers["c"].Handovers() != 1 || h.files["c"].fetched.Load() == 0 {
		t.Fatalf("c adopted %d subtasks and fetched %d files", h.workers["c"].Handovers(), h.files["c"].fetched.Load())
	}
	if m := h.scrapeTally(t); !strings.Contains(m, `edged_cluster_rebalances_by_mode_total{mode="handover",outcome="done",trigger="join"} 1`+"\n") ||
		!strings.Contains(m, `edged_cluster_rebalance_pause_seconds_count{mode="handover"} 1`+"\n") {
		t.Fatalf("metrics:\n%s", m)
	}
	h.finish(t, want)
	if h.job.Attempts() != 1 {
		t.Fatalf("%d attempts", h.job.Attempts())
	}
}

// testHandoverFallsBack runs a join whose handover fails after its
// barrier at the step fail injects (fired reports that it did): the
// rebalance is recorded as fell-back by handover and counted, the undrain
// returns the error, the job restarts from its latest completed
// checkpoint or savepoint (the handover's) on the placement the live
// nodes give, as a redeployment places it, never half moved, and the
// output is exact.
// failed names the step that failed, as the error says it.
func testHandoverFallsBack(t *testing.T, fired *atomic.Bool, failed string, o hoOptions, setup func(*hoCluster)) {
	testutil.Burn(t, 1)
	want := hoReference(t, hoN, hoKeys)
	h := startHoCluster(t, newHoShape(hoN, hoKeys, hoRate, t.TempDir()), o)
	if setup != nil {
		setup(h)
	}
	r0 := h.runner(t)
	done := h.undrain(t)
	h.settle()
	h.open(t)
	err := <-done
	if err == nil || !strings.Contains(err.Error(), "handover of job") || !strings.Contains(err.Error(), failed) {
		t.Fatalf("undrain: %v, want the handover's failure at %q", err, failed)
	}
	if !fired.Load() {
		t.Fatal("the failure under test was not injected")
	}
	t.Log(err)
	recs := h.history()
	if len(recs) != 1 || recs[0].Mode != cluster.RebalanceHandover || recs[0].Outcome != cluster.RebalanceFellBack {
		t.Fatalf("history %+v, want one handover that fell back", recs)
	}
	testutil.Eventually(t, 0, "the job restarted", func() bool { return h.job.Attempts() >= 2 })
	var r1 *actors.Runner
	testutil.Eventually(t, 0, "the restarted attempt runs", func() bool {
		r, _ := h.job.Execution().Runner()
		if r == nil || r == r0 {
			return false
		}
		select {
		case <-r.Started():
			r1 = r
			return true
		default:
			return false
		}
	})
	// The handover's savepoint completed before the failure: the
	// restart restores it (or a newer checkpoint, never an older one).
	latest := latestCompleted(r0)
	restores := h.job.Restores()
	if len(restores) == 0 || restores[0] < latest || restores[0] == 0 {
		t.Fatalf("restores %v, the latest completed before the failure was %d", restores, latest)
	}
	// Never half moved: the restart placed every subtask where the live
	// nodes' placement puts it, as a redeployment does.
	_, placement, err := h.c.live.update(&actors.Cluster{Placement: h.home})
	if err != nil {
		t.Fatal(err)
	}
	for k, node := range placement {
		if got := r1.NodeOf(k.UID, k.Subtask); got != node {
			t.Fatalf("after the fallback %s runs on %q, the placement says %q", k, got, node)
		}
	}
	if m := h.scrapeTally(t); !strings.Contains(m, `edged_cluster_rebalances_by_mode_total{mode="handover",outcome="fell-back",trigger="join"} 1`+"\n") {
		t.Fatalf("metrics:\n%s", m)
	}
	h.finish(t, want)
	t.Logf("attempts %d, restores %v (latest completed before the failure %d); count-sum[2] on %s, was on %s",
		h.job.Attempts(), restores, latest, r1.NodeOf("count-sum", 2), h.from)
}

// The old owner fails mid-handover: its node's worker (b) stops every
// task it hosts after the moved subtask snapshotted at the barrier and
// before it retires it, as the node's process dying would; the masters
// hear nothing more from it.
func TestRebalanceByHandoverOldOwnerFails(t *testing.T) {
	var fired atomic.Bool
	testHandoverFallsBack(t, &fired, `retire count-sum[2] on node "b"`, hoOptions{hook: func(h *hoCluster) func(actors.HandoverStep, string) error {
		return func(step actors.HandoverStep, node string) error {
			if step == actors.HandoverRetire && node == h.from && fired.CompareAndSwap(false, true) {
				h.workers[node].Evict()
			}
			return nil
		}
	}}, func(h *hoCluster) {
		if _, ok := h.workers[h.from]; !ok {
			t.Fatalf("count-sum[2] runs on %s, the masters' node: its death is not a handover's", h.from)
		}
	})
}

// The new owner fails mid-restore: c's worker fails while it fetches the
// moved subtask's state files of the savepoint (the old owner retired it
// already) and stops every task it hosts.
func TestRebalanceByHandoverNewOwnerFailsMidRestore(t *testing.T) {
	var fired, restoring atomic.Bool
	testHandoverFallsBack(t, &fired, `restore count-sum[2] on node "c"`, hoOptions{hook: func(h *hoCluster) func(actors.HandoverStep, string) error {
		return func(step actors.HandoverStep, node string) error {
			if step == actors.HandoverRestore && node == "c" {
				restoring.Store(true)
			}
			return nil
		}
	}}, func(h *hoCluster) {
		h.files["c"].onFetch = func(node string) error {
			if !restoring.Load() || !fired.CompareAndSwap(false, true) {
				return nil
			}
			go h.workers[node].Evict()
			return fmt.Errorf("node %s died while fetching the moved subtask's state", node)
		}
	})
}

// The job fails after the handover's barrier, once the moved subtask is
// restored on c and before every channel to it is re-pointed: the
// moment the job is closest to half moved. It restarts whole.
func TestRebalanceByHandoverJobFailsAfterBarrier(t *testing.T) {
	var fired atomic.Bool
	testHandoverFallsBack(t, &fired, "failed re-pointing its channels", hoOptions{hook: func(h *hoCluster) func(actors.HandoverStep, string) error {
		return func(step actors.HandoverStep, node string) error {
			if step == actors.HandoverRepoint && fired.CompareAndSwap(false, true) {
				return fmt.Errorf("node %s failed re-pointing its channels", node)
			}
			return nil
		}
	}}, nil)
}

// A join that comes while a checkpoint is in progress is queued behind
// it at the gate — no handover starts, nothing is recorded — and runs by
// handover once the checkpoint ended.
func TestRebalanceByHandoverQueuedBehindCheckpoint(t *testing.T) {
	testutil.Burn(t, 1)
	want := hoReference(t, hoN, hoKeys)
	shape := newHoShape(hoN, hoKeys, hoRate, t.TempDir())
	h := startHoCluster(t, shape, hoOptions{interval: time.Hour})
	r0 := h.runner(t)
	shape.armed.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	type spRes struct {
		path string
		err  error
	}
	sp := make(chan spRes, 1)
	go func() {
		p, err := h.job.TriggerSavepoint(ctx, "")
		sp <- spRes{p, err}
	}()
	<-shape.entered
	done := h.undrain(t)
	h.settle()
	for range 5 {
		if h.step() {
			t.Fatal("the join ran while a checkpoint was in progress")
		}
		h.clock.Advance(rebalancePoll)
	}
	if why := h.c.rb.waiting; !strings.Contains(why, "checkpoint") {
		t.Fatalf("the gate waits for %q, want a checkpoint", why)
	}
	if n := len(h.history()); n != 0 || r0.PendingMoves() != 0 || r0.Handovers() != 0 {
		t.Fatalf("while queued: %d rebalances recorded, %d moves pending, %d handovers", n, r0.PendingMoves(), r0.Handovers())
	}
	select {
	case err := <-done:
		t.Fatalf("the undrain returned while its join was queued: %v", err)
	default:
	}
	shape.armed.Store(false)
	close(shape.release)
	s := <-sp
	if s.err != nil {
		t.Fatal(s.err)
	}
	md, err := snapshot.Load(s.path)
	if err != nil {
		t.Fatal(err)
	}
	h.clock.Advance(rebalancePoll)
	if !h.step() {
		t.Fatalf("the join did not run once the checkpoint ended (waiting %q)", h.c.rb.waiting)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	recs := h.history()
	if len(recs) != 1 || recs[0].Mode != cluster.RebalanceHandover || recs[0].Outcome != cluster.RebalanceDone {
		t.Fatalf("history %+v, want one join done by handover", recs)
	}
	if latest := latestCompleted(r0); latest <= snapshot.ID(md.Checkpoint) {
		t.Fatalf("the handover's savepoint %d is not after the held one %d", latest, md.Checkpoint)
	}
	if got := r0.NodeOf("count-sum", 2); got != "c" || h.job.Attempts() != 1 {
		t.Fatalf("count-sum[2] runs on %q after %d attempts, want c after 1", got, h.job.Attempts())
	}
	h.finish(t, want)
}

// A drain whose handover fails after its barrier falls back: the job
// restarts from its latest checkpoint or savepoint on the nodes left (a:
// c was drained before), nothing of it on the drained node b, which is
// then asked to leave; the drain returns no error, is recorded as a
// drain by handover that fell back, and the output is exact.
func TestDrainByHandoverFallsBackAndTheNodeLeaves(t *testing.T) {
	testutil.Burn(t, 1)
	want := hoReference(t, hoN, hoKeys)
	var armed, fired atomic.Bool
	h := startHoCluster(t, newHoShape(hoN, hoKeys, hoRate, t.TempDir()), hoOptions{hook: func(*hoCluster) func(actors.HandoverStep, string) error {
		return func(step actors.HandoverStep, node string) error {
			if armed.Load() && step == actors.HandoverRepoint && fired.CompareAndSwap(false, true) {
				return fmt.Errorf("node %s failed re-pointing its channels", node)
			}
			return nil
		}
	}})
	var left atomic.Int32
	mux := http.NewServeMux()
	mux.HandleFunc("GET /ingest", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, http.StatusOK, IngestList{}) })
	mux.HandleFunc("POST /cluster/leave", func(w http.ResponseWriter, r *http.Request) {
		left.Add(1)
		writeJSON(w, http.StatusOK, map[string]any{"node": "b", "left": true})
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	h.c.cfg.Peers[0].API = strings.TrimPrefix(srv.URL, "http://")
	r0 := h.runner(t)
	onB := 0
	for _, ch := range r0.Plan().Chains {
		for sub := range ch.Head().Parallelism {
			if r0.NodeOf(ch.Head().UID, sub) == "b" {
				onB++
			}
		}
	}
	if onB == 0 {
		t.Fatal("node b runs no subtask")
	}
	armed.Store(true)
	h.syncClock()
	done := make(chan error, 1)
	go func() { done <- h.c.Drain(context.Background(), "b") }()
	h.open(t)
	if err := <-done; err != nil {
		t.Fatalf("drain: %v", err)
	}
	if !fired.Load() {
		t.Fatal("the failure under test was not injected")
	}
	recs := h.history()
	if len(recs) != 1 || recs[0].Trigger != cluster.TriggerDrain || recs[0].Mode != cluster.RebalanceHandover || recs[0].Outcome != cluster.RebalanceFellBack {
		t.Fatalf("history %+v, want one drain by handover that fell back", recs)
	}
	t.Logf("drain: %s", recs[0].Error)
	if left.Load() != 1 {
		t.Fatalf("node b was asked to leave %d times", left.Load())
	}
	r1, _ := h.job.Execution().Runner()
	if r1 == nil || r1 == r0 || h.job.Attempts() < 2 {
		t.Fatalf("the job did not restart: %d attempts", h.job.Attempts())
	}
	if slices.Contains(r1.Nodes(), "b") {
		t.Fatalf("node b is in the restarted deployment %v", r1.Nodes())
	}
	for _, ch := range r1.Plan().Chains {
		for sub := range ch.Head().Parallelism {
			if got := r1.NodeOf(ch.Head().UID, sub); got != "a" {
				t.Fatalf("after the fallback %s[%d] runs on %q, want a", ch.Head().UID, sub, got)
			}
		}
	}
	h.finish(t, want)
}

// A node drained by handover and undrained gets its work back by
// handover: c joins (undrain), is drained — its subtasks move away by
// handover, it leaves the running deployment and is asked to leave — and
// is undrained again: asked to rejoin, invited into the same running
// deployment again and given its subtasks back by handover. The job never
// restarts, and the output is exact.
func TestDrainThenUndrainByHandover(t *testing.T) {
	testutil.Burn(t, 1)
	want := hoReference(t, hoN, hoKeys)
	h := startHoCluster(t, newHoShape(hoN, hoKeys, hoRate, t.TempDir()), hoOptions{})
	var left, rejoined atomic.Int32
	mux := http.NewServeMux()
	mux.HandleFunc("GET /ingest", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, http.StatusOK, IngestList{}) })
	mux.HandleFunc("POST /cluster/leave", func(w http.ResponseWriter, r *http.Request) {
		left.Add(1)
		writeJSON(w, http.StatusOK, map[string]any{"node": "c", "left": true})
	})
	mux.HandleFunc("POST /cluster/rejoin", func(w http.ResponseWriter, r *http.Request) {
		rejoined.Add(1)
		writeJSON(w, http.StatusOK, map[string]any{"node": "c", "rejoined": true})
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	h.c.cfg.Peers[1].API = strings.TrimPrefix(srv.URL, "http://")
	r0 := h.runner(t)
	// run asks for a rebalance with ask (from another goroutine, as the
	// API handler does), lets the gate open (past the settle delay and
	// the damping interval) and returns ask's outcome.
	run := func(what string, ask func() error) {
		t.Helper()
		rec := h.rebalanceThroughGate(t, what, ask)
		if rec.Outcome != cluster.RebalanceDone || rec.Mode != cluster.RebalanceHandover {
			t.Fatalf("%s: outcome %s mode %s (%s), want done by handover", what, rec.Outcome, rec.Mode, rec.Error)
		}
		if r, _ := h.job.Execution().Runner(); r != r0 || h.job.Attempts() != 1 {
			t.Fatalf("%s: the job restarted: %d attempts", what, h.job.Attempts())
		}
	}
	undrain := func() error { return h.c.Undrain(context.Background(), "c") }
	run("the first undrain", undrain)
	if got := r0.NodeOf("count-sum", 2); got != "c" {
		t.Fatalf("count-sum[2] runs on %q after the undrain, want c", got)
	}
	run("the drain", func() error { return h.c.Drain(context.Background(), "c") })
	if got := r0.NodeOf("count-sum", 2); got == "c" || slices.Contains(r0.Nodes(), "c") || left.Load() != 1 {
		t.Fatalf("after the drain count-sum[2] runs on %q, the deployment is %v, c was asked to leave %d times", got, r0.Nodes(), left.Load())
	}
	run("the second undrain", undrain)
	if got := r0.NodeOf("count-sum", 2); got != "c" || !slices.Contains(r0.Nodes(), "c") || rejoined.Load() != 2 {
		t.Fatalf("after the second undrain count-sum[2] runs on %q, the deployment is %v, c was asked to rejoin %d times", got, r0.Nodes(), rejoined.Load())
	}
	h.finish(t, want)
	if h.job.Attempts() != 1 {
		t.Fatalf("%d attempts", h.job.Attempts())
	}
}
