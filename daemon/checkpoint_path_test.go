package daemon_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgedio/edged/daemon"
	"github.com/edgedio/edged/internal/testutil"
)

// GET /jobs/{name}/checkpoints gives every completed checkpoint, not only
// savepoints, its directory (what the dashboard's checkpoint table and
// edged checkpoints show), and that path, passed as --from-savepoint
// (daemon.Options.Savepoint), starts the job from that checkpoint.
func TestCompletedCheckpointsHaveTheirPath(t *testing.T) {
	dir := t.TempDir()
	cp := filepath.Join(dir, "cp")
	yml := tickingConfig("ticking", cp)
	n := startNode(t, yml, daemon.Options{})
	ctx := ctxT(t)
	var completed []daemon.CheckpointInfo
	testutil.Eventually(t, waitLimit, "two completed checkpoints", func() bool {
		cps, err := n.client.Checkpoints(ctx, "ticking")
		if err != nil {
			t.Fatal(err)
		}
		completed = completed[:0]
		for _, c := range cps {
			if c.Kind == "checkpoint" && c.Status == "completed" {
				completed = append(completed, c)
			}
		}
		return len(completed) >= 2
	})
	for _, c := range completed {
		if want := filepath.Join(cp, "checkpoints", fmt.Sprintf("chk-%d", c.ID)); c.Path != want {
			t.Errorf("checkpoint %d has path %q, want %q", c.ID, c.Path, want)
		}
	}
	n.cancel()
	if err := n.wait(t); err != nil {
		t.Fatal(err)
	}
	// Retention keeps the newest ones: start from the newest listed that
	// is still there.
	var from daemon.CheckpointInfo
	for _, c := range completed {
		if _, err := os.Stat(filepath.Join(c.Path, "_metadata")); err == nil {
			from = c
		}
	}
	if from.Path == "" {
		t.Fatalf("none of the listed checkpoints is still on disk: %+v", completed)
	}
	n2 := startNode(t, yml, daemon.Options{Savepoint: from.Path})
	want := `msg="job started" job=ticking checkpointing=true restored_from=` + from.Path
	if !testutil.Within(waitLimit, func() bool { return strings.Contains(n2.logs.String(), want) }) {
		t.Fatalf("the node started from %s logs no %q:\n%s", from.Path, want, n2.logs.String())
	}
}
