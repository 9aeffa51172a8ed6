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
	n := startNode(t, blockedPipeline(t, ""), daemon.Options{})
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

// A savepoint asked of a job that is restarting waits for an attempt to
// take it; when none does within the node's stop timeout, the answer
// (504) says that the job is restarting and why, not only "context
// deadline exceeded": `edged savepoint` of a job whose every attempt
// failed printed `savepoint of job "p": context deadline exceeded (HTTP
// 504)` after a minute, with no word of the failures.
func TestSavepointOfARestartingJobNamesItsFailure(t *testing.T) {
	ck := filepath.Join(t.TempDir(), "ck")
	n := startNode(t, blockedPipeline(t, "    checkpoint: {dir: "+ck+", interval: 1s}\n"), daemon.Options{StopTimeout: 500 * time.Millisecond})
	ctx := ctxT(t)
	testutil.Eventually(t, 0, "the job restarting", func() bool {
		jobs, err := n.client.Jobs(ctx)
		return err == nil && len(jobs) == 1 && jobs[0].Status == daemon.StatusRestarting
	})
	for _, op := range []string{"savepoint", "stop"} {
		var err error
		if op == "stop" {
			_, err = n.client.Stop(ctx, "blocked", "")
		} else {
			_, err = n.client.Savepoint(ctx, "blocked", "")
		}
		if err == nil || !strings.Contains(err.Error(), "504") || !strings.Contains(err.Error(), "restarting") || !strings.Contains(err.Error(), "file sink") {
			t.Fatalf("%s of a restarting job: %v; want a 504 saying the job is restarting, and why", op, err)
		}
	}
}

// blockedPipeline returns the config of a pipeline "blocked" whose every
// attempt fails when its file sink opens (it cannot make its directory
// under a regular file), restarting after 1 h, with the config lines
// more.
func blockedPipeline(t *testing.T, more string) string {
	t.Helper()
	blocker := filepath.Join(t.TempDir(), "a-file")
	if err := os.WriteFile(blocker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return `
pipelines:
  - name: blocked
    source:
      generator: {count: 0, rate: 100, keys: 2}
    sinks:
      - file: {dir: ` + filepath.Join(blocker, "out") + `}
` + more + `    restart: {strategy: fixed_delay, attempts: 3, delay: 1h}
`
}
