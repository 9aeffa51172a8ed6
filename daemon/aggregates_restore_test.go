package daemon_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgedio/edged/daemon"
	"github.com/edgedio/edged/internal/testutil"
)

// A node restarted with other aggregates than its snapshot's windows hold
// refuses the restore with the reason (its windows keep one slot per
// aggregate, by position: reading them under other functions gave wrong
// values for every window open at the stop); one restarted with only
// the aggregates' names changed resumes.
func TestRestoreRefusesChangedAggregates(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "cp")
	size := "1h"
	config := func(aggs string) string {
		return `
pipelines:
  - name: agg
    source:
      generator: {count: 0, rate: 200, keys: 4}
    key: id
    window:
      type: tumbling
      size: ` + size + `
      aggregates: ` + aggs + `
    sinks:
      - stdout: {}
    checkpoint:
      interval: 50ms
      dir: ` + dir + "\n"
	}
	checkpointAndStop(t, config(`[{name: n, fn: count}, {name: s, fn: sum, field: temp}]`), "agg")

	// Renamed only: resumes.
	n := checkpointAndStop(t, config(`[{name: readings, fn: count}, {name: total, fn: sum, field: temp}]`), "agg")
	if !strings.Contains(n.logs.String(), "resuming from the latest snapshot") {
		t.Fatalf("the renamed aggregates did not resume:\n%s", n.logs.String())
	}

	// Another function in a slot: refused at once, with the operator and
	// both settings named; the node, whose only job failed, exits with it.
	n = startNode(t, config(`[{name: readings, fn: count}, {name: top, fn: max, field: temp}]`), daemon.Options{})
	err := n.wait(t)
	for _, want := range []string{"agg/window", "aggregates count() sum(temp)", "aggregates count() max(temp)", "incompatible",
		// and how to start the changed pipeline without that state
		"the latest snapshot under its checkpoint.dir \"" + dir + "\"", "move that directory away or give the pipeline another checkpoint.dir"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Run: %v; want it to name %q", err, want)
		}
	}
	if !strings.Contains(n.logs.String(), "attempts=0") {
		t.Errorf("the restore was retried:\n%s", n.logs.String())
	}

	// The window's size cuts its slices: another size is refused too.
	size = "30m"
	n = startNode(t, config(`[{name: readings, fn: count}, {name: total, fn: sum, field: temp}]`), daemon.Options{})
	err = n.wait(t)
	for _, want := range []string{"agg/window", "size=3600000ms", "size=1800000ms", "incompatible"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Run with another window size: %v; want it to name %q", err, want)
		}
	}
}

// The alerts keep each alert's progress by position: a restart with the
// alerts reordered is refused; one with a condition changed resumes.
func TestRestoreRefusesReorderedAlerts(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "cp")
	config := func(alerts string) string {
		return `
pipelines:
  - name: al
    source:
      generator: {count: 0, rate: 200, keys: 4}
    key: id
    alerts: ` + alerts + `
    sinks:
      - stdout: {}
    checkpoint:
      interval: 50ms
      dir: ` + dir + "\n"
	}
	checkpointAndStop(t, config(`[{name: hot, when: temp > 38, for: 1h}, {name: cold, when: temp < 21, for: 1h}]`), "al")
	n := checkpointAndStop(t, config(`[{name: hot, when: temp > 35, for: 1h}, {name: cold, when: temp < 21, for: 2h}]`), "al")
	if !strings.Contains(n.logs.String(), "resuming from the latest snapshot") {
		t.Fatalf("changed conditions did not resume:\n%s", n.logs.String())
	}
	n = startNode(t, config(`[{name: cold, when: temp < 21, for: 1h}, {name: hot, when: temp > 35, for: 1h}]`), daemon.Options{})
	err := n.wait(t)
	if err == nil || !strings.Contains(err.Error(), `; alerts hot,cold"`) || !strings.Contains(err.Error(), `; alerts cold,hot"`) {
		t.Fatalf("Run: %v; want the reordered alerts refused", err)
	}
}

// checkpointAndStop runs a node of cfg until job completed a checkpoint,
// then stops it (a savepoint on the way out) and returns it.
func checkpointAndStop(t *testing.T, cfg, job string) *node {
	t.Helper()
	n := startNode(t, cfg, daemon.Options{})
	testutil.Eventually(t, waitLimit, "a checkpoint completed", func() bool {
		cps, err := n.client.Checkpoints(ctxT(t), job)
		return err == nil && len(cps) > 0 && cps[len(cps)-1].Status == "completed"
	})
	n.cancel()
	if err := n.wait(t); err != nil {
		t.Fatal(err)
	}
	return n
}
