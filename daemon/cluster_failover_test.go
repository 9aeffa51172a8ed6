package daemon

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
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
	"github.com/edgedio/edged/pipeline"
	"github.com/edgedio/edged/snapshot"
)

// The failover scripts drive three daemon nodes (a, b, c; five, a to e,
// where two die) in one process: each a real node with its job runtime,
// worker, replicas, leadership and cluster routes (on an httptest
// server), their tasks joined by the in-memory transport
// (cluster.MemoryNetwork). Membership is the
// script's: it declares a node dead (its transport closed, its links
// cut, its API gone, its worker and jobs stopped) and then runs the step
// the membership loop runs on that event, on the leader (liveView.follow)
// or on the lowest survivor (liveView.maybeTakeOver). The leadership's
// timers run on a fake clock; the jobs run in real time, paced by their
// generator so that each failure strikes a running job. Every script
// ends with the committed window counts checked key by key against the
// generator's.

const (
	foJob = "totals"
	// foJob2 is the second pipeline's (foOptions.second).
	foJob2 = "totals2"
	// foCount records over foKeys keys at foRate records/s: about 3 s
	// of input, so the failure strikes midway.
	foCount, foKeys, foRate = 6000, 20, 2000
)

// foNode is one node of a failover script.
type foNode struct {
	id   string
	dir  string
	pc   pipeline.PipelineConfig
	pc2  pipeline.PipelineConfig // with foOptions.second
	n    *node
	c    *clusterNode
	tr   *cluster.MemoryTransport
	dead atomic.Bool
	// restoreGets and replicaGets count the state files this node served
	// to a restoring peer: from its job master's restore route, and
	// from its replicas.
	restoreGets, replicaGets atomic.Int64
	// restoreMu guards restoreAnswers: the status and body of every
	// answer of the node's restore route, in order.
	restoreMu      sync.Mutex
	restoreAnswers []string
	// damage, when set, is asked about every replica of a state file the
	// node stores for a peer: true damages the stored copy (same size,
	// other bytes) right after it was stored intact; damaged counts them.
	damage  func(file string) bool
	damaged atomic.Int64
}

// damageStored damages the node's stored copy of file of snapshot id.
func (fn *foNode) damageStored(t *testing.T, id snapshot.ID, file string) {
	s, err := fn.c.rep.store(foJob)
	if err != nil {
		t.Error(err)
		return
	}
	path := filepath.Join(s.CheckpointDir(id), file)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Errorf("damage %s: %v", path, err)
		return
	}
	for i := range b {
		b[i] ^= 0x5a
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Error(err)
		return
	}
	fn.damaged.Add(1)
}

// foCluster is the nodes of a failover script: three unless it asks
// for more (foOptions.nodes).
type foCluster struct {
	t     *testing.T
	mem   *cluster.MemoryNetwork
	pump  *cluster.Pump
	clock *clockwork.FakeClock
	out   string
	nodes map[string]*foNode
	ids   []string

	mu    sync.Mutex // guards alive, cut and killed
	alive []string
	// cut is the node cut off from the others, if any: it reaches none
	// of them, nor they it, though none is declared dead yet.
	cut string
	// split is set once each side of the cut has declared the other
	// dead: the cut node sees only itself alive, the others see it dead.
	split bool
	// count is how many records the generator emits.
	count int64
	// releaseInput lets the generator end its input (foOptions.holdEnd);
	// finish calls it.
	releaseInput func()
	// localSinks gives each node its own file sink dir, out/<id>.
	localSinks bool
	// killed is when each killed node died: its last sign of life.
	killed map[string]time.Time
	logs   *logRecorder
	// silent, when set, names the node whose frames to and from the
	// others the network drops without a word (cutSilently).
	silent atomic.Pointer[string]
}

// logRecorder keeps every log record's message and attributes, as one
// line each, and passes the record on.
type logRecorder struct {
	inner slog.Handler
	attrs []slog.Attr
	mu    *sync.Mutex
	lines *[]string
}

func (l *logRecorder) Enabled(ctx context.Context, level slog.Level) bool {
	return level >= slog.LevelInfo
}

