package daemon_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/edgedio/edged/daemon"
	"github.com/edgedio/edged/internal/testutil"
)

// node.memory.broker_retained_bytes bounds the embedded broker's retained
// messages: past it a retained message is not retained, and /metrics
// counts it in edged_broker_retained_refused_total.
func TestBrokerRetainedBytesBoundsRetainedMessages(t *testing.T) {
	y := mqttDemo(t)
	y = strings.Replace(y, "node:\n", "node:\n  memory: {broker_retained_bytes: 10KiB}\n", 1)
	n := startNode(t, y, daemon.Options{})
	if m := metric(t, n.addr, "edged_broker_retained_refused_total"); m != "0" {
		t.Fatalf("edged_broker_retained_refused_total = %q before, want 0", m)
	}
	dev := mqttClient(t, "tcp://"+brokerOf(t, y), "retaining-device")
	pad := strings.Repeat("x", 200)
	for i := range 10 { // 208 bytes and 2,304 of overhead each: four fit in 10 KiB, the last six do not
		if tok := dev.Publish(fmt.Sprintf("status/%d", i), 1, true, pad); !tok.WaitTimeout(waitLimit) || tok.Error() != nil {
			t.Fatalf("publish: %v", tok.Error())
		}
	}
	testutil.Eventually(t, waitLimit, "the retained messages over the bound counted", func() bool {
		return metric(t, n.addr, "edged_broker_retained_refused_total") == "6"
	})
}
