package daemon_test

import (
	"strings"
	"testing"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgedio/edged/daemon"
	"github.com/edgedio/edged/internal/testutil"
)

// node.memory.broker_client_subscriptions bounds the topic filters one
// client of the embedded broker holds: past it a filter is refused in the
// SUBACK, and /metrics counts it in
// edged_broker_subscriptions_refused_total; the connections refused over
// node.memory.broker_connections are counted beside it.
func TestBrokerClientSubscriptionsBound(t *testing.T) {
	y := mqttDemo(t)
	y = strings.Replace(y, "node:\n", "node:\n  memory: {broker_client_subscriptions: 2, broker_connections: 50}\n", 1)
	n := startNode(t, y, daemon.Options{})
	if !strings.Contains(n.logs.String(), "broker_connections=50 broker_client_subscriptions=2") {
		t.Fatalf("the memory settings logged lack the broker's bounds:\n%s", n.logs.String())
	}
	dev := mqttClient(t, "tcp://"+brokerOf(t, y), "subscribing-device")
	tok := dev.SubscribeMultiple(map[string]byte{"a/#": 1, "b/#": 1, "c/#": 1}, func(paho.Client, paho.Message) {})
	if !tok.WaitTimeout(waitLimit) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	refused := 0
	for _, code := range tok.(*paho.SubscribeToken).Result() {
		if code == 0x80 {
			refused++
		}
	}
	if refused != 1 {
		t.Fatalf("SUBACK codes %v: %d refused, want 1", tok.(*paho.SubscribeToken).Result(), refused)
	}
	testutil.Eventually(t, waitLimit, "the refused filter counted", func() bool {
		return metric(t, n.addr, "edged_broker_subscriptions_refused_total") == "1"
	})
	if m := metric(t, n.addr, "edged_broker_connections_refused_total"); m != "0" {
		t.Fatalf("edged_broker_connections_refused_total = %q, want 0", m)
	}
}
