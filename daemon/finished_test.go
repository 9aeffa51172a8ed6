package daemon_test

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgedio/edged/daemon"
	"github.com/edgedio/edged/operators"
)

// windowCounts sums the counts of the committed window results under dir
// and returns them with the number of results.
func windowCounts(t *testing.T, dir string) (total int64, results int) {
	t.Helper()
	parts, err := operators.CommittedParts(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range parts {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			var w struct {
				Count int64 `json:"count"`
			}
			if err := json.Unmarshal(sc.Bytes(), &w); err != nil {
				t.Fatalf("%s: %q: %v", p, sc.Text(), err)
			}
			total += w.Count
			results++
		}
		f.Close()
	}
	return total, results
}

// A bounded generator pipeline with checkpoints and a file sink, started
// twice on the same data directory, commits each result once: the second
// start finds the job finished and runs nothing.
func TestFinishedPipelineDoesNotRunTwice(t *testing.T) {
	dir := t.TempDir()
	cfg := `
node:
  data_dir: ` + filepath.Join(dir, "data") + `
pipelines:
  - name: bounded
    source:
      generator: {count: 1000, rate: 0, keys: 10}
    event_time:
      field: ts
    key: id
    window:
      type: tumbling
      size: 10s
      aggregates: [{name: count, fn: count}]
    sinks:
      - file: {dir: ` + filepath.Join(dir, "out") + `}
    checkpoint:
      interval: 10ms
      dir: ` + filepath.Join(dir, "data", "checkpoints") + `
`
	windows := filepath.Join(dir, "out", "windows")
	var first int
	for run := range 2 {
		n := startNode(t, cfg, daemon.Options{})
		if err := n.wait(t); err != nil {
			t.Fatalf("run %d: %v", run, err)
		}
		total, results := windowCounts(t, windows)
		if total != 1000 {
			t.Fatalf("after run %d: window counts sum to %d over %d results, want 1000", run, total, results)
		}
		if run == 0 {
			first = results
		} else if results != first {
			t.Fatalf("run 1 changed the results: %d, then %d", first, results)
		}
		logs := n.logs.String()
		if finished := strings.Contains(logs, "job already finished"); finished != (run == 1) {
			t.Fatalf("run %d: logs say already finished: %v\n%s", run, finished, logs)
		}
		if !strings.Contains(logs, `msg="job finished" job=bounded status=finished`) {
			t.Fatalf("run %d: logs lack the finished job:\n%s", run, logs)
		}
	}
}
