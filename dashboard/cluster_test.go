package dashboard_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/edgedio/edged/cluster"
	"github.com/edgedio/edged/daemon"
	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/keygroup"
)

// fakeCluster is a cluster of members edge-1..edge-<alive> alive and one
// more dead after a failover, with two keyed operators placed by
// cluster.Place. It records the drains and rebalances asked of it.
type fakeCluster struct {
	mu         sync.Mutex // guards the fields below
	status     cluster.Status
	drained    []string
	undrained  []string
	rebalances int
}

const fakeMaxParallelism = 128

func newFakeCluster(t *testing.T, alive int) *fakeCluster {
	t.Helper()
	now := time.Now().UTC().Truncate(time.Second)
	s := cluster.Status{Enabled: true, Node: "edge-1", Leader: "edge-1", Epoch: 7, MaxParallelism: fakeMaxParallelism}
	var live []cluster.Member
	for i := 1; i <= alive+1; i++ {
		id := fmt.Sprintf("edge-%d", i)
		m := cluster.MemberStatus{ID: id, Address: fmt.Sprintf("10.0.0.%d:7946", 10+i), API: fmt.Sprintf("10.0.0.%d:8081", 10+i),
			State: cluster.StateAlive, SeesMajority: true, Capacity: 1, Weight: 1, Leader: i == 1}
		if i == 2 {
			m.Capacity, m.Weight = 2, 2
		}
		if i == alive+1 {
			m.State, m.SeesMajority = cluster.StateDead, false
		} else {
			live = append(live, cluster.Member{ID: id, Capacity: m.Capacity})
		}
		s.Members = append(s.Members, m)
	}
	ops := map[string]int{"window": 8, "alert": 4}
	var units []cluster.Unit
	for op, par := range ops {
		for i := range par {
			units = append(units, cluster.Unit(fmt.Sprintf("%s/%d", op, i)))
		}
	}
	pl, err := cluster.Place(live, units)
	if err != nil {
		t.Fatal(err)
	}
	for node, us := range pl.ByNode() {
		np := cluster.NodePlacement{Node: node}
		for _, u := range us {
			op, idx, _ := strings.Cut(string(u), "/")
			var i int
			fmt.Sscan(idx, &i)
			np.Subtasks = append(np.Subtasks, cluster.PlacedSubtask{Job: "sensors", Operator: op, UID: op, Subtask: i,
				KeyGroups: cluster.KeyGroupsOf(keygroup.RangeFor(i, ops[op], fakeMaxParallelism))})
		}
		s.Placement = append(s.Placement, np)
	}
	for cp := int64(42); cp >= 41; cp-- {
		c := cluster.CheckpointReplicas{Checkpoint: cp, Job: "sensors"}
		for _, u := range []string{"window/0", "window/1", "alert/0"} {
			holders := []string{pl[cluster.Unit(u)]}
			holders = append(holders, cluster.ReplicaTargets(holders[0], memberIDs(live), 2)...)
			c.Files = append(c.Files, cluster.ReplicaFile{File: fmt.Sprintf("%d/%s.snap", cp, strings.ReplaceAll(u, "/", "-")),
				Size: int64(180_000 + 1000*cp), Nodes: holders})
		}
		s.Replicas = append(s.Replicas, c)
	}
	dead := s.Members[alive].ID
	s.Failovers = []cluster.Failover{
		{At: now.Add(-4 * time.Minute), DeadNode: dead, Epoch: 7, DetectionMS: 1820, PlacementMS: 35, RestoreMS: 410, FirstRecordMS: 62},
		{At: now.Add(-52 * time.Minute), DeadNode: "edge-2", Epoch: 4, DetectionMS: 1640, PlacementMS: 28, RestoreMS: 655, FirstRecordMS: 48},
	}
	s.FailoversTotal = 2
	s.Rebalances = []cluster.Rebalance{
		{At: now.Add(-20 * time.Minute), Trigger: cluster.TriggerManual, Outcome: cluster.RebalanceRefused,
			Error: "cluster: over capacity: edge-1 would run 9 units, it has 8 slots"},
		{At: now.Add(-31 * time.Minute), Trigger: cluster.TriggerJoin, MovedKeyGroups: 48, BytesShipped: 6_400_000, Outcome: cluster.RebalanceDone,
			PauseMS: map[string]float64{"window/3": 212, "window/6": 188, "alert/1": 96}},
	}
	s.RebalancesTotal = 3
	return &fakeCluster{status: s}
}