func (l *logRecorder) Handle(ctx context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	for _, a := range l.attrs {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
	}
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	})
	l.mu.Lock()
	*l.lines = append(*l.lines, b.String())
	l.mu.Unlock()
	if l.inner.Enabled(ctx, r.Level) {
		return l.inner.Handle(ctx, r)
	}
	return nil
}

func (l *logRecorder) WithAttrs(as []slog.Attr) slog.Handler {
	return &logRecorder{inner: l.inner.WithAttrs(as), attrs: append(slices.Clone(l.attrs), as...), mu: l.mu, lines: l.lines}
}

func (l *logRecorder) WithGroup(name string) slog.Handler {
	return &logRecorder{inner: l.inner.WithGroup(name), attrs: l.attrs, mu: l.mu, lines: l.lines}
}

// count returns how many lines logged contain every one of parts.
func (l *logRecorder) count(parts ...string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, line := range *l.lines {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			n++
		}
	}
	return n
}

// logged reports whether a line logged contains every one of parts.
func (l *logRecorder) logged(parts ...string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range *l.lines {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			return true
		}
	}
	return false
}

// foPipeline is the script's job: a bounded, paced generator keyed by
// sensor, counted in 10 s event-time windows, written exactly once by
// the file sink; one subtask of each operator per node (of nodes).
func foPipeline(t *testing.T, dir, out string, nodes int, count int64, attempts int, window string) pipeline.PipelineConfig {
	t.Helper()
	y := fmt.Sprintf(`
pipelines:
  - name: %s
    parallelism: %d
    source:
      generator: {count: %d, rate: %d, keys: %d}
    event_time:
      field: ts
    key: id
    window:
      type: tumbling
      size: %s
      aggregates: [{name: count, fn: count}]
    sinks:
      - file: {dir: %s}
    checkpoint:
      interval: 100ms
      dir: %s
      retain: 3
    restart: {strategy: fixed_delay, attempts: %d, delay: 20ms}
`, foJob, nodes, count, foRate, foKeys, window, out, filepath.Join(dir, "checkpoints"), attempts)
	cfg, err := pipeline.Parse([]byte(y))
	if err != nil {
		t.Fatal(err)
	}
	return cfg.Pipelines[0]
}

// foOptions shape a failover script's cluster.
type foOptions struct {
	// replicas is cluster.replicas: the peers that get a copy of each
	// state file.
	replicas int
	// damage, when set, damages the copies node b stores of the state
	// files it names (foNode.damage).
	damage func(file string) bool
	// count is how many records the generator emits (foCount if 0).
	count int64
	// attempts is the job's restart budget (1000 if 0).
	attempts int
	// credits, when set, is cluster.channels.credits: the frames a
	// channel may have unacknowledged.
	credits int
	// maxConcurrent, when set, is the job's checkpoint.max_concurrent.
	maxConcurrent int
	// interval, when set, is the job's checkpoint.interval (100 ms
	// otherwise).
	interval time.Duration
	// localSinks gives each node a file sink dir of its own (out/<id>),
	// as nodes on separate machines have: checkTotals reads their union.
	localSinks bool
	// other, when set, is a node whose config declares other pipelines
	// (20 s windows): its worker refuses the job's plan
	// (actors.ErrPlanMismatch), and the nodes see its fingerprint differ
	// as gossip would show it (liveView.othersFn).
	other string
	// otherName, with other, also names the other node's pipeline
	// differently, so that it takes no checkpoints of the job at all.
	otherName bool
	// nodes is how many nodes the cluster has, named a, b, c, d, e…
	// (3 if 0).
	nodes int
	// second adds a second pipeline of the same shape (foJob2) to every
	// node's config, started with the first.
	second bool
	// holdEnd keeps the generator from ending its input until the script
	// calls finish: it emits every record, paced as ever, and then waits,
	// so that the job is still running at each step the script takes,
	// however slowly the machine runs it.
	holdEnd bool
}

