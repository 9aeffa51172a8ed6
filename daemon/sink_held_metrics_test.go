package daemon_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgedio/edged/daemon"
	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/mqtt"
)

// The results an MQTT sink holds while its broker is away show in
// /metrics, per sink subtask: they grow while the broker is down (the
// node's sink broker is the broker of its first pipeline, "other", which
// is closed while readings arrive from another broker) and fall back to
// 0 once the broker is back and has taken them.
func TestSinkResultsHeldInMetrics(t *testing.T) {
	src := externalBroker(t)
	out, err := mqtt.NewBroker(mqtt.BrokerConfig{Address: "127.0.0.1:0", Filters: []string{"#"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := out.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	outAddr := out.Addr()
	// Closed after the node stopped (cleanups run last first).
	t.Cleanup(func() { out.Close() })
	dir := t.TempDir()
	n := startNode(t, fmt.Sprintf(`
node:
  data_dir: %[1]s
pipelines:
  - name: other
    source:
      mqtt:
        broker: tcp://%[2]s
        topics: [other/+]
        format: json
        fields:
          id: {type: string, path: $.id}
    key: id
    sinks: [{stdout: {}}]
  - name: plant
    source:
      mqtt:
        broker: %[3]s
        topics: [sensors/+/temperature]
        qos: 1
        format: json
        fields:
          id: {type: string, path: $.sensor}
          temp: {type: float, path: $.t}
    key: id
    sinks: [{mqtt: {topic: "rows/{id}"}}]
    checkpoint: {dir: %[4]s, interval: 200ms, mode: exactly_once}
`, filepath.Join(dir, "data"), outAddr, src, filepath.Join(dir, "checkpoints")), daemon.Options{})
	testutil.Eventually(t, waitLimit, "both pipelines subscribed", func() bool {
		return strings.Count(n.logs.String(), "mqtt subscriber subscribed") >= 2
	})
	dev := mqttClient(t, src, "device")
	publish := func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			if tok := dev.Publish(fmt.Sprintf("sensors/s%d/temperature", i), 1, false, fmt.Sprintf(`{"sensor":"s%d","t":%d}`, i, i)); !tok.WaitTimeout(waitLimit) || tok.Error() != nil {
				t.Fatalf("publish: %v", tok.Error())
			}
		}
	}
	held := func() string {
		return metric(t, n.addr, `edged_sink_results_held{job="plant",sink="sink-0-rows",subtask="0"}`)
	}
	// Published while the broker is up: nothing waits.
	publish(0, 3)
	testutil.Eventually(t, waitLimit, "the sink's subtask reported, holding nothing", func() bool { return held() == "0" })

	out.Close()
	publish(3, 8)
	testutil.Eventually(t, waitLimit, "the results held while the sink's broker is down counted", func() bool {
		// The 5 new results, with the latest publish before the
		// failure, which goes out again first.
		return held() == "8"
	})

	out, err = mqtt.NewBroker(mqtt.BrokerConfig{Address: outAddr, Filters: []string{"#"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := out.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, waitLimit, "the held results published once the broker is back", func() bool { return held() == "0" })
}