func memberIDs(ms []cluster.Member) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.ID
	}
	return out
}

func (f *fakeCluster) Status() cluster.Status {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.status
}

func (f *fakeCluster) Drain(_ context.Context, node string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.drained = append(f.drained, node)
	f.setDrained(node, true)
	f.status.Rebalances = append([]cluster.Rebalance{{At: time.Now(), Trigger: cluster.TriggerDrain, MovedKeyGroups: 40,
		BytesShipped: 2 << 20, PauseMS: map[string]float64{"window/2": 120}, Outcome: cluster.RebalanceDone}}, f.status.Rebalances...)
	f.status.RebalancesTotal++
	return nil
}

// Undrain records the undrain and shows node alive again; the daemon's
// route asks it of a cluster that can undrain.
func (f *fakeCluster) Undrain(_ context.Context, node string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.undrained = append(f.undrained, node)
	f.setDrained(node, false)
	return nil
}

// setDrained shows node drained (and left) or back; f.mu is held.
func (f *fakeCluster) setDrained(node string, drained bool) {
	for i := range f.status.Members {
		if m := &f.status.Members[i]; m.ID == node {
			m.Drained, m.State = drained, cluster.StateAlive
			if drained {
				m.State = cluster.StateLeft
			}
		}
	}
}

func (f *fakeCluster) Rebalance(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rebalances++
	return nil
}

func (f *fakeCluster) asked() ([]string, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.drained), f.rebalances
}

