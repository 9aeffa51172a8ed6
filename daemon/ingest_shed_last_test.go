package daemon_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgedio/edged/daemon"
	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/mqtt/ingestlog"
)

// The node's only pipeline ends (cancelled here; failed for good alike)
// while its full ingest log holds devices back: the node exits, and the
// pipeline runs again when it restarts. The readings held back are not
// acknowledged: the devices send them again to the restarted node. No
// other pipeline runs, so the log does not shed: shedding would
// acknowledge the held readings and store them nowhere.
func TestLastPipelineEndingWithAFullLogAcknowledgesNothingUnstored(t *testing.T) {
	broker := freeAddr(t)
	dir := t.TempDir()
	dataDir := filepath.Join(dir, "data")
	yml := fmt.Sprintf(`node:
  data_dir: %s
  broker: %s
pipelines:
  - name: only
    source:
      mqtt:
        topics: [sensors/#]
        qos: 1
        format: json
        log_max_bytes: 4194304
        max_message_bytes: 65536
        fields:
          id: {type: string, path: $.sensor}
          pad: {type: string, path: $.pad}
    sinks:
      - file: {dir: %s}
    checkpoint: {dir: %s, interval: 1h}
`, dataDir, broker, filepath.Join(dir, "out"), filepath.Join(dir, "cp"))
	n := startNode(t, yml, daemon.Options{})

	dev := mqttClient(t, "tcp://"+broker, "device-1")
	pad := strings.Repeat("x", 1000)
	reading := func(i int) paho.Token {
		return dev.Publish(fmt.Sprintf("sensors/%d", i%10), 1, false, fmt.Appendf(nil, `{"sensor":"s%d","pad":"%s"}`, i, pad))
	}
	// The file sink asks for a checkpoint as soon as it holds its first
	// output, without waiting for the interval: that one releases what
	// the source read before its barrier. Let it pass with one reading
	// first, so that none of the 5,000 below is released.
	if tok := reading(0); !tok.WaitTimeout(waitLimit) || tok.Error() != nil {
		t.Fatalf("first reading: %v", tok.Error())
	}
	testutil.Eventually(t, waitLimit, "the first checkpoint to complete", func() bool {
		cps, err := n.client.Checkpoints(ctxT(t), "only")
		return err == nil && len(cps) > 0 && cps[len(cps)-1].Status == "completed"
	})

	// 5,000 readings of 1 KB: more than the log holds, and no checkpoint
	// releases any of it.
	const readings = 5000
	toks := make([]paho.Token, 0, readings)
	for i := 1; i <= readings; i++ {
		toks = append(toks, reading(i))
	}
	// Full, and holding the device back: an append waits for room.
	if !testutil.Within(waitLimit, func() bool {
		return strings.Contains(n.logs.String(), "ingest log full: appends wait")
	}) {
		t.Fatalf("the log did not fill: %s bytes\n%s", metric(t, n.addr, `edged_ingest_log_bytes{pipeline="only"}`), n.logs.String())
	}
	if _, err := n.client.Cancel(context.Background(), "only"); err != nil {
		t.Fatalf("cancel: %v", err)
	}
	// The node ends with its last pipeline.
	err := testutil.Receive(t, 0, "the node to end with its last pipeline", n.errc)
	n.errc <- err // for startNode's cleanup

	acked := 1 // the first reading
	for _, tok := range toks {
		if tok.WaitTimeout(waitLimit) && tok.Error() == nil {
			acked++
		}
	}
	lg, err := ingestlog.Open(filepath.Join(dataDir, "ingest", "only"), ingestlog.DefaultOptions(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer lg.Close()
	// Offsets are dense from 0: every reading appended, released by a
	// checkpoint since or not.
	stored := int(lg.Stats().NextOffset)
	if acked > stored {
		t.Fatalf("%d readings acknowledged, %d stored in the log: %d acknowledged and stored nowhere\n%s",
			acked, stored, acked-stored, n.logs.String())
	}
}
