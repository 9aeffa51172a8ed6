package test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
)

// TestMosquittoKillExactlyOnce: devices publish EDGED_E2E_READINGS
// readings of 100 sensors to a real Mosquitto at QoS 1; edged reads them
// through its persistent subscription (acknowledging each message once it
// is in the ingest log), counts each sensor's readings per 1 s event-time
// window at parallelism EDGED_E2E_PARALLELISM and publishes the counts
// back to Mosquitto through the write-ahead sink, each with a msg_id.
// CPU burner processes compete with it, and it is SIGKILLed five times at
// seeded points while readings are in flight, each time restarted with the
// same config (it resumes from its latest checkpoint). Mosquitto queues
// for edged's session while it is down and redelivers what edged had not
// acknowledged; the devices and the result consumer (a persistent
// session) never see the kills. A consumer that drops repeated msg_ids
// must see every window exactly once with its exact count: no reading
// lost or counted twice, no result missing or published under a second
// msg_id.
func TestMosquittoKillExactlyOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with kills")
	}
	const (
		job    = "plant"
		nKills = 5
	)
	w := newWorkload(t, 100_000)
	killAt := killPoints(t, w.n, nKills)
	par := envInt(t, "EDGED_E2E_PARALLELISM", 2)
	t.Logf("%d readings (EDGED_E2E_READINGS) of %d sensors, parallelism %d (EDGED_E2E_PARALLELISM)", w.n, w.sensors, par)

	start := time.Now()
	mq := startMosquitto(t)
	url := "tcp://" + mq
	dir := t.TempDir()
	api := freeAddr(t)
	cfgPath := writeExactConfig(t, dir, exactConfig{job: job, api: api, external: url, clientID: "edged-e2e-kill", qos: 1, parallelism: par})

	col := newCollector()
	sub := connect(t, paho.NewClientOptions().AddBroker(url).SetClientID("e2e-kill-results").
		SetCleanSession(false).SetAutoReconnect(false).SetOrderMatters(false).SetDefaultPublishHandler(col.handle))
	defer sub.Disconnect(100)
	if tok := sub.Subscribe("agg/#", 1, col.handle); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}

	nd := &node{t: t, cfgPath: cfgPath, logPath: filepath.Join(dir, "edged.log"), brokerAddr: mq, apiAddr: api}
	cleanupNode(t, nd)
	burn := startBurners(t)
	nd.start()
	nd.checkParallelism(t, job, job+"/window", par)

	devs := devices(t, url, "e2e-kill-devices", conns, false)
	defer disconnectAll(devs, 100)
	l := startLoader(w, devs, 1, 0, w.all())
	run := 0
	for i, k := range killAt {
		seen := killInFlight(t, nd, job, l, col, run, k)
		// Mosquitto takes the readings while edged is down.
		l.resume()
		burn.check(t)
		t.Logf("kill %d at reading %d (kill point %d) after %v: %d publishes unacknowledged, the source had sent on %d records and %d results had arrived in this run",
			i+1, seen.reading, k, time.Since(start).Round(time.Millisecond), seen.unacked, seen.sourceOut, seen.results)
		run++
		col.setRun(run)
		restart := time.Now()
		nd.start()
		t.Logf("restarted in %v", time.Since(restart).Round(time.Millisecond))
	}
	l.liftCap()
	l.wait(t, nd, 90*time.Second)
	t.Logf("published %d readings in %v", w.all(), time.Since(start).Round(time.Millisecond))

	waitResults(t, col, w, 60*time.Second)
	if code := nd.terminate(30 * time.Second); code != 0 {
		t.Errorf("edged exited %d after SIGTERM, want 0", code)
	}
	// Everything the sinks published is in Mosquitto now: let it reach
	// the consumer before judging.
	drain(t, url, "agg/_marker", col)
	burn.report(t)
	t.Logf("redeliveries: %s", redeliveryNotes(nd))
	checkExact(t, col, w)
	t.Logf("done in %v", time.Since(start).Round(time.Millisecond))
}

// redeliveryNotes sums up, from the node's log over all its runs, the
// redelivery notes each start found in the ingest log's tail and what the
// last run's subscriber dropped and noted.
func redeliveryNotes(n *node) string {
	b, _ := os.ReadFile(n.logPath)
	var loaded []string
	closed := "no subscriber closed"
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, "redelivery window loaded") {
			if _, v, ok := strings.Cut(line, "redelivery_notes="); ok {
				loaded = append(loaded, strings.Fields(v)[0])
			}
		}
		if _, v, ok := strings.Cut(line, "mqtt subscriber closed"); ok {
			closed = strings.TrimLeft(v, "\" ")
		}
	}
	return fmt.Sprintf("notes in the tail at each start %v; at the end: %s", loaded, closed)
}
