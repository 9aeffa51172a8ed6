package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgedio/edged/cluster"
	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/pipeline"
	"github.com/edgedio/edged/snapshot"
)

var testHandbackConfig = cluster.DefaultLeadershipConfig()

// The hand-back decision on a fake clock: the leader b hands back to a
// only once a has been up, in one run, for the settle delay, and only
// with a majority; a node that dies or restarts after a short run settles
// twice as long next time, back to the settle delay once it stayed up;
// attempts are spaced by the interval, which a failure doubles and a
// success resets; a node that had not caught up is retried after the
// settle delay without backing off.
func TestHandbackDecision(t *testing.T) {
	cfg := testHandbackConfig
	d := newHandbackDecider(cfg)
	t0 := time.Unix(1000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	abc := []string{"a", "b", "c"}
	check := func(now time.Time, alive []string, want string) {
		t.Helper()
		got, why := d.decide(now, "b", alive, nil, 3)
		if got != want {
			t.Fatalf("at %v alive %v: hand back to %q (%s), want %q", now.Sub(t0), alive, got, why, want)
		}
	}
	// Only b and c: nobody lower.
	d.observe(at(0), map[string]string{"b": "", "c": "x"})
	check(at(0), []string{"b", "c"}, "")
	// a comes up at 10 s: it settles for 5 s.
	d.observe(at(10), map[string]string{"a": "1", "b": "", "c": "x"})
	check(at(10), abc, "")
	d.observe(at(14.9), map[string]string{"a": "1", "b": "", "c": "x"})
	check(at(14.9), abc, "")
	if _, why := d.decide(at(14.9), "b", abc, nil, 3); !strings.Contains(why, "settling") {
		t.Fatalf("waiting %q", why)
	}
	check(at(15), abc, "a")
	// No majority: no hand-back.
	if got, _ := d.decide(at(15), "b", []string{"a", "b"}, nil, 5); got != "" {
		t.Fatalf("hand-back to %q without a majority", got)
	}
	// a died after 6 s up (a flap): its settle delay doubles.
	d.observe(at(16), map[string]string{"b": "", "c": "x"})
	check(at(16), []string{"b", "c"}, "")
	d.observe(at(20), map[string]string{"a": "2", "b": "", "c": "x"})
	check(at(29.9), abc, "")
	check(at(30), abc, "a")
	// a restarts (a new boot) before anyone saw it dead: another flap.
	d.observe(at(31), map[string]string{"a": "3", "b": "", "c": "x"})
	if s := d.settleOf("a"); s != 20*time.Second {
		t.Fatalf("settle of a after two flaps: %v", s)
	}
	check(at(50.9), abc, "")
	check(at(51), abc, "a")
	// It stays up for a minute: back to 5 s.
	d.observe(at(91), map[string]string{"a": "3", "b": "", "c": "x"})
	if s := d.settleOf("a"); s != cfg.Settle {
		t.Fatalf("settle of a once stable: %v", s)
	}

	// Attempts: the interval after each; a failure doubles it.
	d.attempt(at(100))
	check(at(109.9), abc, "")
	if _, why := d.decide(at(109.9), "b", abc, nil, 3); !strings.Contains(why, "damping") {
		t.Fatalf("waiting %q", why)
	}
	d.done(at(101), ErrHandback)
	check(at(120.9), abc, "")
	check(at(121), abc, "a")
	d.attempt(at(121))
	d.done(at(122), ErrHandback)
	check(at(161.9), abc, "")
	check(at(162), abc, "a")
	// Not ready (not caught up): after the settle delay, no backoff.
	d.attempt(at(162))
	d.done(at(163), fmt.Errorf("%w: behind", errHandbackNotReady))
	check(at(167.9), abc, "")
	check(at(168), abc, "a")
	// Busy (a rebalance or a checkpoint under way, the node not caught
	// up): after handbackBusyRetry, no backoff.
	d.attempt(at(168))
	d.done(at(168.5), fmt.Errorf("%w: a rebalance is in progress", errHandbackBusy))
	check(at(169.4), abc, "")
	check(at(169.5), abc, "a")
	// A success resets the interval.
	d.attempt(at(170))
	d.done(at(171), nil)
	check(at(180.9), abc, "")
	check(at(181), abc, "a")

	// The lowest node that settled: c hands back to b while a settles.
	d2 := newHandbackDecider(cfg)
	d2.observe(at(0), map[string]string{"b": "1", "c": ""})
	d2.observe(at(10), map[string]string{"a": "1", "b": "1", "c": ""})
	if got, _ := d2.decide(at(10), "c", abc, nil, 3); got != "b" {
		t.Fatalf("c hands back to %q, want b", got)
	}
	if got, _ := d2.decide(at(15), "c", abc, nil, 3); got != "a" {
		t.Fatalf("c hands back to %q, want a", got)
	}
	// A lower node running other pipelines is passed over: c hands back
	// to b, and b to nobody.
	if got, _ := d2.decide(at(15), "c", abc, map[string]bool{"a": true}, 3); got != "b" {
		t.Fatalf("c hands back to %q with a running other pipelines, want b", got)
	}
	if got, why := d2.decide(at(15), "b", abc, map[string]bool{"a": true}, 3); got != "" || why != "" {
		t.Fatalf("b hands back to %q (%q) with a running other pipelines, want nobody", got, why)
	}
	// The lowest node never hands back.
	if got, _ := d2.decide(at(100), "a", abc, nil, 3); got != "" {
		t.Fatalf("a hands back to %q", got)
	}
}

// A low node that flaps (up 6 s, down 2 s, for ten minutes) against a
// leader that hands back whenever the decider says so: without damping it
// would get the leadership every 8 s (75 times); the doubling settle delay
// lets it have it at most a few times.
func TestHandbackStormDamped(t *testing.T) {
	d := newHandbackDecider(testHandbackConfig)
	t0 := time.Unix(1000, 0)
	handbacks := 0
	boot := 0
	for s := 0; s < 600; s++ {
		now := t0.Add(time.Duration(s) * time.Second)
		alive := map[string]string{"b": "", "c": ""}
		ids := []string{"b", "c"}
		if s%8 < 6 {
			if s%8 == 0 {
				boot++
			}
			alive["a"] = fmt.Sprint(boot)
			ids = []string{"a", "b", "c"}
		}
		d.observe(now, alive)
		if target, _ := d.decide(now, "b", ids, nil, 3); target != "" {
			handbacks++
			d.attempt(now)
			d.done(now, nil)
		}
	}
	if handbacks == 0 || handbacks > 2 {
		t.Fatalf("%d hand-backs to a flapping node in 10 min, want 1 or 2", handbacks)
	}
	t.Logf("%d hand-backs; a's settle delay now %v", handbacks, d.settleOf("a"))
}

// handbackNode is one node of the daemon-level hand-back test: a
// clusterNode with its cluster routes on an httptest server, replicas in
// a temporary directory, and fake job steps.
type handbackNode struct {
	*clusterNode
	dir     string
	mu      sync.Mutex
	took    []string // takeover calls, by the node taken over from
	stopped int      // stop calls
	stop    func(ctx context.Context) (map[string]snapshot.ID, bool, error)
	// workerHits counts the GET /cluster/worker the node answered.
	workerHits *atomic.Int32
	// garbled, when set, cuts the node's GET /cluster/worker answer.
	garbled *atomic.Bool
	srv     *httptest.Server
}

func (h *handbackNode) takeovers() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.took...)
}

