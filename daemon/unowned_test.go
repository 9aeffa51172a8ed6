package daemon_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgedio/edged/daemon"
)

func writeTestFile(t *testing.T, path string, size int) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, make([]byte, size), 0o644); err != nil {
		t.Fatal(err)
	}
}

// A renamed pipeline leaves its ingest log and checkpoints behind: the
// node warns about each at start, says what it holds, and deletes
// nothing.
func TestStartWarnsAboutUnownedIngestLogsAndCheckpoints(t *testing.T) {
	data := t.TempDir()
	oldLog := filepath.Join(data, "ingest", "old-name")
	writeTestFile(t, filepath.Join(oldLog, "00000000000000000042.seg"), 1000)
	writeTestFile(t, filepath.Join(oldLog, "00000000000000000090.seg"), 500)
	oldCkp := filepath.Join(data, "checkpoints", "old-name")
	writeTestFile(t, filepath.Join(oldCkp, "LAYOUT"), 10)
	writeTestFile(t, filepath.Join(oldCkp, "checkpoints", "chk-7", "_metadata"), 90)
	writeTestFile(t, filepath.Join(oldCkp, "savepoints", "sp-3-1", "_metadata"), 100)
	notAStore := filepath.Join(data, "checkpoints", "notes")
	writeTestFile(t, filepath.Join(notAStore, "readme"), 5)

	cfg := `
node:
  data_dir: ` + data + `
pipelines:
  - name: new-name
    source: {generator: {count: 10}}
    sinks: [{stdout: {}}]
    checkpoint: {dir: ` + filepath.Join(data, "checkpoints", "new-name") + `}
`
	n := startNode(t, cfg, daemon.Options{})
	if err := n.wait(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
	logs := n.logs.String()
	var ingest, ckp []string
	for _, l := range strings.Split(logs, "\n") {
		switch {
		case strings.Contains(l, "ingest log owned by no configured pipeline"):
			ingest = append(ingest, l)
		case strings.Contains(l, "checkpoint dir owned by no configured pipeline"):
			ckp = append(ckp, l)
		}
	}
	if len(ingest) != 1 || !strings.Contains(ingest[0], "level=WARN") || !strings.Contains(ingest[0], "dir="+oldLog) ||
		!strings.Contains(ingest[0], "segments=2") || !strings.Contains(ingest[0], "bytes=1500") || !strings.Contains(ingest[0], "first_offset=42") {
		t.Errorf("ingest warnings: %q\nlogs:\n%s", ingest, logs)
	}
	if len(ckp) != 1 || !strings.Contains(ckp[0], "level=WARN") || !strings.Contains(ckp[0], "dir="+oldCkp) ||
		!strings.Contains(ckp[0], "checkpoints=1") || !strings.Contains(ckp[0], "savepoints=1") || !strings.Contains(ckp[0], "bytes=200") {
		t.Errorf("checkpoint warnings: %q\nlogs:\n%s", ckp, logs)
	}
	for _, p := range []string{oldLog, oldCkp, notAStore} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s: %v (nothing may be deleted)", p, err)
		}
	}
}
