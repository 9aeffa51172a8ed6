package daemon_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/edgedio/edged/daemon"
	"github.com/edgedio/edged/internal/testutil"
)

// /metrics exports edged_file_source_resets_total for each pipeline that
// reads a file, and for no other (pipeline.Job.FileSourceResets; the
// count is tested in the pipeline package).
func TestFileSourceResetsInMetrics(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "in.csv")
	if err := os.WriteFile(path, []byte("s1,1547718199,20.5\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	n := startNode(t, fmt.Sprintf(`
node:
  data_dir: %s
pipelines:
  - name: file
    source:
      file: {path: %s, format: csv, fields: {id: string, ts: {type: time, unit: s}, temp: float}}
    sinks: [{stdout: {}}]
  - name: gen
    source:
      generator: {rate: 10}
    sinks: [{stdout: {}}]
`, filepath.Join(dir, "data"), path), daemon.Options{})
	testutil.Eventually(t, waitLimit, "the file pipeline in /metrics", func() bool {
		return metric(t, n.addr, `edged_file_source_resets_total{pipeline="file"}`) == "0"
	})
	if m := metric(t, n.addr, `edged_file_source_resets_total{pipeline="gen"}`); m != "" {
		t.Errorf(`edged_file_source_resets_total{pipeline="gen"} = %q, want none (it reads no file)`, m)
	}
}