// newFailoverCluster starts nodes a, b and c (or o.nodes of them), a
// leading, and the job running on all of them.
func newFailoverCluster(t *testing.T, o foOptions) *foCluster {

	t.Helper()
	fc := &foCluster{t: t, clock: clockwork.NewFakeClock(),
		out: t.TempDir(), nodes: map[string]*foNode{}}
	for i := range cmp.Or(o.nodes, 3) {
		fc.ids = append(fc.ids, string(rune('a'+i)))
	}
	fc.mem = cluster.NewMemoryNetwork(1, cluster.Faults{DropIf: func(from, to string, _ []byte) bool {
		// Called with the network's lock held: it reads only silent.
		n := fc.silent.Load()
		return n != nil && (from == *n) != (to == *n)
	}})
	fc.alive, fc.killed = slices.Clone(fc.ids), map[string]time.Time{}
	fc.count = o.count
	fc.localSinks = o.localSinks
	var graphHook func(*actors.Job)
	fc.releaseInput = func() {}
	if o.holdEnd {
		input := make(chan struct{})
		fc.releaseInput = sync.OnceFunc(func() { close(input) })
		t.Cleanup(fc.releaseInput)
		graphHook = func(g *actors.Job) { holdGeneratorEnds(g, input) }
	}
	if fc.count == 0 {
		fc.count = foCount
	}
	var inner slog.Handler = slog.DiscardHandler
	if testing.Verbose() {
		inner = slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})
	}
	fc.logs = &logRecorder{inner: inner, mu: &sync.Mutex{}, lines: new([]string)}
	log := slog.New(fc.logs)
	muxes := map[string]*http.ServeMux{}
	apis := map[string]string{}
	for _, id := range fc.ids {
		fn := &foNode{id: id, dir: t.TempDir()}
		fc.nodes[id] = fn
		mux := http.NewServeMux()
		muxes[id] = mux
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if fn.dead.Load() {
				// A dead node answers nothing.
				if hj, ok := w.(http.Hijacker); ok {
					if conn, _, err := hj.Hijack(); err == nil {
						conn.Close()
						return
					}
				}
				http.Error(w, "dead", http.StatusServiceUnavailable)
				return
			}
			if r.Method == http.MethodGet {
				switch {
				case strings.Contains(r.URL.Path, "/restore/"):
					fn.restoreGets.Add(1)
				case strings.Contains(r.URL.Path, "/replicas/"):
					fn.replicaGets.Add(1)
				}
			}
			if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/restore/") {
				rec := httptest.NewRecorder()
				mux.ServeHTTP(rec, r)
				fn.restoreMu.Lock()
				fn.restoreAnswers = append(fn.restoreAnswers, fmt.Sprintf("%d %s", rec.Code, strings.TrimSpace(string(rec.Body.Bytes()[:min(rec.Body.Len(), 200)]))))
				fn.restoreMu.Unlock()
				maps.Copy(w.Header(), rec.Header())
				w.WriteHeader(rec.Code)
				w.Write(rec.Body.Bytes())
				return
			}
			mux.ServeHTTP(w, r)
			if r.Method == http.MethodPut && strings.Contains(r.URL.Path, "/replicas/") && fn.damage != nil && fn.damage(r.PathValue("name")) {
				id, err := strconv.ParseUint(r.PathValue("id"), 10, 64)
				if err != nil {
					t.Errorf("replica path %s: %v", r.URL.Path, err)
					return
				}
				fn.damageStored(t, snapshot.ID(id), r.PathValue("name"))
			}
		}))
		t.Cleanup(srv.Close)
		apis[id] = strings.TrimPrefix(srv.URL, "http://")
	}
	ctx, cancel := context.WithCancel(context.Background())
	var nets []*cluster.Network
	for _, id := range fc.ids {
		fn := fc.nodes[id]
		ccfg := &pipeline.ClusterConfig{Node: id, Listen: "127.0.0.1:1", Replicas: o.replicas,
			Leadership: pipeline.LeadershipBlock{DeployRetry: cluster.MinLeadershipPoll},
			Channels:   pipeline.ChannelsConfig{Credits: o.credits}}
		for _, p := range fc.ids {
			if p != id {
				ccfg.Peers = append(ccfg.Peers, pipeline.PeerConfig{ID: p, Address: "127.0.0.1:1", API: apis[p]})
			}
		}
		attempts := o.attempts
		if attempts == 0 {
			attempts = 1000
		}
		window := "10s"
		if id == o.other {
			window = "20s"
		}
		out := fc.out
		if o.localSinks {
			out = filepath.Join(fc.out, id)
		}
		pc := foPipeline(t, fn.dir, out, len(fc.ids), fc.count, attempts, window)
		if id == o.other && o.otherName {
			pc.Name = "other"
		}
		if o.maxConcurrent > 0 {
			pc.Checkpoint.MaxConcurrent = o.maxConcurrent
		}
		if o.interval > 0 {
			pc.Checkpoint.Interval = o.interval
		}
		cfg := &pipeline.Config{Pipelines: []pipeline.PipelineConfig{pc}, Cluster: ccfg}
		if o.second {
			pc2 := foPipeline(t, filepath.Join(fn.dir, foJob2), filepath.Join(out, foJob2), len(fc.ids), fc.count, attempts, window)
			pc2.Name = foJob2
			cfg.Pipelines = append(cfg.Pipelines, pc2)
			fn.pc2 = pc2
		}
		nlog := log.With("node", id)
		n := &node{opts: Options{Logger: nlog, PollInterval: 50 * time.Millisecond}.withDefaults(), log: nlog,
			out: &lockedWriter{w: io.Discard}, byName: map[string]*job{}, mem: cfg.Node.Memory.WithDefaults(), ctx: ctx,
			graphHook: graphHook}
		c := &clusterNode{cfg: ccfg, log: nlog, master: id == "a", dataDir: fn.dir}
		gate, err := cluster.NewRebalanceGate(cluster.DefaultGateConfig())
		if err != nil {
			t.Fatal(err)
		}
		c.live = &liveView{c: c, stop: make(chan struct{}), gate: gate, joining: map[string]bool{}, aliveFn: func() []string { return fc.aliveFrom(id) }, lastSeenFn: fc.lastSeen,
			reachableFn: func() []string { return fc.reachableFrom(id) }}
		c.rb = c.newRebalancer()
		c.peers = &peerClient{cfg: ccfg, http: &http.Client{Timeout: 30 * time.Second}}
		c.net = cluster.NewNetwork(id, ccfg.ChannelConfig(), nlog)
		fn.tr = fc.mem.Node(id, c.net.Endpoint())
		c.net.Attach(fn.tr)
		nets = append(nets, c.net)
		c.fingerprint = pipelinesFingerprint(cfg.Pipelines)
		if o.other != "" {
			c.live.othersFn = func() map[string]bool {
				out := map[string]bool{}
				for _, p := range fc.aliveFrom(id) {
					if p != id && fc.nodes[p].c.fingerprint != c.fingerprint {
						out[p] = true
					}
				}
				return out
			}
		}
		c.rep = newReplicas(ccfg, cfg.Pipelines, c.peers, c.live.alike, c.seen.Load, nlog)
		c.peers.rep = c.rep
		c.hb = newHandback(ccfg.LeadershipConfig())
		c.hb.clock = fc.clock
		c.hb.stop, c.hb.drop, c.hb.cancel, c.hb.recancel = n.stopForHandback, n.dropJobs, n.cancelJobs, n.recancelJobs
		c.lead.id = "a"
		c.takeover = func(dead string) error { return n.takeOver(dead, cfg.Pipelines) }
		if c.master {
			if c.epochBase, err = nextEpochBase(filepath.Join(fn.dir, "cluster"), c.seen.Load(), ccfg.Nodes(), id); err != nil {
				t.Fatal(err)
			}
		}
		n.cluster = c
		n.setCluster(c)
		n.inputs.Nodes, n.inputs.Self = ccfg.Nodes(), id
		c.worker = n.newWorker(cfg, fn.dir)
		c.mount(muxes[id], n)
		fn.n, fn.c, fn.pc = n, c, pc
		if id == "b" {
			fn.damage = o.damage
		}
	}
	fc.pump = cluster.NewPump(fc.mem, 2*time.Millisecond, nets...)
	fc.pump.Start()
	t.Cleanup(func() {
		for _, fn := range fc.nodes {
			fn.c.stopTakeover()
			for _, j := range fn.n.jobList() {
				j.cancel()
				<-j.run.Done()
			}
		}
		cancel()
		for _, fn := range fc.nodes {
			fn.n.late.Wait()
			fn.c.live.stopOnce.Do(func() { close(fn.c.live.stop) })
			fn.c.live.wg.Wait()
			fn.c.worker.Close()
		}
		fc.pump.Stop()
	})
	// a leads: it starts the job master, which deploys on b and c.
	a := fc.nodes["a"]
	j, err := a.n.start(ctx, a.pc)
	if err != nil {
		t.Fatal(err)
	}
	a.n.late.Go(func() { a.n.watch(j) })
	if o.second {
		j2, err := a.n.start(ctx, a.pc2)
		if err != nil {
			t.Fatal(err)
		}
		a.n.late.Go(func() { a.n.watch(j2) })
	}
	return fc
}

