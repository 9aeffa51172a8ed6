package dashboard_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/edgedio/edged/internal/testutil"
)

// screenshots writes PNGs of the job and checkpoint views into dir
// (scripts/screenshots.sh sets EDGED_SCREENSHOTS).
func screenshots(t *testing.T, ctx context.Context, dir string) {
	t.Helper()
	testutil.Eventually(t, waitLimit, "a few checkpoints in the chart", func() bool {
		return evalInt(t, ctx, `document.querySelectorAll("#cp-chart rect.bar").length`) >= 6
	})
	shot := func(name, view string) {
		var png []byte
		run(t, ctx, "screenshot "+name, chromedp.Navigate("about:blank"), chromedp.Navigate(chromeURL(t, ctx)+"#"+view),
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
}

var pageURL string

func chromeURL(t *testing.T, ctx context.Context) string {
	if pageURL == "" {
		run(t, ctx, "location", chromedp.Evaluate(`location.origin + "/"`, &pageURL))
	}
	return pageURL
}
