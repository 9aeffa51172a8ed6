package daemon_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/edgedio/edged/daemon"
)

// A node stopped and started again four times keeps the newest two of
// the savepoints it took at its stops and deletes the older ones; a
// savepoint asked for through the API is kept, and every start resumes
// from the newest stop savepoint.
func TestNodeKeepsItsNewestStopSavepoints(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "cp")
	cfg := tickingConfig("ticking", dir)
	ctx := ctxT(t)
	var stops []string // every stop savepoint, in order
	var asked string
	for run := range 4 {
		n := startNode(t, cfg, daemon.Options{})
		if run > 0 && !strings.Contains(n.logs.String(), "resuming from the latest snapshot") {
			t.Fatalf("run %d did not resume:\n%s", run, n.logs.String())
		}
		if run == 0 {
			p, err := n.client.Savepoint(ctx, "ticking", "")
			if err != nil {
				t.Fatal(err)
			}
			asked = p
		}
		n.cancel()
		if err := n.wait(t); err != nil {
			t.Fatalf("run %d: %v", run, err)
		}
		before := savepointsIn(t, dir)
		var found string
		for _, p := range before {
			if p != asked && !slices.Contains(stops, p) {
				found = p
			}
		}
		if found == "" {
			t.Fatalf("run %d: no new stop savepoint in %v", run, before)
		}
		stops = append(stops, found)
		want := []string{asked}
		want = append(want, stops[max(0, len(stops)-2):]...)
		slices.Sort(want)
		if !slices.Equal(before, want) {
			t.Fatalf("after stop %d: savepoints %v, want %v (the asked one and the newest two stop savepoints)", run+1, before, want)
		}
	}
}

// savepointsIn returns the savepoint directories under dir/savepoints,
// sorted.
func savepointsIn(t *testing.T, dir string) []string {
	t.Helper()
	des, err := os.ReadDir(filepath.Join(dir, "savepoints"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, de := range des {
		out = append(out, filepath.Join(dir, "savepoints", de.Name()))
	}
	slices.Sort(out)
	return out
}