// The cluster view in a real browser against a node with a cluster of
// three (two alive): the members, the key-group map with every subtask's
// range in its node's colour, replicas, failovers and rebalances; a
// drain confirmed from the page reaches the cluster.
func TestBrowserCluster(t *testing.T) {
	chromium(t)
	f := newFakeCluster(t, 2)
	addr, _ := startDemoWith(t, daemon.Options{Cluster: f})
	ctx := browser(t, 1400, 1000)

	run(t, ctx, "open the cluster view", chromedp.Navigate("http://"+addr+"/#cluster"),
		chromedp.WaitVisible(`#kg-map rect.kg`, chromedp.ByQuery))
	if n := evalInt(t, ctx, `document.querySelectorAll("#members tbody tr[data-node]").length`); n != 3 {
		t.Fatalf("%d member rows, want 3", n)
	}
	var states string
	run(t, ctx, "states", chromedp.Evaluate(`[...document.querySelectorAll("#members .state")].map(e => e.textContent).join(",")`, &states))
	if states != "alive,alive,dead" {
		t.Fatalf("member states %q", states)
	}
	// Every placed subtask is one range on the map, in its node's row
	// colour, and together they cover each operator's key groups once.
	var ranges string
	run(t, ctx, "key-group map", chromedp.Evaluate(`[...document.querySelectorAll("#kg-map rect.kg")].map(r =>
		[r.dataset.operator, r.dataset.subtask, r.dataset.node, r.dataset.first, r.dataset.last].join(":")).sort().join(" ")`, &ranges))
	var want []string
	covered := map[string]int{}
	for _, p := range f.Status().Placement {
		for _, st := range p.Subtasks {
			want = append(want, fmt.Sprintf("%s:%d:%s:%d:%d", st.Operator, st.Subtask, p.Node, st.KeyGroups[0], st.KeyGroups[1]))
			covered[st.Operator] += st.KeyGroups.Len()
		}
	}
	slices.Sort(want)
	if ranges != strings.Join(want, " ") {
		t.Fatalf("map ranges\n%s\nwant\n%s", ranges, strings.Join(want, " "))
	}
	if covered["window"] != fakeMaxParallelism || covered["alert"] != fakeMaxParallelism {
		t.Fatalf("fake placement covers %v", covered)
	}
	if n := evalInt(t, ctx, `new Set([...document.querySelectorAll("#kg-map rect.kg")].map(r => r.getAttribute("fill"))).size`); n != 2 {
		t.Fatalf("%d colours on the map, want one per live node (2)", n)
	}
	var legend, cards string
	run(t, ctx, "legend", chromedp.Evaluate(`document.querySelector("#kg-legend").textContent`, &legend),
		chromedp.Evaluate(`document.querySelector("#cluster-cards").textContent`, &cards))
	if !strings.Contains(legend, "edge-3") || !strings.Contains(legend, "(dead)") || !strings.Contains(cards, "edge-1") || !strings.Contains(cards, "2 / 3") {
		t.Fatalf("legend %q, cards %q", legend, cards)
	}
	if n := evalInt(t, ctx, `document.querySelectorAll("#replicas tbody tr").length`); n != 6 {
		t.Fatalf("%d replica rows, want 6", n)
	}
	if n := evalInt(t, ctx, `document.querySelectorAll("#failovers svg.phases").length`); n != 2 {
		t.Fatalf("%d failover bars, want 2", n)
	}
	var failover string
	run(t, ctx, "failover", chromedp.Evaluate(`document.querySelector("#failovers tbody tr").textContent`, &failover))
	if !strings.Contains(failover, "edge-3") || !strings.Contains(failover, "1.82 s") || !strings.Contains(failover, "2.33 s") {
		t.Fatalf("latest failover row %q", failover)
	}
	if n := evalInt(t, ctx, `document.querySelectorAll('#members button.drain[data-node="edge-3"]:disabled').length`); n != 1 {
		t.Fatal("the dead member's drain button is enabled")
	}

	// Drain edge-2 from the page: confirm, see the answer, and the cluster
	// was asked.
	run(t, ctx, "drain edge-2", chromedp.Click(`#members button.drain[data-node="edge-2"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`#confirm-ok`, chromedp.ByQuery))
	var confirmText string
	run(t, ctx, "confirm text", chromedp.Text(`#confirm-text`, &confirmText, chromedp.ByQuery))
	if !strings.Contains(confirmText, "edge-2") {
		t.Fatalf("confirmation %q does not name edge-2", confirmText)
	}
	if d, _ := f.asked(); len(d) != 0 {
		t.Fatalf("drained %v before the confirmation", d)
	}
	run(t, ctx, "confirm", chromedp.Click(`#confirm-ok`, chromedp.ByQuery))
	testutil.Eventually(t, waitLimit, "the drain answered on the page", func() bool {
		var s string
		run(t, ctx, "status", chromedp.Text(`#cluster-status`, &s, chromedp.ByQuery))
		return strings.Contains(s, "Drain edge-2: done") && strings.Contains(s, "40 key groups moved")
	})
	if d, n := f.asked(); !slices.Equal(d, []string{"edge-2"}) || n != 0 {
		t.Fatalf("cluster asked to drain %v and rebalance %d times; want edge-2 once", d, n)
	}
	testutil.Eventually(t, waitLimit, "the drain listed among the rebalances", func() bool {
		var s string
		// Evaluate rather than Text: the table is redrawn on every poll.
		run(t, ctx, "rebalances", chromedp.Evaluate(`document.querySelector("#rebalances tbody tr").textContent`, &s))
		return strings.Contains(s, "drain") && strings.Contains(s, "window/2")
	})

	// The drained member is marked so, as edged cluster status prints
	// "(drained)"; it shows Undrain in place of Drain; undrain it.
	testutil.Eventually(t, waitLimit, "edge-2 marked drained", func() bool {
		var s string
		run(t, ctx, "drained tag", chromedp.Evaluate(`[...document.querySelectorAll("#members tr[data-node] .tag.drained")].map(e => e.closest("tr").dataset.node).join(",")`, &s))
		return s == "edge-2"
	})
	run(t, ctx, "undrain edge-2", chromedp.WaitVisible(`#members button.undrain[data-node="edge-2"]`, chromedp.ByQuery),
		chromedp.Click(`#members button.undrain[data-node="edge-2"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`#confirm-ok`, chromedp.ByQuery), chromedp.Click(`#confirm-ok`, chromedp.ByQuery))
	testutil.Eventually(t, waitLimit, "the undrain answered on the page", func() bool {
		var s string
		run(t, ctx, "status", chromedp.Text(`#cluster-status`, &s, chromedp.ByQuery))
		return strings.Contains(s, "Undrain edge-2: done")
	})
	f.mu.Lock()
	undrained := slices.Clone(f.undrained)
	f.mu.Unlock()
	if !slices.Equal(undrained, []string{"edge-2"}) {
		t.Fatalf("cluster asked to undrain %v; want edge-2 once", undrained)
	}
	run(t, ctx, "drain button back", chromedp.WaitVisible(`#members button.drain[data-node="edge-2"]:enabled`, chromedp.ByQuery))
	if n := evalInt(t, ctx, `document.querySelectorAll("#members .tag.drained").length`); n != 0 {
		t.Fatalf("%d members marked drained after the undrain", n)
	}

	// Rebalance, but step back at the confirmation: nothing is asked.
	run(t, ctx, "rebalance", chromedp.Click(`#btn-rebalance`, chromedp.ByQuery),
		chromedp.WaitVisible(`#confirm-cancel`, chromedp.ByQuery), chromedp.Click(`#confirm-cancel`, chromedp.ByQuery),
		chromedp.WaitNotVisible(`#confirm`, chromedp.ByQuery))
	if _, n := f.asked(); n != 0 {
		t.Fatalf("rebalance asked %d times after Back", n)
	}
}

// On a node without a cluster the Cluster tab is hidden, and the view
// says there is no cluster.
func TestBrowserNoCluster(t *testing.T) {
	chromium(t)
	addr, _ := startDemo(t)
	ctx := browser(t, 1200, 800)
	run(t, ctx, "open the job view", chromedp.Navigate("http://"+addr+"/"),
		chromedp.WaitVisible(`#graph g.chain`, chromedp.ByQuery),
		chromedp.WaitNotVisible(`nav a[data-view="cluster"]`, chromedp.ByQuery))
	run(t, ctx, "open the cluster view", chromedp.Navigate("http://"+addr+"/#cluster"),
		chromedp.WaitVisible(`#cluster-off`, chromedp.ByQuery))
	if n := evalInt(t, ctx, `document.querySelectorAll("#kg-map rect.kg").length`); n != 0 {
		t.Fatalf("%d key-group ranges drawn without a cluster", n)
	}
}

// The cluster view of a worker: the placement, the failovers and the
// rebalances are the job masters', on the leader, and the worker's GET
// /cluster holds none of them. The view says so and links the leader's
// dashboard, rather than showing every member with 0 subtasks and 0 key
// groups, "no keyed subtask placed" and "no failover since this node
// started" while the cluster runs and failed over (as edged cluster
// status asked of a worker prints "-" and names the leader).
func TestBrowserClusterOnAWorker(t *testing.T) {
	chromium(t)
	f := newFakeCluster(t, 2)
	f.mu.Lock()
	s := &f.status
	s.Node, s.Placement, s.Failovers, s.FailoversTotal, s.Rebalances, s.RebalancesTotal = "edge-2", nil, nil, 0, nil, 0
	f.mu.Unlock()
	addr, _ := startDemoWith(t, daemon.Options{Cluster: f})
	ctx := browser(t, 1400, 1000)

	run(t, ctx, "open the cluster view", chromedp.Navigate("http://"+addr+"/#cluster"),
		chromedp.WaitVisible(`#members tbody tr[data-node]`, chromedp.ByQuery))
	var view struct {
		Counts, Map, Legend, Failovers, Rebalances, Cards, Link string
	}
	testutil.Eventually(t, waitLimit, "the cluster view drawn", func() bool {
		run(t, ctx, "cluster view", chromedp.Evaluate(`({
			Counts: [...document.querySelectorAll("#members tbody tr[data-node]")].map(r => r.cells[6].textContent + "/" + r.cells[7].textContent).join(" "),
			Map: document.querySelector("#kg-map").textContent,
			Legend: document.querySelector("#kg-legend").textContent,
			Failovers: document.querySelector("#failovers tbody").textContent,
			Rebalances: document.querySelector("#rebalances tbody").textContent,
			Cards: [...document.querySelectorAll("#cluster-cards .card")].map(c => c.textContent).join("|"),
			Link: (document.querySelector("#kg-legend a") || {}).href || "",
		})`, &view))
		return view.Map != ""
	})
	if view.Counts != "–/– –/– –/–" {
		t.Errorf("members' subtasks/key groups on a worker: %q, want – for each (kept by the leader)", view.Counts)
	}
	if !strings.Contains(view.Map, "kept by the leader, node edge-1") || strings.Contains(view.Map, "no keyed subtask") {
		t.Errorf("key-group map on a worker: %q", view.Map)
	}
	if want := "http://10.0.0.11:8081/#cluster"; view.Link != want || !strings.Contains(view.Legend, "edge-1") {
		t.Errorf("legend %q links %q, want the leader's dashboard %s", view.Legend, view.Link, want)
	}
	for name, text := range map[string]string{"failovers": view.Failovers, "rebalances": view.Rebalances} {
		if !strings.Contains(text, "recorded by this node: the leader, node edge-1") || strings.Contains(text, "since this node started") {
			t.Errorf("%s table on a worker: %q", name, text)
		}
	}
	if !strings.Contains(view.Cards, "failovers–") || !strings.Contains(view.Cards, "rebalances–") {
		t.Errorf("cards on a worker: %q", view.Cards)
	}
}

// A failover in progress (its nodes seen dead, its jobs not running again
// yet) is shown above the done ones, and counted apart on the card.
func TestBrowserClusterFailoverInProgress(t *testing.T) {
	chromium(t)
	f := newFakeCluster(t, 2)
	f.mu.Lock()
	f.status.FailoversInProgress = []cluster.Failover{{At: time.Now(), DeadNode: "edge-2", DetectionMS: 1100}}
	f.mu.Unlock()
	addr, _ := startDemoWith(t, daemon.Options{Cluster: f})
	ctx := browser(t, 1400, 1000)
	run(t, ctx, "open the cluster view", chromedp.Navigate("http://"+addr+"/#cluster"),
		chromedp.WaitVisible(`#failovers tbody tr.in-progress`, chromedp.ByQuery))
	var first, cards string
	run(t, ctx, "failovers", chromedp.Evaluate(`document.querySelector("#failovers tbody tr").textContent`, &first),
		chromedp.Evaluate(`[...document.querySelectorAll("#cluster-cards .card")].map(c => c.textContent).join("|")`, &cards))
	if !strings.Contains(first, "edge-2") || !strings.Contains(first, "in progress (detection 1.10 s)") {
		t.Fatalf("first failover row %q", first)
	}
	if !strings.Contains(cards, "failovers2 (+1 in progress)") {
		t.Fatalf("cards %q", cards)
	}
	if n := evalInt(t, ctx, `document.querySelectorAll("#failovers svg.phases").length`); n != 2 {
		t.Fatalf("%d failover bars, want the 2 done ones", n)
	}
}
