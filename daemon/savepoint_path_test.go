package daemon_test

import (
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgedio/edged/daemon"
)

// A relative savepoint path that leaves the job's savepoints/ ("../x") or
// names it (".") is the caller's mistake, and so is a path with a NUL
// byte or a name too long, or an absolute path where no directory can be
// (/dev/null, a file, a path under a file): refused with 400 before any
// savepoint begins, for a savepoint and a stop alike, so the job's
// checkpoint history gains no failed savepoint for it and the job runs on.
func TestSavepointPathLeavingSavepointsIsABadRequest(t *testing.T) {
	dir := t.TempDir()
	n := startNode(t, tickingConfig("ticking", filepath.Join(dir, "cp")), daemon.Options{})
	ctx := ctxT(t)
	// savepoints/ itself, a NUL byte, a name or path too long for the
	// file system: the caller's mistakes too.
	// And absolute paths where no directory can be: a device, a regular
	// file, a path under a file.
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"../x", "a/../../x", "..", ".", "a/..", "a\x00b", "/tmp/a\x00b",
		strings.Repeat("x", 256), strings.Repeat("x/", 2048), "/dev/null", file, filepath.Join(file, "x", "y"),
		// The job's own checkpoints directory, or a checkpoint's to come.
		filepath.Join(dir, "cp", "checkpoints"), filepath.Join(dir, "cp", "checkpoints", "chk-100000")} {
		for _, stop := range []bool{false, true} {
			var err error
			if stop {
				_, err = n.client.Stop(ctx, "ticking", p)
			} else {
				_, err = n.client.Savepoint(ctx, "ticking", p)
			}
			var apiErr *daemon.APIError
			if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || !strings.Contains(err.Error(), "snapshot: invalid name") {
				t.Errorf("path %q (stop %v): %v, want 400 naming snapshot: invalid name", p, stop, err)
			}
		}
	}
	cps, err := n.client.Checkpoints(ctx, "ticking")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cps {
		if c.Kind == "savepoint" {
			t.Errorf("savepoint %d in the history (%s, %s): a refused path must begin none", c.ID, c.Status, c.Error)
		}
	}
	jobs, err := n.client.Jobs(ctx)
	if err != nil || len(jobs) != 1 || jobs[0].Status != daemon.StatusRunning {
		t.Fatalf("jobs = %+v, %v; want ticking running", jobs, err)
	}
	// A path under savepoints/ is taken there.
	sp, err := n.client.Savepoint(ctx, "ticking", "a/../b")
	if err != nil || sp != filepath.Join(dir, "cp", "savepoints", "b") {
		t.Fatalf("savepoint a/../b = %q, %v; want %s", sp, err, filepath.Join(dir, "cp", "savepoints", "b"))
	}
}