// aliveNow returns the nodes the script has alive.
func (fc *foCluster) aliveNow() []string {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	return slices.Clone(fc.alive)
}

// aliveFrom returns the nodes node id sees alive: the live ones, less
// the other side of a split.
func (fc *foCluster) aliveFrom(id string) []string {
	fc.mu.Lock()
	split := fc.split
	fc.mu.Unlock()
	if !split {
		return fc.aliveNow()
	}
	return fc.reachableFrom(id)
}

// partition cuts node id off from the others, links included, and makes
// each side see the other dead (what memberlist does once its probes of
// the other side fail and the deaths are confirmed).
func (fc *foCluster) partition(id string) {
	fc.mu.Lock()
	fc.cut, fc.split = id, true
	fc.mu.Unlock()
	for _, other := range fc.ids {
		if other != id {
			fc.mem.Cut(id, other)
		}
	}
}

// heal ends the partition of node id: the links come back and every node
// sees the others alive again.
func (fc *foCluster) heal(id string) {
	for _, other := range fc.ids {
		if other != id {
			fc.mem.Heal(id, other)
		}
	}
	fc.mu.Lock()
	fc.cut, fc.split = "", false
	fc.mu.Unlock()
}

// reachableFrom returns the nodes node id reaches: the live ones, less
// the other side of a cut.
func (fc *foCluster) reachableFrom(id string) []string {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	switch fc.cut {
	case "":
		return slices.Clone(fc.alive)
	case id:
		return []string{id}
	}
	return slices.DeleteFunc(slices.Clone(fc.alive), func(x string) bool { return x == fc.cut })
}

