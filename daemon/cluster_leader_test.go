package daemon

import (
	"errors"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/pipeline"
)

// scriptNode is one node of the takeover script: what it knows of the
// leader, its epoch counter directory and the highest epoch it saw.
type scriptNode struct {
	id       string
	dir      string
	leader   string
	followed bool
	master   bool
	seen     uint64
	base     uint64 // epoch base while master
	attempts uint64 // deployments since it became master
}

// The takeover rule over a scripted life of a three-node cluster: the
// leader dies, exactly one node takes over, in an epoch above every epoch
// deployed before; the old leader comes back and follows the new one
// (nobody takes over, never two masters); the new leader dies and the
// lowest live node takes over, again in a newer epoch; a node that sees no
// majority never takes over; at a first start no node takes over from a
// leader it never followed.
func TestTakeoverScript(t *testing.T) {
	ids := []string{"a", "b", "c"}
	nodes := map[string]*scriptNode{}
	for _, id := range ids {
		nodes[id] = &scriptNode{id: id, dir: filepath.Join(t.TempDir(), id, "cluster"), leader: "a"}
	}
	var epochs []uint64 // every epoch deployed, in order
	deploy := func(master string, alive []string) {
		m := nodes[master]
		m.attempts++
		e := m.base + m.attempts
		if len(epochs) > 0 && e <= epochs[len(epochs)-1] {
			t.Fatalf("master %s deploys epoch %d after %d: not monotonic", master, e, epochs[len(epochs)-1])
		}
		epochs = append(epochs, e)
		for _, id := range alive {
			if id == master {
				continue
			}
			n := nodes[id]
			n.leader, n.followed, n.seen = master, true, max(n.seen, e)
		}
	}
	// step evaluates the rule on every live node, takes over where it
	// says so, and checks that at most one node is master at once.
	step := func(alive []string, want string) {
		t.Helper()
		var took []string
		for _, id := range alive {
			n := nodes[id]
			if n.master || !shouldTakeOver(id, n.leader, n.followed, alive, nil, len(ids)) {
				continue
			}
			took = append(took, id)
			base, err := nextEpochBase(n.dir, n.seen, ids, id)
			if err != nil {
				t.Fatal(err)
			}
			n.master, n.leader, n.base, n.attempts = true, id, base, 0
		}
		if want == "" && len(took) > 0 || want != "" && !slices.Equal(took, []string{want}) {
			t.Fatalf("alive %v: %v took over, want %q", alive, took, want)
		}
		var masters []string
		for _, id := range alive {
			if nodes[id].master {
				masters = append(masters, id)
			}
		}
		if len(masters) > 1 {
			t.Fatalf("alive %v: masters %v", alive, masters)
		}
	}

	// First start: b and c are up before a; they never followed a.
	step([]string{"b", "c"}, "")
	// a starts: its peers name no other leader.
	if got := chooseLeader("a", nil); got != "a" {
		t.Fatalf("first start: leader %q", got)
	}
	a := nodes["a"]
	a.master = true
	var err error
	if a.base, err = nextEpochBase(a.dir, 0, ids, "a"); err != nil {
		t.Fatal(err)
	}
	deploy("a", ids)
	deploy("a", ids) // a restart of the job
	step(ids, "")

	// a dies: b, the lowest live node, takes over; c does not.
	a.master = false
	step([]string{"b", "c"}, "b")
	deploy("b", []string{"b", "c"})

	// A minority never takes over.
	step([]string{"c"}, "")

	// a comes back: its peers name b; it follows b.
	if got := chooseLeader("a", []string{"b", "b"}); got != "b" {
		t.Fatalf("a returning follows %q, want b", got)
	}
	a.leader, a.followed = "b", false
	step(ids, "")
	deploy("b", ids)
	step(ids, "")

	// b dies: a, now the lowest live node and a follower of b, takes over
	// in an epoch above b's.
	nodes["b"].master = false
	step([]string{"a", "c"}, "a")
	deploy("a", []string{"a", "c"})
	if !slices.IsSorted(epochs) {
		t.Fatalf("epochs %v not increasing", epochs)
	}
	t.Logf("epochs %v", epochs)
}

// A member running other pipelines than a node's is passed over by its
// takeover rule: the lowest of the others that do take over, so the
// cluster is not left without a leader while that member is up.
func TestTakeoverPassesOverOtherPipelines(t *testing.T) {
	alive := []string{"b", "c", "d"} // a, the leader, died
	b := map[string]bool{"b": true}
	if shouldTakeOver("c", "a", true, alive, nil, 4) {
		t.Fatal("c takes over with b, lower, running the same pipelines")
	}
	if !shouldTakeOver("c", "a", true, alive, b, 4) {
		t.Fatal("c does not take over with b running other pipelines")
	}
	if shouldTakeOver("d", "a", true, alive, b, 4) {
		t.Fatal("d takes over with c, lower, running the same pipelines")
	}
	// The member itself counts for the majority: without it, c and d
	// are no majority of four.
	if shouldTakeOver("c", "a", true, []string{"c", "d"}, nil, 4) {
		t.Fatal("c takes over without a majority")
	}
}

