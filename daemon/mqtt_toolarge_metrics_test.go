package daemon_test

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgedio/edged/daemon"
	"github.com/edgedio/edged/internal/testutil"
)

// Messages over max_message_bytes show in /metrics: the embedded broker's
// packets over the bound and dead-letter records, and a subscriber's dead-letter records of an external
// broker's messages (which are also the job's dead letters).
func TestTooLargeMessagesInMetrics(t *testing.T) {
	big := `{"sensor":"s1","t":1,"ts":1000,"pad":"` + strings.Repeat("x", 4096) + `"}`

	t.Run("embedded broker", func(t *testing.T) {
		y := mqttDemo(t)
		if !strings.Contains(y, "        qos: 1\n") {
			t.Fatal("mqtt-demo.yaml's source has no qos: 1 line")
		}
		y = strings.Replace(y, "        qos: 1\n", "        qos: 1\n        max_message_bytes: 1024\n", 1)
		n := startNode(t, y, daemon.Options{})
		if m := metric(t, n.addr, "edged_broker_packets_too_large_total"); m != "0" {
			t.Fatalf("edged_broker_packets_too_large_total = %q before, want 0", m)
		}
		broker := brokerOf(t, y)
		dev := mqttClient(t, "tcp://"+broker, "big-device")
		// An MQTT 3.1.1 device: the broker cuts the message to its dead
		// letter and acknowledges it.
		if tok := dev.Publish("sensors/s1/temperature", 1, false, big); !tok.WaitTimeout(waitLimit) || tok.Error() != nil {
			t.Fatalf("the message over the bound was not acknowledged: %v", tok.Error())
		}
		testutil.Eventually(t, waitLimit, "the message over the bound counted", func() bool {
			return metric(t, n.addr, "edged_broker_packets_too_large_total") == "1" &&
				metric(t, n.addr, "edged_broker_dead_letters_total") == "1"
		})
	})

	t.Run("external broker", func(t *testing.T) {
		url := externalBroker(t)
		dir := t.TempDir()
		n := startNode(t, fmt.Sprintf(`
node:
  data_dir: %s
pipelines:
  - name: big
    source:
      mqtt:
        broker: %s
        topics: [sensors/+/temperature]
        max_message_bytes: 1024
        format: json
        fields:
          id: {type: string, path: $.sensor}
          temp: {type: float, path: $.t}
    key: id
    sinks: [{stdout: {}}]
`, filepath.Join(dir, "data"), url), daemon.Options{})
		testutil.Eventually(t, waitLimit, "the node subscribed", func() bool {
			return strings.Contains(n.logs.String(), "mqtt subscriber subscribed")
		})
		dev := mqttClient(t, url, "big-device")
		if tok := dev.Publish("sensors/s1/temperature", 1, false, big); !tok.WaitTimeout(waitLimit) || tok.Error() != nil {
			t.Fatalf("publish: %v", tok.Error())
		}
		testutil.Eventually(t, waitLimit, "the message counted too large and as a dead letter", func() bool {
			return metric(t, n.addr, `edged_mqtt_messages_too_large_total{pipeline="big"}`) == "1" &&
				metric(t, n.addr, `edged_job_dead_letters_total{job="big"}`) == "1"
		})
	})
}

// brokerOf returns node.broker of a config written by mqttDemo.
func brokerOf(t *testing.T, y string) string {
	t.Helper()
	for _, l := range strings.Split(y, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "broker: "); ok {
			return strings.Fields(v)[0]
		}
	}
	t.Fatal("no broker in the config")
	return ""
}