// cutOff cuts node id off from the others ("" heals the cut): neither
// side reaches the other, and none is declared dead.
func (fc *foCluster) cutOff(id string) {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	fc.cut = id
}

// cutSilently drops every frame between node id and the others from
// now on ("" stops), as a switch that lost the node's cable does: no
// side hears of a disconnection, frames sent are never acknowledged.
func (fc *foCluster) cutSilently(id string) {
	if id == "" {
		fc.silent.Store(nil)
		return
	}
	fc.silent.Store(&id)
}

// lastSeen returns when node id was killed, its last sign of life.
func (fc *foCluster) lastSeen(id string) (time.Time, bool) {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	t, ok := fc.killed[id]
	return t, ok
}

// kill makes node id die as a SIGKILL would: its transport and API are
// gone, its tasks and jobs stop without a word to anyone. Its peers see
// it alive until declareDead.
func (fc *foCluster) kill(id string) {
	fc.t.Helper()
	fc.mu.Lock()
	fc.killed[id] = time.Now()
	fc.mu.Unlock()
	fn := fc.nodes[id]
	fn.dead.Store(true)
	for _, other := range fc.ids {
		if other != id {
			fc.mem.Cut(id, other)
		}
	}
	fn.tr.Close()
	fn.c.stopTakeover()
	fn.c.worker.Close()
	for _, j := range fn.n.jobList() {
		j.cancel()
		<-j.run.Done()
	}
}

// declareDead makes the membership see the nodes ids dead at once (what
// memberlist does once its probes fail) and returns the live nodes.
func (fc *foCluster) declareDead(ids ...string) []string {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	fc.alive = slices.DeleteFunc(fc.alive, func(x string) bool { return slices.Contains(ids, x) })
	return slices.Clone(fc.alive)
}

// failovers returns the failovers node id recorded, once there are n.
func (fc *foCluster) failovers(id string, n int) []cluster.Failover {
	fc.t.Helper()
	v := fc.nodes[id].c.live
	var out []cluster.Failover
	testutil.Eventually(fc.t, time.Minute, fmt.Sprintf("%d failovers recorded on %s", n, id), func() bool {
		v.mu.Lock()
		defer v.mu.Unlock()
		out = slices.Clone(v.failovers)
		return len(out) >= n
	})
	return out
}

