package dashboard_test

import (
	"context"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/edgedio/edged/daemon"
	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/mqtt"
	"github.com/edgedio/edged/pipeline"
)

const waitLimit = 60 * time.Second

// chromium returns the headless browser's path, or skips the test.
func chromium(t *testing.T) string {
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

// startDemo runs configs/mqtt-demo.yaml on free loopback ports with its
// data in a temp dir and returns the API's and the broker's addresses.
func startDemo(t *testing.T) (api, broker string) {
	t.Helper()
	return startDemoWith(t, daemon.Options{})
}

// startDemoWith is startDemo with opts (its Listen, Logger and Ready are
// replaced).
func startDemoWith(t *testing.T, opts daemon.Options) (api, broker string) {
	t.Helper()
	data, err := os.ReadFile("../configs/mqtt-demo.yaml")
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	broker = l.Addr().String()
	l.Close()
	dir := filepath.ToSlash(t.TempDir())
	y := string(data)
	for old, new := range map[string]string{
		"data_dir: edged-data": "data_dir: " + dir,
		"127.0.0.1:1883":       broker,
		"dir: edged-data/":     "dir: " + dir + "/",
		"interval: 5s":         "interval: 1s",
	} {
		if !strings.Contains(y, old) {
			t.Fatalf("mqtt-demo.yaml has no %q", old)
		}
		y = strings.ReplaceAll(y, old, new)
	}
	cfg, err := pipeline.Parse([]byte(y))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan net.Addr, 1)
	errc := make(chan error, 1)
	go func() {
		opts.Listen, opts.Logger, opts.Ready = "127.0.0.1:0", slog.New(slog.DiscardHandler), func(a net.Addr) { ready <- a }
		errc <- daemon.Run(ctx, cfg, opts)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-errc:
		case <-time.After(waitLimit):
			t.Errorf("Run did not return %v after cancel", waitLimit)
		}
	})
	select {
	case a := <-ready:
		return a.String(), broker
	case err := <-errc:
		errc <- err
		t.Fatalf("Run: %v", err)
	case <-time.After(waitLimit):
		t.Fatal("node not ready")
	}
	return "", ""
}

// publishBad publishes malformed readings to the demo's broker: they
// become dead letters.
func publishBad(t *testing.T, broker string, payloads ...string) {
	t.Helper()
	cfg := mqtt.DefaultPublisherConfig()
	cfg.Broker, cfg.ClientID = "tcp://"+broker, "dashboard-test"
	p, err := mqtt.NewPublisher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for _, b := range payloads {
		if err := p.Publish("sensors/s-bad/temperature", []byte(b)); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Flush(); err != nil {
		t.Fatal(err)
	}
}

// browser starts a fresh headless chromium and returns its context.
func browser(t *testing.T, w, h int) context.Context {
	t.Helper()
	// Not t.TempDir: chromium's helper processes may still write to the
	// profile for a moment after the browser exits, and TempDir's cleanup
	// fails the test on a directory that is not empty.
	profile, err := os.MkdirTemp("", "edged-chromium-")
	if err != nil {
		t.Fatal(err)
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromium(t)),
		chromedp.Flag("headless", true), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true), chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.Flag("hide-scrollbars", true),
		chromedp.UserDataDir(profile), chromedp.WindowSize(w, h),
	}
	actx, acancel := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx, chromedp.WithErrorf(func(string, ...any) {}))
	t.Cleanup(func() {
		cancel()
		acancel()
		testutil.Eventually(t, waitLimit, "chromium's profile removed", func() bool { return os.RemoveAll(profile) == nil })
	})
	if err := chromedp.Run(ctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return ctx
}