const handbackJob = "j"

// handbackCluster starts nodes a, b and c, all alive, following leader b
// (b runs the job masters; a and c followed it).
func handbackCluster(t *testing.T) map[string]*handbackNode {
	t.Helper()
	ids := []string{"a", "b", "c"}
	nodes := map[string]*handbackNode{}
	muxes := map[string]*http.ServeMux{}
	workerHits := map[string]*atomic.Int32{}
	garbled := map[string]*atomic.Bool{}
	for _, id := range ids {
		workerHits[id], garbled[id] = &atomic.Int32{}, &atomic.Bool{}
	}
	srvs := map[string]*httptest.Server{}
	for _, id := range ids {
		muxes[id] = http.NewServeMux()
		mux := muxes[id]
		hits, garble := workerHits[id], garbled[id]
		srvs[id] = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/cluster/worker" {
				hits.Add(1)
				if garble.Load() {
					w.Header().Set("Content-Type", "application/json")
					io.WriteString(w, `{"node":"`+id+`","jobs":[{"name":"sensors","tasks":[`)
					return
				}
			}
			mux.ServeHTTP(w, r)
		}))
		t.Cleanup(srvs[id].Close)
	}
	log := slog.New(slog.DiscardHandler)
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	for _, id := range ids {
		cfg := &pipeline.ClusterConfig{Node: id, Listen: "127.0.0.1:1"}
		for _, p := range ids {
			if p != id {
				cfg.Peers = append(cfg.Peers, pipeline.PeerConfig{ID: p, Address: "127.0.0.1:1", API: strings.TrimPrefix(srvs[p].URL, "http://")})
			}
		}
		dir := filepath.Join(t.TempDir(), id)
		pc := pipeline.DefaultPipelineConfig()
		pc.Name = handbackJob
		pc.Checkpoint.Dir = filepath.Join(dir, "checkpoints")
		pc.Checkpoint.Retain = 2
		c := &clusterNode{cfg: cfg, log: log.With("node", id), dataDir: dir, master: id == "b"}
		gate, err := cluster.NewRebalanceGate(cluster.DefaultGateConfig())
		if err != nil {
			t.Fatal(err)
		}
		c.live = &liveView{c: c, stop: make(chan struct{}), gate: gate, joining: map[string]bool{}}
		c.peers = &peerClient{cfg: cfg, http: srvs[id].Client()}
		c.rep = newReplicas(cfg, []pipeline.PipelineConfig{pc}, c.peers, c.live.alive, c.seen.Load, c.log)
		c.peers.rep = c.rep
		c.lead.id, c.lead.followed = "b", id != "b"
		cfgHB := testHandbackConfig
		cfgHB.Settle = 0
		c.hb = newHandback(cfgHB)
		hn := &handbackNode{clusterNode: c, dir: dir, workerHits: workerHits[id], garbled: garbled[id], srv: srvs[id]}
		c.takeover = func(from string) error {
			hn.mu.Lock()
			defer hn.mu.Unlock()
			hn.took = append(hn.took, from)
			return nil
		}
		c.hb.stop = func(ctx context.Context) (map[string]snapshot.ID, bool, error) {
			hn.mu.Lock()
			hn.stopped++
			stop := hn.stop
			hn.mu.Unlock()
			return stop(ctx)
		}
		c.mount(muxes[id], &node{})
		t.Cleanup(func() {
			c.live.stopOnce.Do(func() { close(c.live.stop) })
			c.live.wg.Wait()
		})
		nodes[id] = hn
	}
	return nodes
}

