package daemon_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/edgedio/edged/daemon"
)

// A node whose checkpoint.dir is relative to its working directory
// answers a savepoint and a stop with the savepoint's absolute path, so
// the path the CLI prints is the savepoint's from any directory (the
// CLI's own, which `edged run --from-savepoint` resolves it against).
func TestSavepointResultPathIsAbsolute(t *testing.T) {
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	n := startNode(t, tickingConfig("ticking", "cp"), daemon.Options{})
	ctx := ctxT(t)
	sp, err := n.client.Savepoint(ctx, "ticking", "")
	if err != nil {
		t.Fatal(err)
	}
	stopped, err := n.client.Stop(ctx, "ticking", "")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{sp, stopped} {
		if !filepath.IsAbs(p) || filepath.Dir(p) != filepath.Join(dir, "cp", "savepoints") {
			t.Errorf("savepoint path %q: want an absolute path under %s", p, filepath.Join(dir, "cp", "savepoints"))
		}
		if _, err := os.Stat(filepath.Join(p, "_metadata")); err != nil {
			t.Errorf("savepoint %q: %v", p, err)
		}
	}
	if err := n.wait(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
}
