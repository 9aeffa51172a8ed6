package daemon_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgedio/edged/daemon"
	"github.com/edgedio/edged/internal/testutil"
)

// A job whose attempts fail shows as restarting, with why, while it waits
// out its restart delay; before, GET /jobs said running.
func TestAPIShowsARestartingJob(t *testing.T) {
	dir := t.TempDir()
	blocker := filepath.Join(dir, "a-file")
	if err := os.WriteFile(blocker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// The file sink cannot make its directory under a regular file: every
	// attempt fails when the sink opens.
	cfg := `
pipelines:
  - name: blocked
    source:
      generator: {count: 0, rate: 100, keys: 2}
    sinks:
      - file: {dir: ` + filepath.Join(blocker, "out") + `}
    restart: {strategy: fixed_delay, attempts: 3, delay: 1h}
`
	n := startNode(t, cfg, daemon.Options{})
	ctx := ctxT(t)
	var got daemon.JobInfo
	testutil.Eventually(t, 0, "the job restarting", func() bool {
		jobs, err := n.client.Jobs(ctx)
		if err != nil || len(jobs) != 1 {
			return false
		}
		got = jobs[0]
		return got.Status == daemon.StatusRestarting
	})
	if !strings.Contains(got.LastFailure, "file sink") || got.LastFailureAt == nil || time.Since(*got.LastFailureAt) > time.Minute {
		t.Fatalf("restarting job: %+v", got)
	}
}
