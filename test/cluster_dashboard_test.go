package test

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/edgedio/edged/internal/testutil"
)

// chromiumPath returns the headless browser's path, or skips the test.
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, p := range []string{os.Getenv("EDGED_CHROMIUM"), "/usr/bin/chromium", "/usr/bin/chromium-browser"} {
		if p == "" {
			continue
		}
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if p, err := exec.LookPath("chromium"); err == nil {
		return p
	}
	t.Skip("chromium not installed (apt-get install chromium, or set EDGED_CHROMIUM): the browser test is skipped")
	return ""
}

// dashboardPage is one headless browser tab on a node's dashboard.
type dashboardPage struct {
	t   *testing.T
	ctx context.Context
}

// headlessBrowser starts a headless chromium and returns its context,
// in which openDashboard opens tabs.
func headlessBrowser(t *testing.T) context.Context {
	t.Helper()
	// Not t.TempDir: chromium's helper processes may still write to the
	// profile for a moment after the browser exits.
	profile, err := os.MkdirTemp("", "edged-chromium-")
	if err != nil {
		t.Fatal(err)
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromiumPath(t)),
		chromedp.Flag("headless", true), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.UserDataDir(profile), chromedp.WindowSize(1400, 1000),
	}
	actx, acancel := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx, chromedp.WithErrorf(func(string, ...any) {}))
	t.Cleanup(func() {
		cancel()
		acancel()
		testutil.Eventually(t, 60*time.Second, "chromium's profile removed", func() bool { return os.RemoveAll(profile) == nil })
	})
	if err := chromedp.Run(ctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return ctx
}

// openDashboard opens url in a new tab of browser and installs a
// recorder of the page's uncaught errors and rejected promises
// (window.__errors).
func openDashboard(t *testing.T, browser context.Context, url string) *dashboardPage {
	t.Helper()
	ctx, cancel := chromedp.NewContext(browser)
	t.Cleanup(cancel)
	// The tab's first Run creates it, and lives as long as its context:
	// not one of run's bounded ones, which would close the tab.
	if err := chromedp.Run(ctx); err != nil {
		t.Fatalf("open a tab: %v", err)
	}
	p := &dashboardPage{t: t, ctx: ctx}
	p.run("open "+url, chromedp.Navigate(url), chromedp.WaitVisible(`#conn.live`, chromedp.ByQuery),
		chromedp.Evaluate(`window.__errors = [];
			addEventListener("error", (e) => __errors.push(String(e.message)));
			addEventListener("unhandledrejection", (e) => __errors.push(String(e.reason)));`, nil))
	return p
}

// run runs actions in the page, bounded by a minute.
func (p *dashboardPage) run(what string, actions ...chromedp.Action) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, 60*time.Second)
	defer cancel()
	if err := chromedp.Run(ctx, actions...); err != nil {
		p.t.Fatalf("%s: %v", what, err)
	}
}

// eval evaluates expr in the page into v.
func (p *dashboardPage) eval(expr string, v any) {
	p.t.Helper()
	p.run(expr, chromedp.Evaluate(expr, v))
}

// healthy fails the test when the page recorded an error or lost the
// node: its poll catches whatever one of its views throws and shows it
// as a lost connection with the message in the banner.
func (p *dashboardPage) healthy(what string) {
	p.t.Helper()
	var s struct {
		Errors []string
		Conn   string
		Banner string
	}
	p.eval(`({Errors: window.__errors, Conn: document.querySelector("#conn").textContent,
		Banner: document.querySelector("#banner").hidden ? "" : document.querySelector("#banner").textContent})`, &s)
	if len(s.Errors) > 0 || s.Conn != "live" || s.Banner != "" {
		p.t.Fatalf("%s: the page's errors %q, connection %q, banner %q", what, s.Errors, s.Conn, s.Banner)
	}
}