// run runs actions in the browser, bounded by waitLimit.
func run(t *testing.T, ctx context.Context, what string, actions ...chromedp.Action) {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, waitLimit)
	defer cancel()
	if err := chromedp.Run(c, actions...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// evalInt evaluates a JavaScript expression giving a number.
func evalInt(t *testing.T, ctx context.Context, expr string) int {
	t.Helper()
	var v float64
	run(t, ctx, expr, chromedp.Evaluate(expr, &v))
	return int(v)
}

// The demo in a real browser: the job and its graph show, the rates move,
// a savepoint triggered from the page appears in the list.
func TestBrowserJobAndSavepoint(t *testing.T) {
	chromium(t)
	addr, broker := startDemo(t)
	ctx := browser(t, 1400, 1000)

	run(t, ctx, "open the dashboard", chromedp.Navigate("http://"+addr+"/"),
		chromedp.WaitVisible(`#graph g.chain`, chromedp.ByQuery))
	var job string
	run(t, ctx, "job select", chromedp.Value(`#job-select`, &job, chromedp.ByQuery))
	if job != "sensors" {
		t.Fatalf("selected job %q, want sensors", job)
	}
	if n := evalInt(t, ctx, `document.querySelectorAll("#graph g.chain").length`); n < 2 {
		t.Fatalf("%d chains drawn", n)
	}
	var labels string
	run(t, ctx, "edge labels", chromedp.Evaluate(`[...document.querySelectorAll("#graph .elabel")].map(e => e.textContent).join(",")`, &labels))
	if !strings.Contains(labels, "key-by") {
		t.Fatalf("edge labels %q lack key-by", labels)
	}
	// Rates move: the source chain's records in/out per second shown in
	// the task table become non-zero and change between polls.
	rate := func() string {
		var s string
		run(t, ctx, "rates", chromedp.Evaluate(`[...document.querySelectorAll("#tasks .rate-out")].map(e => e.textContent).join(" ")`, &s))
		return s
	}
	var first string
	testutil.Eventually(t, waitLimit, "a non-zero rate", func() bool {
		first = rate()
		for _, f := range strings.Fields(first) {
			if v, err := strconv.ParseFloat(strings.TrimRight(f, "kM"), 64); err == nil && v > 0 {
				return true
			}
		}
		return false
	})
	testutil.Eventually(t, waitLimit, "the rates to change", func() bool { return rate() != first })
	var graphRates string
	run(t, ctx, "graph rates", chromedp.Evaluate(`[...document.querySelectorAll("#graph .rates")].map(e => e.textContent).join("|")`, &graphRates))
	if !strings.Contains(graphRates, "/s") || !strings.ContainsAny(strings.ReplaceAll(graphRates, "0.0/s", ""), "123456789") {
		t.Fatalf("graph rates %q", graphRates)
	}

	// Malformed readings show as dead letters, newest first.
	publishBad(t, broker, `{"sensor":"s-bad","t":"hot"`, `not json at all`)
	testutil.Eventually(t, waitLimit, "the dead letters listed", func() bool {
		var s string
		run(t, ctx, "dead letters", chromedp.Evaluate(`[...document.querySelectorAll("#deadletters .payload")].map(e => e.textContent).join("|")`, &s))
		return s == `not json at all|{"sensor":"s-bad","t":"hot"`
	})

	// Trigger a savepoint from the checkpoints view, confirm, see it listed.
	run(t, ctx, "checkpoints view", chromedp.Click(`nav a[data-view="checkpoints"]`, chromedp.ByQuery),
		chromedp.WaitEnabled(`#btn-savepoint`, chromedp.ByQuery))
	if n := evalInt(t, ctx, `document.querySelectorAll("#savepoints li .path").length`); n != 0 {
		t.Fatalf("%d savepoints before triggering one", n)
	}
	run(t, ctx, "trigger", chromedp.Click(`#btn-savepoint`, chromedp.ByQuery),
		chromedp.WaitVisible(`#confirm-ok`, chromedp.ByQuery), chromedp.Click(`#confirm-ok`, chromedp.ByQuery))
	// The list is redrawn on every poll: read the path in one evaluation,
	// not by a node a redraw may have replaced.
	var path string
	testutil.Eventually(t, waitLimit, "the savepoint listed", func() bool {
		run(t, ctx, "savepoint listed", chromedp.Evaluate(`(document.querySelector("#savepoints li .path") || {}).textContent || ""`, &path))
		return strings.Contains(path, "savepoint")
	})
	var status string
	run(t, ctx, "action status", chromedp.Text(`#action-status`, &status, chromedp.ByQuery))
	if !strings.Contains(status, path) {
		t.Fatalf("status %q does not name %s", status, path)
	}
	if n := evalInt(t, ctx, `document.querySelectorAll("#cp-chart rect.bar").length`); n < 1 {
		t.Fatalf("%d bars in the checkpoint chart", n)
	}

	// A savepoint whose files were removed, and checkpoints that retention
	// discarded, are shown as gone, as edged checkpoints prints them: the
	// path is not offered as one to start from.
	if !filepath.IsAbs(path) {
		t.Fatalf("savepoint path %q is not absolute", path)
	}
	if err := os.RemoveAll(path); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, waitLimit, "the removed savepoint marked gone", func() bool {
		var s string
		run(t, ctx, "savepoint gone", chromedp.Evaluate(`[...document.querySelectorAll("#savepoints li.gone")].map(e => e.textContent).join("|")`, &s))
		return strings.Contains(s, path) && strings.Contains(s, "files gone")
	})
	testutil.Eventually(t, waitLimit, "a discarded checkpoint marked gone", func() bool {
		var s string
		run(t, ctx, "checkpoints gone", chromedp.Evaluate(`[...document.querySelectorAll("#checkpoints td.gone")].map(e => e.textContent).join("|")`, &s))
		return strings.Contains(s, "completed (files gone)")
	})

	// Every completed checkpoint's row shows its directory, the path to
	// start from; a discarded one's is struck through, a retained one's
	// is not, and one click selects it whole for copying.
	type cpRow struct {
		ID, Kind, Status, Path, Deco, Select string
		Gone                                 bool
	}
	var rows []cpRow
	testutil.Eventually(t, waitLimit, "checkpoint paths, retained and gone", func() bool {
		run(t, ctx, "checkpoint rows", chromedp.Evaluate(`[...document.querySelectorAll("#checkpoints tbody tr")].filter(r => r.cells.length > 1).map(r => {
			const p = r.querySelector("td.path"), cs = getComputedStyle(p);
			return {ID: r.cells[0].textContent, Kind: r.cells[1].textContent, Status: r.cells[2].textContent,
				Path: p.textContent, Gone: p.classList.contains("gone"), Deco: cs.textDecorationLine, Select: cs.userSelect};
		})`, &rows))
		var retained, gone bool
		for _, r := range rows {
			if r.Kind == "checkpoint" && strings.HasPrefix(r.Status, "completed") {
				retained = retained || !r.Gone
				gone = gone || r.Gone
			}
		}
		return retained && gone
	})
	for _, r := range rows {
		if r.Kind != "checkpoint" || !strings.HasPrefix(r.Status, "completed") {
			continue
		}
		if !filepath.IsAbs(r.Path) || !strings.HasSuffix(r.Path, string(filepath.Separator)+filepath.Join("checkpoints", "chk-"+r.ID)) {
			t.Errorf("checkpoint %s shows path %q, want its chk-%s directory", r.ID, r.Path, r.ID)
		}
		if gone := r.Status == "completed (files gone)"; r.Gone != gone || (r.Deco == "line-through") != gone {
			t.Errorf("checkpoint %s (%s): path marked gone %v, text-decoration %q", r.ID, r.Status, r.Gone, r.Deco)
		}
		if r.Select != "all" {
			t.Errorf("checkpoint %s: path user-select %q, want all (one click selects it)", r.ID, r.Select)
		}
	}
}