// job returns the job master's job on node id; nil if it runs none.
func (fc *foCluster) job(id string) *job { return fc.jobNamed(id, foJob) }

// jobNamed returns node id's record of the job of pipeline name (the
// latest, should it have started more than once).
func (fc *foCluster) jobNamed(id, name string) *job {
	jobs := fc.nodes[id].n.jobList()
	for i := len(jobs) - 1; i >= 0; i-- {
		if jobs[i].name == name {
			return jobs[i]
		}
	}
	return nil
}

// waitCheckpoint waits until the job master on node id completed a
// checkpoint above after (whose metadata is then on every live node)
// while the job still has input left, and returns its id.
func (fc *foCluster) waitCheckpoint(id string, after snapshot.ID) snapshot.ID {
	fc.t.Helper()
	return fc.waitCheckpointOf(id, foJob, after)
}

// waitCheckpointOf is waitCheckpoint for the job of pipeline name.
func (fc *foCluster) waitCheckpointOf(id, name string, after snapshot.ID) snapshot.ID {
	fc.t.Helper()
	var got snapshot.ID
	testutil.Eventually(fc.t, time.Minute, fmt.Sprintf("a checkpoint of %s above %d completed on %s", name, after, id), func() bool {
		j := fc.jobNamed(id, name)
		if j == nil {
			return false
		}
		for _, s := range j.run.History() {
			if s.Status == snapshot.Completed && s.Checkpoint > after {
				got = max(got, s.Checkpoint)
			}
		}
		return got > 0
	})
	if st := fc.jobNamed(id, name).snapshot(); st.Status != StatusRunning {
		fc.t.Fatalf("the job ended (%s) before the failure: nothing left to fail over", st.Status)
	}
	return got
}

// finish lets the generator end its input, waits for the job master on
// node id to end and checks it finished.
func (fc *foCluster) finish(id string) *job {
	fc.t.Helper()
	fc.releaseInput()
	j := fc.job(id)
	if j == nil {
		fc.t.Fatalf("node %s runs no job master", id)
	}
	select {
	case <-j.run.Done():
	case <-time.After(3 * time.Minute):
		fc.t.Fatalf("the job on %s did not end", id)
	}
	testutil.Eventually(fc.t, 10*time.Second, "the job's end is recorded", func() bool { return j.snapshot().Status != StatusRunning })
	if st := j.snapshot(); st.Status != StatusFinished {
		fc.t.Fatalf("the job on %s ended %s: %v", id, st.Status, st.Err)
	}
	return j
}

// checkTotals reads the committed window results and checks each
// (sensor, window) count against the generator's: none lost, none
// twice.
func (fc *foCluster) checkTotals() {
	fc.t.Helper()
	want := map[string]int64{}
	for i := int64(0); i < fc.count; i++ {
		ts := operators.DefaultGeneratorStart + i/foKeys
		want[fmt.Sprintf("sensor_%d@%d", i%foKeys, ts/10*10)]++
	}
	parts, err := fc.committedParts()
	if err != nil {
		fc.t.Fatal(err)
	}
	got := map[string]int64{}
	results := 0
	for _, p := range parts {
		f, err := os.Open(p)
		if err != nil {
			fc.t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			var w map[string]any
			if err := json.Unmarshal(sc.Bytes(), &w); err != nil {
				fc.t.Fatalf("%s: %q: %v", p, sc.Text(), err)
			}
			key := fmt.Sprintf("%v@%d", w["id"], windowStartSec(fc.t, w))
			if _, dup := got[key]; dup {
				fc.t.Fatalf("window %s committed twice", key)
			}
			got[key] = int64(w["count"].(float64))
			results++
		}
		f.Close()
	}
	if !maps.Equal(got, want) {
		var diff []string
		for k, v := range want {
			if got[k] != v {
				diff = append(diff, fmt.Sprintf("%s: got %d, want %d", k, got[k], v))
			}
		}
		for k := range got {
			if _, ok := want[k]; !ok {
				diff = append(diff, fmt.Sprintf("%s: got %d, want none", k, got[k]))
			}
		}
		slices.Sort(diff)
		fc.t.Fatalf("committed window counts differ from the generator's in %d of %d windows:\n%s", len(diff), len(want), strings.Join(diff[:min(len(diff), 20)], "\n"))
	}
	fc.t.Logf("%d window results, every count exact", results)
}