// The dashboard in a real browser while a worker of a three-node
// cluster is killed under MQTT load: on the leader the cluster view
// shows the node dead, the failover recorded once with the dead node,
// and its key groups on the live nodes, as GET /cluster says; on a
// worker the job view lists the leader's job with the tasks the worker
// hosts and names the leader, whose dashboard has the job's graph and
// checkpoints, and the cluster view says that the leader keeps the
// placement and the failovers, rather than zeros. Neither page throws
// or loses its node meanwhile. Before, the worker's job view said "no
// jobs" and its cluster view showed every member with 0 subtasks and 0
// key groups, "no keyed subtask placed under this epoch" and "no
// failover since this node started", while the job ran on it and had
// just failed over.
func TestClusterDashboardDuringFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with three subprocesses and a browser")
	}
	chromiumPath(t)
	members := startCluster(t, true)
	a, b := members[0], members[1]
	l := newClusterLoad(t, members)
	client := &http.Client{Timeout: time.Second}
	waitAllAlive(t, a, 3)
	browser := headlessBrowser(t)
	leader := openDashboard(t, browser, "http://"+a.apiAddr+"/#cluster")
	worker := openDashboard(t, browser, "http://"+b.apiAddr+"/#job")
	const n = 9_000
	l.publish(0, n/3)

	// The worker's job view: the leader's job, the tasks hosted here,
	// and where the rest is.
	var job struct{ Cards, Note, Link, Graph, Tasks string }
	ok := testutil.Within(30*time.Second, func() bool {
		worker.eval(`({Cards: document.querySelector("#job-cards").textContent,
			Note: (document.querySelector("#worker-note:not([hidden])") || {}).textContent || "",
			Link: (document.querySelector("#worker-note a") || {}).href || "",
			Graph: document.querySelector("#graph").textContent, Tasks: document.querySelector("#tasks tbody").textContent})`, &job)
		return strings.Contains(job.Cards, "sensors") && strings.Contains(job.Cards, "running") && job.Link != ""
	})
	if !ok || !strings.Contains(job.Cards, "tasks here") || !strings.Contains(job.Note, "Node b is a worker") ||
		job.Link != "http://"+a.apiAddr+"/#job" || !strings.Contains(job.Graph, "on the leader, node a") ||
		!strings.Contains(job.Tasks, "on the leader, node a") {
		t.Fatalf("the worker's job view: %+v", job)
	}
	worker.healthy("the worker's job view")

	// Readings c acknowledged that no checkpoint covers would be lost
	// with it (see "What a failover guarantees"): it goes down once its
	// log released every one.
	sentToC := uint64(0)
	for i := range n / 3 {
		if i%3 == 2 {
			sentToC++
		}
	}
	testutil.Eventually(t, 60*time.Second, "node c's log released all it was sent", func() bool {
		rel, err := members[2].released(client)
		return err == nil && rel >= sentToC
	})
	l.kill(2)
	type leaderView struct {
		States, Failovers, Cards, MapNodes string
	}
	var lv leaderView
	testutil.Eventually(t, 30*time.Second, "the leader's cluster view shows c dead and its failover completed", func() bool {
		leader.eval(`({States: [...document.querySelectorAll("#members tbody tr[data-node]")].map(r => r.dataset.node + ":" + r.querySelector(".state").textContent).join(" "),
			Failovers: [...document.querySelectorAll("#failovers tbody tr")].map(r => (r.cells[1] || {}).textContent || "").join(" "),
			Cards: [...document.querySelectorAll("#cluster-cards .card")].map(c => c.textContent).join("|"),
			MapNodes: [...new Set([...document.querySelectorAll("#kg-map rect.kg")].map(r => r.dataset.node))].sort().join(",")})`, &lv)
		// The failover's row shows while it is in progress, its count
		// ("failovers1") once it completed.
		return strings.Contains(lv.States, "c:dead") && lv.Failovers == "c" && lv.MapNodes == "a,b" &&
			strings.Contains(lv.Cards, "failovers1")
	})
	s, err := a.status(client)
	if err != nil {
		t.Fatal(err)
	}
	if s.FailoversTotal != 1 || !strings.Contains(lv.Cards, "failovers1") || s.alive() != 2 || s.keyedOn("c") != 0 {
		t.Fatalf("the leader's page %+v; GET /cluster: %d failovers, %d alive, %d keyed subtasks on c", lv, s.FailoversTotal, s.alive(), s.keyedOn("c"))
	}
	leader.healthy("the leader's cluster view after the failover")
	worker.healthy("the worker's job view after the failover")

	// The worker's cluster view names the leader for what it keeps.
	worker.run("the worker's cluster view", chromedp.Click(`nav a[data-view="cluster"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`#members tbody tr[data-node]`, chromedp.ByQuery))
	var wv struct{ States, Counts, Map, Failovers string }
	testutil.Eventually(t, 30*time.Second, "the worker's cluster view shows c dead", func() bool {
		worker.eval(`({States: [...document.querySelectorAll("#members tbody tr[data-node]")].map(r => r.dataset.node + ":" + r.querySelector(".state").textContent).join(" "),
			Counts: [...document.querySelectorAll("#members tbody tr[data-node]")].map(r => r.cells[6].textContent + "/" + r.cells[7].textContent).join(" "),
			Map: document.querySelector("#kg-map").textContent, Failovers: document.querySelector("#failovers tbody").textContent})`, &wv)
		return strings.Contains(wv.States, "c:dead")
	})
	if wv.Counts != "–/– –/– –/–" || !strings.Contains(wv.Map, "kept by the leader, node a") ||
		!strings.Contains(wv.Failovers, "the leader, node a") || strings.Contains(wv.Failovers, "no failover") {
		t.Fatalf("the worker's cluster view after the failover: %+v", wv)
	}
	worker.healthy("the worker's cluster view")

	l.publish(n/3, n)
	l.finishChecked(n, 120*time.Second)
	leader.healthy("the leader's cluster view at the end")
}