// The highest epoch a node saw is kept across its restarts, and the start
// counter a node then takes over with puts its epochs above it.
func TestSeenEpochPersisted(t *testing.T) {
	dir := t.TempDir()
	c := &clusterNode{dataDir: dir, log: slog.New(slog.DiscardHandler)}
	c.sawEpoch(5<<32 + 3)
	c.sawEpoch(2<<32 + 9) // older: ignored
	got, err := readEpoch(filepath.Join(dir, "cluster", "epoch"))
	if err != nil || got != 5<<32+3 {
		t.Fatalf("persisted epoch %d, %v", got, err)
	}
	base, err := nextEpochBase(filepath.Join(dir, "cluster"), got, nil, "")
	if err != nil || base <= got {
		t.Fatalf("epoch base %d after seeing %d: %v", base, got, err)
	}
	again, err := nextEpochBase(filepath.Join(dir, "cluster"), 0, nil, "")
	if err != nil || again <= base {
		t.Fatalf("epoch base %d after %d: %v", again, base, err)
	}
}

// powerNode returns node self of a three-node cluster a, b, c in the
// state a restart leaves it in: following leader (a, the lowest id, when
// no peer named another), not having followed it in this run, having
// taken part in a deployment before (before) or not; its live nodes are
// *alive, its leadership clock clock. Its takeovers are recorded in
// took, and fail, so that nothing starts.
func powerNode(t *testing.T, self, leader string, before bool, alive *[]string, clock clockwork.Clock, logs *testutil.Buffer) (*clusterNode, *[]string) {
	t.Helper()
	cfg := &pipeline.ClusterConfig{Node: self}
	for _, id := range []string{"a", "b", "c"} {
		if id != self {
			cfg.Peers = append(cfg.Peers, pipeline.PeerConfig{ID: id})
		}
	}
	c := &clusterNode{cfg: cfg, log: slog.New(slog.NewTextHandler(logs, nil)).With("node", self), hb: newHandback(cfg.LeadershipConfig())}
	c.hb.clock = clock
	c.lead.id, c.lead.before = leader, before
	took := new([]string)
	c.takeover = func(dead string) error {
		// Read once the view's goroutines ended.
		*took = append(*took, dead)
		return errors.New("not started in this test")
	}
	c.live = &liveView{c: c, stop: make(chan struct{}), aliveFn: func() []string { return slices.Clone(*alive) }}
	t.Cleanup(func() {
		close(c.live.stop)
		settleTakeovers(c)
	})
	return c, took
}

// settleTakeovers waits for the takeovers of nodes to end. They run on
// the views' goroutines, and powerNode's fail: each is retried until its
// node stops, which this does.
func settleTakeovers(nodes ...*clusterNode) {
	for _, c := range nodes {
		c.stopTakeover()
		c.live.wg.Wait()
	}
}

// After a power loss of the whole cluster, the nodes that come back
// without the leader take over from it once it stayed away for the
// grace, if they are a majority and took part in a deployment before:
// b, the lowest, takes over at the grace and not before, c never; a
// leader back within the grace keeps the leadership and restarts the
// timing; a minority never takes over, nor do nodes that never took
// part in a deployment (a first start: the leader may merely not be up
// yet), which log that they wait for it.
func TestTakeoverAfterPowerLoss(t *testing.T) {
	grace := restartGrace("")
	type step struct {
		at    time.Duration // since the first step
		alive []string
		took  bool // b has taken over after this step
	}
	for _, tc := range []struct {
		name   string
		before bool
		steps  []step
		logged string
	}{
		{name: "majority back", before: true, steps: []step{
			{0, []string{"b"}, false},
			{time.Second, []string{"b", "c"}, false},
			{time.Second + grace - time.Millisecond, []string{"b", "c"}, false},
			{time.Second + grace, []string{"b", "c"}, true},
		}, logged: "the leader is not up; the cluster ran before"},
		{name: "leader back within the grace", before: true, steps: []step{
			{0, []string{"b", "c"}, false},
			{grace / 2, []string{"a", "b", "c"}, false},
			{grace, []string{"b", "c"}, false},
			{grace + grace/2, []string{"b", "c"}, false},
			{2 * grace, []string{"b", "c"}, true},
		}},
		{name: "minority", before: true, steps: []step{
			{0, []string{"b"}, false},
			{10 * grace, []string{"b"}, false},
		}},
		{name: "first start", before: false, steps: []step{
			{0, []string{"b", "c"}, false},
			{10 * grace, []string{"b", "c"}, false},
		}, logged: "waiting for the leader to start"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := clockwork.NewFakeClock()
			start := clock.Now()
			var alive []string
			var logs testutil.Buffer
			b, bTook := powerNode(t, "b", "a", tc.before, &alive, clock, &logs)
			c, cTook := powerNode(t, "c", "a", tc.before, &alive, clock, &logs)
			for _, s := range tc.steps {
				clock.Advance(start.Add(s.at).Sub(clock.Now()))
				alive = s.alive
				c.live.maybeTakeOver(alive)
				b.live.maybeTakeOver(alive)
				if b.isMaster() != s.took {
					t.Fatalf("at %v, alive %v: b took over %v, want %v\n%s", s.at, s.alive, b.isMaster(), s.took, logs.String())
				}
				if c.isMaster() {
					t.Fatalf("at %v, alive %v: c took over, b being the lowest live node", s.at, s.alive)
				}
			}
			settleTakeovers(b, c)
			if want := tc.steps[len(tc.steps)-1].took; !slices.Equal(*bTook, map[bool][]string{true: {"a"}}[want]) || len(*cTook) > 0 {
				t.Fatalf("b took over from %v, c from %v; want b from a: %v", *bTook, *cTook, want)
			}
			if tc.logged != "" && !strings.Contains(logs.String(), tc.logged) {
				t.Fatalf("not logged %q:\n%s", tc.logged, logs.String())
			}
		})
	}
}