// commit writes snapshot id of the job in leader's store, with one state
// file it holds alone, and publishes its metadata to every node when
// publish is set.
func (h *handbackNode) commit(t *testing.T, id snapshot.ID, savepoint, publish bool) {
	t.Helper()
	s, err := h.rep.store(handbackJob)
	if err != nil {
		t.Fatal(err)
	}
	kind := snapshot.KindCheckpoint
	if savepoint {
		kind = snapshot.KindSavepoint
	}
	if _, err := s.Begin(snapshot.Trigger{Checkpoint: id, Savepoint: savepoint, Timestamp: int64(id)}); err != nil {
		t.Fatal(err)
	}
	path, fh := stateFile(t, t.TempDir(), id, "j%2Fwin.0.state")
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	err = s.Import(id, fh.File, fh.Size, fh.Checksum, f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	md := &snapshot.Metadata{Checkpoint: id, Kind: kind, Timestamp: int64(id),
		Operators: []snapshot.Operator{{UID: "j/win", Parallelism: 1, Subtasks: []snapshot.Handle{fh}}}}
	if _, err := s.Commit(md); err != nil {
		t.Fatal(err)
	}
	if publish {
		h.rep.hold(handbackJob, id, fh.File, []string{h.cfg.Node})
		if err := h.rep.publish(context.Background(), h.seen.Load(), md); err != nil {
			t.Fatal(err)
		}
	}
}

// The hand-back between daemon nodes over their cluster routes: leader b
// hands back to a only once a has the latest checkpoint's metadata; it
// stops its jobs with a savepoint, a copies in the savepoint's files (b
// alone held them), b steps down, and a persists b's epoch as its floor
// and takes over, restoring above the savepoint; never both lead. A
// hand-back that a refuses (it follows another leader) leaves b leading:
// b restarts its jobs.
func TestHandbackBetweenNodes(t *testing.T) {
	nodes := handbackCluster(t)
	a, b := nodes["a"], nodes["b"]
	const epoch = 3<<32 + 4
	for _, n := range nodes {
		n.seen.Store(epoch)
	}
	if err := os.MkdirAll(filepath.Join(a.dir, "cluster"), 0o755); err != nil {
		t.Fatal(err)
	}
	b.stop = func(ctx context.Context) (map[string]snapshot.ID, bool, error) {
		b.seen.Store(epoch + 2) // b deployed up to there
		b.commit(t, 8, true, true)
		return map[string]snapshot.ID{handbackJob: 8}, true, nil
	}
	// b's latest checkpoint is not on a: no hand-back starts.
	b.commit(t, 5, false, false)
	err := b.handBack(context.Background(), "a", time.Now())
	if !errors.Is(err, errHandbackNotReady) || b.stopped != 0 {
		t.Fatalf("hand-back to a node that has not caught up: %v, %d stops", err, b.stopped)
	}
	b.commit(t, 6, false, true)

	// Nobody leads beside another: a is read first (once it leads, b has
	// stepped down for good).
	var both atomic.Bool
	done := make(chan struct{})
	var poll sync.WaitGroup
	poll.Go(func() {
		for {
			select {
			case <-done:
				return
			default:
			}
			if a.isMaster() && b.isMaster() {
				both.Store(true)
			}
		}
	})
	// Gate-queued: not while a failover is in progress.
	b.live.mu.Lock()
	b.live.pending = []*pendingChange{{at: time.Now(), dead: "c"}}
	b.live.mu.Unlock()
	b.live.maybeHandBack([]string{"a", "b", "c"})
	b.hb.mu.Lock()
	waiting, running := b.hb.waiting, b.hb.running
	b.hb.mu.Unlock()
	if running || !strings.Contains(waiting, "failover") {
		t.Fatalf("hand-back beside a failover: running %v, waiting %q", running, waiting)
	}
	b.live.mu.Lock()
	b.live.pending = nil
	b.live.mu.Unlock()
	b.live.maybeHandBack([]string{"a", "b", "c"})
	testutil.Eventually(t, 10*time.Second, "a took over from b", func() bool {
		tk := a.takeovers()
		return len(tk) == 1 && tk[0] == "b"
	})
	testutil.Eventually(t, 10*time.Second, "both record the hand-back", func() bool {
		ra, _ := a.hb.status()
		rb, _ := b.hb.status()
		return len(ra) == 1 && ra[0].Outcome == "done" && len(rb) == 1 && rb[0].Outcome == "done"
	})
	close(done)
	poll.Wait()
	if both.Load() {
		t.Fatal("a and b led at once")
	}
	if b.isMaster() || b.leader() != "a" || !a.isMaster() || a.leader() != "a" || len(b.takeovers()) != 0 {
		t.Fatalf("after the hand-back: b master %v follows %q; a master %v follows %q; b resumed %v",
			b.isMaster(), b.leader(), a.isMaster(), a.leader(), b.takeovers())
	}
	recs, _ := b.hb.status()
	rec := recs[0]
	if rec.From != "b" || rec.To != "a" || rec.Epoch != epoch+2 || rec.Savepoints[handbackJob] != 8 || rec.SavepointMS <= 0 || rec.ReplicateMS <= 0 {
		t.Fatalf("record %+v", rec)
	}
	// a persisted b's epoch as its floor: it deploys above it.
	floor, err := readEpoch(filepath.Join(a.dir, "cluster", "epoch"))
	if err != nil || floor != epoch+2 {
		t.Fatalf("a's epoch floor %d, %v", floor, err)
	}
	if base, err := nextEpochBase(filepath.Join(a.dir, "cluster"), a.seen.Load(), a.cfg.Nodes(), a.cfg.Node); err != nil || base <= epoch+2 {
		t.Fatalf("a's epoch base %d, %v", base, err)
	}
	// Checkpoint ids go on above the savepoint's; a has its files.
	if next := a.nextCheckpoint(); next != 9 {
		t.Fatalf("a's next checkpoint %d, want 9", next)
	}
	s, err := a.rep.store(handbackJob)
	if err != nil {
		t.Fatal(err)
	}
	md, err := s.RecoveryPoint(false)
	if err != nil || md.Checkpoint != 8 || len(snapshot.Missing(md)) != 0 {
		t.Fatalf("a's recovery point %v, %v", md, err)
	}
}

// A hand-back that fails after the leader stopped its jobs leaves it
// leading: the lower node refuses (it follows another node), and the
// leader restarts its jobs from the savepoint, records the failure and
// backs off; a savepoint that fails stops nothing and changes nothing.
func TestHandbackFailureLeavesTheLeader(t *testing.T) {
	nodes := handbackCluster(t)
	a, b := nodes["a"], nodes["b"]
	b.commit(t, 6, false, true)
	b.stop = func(ctx context.Context) (map[string]snapshot.ID, bool, error) {
		return nil, false, errors.New("savepoint declined")
	}
	if err := b.handBack(context.Background(), "a", time.Now()); !errors.Is(err, ErrHandback) || !b.isMaster() || len(b.takeovers()) != 0 {
		t.Fatalf("failed savepoint: %v, master %v, resumed %v", err, b.isMaster(), b.takeovers())
	}
	b.stop = func(ctx context.Context) (map[string]snapshot.ID, bool, error) {
		b.commit(t, 8, true, true)
		return map[string]snapshot.ID{handbackJob: 8}, true, nil
	}
	a.lead.mu.Lock()
	a.lead.id = "c"
	a.lead.mu.Unlock()
	err := b.handBack(context.Background(), "a", time.Now())
	if !errors.Is(err, ErrHandback) || !strings.Contains(err.Error(), "follows") {
		t.Fatalf("refused hand-back: %v", err)
	}
	if !b.isMaster() || b.leader() != "b" || a.isMaster() {
		t.Fatalf("after a refused hand-back: b master %v follows %q, a master %v", b.isMaster(), b.leader(), a.isMaster())
	}
	if tk := b.takeovers(); len(tk) != 1 || tk[0] != "b" {
		t.Fatalf("b restarted its jobs %v times, want once", tk)
	}
	recs, total := b.hb.status()
	if len(recs) != 2 || recs[1].Outcome != "failed" || total != 2 {
		t.Fatalf("records %+v", recs)
	}
	// The decider backs off after the failure.
	b.hb.mu.Lock()
	b.hb.dec.attempt(time.Now())
	b.hb.dec.done(time.Now(), err)
	interval := b.hb.dec.interval
	b.hb.mu.Unlock()
	if interval != 2*testHandbackConfig.MinInterval {
		t.Fatalf("interval after a failure %v", interval)
	}
}

// Of two leaders, the one of the newer term (epoch>>32) keeps leading,
// whatever snapshots each holds; in the same term, the one whose newest
// snapshots are newer; with equal ones, or each newer for some job, the
// lower id.
func TestSplitWinner(t *testing.T) {
	const term1, term2 = 1 << 32, 2 << 32
	for _, tc := range []struct {
		ours, theirs map[string]uint64
		// oursEpoch is b's, theirsEpoch a's.
		oursEpoch, theirsEpoch uint64
		want                   string
	}{
		{map[string]uint64{"j": 5}, map[string]uint64{"j": 5}, 0, 0, "a"},
		{map[string]uint64{"j": 9}, map[string]uint64{"j": 5}, 0, 0, "b"},
		{map[string]uint64{"j": 5}, map[string]uint64{"j": 9}, 0, 0, "a"},
		{map[string]uint64{"j": 5, "k": 1}, map[string]uint64{"j": 5, "k": 2}, 0, 0, "a"},
		{map[string]uint64{"j": 6, "k": 1}, map[string]uint64{"j": 5, "k": 2}, 0, 0, "a"},
		{map[string]uint64{}, map[string]uint64{"j": 1}, 0, 0, "a"},
		{map[string]uint64{"j": 1}, map[string]uint64{}, 0, 0, "b"},
		// The same term, other epochs: the snapshots decide.
		{map[string]uint64{"j": 5}, map[string]uint64{"j": 5}, term1 + 7, term1 + 2, "a"},
		{map[string]uint64{"j": 9}, map[string]uint64{"j": 5}, term1 + 1, term1 + 9, "b"},
		// A newer term wins: with equal snapshots (a healed partition:
		// the old leader holds copies of the new one's metadata) and
		// even with older ones.
		{map[string]uint64{"j": 5}, map[string]uint64{"j": 5}, term2 + 1, term1 + 40, "b"},
		{map[string]uint64{"j": 5}, map[string]uint64{"j": 9}, term2 + 1, term1 + 40, "b"},
		{map[string]uint64{"j": 9}, map[string]uint64{"j": 5}, term1 + 3, term2, "a"},
	} {
		got := splitWinner(splitLeader{id: "b", epoch: tc.oursEpoch, latest: tc.ours}, splitLeader{id: "a", epoch: tc.theirsEpoch, latest: tc.theirs})
		if got != tc.want {
			t.Errorf("b epoch %d %v, a epoch %d %v: %q leads, want %q", tc.oursEpoch, tc.ours, tc.theirsEpoch, tc.theirs, got, tc.want)
		}
	}
}

// Two nodes lead at once (a restarted leader, and the node that took over
// from its old run), and both run the split rule at the same time:
// exactly one yields. The one with the newer snapshots keeps leading
// (here b, whose newest checkpoint a lacks); with equal ones the lower id
// (a). The other cancels its jobs, records the yield and follows the
// winner; the winner cancels nothing.
func TestSplitLeaderYields(t *testing.T) {
	for _, tc := range []struct {
		name          string
		equal         bool
		winner, loser string
	}{
		{name: "newer snapshots win", winner: "b", loser: "a"},
		{name: "equal snapshots, lower id wins", equal: true, winner: "a", loser: "b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nodes := handbackCluster(t)
			a, b := nodes["a"], nodes["b"]
			a.master, a.lead.id = true, "a"
			cancelled := map[string]*atomic.Int32{}
			for id, n := range nodes {
				cancelled[id] = &atomic.Int32{}
				n.hb.cancel = func(context.Context) int { cancelled[id].Add(1); return 0 }
			}
			b.commit(t, 7, false, false)
			if tc.equal {
				if err := b.rep.publish(context.Background(), b.seen.Load(), mustLatest(t, b)); err != nil {
					t.Fatal(err)
				}
			}
			if !a.isMaster() || !b.isMaster() {
				t.Fatal("the split was not set up: a and b must both lead")
			}
			// Both run the rule at once.
			var both sync.WaitGroup
			for _, n := range []*handbackNode{a, b} {
				both.Go(func() {
					n.live.maybeYield([]string{"a", "b", "c"})
					n.live.wg.Wait()
				})
			}
			both.Wait()
			w, l := nodes[tc.winner], nodes[tc.loser]
			var yielded []string
			for _, n := range []*handbackNode{a, b} {
				if recs, _ := n.hb.status(); len(recs) > 0 {
					yielded = append(yielded, n.cfg.Node)
				}
			}
			if len(yielded) != 1 || yielded[0] != tc.loser {
				t.Fatalf("yielded: %v, want exactly %s", yielded, tc.loser)
			}
			if !w.isMaster() || w.leader() != tc.winner || cancelled[tc.winner].Load() != 0 {
				t.Fatalf("winner %s: master %v follows %q, %d cancels", tc.winner, w.isMaster(), w.leader(), cancelled[tc.winner].Load())
			}
			if l.isMaster() || l.leader() != tc.winner || cancelled[tc.loser].Load() != 1 {
				t.Fatalf("loser %s: master %v follows %q, %d cancels", tc.loser, l.isMaster(), l.leader(), cancelled[tc.loser].Load())
			}
			recs, _ := l.hb.status()
			if recs[0].Outcome != "yielded" || recs[0].To != tc.winner || recs[0].From != tc.loser {
				t.Fatalf("records %+v", recs)
			}
			// Both asked the other: the rule ran on both sides.
			if a.workerHits.Load() == 0 || b.workerHits.Load() == 0 {
				t.Fatalf("worker status asked of a %d times, of b %d times: one side did not run the rule", a.workerHits.Load(), b.workerHits.Load())
			}
		})
	}
}

