package daemon_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgedio/edged/daemon"
	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/operators"
)

// Two pipelines read the same topics from the embedded broker; one is
// stopped with a savepoint, the other runs on. The stopped one's log
// (4 MiB) takes its topics' readings until full, then stores no more,
// counted in edged_ingest_shed_total: the devices are not held back, and
// the running pipeline gets every reading. Before, once the stopped
// pipeline's log was full, every device publishing there waited for a
// PUBACK, and the running pipeline was fed nothing more.
func TestStoppedPipelinesFullLogHoldsNoDeviceBack(t *testing.T) {
	broker := freeAddr(t)
	dir := t.TempDir()
	pipe := func(name, extra string) string {
		return fmt.Sprintf(`
  - name: %s
    source:
      mqtt:
        topics: [sensors/#]
        qos: 1
        format: json%s
        fields:
          id: {type: string, path: $.sensor}
          pad: {type: string, path: $.pad}
    sinks:
      - file: {dir: %s}
    checkpoint: {dir: %s, interval: 50ms}`, name, extra, filepath.Join(dir, name, "out"), filepath.Join(dir, name, "cp"))
	}
	yml := fmt.Sprintf("node:\n  data_dir: %s\n  broker: %s\npipelines:%s%s\n", filepath.Join(dir, "data"), broker,
		pipe("stopped", "\n        log_max_bytes: 4194304\n        max_message_bytes: 65536"), pipe("running", ""))
	n := startNode(t, yml, daemon.Options{})
	ctx := context.Background()
	if _, err := n.client.Stop(ctx, "stopped", ""); err != nil {
		t.Fatalf("stop: %v", err)
	}

	// 6,000 readings of 1 KB: half again what the stopped pipeline's
	// log holds.
	const readings = 6000
	dev := mqttClient(t, "tcp://"+broker, "device-1")
	pad := strings.Repeat("x", 1000)
	var toks []paho.Token
	for i := range readings {
		toks = append(toks, dev.Publish(fmt.Sprintf("sensors/%d", i%10), 1, false, fmt.Appendf(nil, `{"sensor":"s%d","pad":"%s"}`, i, pad)))
		if len(toks) == 500 || i == readings-1 {
			for _, tok := range toks {
				if !tok.WaitTimeout(waitLimit) || tok.Error() != nil {
					t.Fatalf("reading %d not acknowledged within %v (%v): the device is held back", i, waitLimit, tok.Error())
				}
			}
			toks = toks[:0]
		}
	}
	shed := metric(t, n.addr, `edged_ingest_shed_total{pipeline="stopped"}`)
	if shed == "" || shed == "0" {
		t.Fatalf("edged_ingest_shed_total of the stopped pipeline = %q, want readings shed", shed)
	}
	if m := metric(t, n.addr, `edged_ingest_shed_total{pipeline="running"}`); m != "0" {
		t.Fatalf("edged_ingest_shed_total of the running pipeline = %q, want 0", m)
	}
	if !testutil.Within(waitLimit, func() bool { return countLines(t, filepath.Join(dir, "running", "out", "rows")) == readings }) {
		t.Fatalf("the running pipeline wrote %d readings, want %d\n%s", countLines(t, filepath.Join(dir, "running", "out", "rows")), readings, n.logs.String())
	}
	if logs := n.logs.String(); !strings.Contains(logs, "pipeline no longer runs: its ingest log keeps") ||
		!strings.Contains(logs, "ingest log full and its pipeline does not run") {
		t.Fatalf("the shedding is not logged:\n%s", n.logs.String())
	}
}

// countLines returns the number of lines in the committed part files of
// the file sink's directory dir.
func countLines(t *testing.T, dir string) int {
	t.Helper()
	parts, err := operators.CommittedParts(dir)
	if err != nil {
		return 0 // not created yet
	}
	n := 0
	for _, p := range parts {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		n += bytes.Count(b, []byte("\n"))
	}
	return n
}
