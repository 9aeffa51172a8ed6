package daemon_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgedio/edged/daemon"
	"github.com/edgedio/edged/mqtt"
)

// A pipeline reads an external broker (an embedded mochi broker of the
// test, not the node's): the node subscribes to it, fills the pipeline's
// ingest log, and the pipeline prints window results on stdout and
// publishes them back to that external broker (the node runs no embedded
// broker, so Inputs.Broker is the external URL).
func TestRunExternalBrokerSource(t *testing.T) {
	url := externalBroker(t)
	var aggs atomic.Int64
	sub := mqttClient(t, url, "agg-reader")
	if tok := sub.Subscribe("agg/#", 1, func(paho.Client, paho.Message) { aggs.Add(1) }); !tok.WaitTimeout(waitLimit) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	pub := mqttClient(t, url, "device")

	dir := t.TempDir()
	yml := fmt.Sprintf(`
node:
  data_dir: %s
pipelines:
  - name: ext
    source:
      mqtt:
        broker: %s
        topics: [sensors/+/temperature]
        format: json
        fields:
          id: {type: string, path: $.sensor}
          temp: {type: float, path: $.t}
          ts: {type: time, path: $.ts, unit: ms}
    event_time: {field: ts, max_out_of_orderness: 1ms}
    key: id
    window:
      type: tumbling
      size: 1s
      aggregates: [{name: count, fn: count}]
    sinks:
      - stdout: {}
      - mqtt: {topic: "agg/{id}"}
`, dir, url)
	n := startNode(t, yml, daemon.Options{})

	// The node subscribes in the background: publish rounds of readings,
	// each a second of event time later, until results come out.
	deadline := time.Now().Add(waitLimit)
	ts := int64(1_700_000_000_000)
	for round := 0; !strings.Contains(n.out.String(), `"count"`) || aggs.Load() == 0; round++ {
		if time.Now().After(deadline) {
			t.Fatalf("no window results after %d rounds; stdout %q, %d published results; logs:\n%s", round, n.out.String(), aggs.Load(), n.logs.String())
		}
		for s := range 3 {
			body := fmt.Sprintf(`{"sensor":"s%d","t":%d,"ts":%d}`, s, 20+s, ts)
			if tok := pub.Publish(fmt.Sprintf("sensors/s%d/temperature", s), 1, false, body); !tok.WaitTimeout(waitLimit) || tok.Error() != nil {
				t.Fatalf("publish: %v", tok.Error())
			}
		}
		ts += 1000
		time.Sleep(20 * time.Millisecond)
	}
	if !strings.Contains(n.logs.String(), "mqtt subscriber subscribed") {
		t.Errorf("no subscriber in the logs:\n%s", n.logs.String())
	}
	if strings.Contains(n.logs.String(), "mqtt broker started") {
		t.Errorf("the node started an embedded broker it does not need")
	}
	n.cancel()
	if err := n.wait(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
	t.Logf("stdout: %.300s", n.out.String())
}

// externalBroker starts an embedded mochi broker on 127.0.0.1, standing in
// for an external one, and returns its URL. It closes when the test's
// cleanups run, after those of the nodes started later.
func externalBroker(t *testing.T) string {
	t.Helper()
	br, err := mqtt.NewBroker(mqtt.BrokerConfig{Address: "127.0.0.1:0", Filters: []string{"#"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := br.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { br.Close() })
	return "tcp://" + br.Addr()
}

// mqttClient connects a client named id to the broker at url; it
// disconnects when the test ends.
func mqttClient(t *testing.T, url, id string) paho.Client {
	t.Helper()
	c := paho.NewClient(paho.NewClientOptions().AddBroker(url).SetClientID(id).SetAutoReconnect(false).
		SetDefaultPublishHandler(func(paho.Client, paho.Message) {}))
	if tok := c.Connect(); !tok.WaitTimeout(waitLimit) || tok.Error() != nil {
		t.Fatalf("connect %s: %v", id, tok.Error())
	}
	t.Cleanup(func() { c.Disconnect(0) })
	return c
}