func mustLatest(t *testing.T, h *handbackNode) *snapshot.Metadata {
	t.Helper()
	s, err := h.rep.store(handbackJob)
	if err != nil {
		t.Fatal(err)
	}
	mds, err := s.Completed()
	if err != nil || len(mds) == 0 {
		t.Fatalf("completed: %v, %v", mds, err)
	}
	return mds[0]
}

// A leader that restarts while its peers still follow it asks them again
// every restartPoll, and follows the node that took over as soon as one
// names it, well before restartGrace; the lan profile waits longer.
func TestRestartedLeaderFollowsTheTakeover(t *testing.T) {
	nodes := handbackCluster(t)
	a, b, c := nodes["a"], nodes["b"], nodes["c"]
	for _, n := range []*handbackNode{b, c} {
		n.master, n.lead.id, n.lead.followed = false, "a", true
	}
	a.master, a.lead.id = false, ""
	start := time.Now()
	got := make(chan string, 1)
	go func() { got <- a.askLeader(context.Background()) }()
	testutil.Eventually(t, 5*time.Second, "a asked b again", func() bool { return b.workerHits.Load() >= 2 })
	b.lead.mu.Lock()
	b.lead.took, b.lead.id = true, "b"
	b.lead.mu.Unlock()
	leader := <-got
	if took := time.Since(start); leader != "b" || took >= restartGrace("device") {
		t.Fatalf("a follows %q after %v, want b before %v", leader, took, restartGrace("device"))
	}
	if restartGrace("lan") <= restartGrace("device") || restartGrace("") != restartGrace("device") {
		t.Fatalf("restart grace: lan %v, device %v", restartGrace("lan"), restartGrace("device"))
	}
}

