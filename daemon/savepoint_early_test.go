package daemon_test

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgedio/edged/daemon"
	"github.com/edgedio/edged/pipeline"
)

// A --from-savepoint path that holds no savepoint is refused before the
// node starts anything, also for a config of one pipeline: the embedded
// broker never listens (no device is acknowledged into an ingest log of
// a node that is about to exit) and no ingest log is created.
func TestBadSavepointRefusedBeforeTheBrokerStarts(t *testing.T) {
	dir := t.TempDir()
	damaged := filepath.Join(dir, "damaged")
	if err := os.MkdirAll(damaged, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, sp := range []string{filepath.Join(dir, "missing"), damaged} {
		data := filepath.Join(dir, "data-"+filepath.Base(sp))
		cfg, err := pipeline.Parse([]byte(fmt.Sprintf(`
node:
  data_dir: %s
  broker: 127.0.0.1:0
pipelines:
  - name: only
    source:
      mqtt:
        topics: [sensors/+/temperature]
        format: json
        fields:
          id: {type: string, path: $.sensor}
          ts: {type: time, path: $.ts, unit: ms}
    event_time: {field: ts}
    key: id
    window:
      type: tumbling
      size: 1s
      aggregates: [{name: n, fn: count}]
    sinks:
      - stdout: {}
    checkpoint: {dir: %s, interval: 100ms}
`, data, filepath.Join(dir, "cp"))))
		if err != nil {
			t.Fatal(err)
		}
		var logs bytes.Buffer
		err = daemon.Run(ctxT(t), cfg, daemon.Options{Listen: "127.0.0.1:0", Savepoint: sp,
			Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		if err == nil || !strings.HasPrefix(err.Error(), "daemon: savepoint: ") {
			t.Fatalf("Run with --from-savepoint %s: %v, want a savepoint error", sp, err)
		}
		if strings.Contains(logs.String(), "mqtt broker started") {
			t.Errorf("--from-savepoint %s: the broker started before the savepoint was refused:\n%s", sp, logs.String())
		}
		if _, err := os.Stat(filepath.Join(data, "ingest")); !os.IsNotExist(err) {
			t.Errorf("--from-savepoint %s: ingest dir exists (%v): the node opened its logs before refusing the savepoint", sp, err)
		}
	}
}