// committedParts returns the committed part files of the window results:
// with node-local sinks, of every node's dir, each part name once (a part
// committed in two dirs must have the same content).
func (fc *foCluster) committedParts() ([]string, error) {
	if !fc.localSinks {
		return operators.CommittedParts(filepath.Join(fc.out, "windows"))
	}
	byName := map[string]string{}
	for _, id := range fc.ids {
		parts, err := operators.CommittedParts(filepath.Join(fc.out, id, "windows"))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
		for _, p := range parts {
			name := filepath.Base(p)
			if first, ok := byName[name]; ok {
				a, errA := os.ReadFile(first)
				b, errB := os.ReadFile(p)
				if errA != nil || errB != nil || !bytes.Equal(a, b) {
					return nil, fmt.Errorf("part %s committed in two dirs with different content (%v, %v)", name, errA, errB)
				}
				fc.t.Logf("part %s committed in two nodes' dirs, the same content", name)
				continue
			}
			byName[name] = p
		}
	}
	return slices.Sorted(maps.Values(byName)), nil
}

// windowStartSec returns the start of a window result, in seconds.
func windowStartSec(t *testing.T, w map[string]any) int64 {
	t.Helper()
	for _, k := range []string{"window_start", "start"} {
		if v, ok := w[k]; ok {
			switch x := v.(type) {
			case float64:
				return int64(x) / 1000
			case string:
				tm, err := time.Parse(time.RFC3339Nano, x)
				if err != nil {
					t.Fatalf("window start %q: %v", x, err)
				}
				return tm.Unix()
			}
		}
	}
	t.Fatalf("no window start in %v", w)
	return 0
}

// placement returns the node of every subtask in the deployment of
// runner r, once started, and its epoch.
func placement(r *actors.Runner) (map[actors.TaskKey]string, uint64) {
	out := map[actors.TaskKey]string{}
	for _, ch := range r.Plan().Chains {
		for sub := range ch.Head().Parallelism {
			out[actors.TaskKey{UID: ch.Head().UID, Subtask: sub}] = r.NodeOf(ch.Head().UID, sub)
		}
	}
	return out, r.Epoch()
}

// metadata returns the metadata of snapshot id in node's store.
func (fn *foNode) metadata(t *testing.T, id snapshot.ID) *snapshot.Metadata {
	t.Helper()
	s, err := fn.c.rep.store(foJob)
	if err != nil {
		t.Fatal(err)
	}
	mds, err := s.Completed()
	if err != nil {
		t.Fatal(err)
	}
	for _, md := range mds {
		if md.Checkpoint == id {
			return md
		}
	}
	t.Fatalf("node %s has no metadata of snapshot %d", fn.id, id)
	return nil
}

// stateFiles returns the state files of snapshot md of the given
// subtasks, by file name.
func stateFiles(md *snapshot.Metadata, keys []actors.TaskKey) map[string]snapshot.Handle {
	out := map[string]snapshot.Handle{}
	for _, o := range md.Operators {
		for _, k := range keys {
			if o.UID == k.UID && k.Subtask < len(o.Subtasks) && o.Subtasks[k.Subtask].File != "" {
				out[o.Subtasks[k.Subtask].File] = o.Subtasks[k.Subtask]
			}
		}
	}
	return out
}

// answers returns the answers of node fn's restore route so far, as
// "<status> <body>" (the body cut at 200 bytes).
func (fn *foNode) answers() []string {
	fn.restoreMu.Lock()
	defer fn.restoreMu.Unlock()
	return slices.Clone(fn.restoreAnswers)
}

// holds reports whether node fn holds an intact copy of h of snapshot id.
func (fn *foNode) holds(t *testing.T, id snapshot.ID, h snapshot.Handle) bool {
	t.Helper()
	s, err := fn.c.rep.store(foJob)
	if err != nil {
		t.Fatal(err)
	}
	_, err = fn.c.rep.localFile(s, id, h)
	return err == nil
}