// A leader that restarts asks its peers who leads. A peer whose answer
// cannot be read (here cut short, as an answer over the read limit is)
// may follow another leader: the node asks again instead of leading at
// once, follows the leader as soon as an answer names it, and leads only
// after restartGrace if none does. Peers that do not answer at all (down,
// or starting themselves) do not hold it up.
func TestRestartedLeaderWaitsForUnreadablePeers(t *testing.T) {
	setup := func(t *testing.T) map[string]*handbackNode {
		nodes := handbackCluster(t)
		a, b, c := nodes["a"], nodes["b"], nodes["c"]
		b.master, b.lead.id, b.lead.took = false, "b", true
		c.master, c.lead.id, c.lead.followed = false, "b", true
		a.master, a.lead.id = false, ""
		b.garbled.Store(true)
		c.garbled.Store(true)
		return nodes
	}
	ask := func(a *handbackNode) (chan string, time.Time) {
		got := make(chan string, 1)
		start := time.Now()
		go func() { got <- a.askLeader(context.Background()) }()
		return got, start
	}
	t.Run("answers readable again", func(t *testing.T) {
		nodes := setup(t)
		a, b, c := nodes["a"], nodes["b"], nodes["c"]
		got, start := ask(a)
		testutil.Eventually(t, 5*time.Second, "a asked b again", func() bool { return b.workerHits.Load() >= 2 })
		select {
		case l := <-got:
			t.Fatalf("a chose %q on unreadable answers", l)
		default:
		}
		c.garbled.Store(false)
		if leader := <-got; leader != "b" {
			t.Fatalf("a follows %q after %v, want b", leader, time.Since(start))
		}
		if took := time.Since(start); took >= restartGrace("device") {
			t.Fatalf("a followed b after %v, want before the grace %v", took, restartGrace("device"))
		}
	})
	t.Run("never readable", func(t *testing.T) {
		nodes := setup(t)
		got, start := ask(nodes["a"])
		if leader := <-got; leader != "a" {
			t.Fatalf("a follows %q, want a (the lowest id) after the grace", leader)
		}
		if took := time.Since(start); took < restartGrace("device") {
			t.Fatalf("a led after %v, before the grace %v", took, restartGrace("device"))
		}
	})
	t.Run("peers down", func(t *testing.T) {
		nodes := setup(t)
		nodes["b"].srv.Close()
		nodes["c"].srv.Close()
		got, start := ask(nodes["a"])
		if leader := <-got; leader != "a" {
			t.Fatalf("a follows %q, want a", leader)
		}
		if took := time.Since(start); took >= restartGrace("device") {
			t.Fatalf("a waited %v for peers that are down", took)
		}
	})
}

