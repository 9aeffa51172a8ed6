package test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgedio/edged/internal/testutil"
)

// TestKillRightAfterIngestLogTruncationExact: a node whose ingest log is
// 4 MiB (1 MiB segments) deletes its oldest segment whenever no retained
// checkpoint needs it any more, while devices publish 60,000 readings at
// QoS 2 with persistent sessions (exactly once into the log across kills). Three times, as soon as the oldest
// segment is gone, the node is SIGKILLed and started again: what the
// deletion left must be all the restore needs (the retained checkpoints'
// offsets), so the results, read by a consumer that drops repeated
// msg_ids, are exact.
func TestKillRightAfterIngestLogTruncationExact(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with kills")
	}
	const (
		job    = "sensors"
		nKills = 3
	)
	w := newWorkload(t, 60_000)
	start := time.Now()
	dir := t.TempDir()
	broker, api := freeAddr(t), freeAddr(t)
	url := "tcp://" + broker
	cfgPath := writeExactConfig(t, dir, exactConfig{job: job, api: api, broker: broker, qos: 2, parallelism: 2})
	b, err := os.ReadFile(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	cfg := strings.Replace(string(b), "        qos: 2\n        format: json\n",
		"        qos: 2\n        format: json\n        log_max_bytes: 4194304\n        max_message_bytes: 65536\n", 1)
	if !strings.Contains(cfg, "log_max_bytes") {
		t.Fatal("the config has no ingest-log bound")
	}
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	nd := &node{t: t, cfgPath: cfgPath, logPath: filepath.Join(dir, "edged.log"), brokerAddr: broker, apiAddr: api}
	cleanupNode(t, nd)
	nd.start()

	col := newCollector()
	sub := connect(t, paho.NewClientOptions().AddBroker(url).SetClientID("e2e-truncate-results").
		SetCleanSession(false).SetAutoReconnect(false).SetOrderMatters(false).
		SetDefaultPublishHandler(col.handle).SetConnectionLostHandler(func(paho.Client, error) {}))
	defer sub.Disconnect(100)
	if tok := sub.Subscribe("agg/#", 2, col.handle); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	devs := devices(t, url, "e2e-truncate-device", 20, true)
	defer disconnectAll(devs, 100)

	segments := filepath.Join(dir, "data", "ingest", job)
	oldest := func() string {
		segs, _ := filepath.Glob(filepath.Join(segments, "*.seg"))
		slices.Sort(segs)
		if len(segs) == 0 {
			return ""
		}
		return filepath.Base(segs[0])
	}
	l := startLoader(w, devs, 2, 0, w.all())
	for i := range nKills {
		was := oldest()
		if !testutil.Within(2*time.Minute, func() bool {
			nd.failIfExited(t)
			if err := l.stopped(); err != nil {
				t.Fatalf("publishing stopped: %v", err)
			}
			now := oldest()
			if was == "" {
				was = now
			}
			return now != "" && now != was
		}) {
			t.Fatalf("kill %d: no segment of the ingest log was deleted within 2m (oldest %s, next reading %d)", i+1, was, l.next.Load())
		}
		l.pause()
		nd.kill()
		t.Logf("kill %d right after %s was deleted (the oldest now %s), at reading %d, %d publishes unacknowledged, after %v",
			i+1, was, oldest(), l.next.Load(), l.unacked(), time.Since(start).Round(time.Millisecond))
		col.setRun(i + 1)
		nd.start()
		if !reconnect(t, sub, "the result consumer") {
			t.Fatalf("kill %d: the result consumer's session was not kept", i+1)
		}
		reconnectAll(t, devs, "devices")
		l.resume()
	}
	l.wait(t, nd, 2*time.Minute)
	waitResults(t, col, w, 60*time.Second)
	drain(t, url, "agg/_marker", col)
	if code := nd.terminate(30 * time.Second); code != 0 {
		t.Errorf("edged exited %d after SIGTERM, want 0", code)
	}
	checkExact(t, col, w)
	t.Logf("done in %v", time.Since(start).Round(time.Millisecond))
}