// A node that comes back after b took over from it and then died with
// the power of b's device follows b, as c (up all along, alone, a
// minority) names it: a, which took part in a deployment before, takes
// over from b once b stayed away for the grace with a and c alive; c,
// which followed b in its run but is not the lowest, does not.
func TestTakeoverFromAbsentLeaderAPeerNames(t *testing.T) {
	clock := clockwork.NewFakeClock()
	alive := []string{"a", "c"}
	var logs testutil.Buffer
	a, aTook := powerNode(t, "a", "b", true, &alive, clock, &logs)
	c, cTook := powerNode(t, "c", "b", false, &alive, clock, &logs)
	c.lead.followed = true
	grace := restartGrace("")
	c.live.maybeTakeOver(alive)
	a.live.maybeTakeOver(alive)
	clock.Advance(grace - time.Millisecond)
	c.live.maybeTakeOver(alive)
	a.live.maybeTakeOver(alive)
	if a.isMaster() || c.isMaster() {
		t.Fatalf("a node took over before b stayed away for %v: a %v, c %v", grace, a.isMaster(), c.isMaster())
	}
	clock.Advance(time.Millisecond)
	c.live.maybeTakeOver(alive)
	a.live.maybeTakeOver(alive)
	if !a.isMaster() || c.isMaster() {
		t.Fatalf("b away for %v: a master %v, c master %v; want a\n%s", grace, a.isMaster(), c.isMaster(), logs.String())
	}
	settleTakeovers(a, c)
	if !slices.Equal(*aTook, []string{"b"}) || len(*cTook) > 0 {
		t.Fatalf("a took over from %v, c from %v; want a from b", *aTook, *cTook)
	}
}

// Two nodes that take over at once from the same epochs seen (their
// views of the membership differed for a moment) start in different
// terms: each takes only the terms equal to its rank modulo the number of
// nodes, so a worker that saw the newer term refuses the other's
// deployments rather than hosting both masters' deployments of one term.
// A node's later starts stay in its own terms and go up.
func TestSimultaneousTakeoversStartInDifferentTerms(t *testing.T) {
	ids := []string{"a", "b", "c"}
	seen := uint64(4)<<32 + 3
	bases := map[string]uint64{}
	for _, id := range ids {
		base, err := nextEpochBase(filepath.Join(t.TempDir(), id), seen, ids, id)
		if err != nil {
			t.Fatal(err)
		}
		if base>>32 <= seen>>32 {
			t.Fatalf("%s starts in term %d, not above the seen term %d", id, base>>32, seen>>32)
		}
		if rank := uint64(slices.Index(ids, id)); (base>>32)%3 != rank {
			t.Fatalf("%s starts in term %d, not one of its own (%d modulo 3)", id, base>>32, rank)
		}
		if base>>32 > seen>>32+3 {
			t.Fatalf("%s starts in term %d, more than the number of nodes above the seen term %d", id, base>>32, seen>>32)
		}
		bases[id] = base
	}
	if bases["b"] == bases["c"] {
		t.Fatalf("b and c take over in the same term %d", bases["b"]>>32)
	}
	older, newer := min(bases["b"], bases["c"]), max(bases["b"], bases["c"])
	if !staleTerm(older+1, newer+1) {
		t.Fatalf("a worker that saw epoch %#x takes epoch %#x of the other master", newer+1, older+1)
	}
	dir := filepath.Join(t.TempDir(), "b")
	prev := uint64(0)
	for range 4 {
		base, err := nextEpochBase(dir, 0, ids, "b")
		if err != nil {
			t.Fatal(err)
		}
		if base <= prev || (base>>32)%3 != 1 {
			t.Fatalf("b's start after term %d is in term %d", prev>>32, base>>32)
		}
		prev = base
	}
}