// A hand-back whose take-over message got no answer: the old leader b
// follows the lower node a until a answers. If a answers that it follows
// b (it never took over), b leads again, so that the two do not follow
// each other with no leader; if a leads, b goes on following it; a node
// that stops ends the questions.
func TestHandbackUnknownResolved(t *testing.T) {
	nodes := handbackCluster(t)
	a, b := nodes["a"], nodes["b"]
	log := slog.New(slog.DiscardHandler)

	// a never got the take-over message: it still follows b.
	b.stepDown("a")
	if b.isMaster() || b.leader() != "a" {
		t.Fatalf("after stepping down b master %v follows %q", b.isMaster(), b.leader())
	}
	b.resolveUnknownHandback(log, "a")
	if !b.isMaster() || b.leader() != "b" {
		t.Fatalf("a follows b, yet b master %v follows %q: no node leads", b.isMaster(), b.leader())
	}
	if tk := b.takeovers(); len(tk) != 1 || tk[0] != "b" {
		t.Fatalf("b restarted its jobs %v times, want once", tk)
	}

	// a took over: b goes on following it and starts nothing.
	b.stepDown("a")
	a.lead.mu.Lock()
	a.lead.id, a.lead.took = "a", true
	a.lead.mu.Unlock()
	b.resolveUnknownHandback(log, "a")
	if b.isMaster() || b.leader() != "a" || len(b.takeovers()) != 1 {
		t.Fatalf("a leads, yet b master %v follows %q, restarted its jobs %v", b.isMaster(), b.leader(), b.takeovers())
	}

	// Stopping ends the questions at once.
	b.stepDown("a")
	b.stopTakeover()
	done := make(chan struct{})
	go func() { b.resolveUnknownHandback(log, "a"); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Second): // its first question is 2 s away
		t.Fatal("resolveUnknownHandback did not end when the node stopped")
	}
}
