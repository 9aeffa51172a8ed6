package dashboard_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/edgedio/edged/daemon"
	"github.com/edgedio/edged/internal/testutil"
)

// TestScreenshots writes PNGs of the job, checkpoint, ingest and cluster
// views into $EDGED_SCREENSHOTS (scripts/screenshots.sh sets it to
// docs/). The cluster view shows a fake cluster of four devices, one of
// them dead after a failover (newFakeCluster).
func TestScreenshots(t *testing.T) {
	dir := os.Getenv("EDGED_SCREENSHOTS")
	if dir == "" {
		t.Skip("EDGED_SCREENSHOTS not set: run scripts/screenshots.sh")
	}
	chromium(t)
	addr, broker := startDemoWith(t, daemon.Options{Cluster: newFakeCluster(t, 3)})
	ctx := browser(t, 1360, 900)
	publishBad(t, broker, `{"sensor":"s7","t":"warm","ts":1764590000000}`, `{"sensor":"s3","t":21.5`)
	run(t, ctx, "open the dashboard", chromedp.Navigate("http://"+addr+"/#checkpoints"),
		chromedp.WaitEnabled(`#btn-savepoint`, chromedp.ByQuery))
	testutil.Eventually(t, waitLimit, "a few checkpoints", func() bool {
		return evalInt(t, ctx, `document.querySelectorAll("#cp-chart rect.bar").length`) >= 8
	})
	run(t, ctx, "trigger a savepoint", chromedp.Click(`#btn-savepoint`, chromedp.ByQuery),
		chromedp.WaitVisible(`#confirm-ok`, chromedp.ByQuery), chromedp.Click(`#confirm-ok`, chromedp.ByQuery),
		chromedp.WaitVisible(`#savepoints li .path`, chromedp.ByQuery))
	testutil.Eventually(t, waitLimit, "more checkpoints after the savepoint", func() bool {
		return evalInt(t, ctx, `document.querySelectorAll("#cp-chart rect.bar").length`) >= 14
	})
	shot := func(name, view string) {
		var png []byte
		run(t, ctx, "screenshot "+name, chromedp.Evaluate(`location.hash = "#`+view+`"`, nil),
			chromedp.WaitVisible(`#view-`+view, chromedp.ByQuery))
		// Two polls, so the rates and the chart are filled in.
		n := evalInt(t, ctx, `Date.now()`)
		testutil.Eventually(t, waitLimit, "two polls", func() bool { return evalInt(t, ctx, `Date.now()`)-n > 2500 })
		run(t, ctx, "capture "+name, chromedp.FullScreenshot(&png, 100))
		if err := os.WriteFile(filepath.Join(dir, name), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	shot("dashboard-job.png", "job")
	shot("dashboard-checkpoints.png", "checkpoints")
	shot("dashboard-ingest.png", "ingest")
	shot("dashboard-cluster.png", "cluster")
}
