package test

import (
	"path/filepath"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
)

// TestEmbeddedKillExactlyOnceQoS2: devices publish EDGED_E2E_READINGS
// (default 60,000) readings of 100 sensors to edged's embedded broker at QoS 2, each
// device with a persistent session (fixed client id, clean session
// false); edged counts each sensor's readings per 1 s event-time window
// at parallelism EDGED_E2E_PARALLELISM and publishes the counts to the
// embedded broker through the write-ahead sink, each with a msg_id, for a
// result consumer with a persistent session subscribed at QoS 2. CPU
// burner processes compete with edged, and it is SIGKILLed five times at
// seeded points while publishes are unacknowledged, each time restarted
// with the same config. The devices and the consumer then connect again
// with their sessions: the devices' paho resends what was not
// acknowledged (QoS 2: PUBLISH with DUP before the PUBREL was sent, the
// PUBREL after it; see releaseAfterPubrel), and the consumer
// does not subscribe again: its subscription must have outlived the
// kill. A consumer that drops repeated msg_ids must see every window
// exactly once with its exact count.
func TestEmbeddedKillExactlyOnceQoS2(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with kills")
	}
	const (
		job    = "sensors"
		nKills = 5
	)
	// QoS 2 through the embedded broker is the slowest ingestion path
	// (each device's message waits for the ingest log and its session
	// state): fewer readings by default keep the test near the others'
	// duration.
	w := newWorkload(t, 60_000)
	killAt := killPoints(t, w.n, nKills)
	par := envInt(t, "EDGED_E2E_PARALLELISM", 2)
	t.Logf("%d readings (EDGED_E2E_READINGS) of %d sensors, parallelism %d (EDGED_E2E_PARALLELISM)", w.n, w.sensors, par)

	start := time.Now()
	dir := t.TempDir()
	broker, api := freeAddr(t), freeAddr(t)
	url := "tcp://" + broker
	cfgPath := writeExactConfig(t, dir, exactConfig{job: job, api: api, broker: broker, qos: 2, parallelism: par})
	nd := &node{t: t, cfgPath: cfgPath, logPath: filepath.Join(dir, "edged.log"), brokerAddr: broker, apiAddr: api}
	cleanupNode(t, nd)
	burn := startBurners(t)
	nd.start()
	nd.checkParallelism(t, job, job+"/window", par)

	col := newCollector()
	sub := connect(t, paho.NewClientOptions().AddBroker(url).SetClientID("e2e-qos2-results").
		SetCleanSession(false).SetAutoReconnect(false).SetOrderMatters(false).
		SetDefaultPublishHandler(col.handle).SetConnectionLostHandler(func(paho.Client, error) {}))
	defer sub.Disconnect(100)
	subscribe := func() {
		t.Helper()
		if tok := sub.Subscribe("agg/#", 2, col.handle); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			t.Fatalf("subscribe: %v", tok.Error())
		}
	}
	subscribe()

	devs := devices(t, url, "e2e-qos2-device", w.sensors, true) // one device per sensor
	defer disconnectAll(devs, 100)
	l := startLoader(w, devs, 2, 0, w.all())
	run := 0
	for i, k := range killAt {
		seen := killInFlight(t, nd, job, l, col, run, k)
		burn.check(t)
		t.Logf("kill %d at reading %d (kill point %d) after %v: %d publishes unacknowledged, the job's event time at reading %d, the source had sent on %d records and %d results had arrived in this run",
			i+1, seen.reading, k, time.Since(start).Round(time.Millisecond), seen.unacked, seen.nodeAt, seen.sourceOut, seen.results)
		run++
		col.setRun(run)
		restart := time.Now()
		nd.start()
		unacked := l.unacked()
		if !reconnect(t, sub, "the result consumer") {
			// Subscribe again so that the rest of the test still
			// measures the counts; the test has failed already.
			t.Errorf("kill %d: the embedded broker did not keep the result consumer's persistent session across the kill (session present false): it is no longer subscribed, and results published before it subscribes again are lost", i+1)
			subscribe()
		}
		kept := reconnectAll(t, devs, "devices")
		t.Logf("restarted and connected again in %v: %d of %d device sessions present; paho resent the %d publishes without acknowledgement", time.Since(restart).Round(time.Millisecond), kept, len(devs), unacked)
		l.resume()
	}
	l.liftCap()
	l.wait(t, nd, 90*time.Second)
	t.Logf("published %d readings in %v", w.all(), time.Since(start).Round(time.Millisecond))

	waitResults(t, col, w, 60*time.Second)
	// The broker delivers a subscriber's messages in order: once the
	// marker is back, what the sinks had published has arrived.
	drain(t, url, "agg/_marker", col)
	if code := nd.terminate(30 * time.Second); code != 0 {
		t.Errorf("edged exited %d after SIGTERM, want 0", code)
	}
	burn.report(t)
	checkExact(t, col, w)
	t.Logf("done in %v", time.Since(start).Round(time.Millisecond))
}
