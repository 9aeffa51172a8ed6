package test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgedio/edged/internal/mqtttest"
	"github.com/edgedio/edged/internal/testutil"
)

// startMosquitto starts the Mosquitto of a test (mqtttest.StartMosquitto)
// with room for the tests' load.
func startMosquitto(t *testing.T) string {
	addr, _ := mqtttest.StartMosquitto(t, "max_inflight_messages 1000\nmax_queued_messages 0\n")
	return addr
}

// TestMosquittoTotals: 200,000 JSON readings of 1,000 sensors go to a real
// Mosquitto with QoS 1; edged subscribes to it (persistent session,
// manual acks after the ingest log), counts each sensor's readings in
// 10 s event-time windows and publishes the counts back to Mosquitto; a
// subscriber checks that every sensor's total equals what was published.
func TestMosquittoTotals(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test")
	}
	const (
		n        = 200_000
		sensorsM = 1000
		windows  = 20 // 10 s windows of 10,000 readings (ts advances 1 ms per reading)
		winMS    = 10_000
	)
	mq := startMosquitto(t)
	url := "tcp://" + mq
	dir := t.TempDir()
	api := freeAddr(t)
	cfgPath := writeMosquittoConfig(t, dir, api, url, "mosquitto", "edged-e2e")

	col := newCollector()
	sub := connect(t, paho.NewClientOptions().AddBroker(url).SetClientID("e2e-totals").
		SetCleanSession(false).SetOrderMatters(false).SetDefaultPublishHandler(col.handle))
	defer sub.Disconnect(100)
	if tok := sub.Subscribe("totals/#", 1, col.handle); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}

	nd := &node{t: t, cfgPath: cfgPath, logPath: filepath.Join(dir, "edged.log"), brokerAddr: mq, apiAddr: api}
	nd.start()
	stopped := false
	defer func() {
		if !stopped {
			nd.terminate(30 * time.Second)
		}
	}()

	pubs := publishers(t, url)
	defer disconnectAll(pubs, 100)
	payload := func(i int) (string, []byte) {
		s := fmt.Sprintf("m%04d", i%sensorsM)
		return "plant/" + s + "/temperature",
			[]byte(fmt.Sprintf(`{"sensor":%q,"t":%d.5,"ts":%d}`, s, 20+i%15, epochMS+int64(i)))
	}
	var toks []paho.Token
	// The readings, then a tail that moves the watermark past the last
	// window.
	for i := 0; i < n+2*winMS; i++ {
		topic, p := payload(i)
		toks = append(toks, pubs[i%len(pubs)].Publish(topic, 1, false, p))
		if len(toks) == batch {
			for _, tok := range toks {
				if !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
					t.Fatalf("publish: %v", tok.Error())
				}
			}
			toks = toks[:0]
		}
	}
	for _, tok := range toks {
		if !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
			t.Fatalf("publish: %v", tok.Error())
		}
	}

	want := sensorsM * windows
	got := 0
	if !testutil.Within(90*time.Second, func() bool {
		col.mu.Lock()
		defer col.mu.Unlock()
		got = 0
		for k := range col.byKey {
			if (k.start-epochMS)/winMS < windows {
				got++
			}
		}
		return got >= want
	}) {
		t.Fatalf("%d of %d window results after 90 s\n%s", got, want, nd.logTail())
	}
	col.mu.Lock()
	defer col.mu.Unlock()
	if len(col.bad) > 0 {
		t.Fatalf("bad results: %v", col.bad[:min(5, len(col.bad))])
	}
	totals := map[string]int64{}
	for k, rs := range col.byKey {
		if (k.start-epochMS)/winMS < windows {
			totals[k.sensor] += rs[len(rs)-1].Count
		}
	}
	for s := 0; s < sensorsM; s++ {
		id := fmt.Sprintf("m%04d", s)
		if totals[id] != n/sensorsM {
			t.Fatalf("sensor %s: total %d, want %d", id, totals[id], n/sensorsM)
		}
	}
	stopped = true
	if code := nd.terminate(30 * time.Second); code != 0 {
		t.Fatalf("edged exited %d after SIGTERM\n%s", code, nd.logTail())
	}
}

// writeMosquittoConfig writes the node config the Mosquitto tests share:
// pipeline job reads plant/+/temperature from the broker at url (client
// id clientID, a persistent session), counts each sensor's readings in
// 10 s event-time windows and publishes the counts to totals/<sensor>, with
// exactly-once checkpoints every 500 ms under dir/data.
func writeMosquittoConfig(t *testing.T, dir, api, url, job, clientID string) string {
	t.Helper()
	cfg := fmt.Sprintf(`node:
  data_dir: %[1]s/data
  listen: %[2]s
pipelines:
  - name: %[4]s
    source:
      mqtt:
        broker: %[3]s
        client_id: %[5]s
        topics: [plant/+/temperature]
        qos: 1
        format: json
        fields:
          id: {type: string, path: $.sensor}
          temp: {type: float, path: $.t}
          ts: {type: time, path: $.ts, unit: ms}
    event_time: {field: ts, max_out_of_orderness: 1s}
    key: id
    window:
      type: tumbling
      size: 10s
      aggregates: [{name: count, fn: count}]
    sinks:
      - mqtt: {topic: "totals/{id}", qos: 1}
    checkpoint: {dir: %[1]s/data/checkpoints, interval: 500ms, mode: exactly_once}
`, dir, api, url, job, clientID)
	p := filepath.Join(dir, "edged.yaml")
	if err := os.WriteFile(p, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}
