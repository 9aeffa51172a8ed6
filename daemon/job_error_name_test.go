package daemon_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgedio/edged/daemon"
)

// A job that fails names itself once in the node's error. A task's
// failure already starts with the job's name (`job "gen": operator …
// failed`); before, the node put it in front a second time (`job "gen":
// job "gen": operator …`).
func TestFailedJobNamedOnceInTheNodesError(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "cp")
	config := func(par string) string {
		return `
pipelines:
  - name: gen
    parallelism: ` + par + `
    source:
      generator: {count: 0, rate: 200, keys: 4}
    key: id
    window:
      type: tumbling
      size: 1h
      aggregates: [{name: n, fn: count}]
    sinks:
      - stdout: {}
    checkpoint:
      interval: 50ms
      dir: ` + dir + "\n"
	}
	checkpointAndStop(t, config("2"), "gen")
	// A generator cannot go from parallelism 2 to 3: its source task
	// fails the restore.
	n := startNode(t, config("3"), daemon.Options{})
	err := n.wait(t)
	if err == nil || !strings.Contains(err.Error(), `operator "gen/source"`) {
		t.Fatalf("Run: %v; want the source task's failure", err)
	}
	if c := strings.Count(err.Error(), `job "gen"`); c != 1 {
		t.Errorf("Run: %v; names the job %d times, want once", err, c)
	}
}
