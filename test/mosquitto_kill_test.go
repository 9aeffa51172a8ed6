package test

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
)

// TestMosquittoKillExactlyOnce is TestMosquittoTotals with three SIGKILLs
// of edged at random moments while the readings are published, each
// followed by a restart with the same config (the node resumes from its
// latest checkpoint). The publishers talk to Mosquitto, which queues for
// edged's persistent session while it is down, so they never see the
// kills. Every sensor's total over the 20 windows must be exactly what
// was published (no loss, no duplicate: the subscriber drops the
// redeliveries of messages appended but not acknowledged before a kill),
// and every window result must come under a single msg_id.
func TestMosquittoKillExactlyOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with kills")
	}
	const (
		n        = 200_000
		sensorsM = 1000
		windows  = 20 // 10 s windows of 10,000 readings (ts advances 1 ms per reading)
		winMS    = 10_000
		nKills   = 3
	)
	killAt := killPoints(t, n, nKills)

	mq := startMosquitto(t)
	url := "tcp://" + mq
	dir := t.TempDir()
	api := freeAddr(t)
	cfgPath := writeMosquittoConfig(t, dir, api, url, "mosquitto", "edged-e2e")

	col := newCollector()
	sub := connect(t, paho.NewClientOptions().AddBroker(url).SetClientID("e2e-kill-totals").
		SetCleanSession(false).SetOrderMatters(false).SetDefaultPublishHandler(col.handle))
	defer sub.Disconnect(100)
	if tok := sub.Subscribe("totals/#", 1, col.handle); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}

	nd := &node{t: t, cfgPath: cfgPath, logPath: filepath.Join(dir, "edged.log"), brokerAddr: mq, apiAddr: api}
	t.Cleanup(func() {
		if nd.cmd != nil {
			select {
			case <-nd.done:
			default:
				_ = nd.cmd.Process.Kill()
				<-nd.done
			}
		}
		if t.Failed() {
			t.Logf("edged log tail:\n%s", nd.logTail())
		}
	})
	start := time.Now()
	nd.start()

	pubs := publishers(t, url)
	defer disconnectAll(pubs, 100)
	payload := func(i int) (string, []byte) {
		s := fmt.Sprintf("m%04d", i%sensorsM)
		return "plant/" + s + "/temperature",
			[]byte(fmt.Sprintf(`{"sensor":%q,"t":%d.5,"ts":%d}`, s, 20+i%15, epochMS+int64(i)))
	}
	wait := func(toks []paho.Token) {
		for _, tok := range toks {
			if !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
				t.Fatalf("publish: %v", tok.Error())
			}
		}
	}
	var toks []paho.Token
	nextKill := 0
	// The readings, then a tail that moves the watermark past the last
	// window.
	for i := 0; i < n+2*winMS; i++ {
		topic, p := payload(i)
		toks = append(toks, pubs[i%len(pubs)].Publish(topic, 1, false, p))
		if nextKill < len(killAt) && i == killAt[nextKill] {
			// Kill with a batch in flight: some of it is appended but
			// not acknowledged, some still queued in Mosquitto.
			nextKill++
			nd.kill()
			t.Logf("killed edged at reading %d after %v", i, time.Since(start).Round(time.Millisecond))
			nd.start()
			t.Logf("restarted edged after %v", time.Since(start).Round(time.Millisecond))
		}
		if len(toks) == batch {
			wait(toks)
			toks = toks[:0]
		}
	}
	wait(toks)
	t.Logf("published %d readings in %v", n+2*winMS, time.Since(start).Round(time.Millisecond))

	inRange := func(k winKey) bool { return (k.start-epochMS)/winMS < windows }
	want := sensorsM * windows
	deadline := time.Now().Add(60 * time.Second)
	for {
		col.mu.Lock()
		got := 0
		for k := range col.byKey {
			if inRange(k) {
				got++
			}
		}
		col.mu.Unlock()
		if got >= want {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d window results after 60 s", got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Let late duplicates (a result published twice) arrive before judging.
	time.Sleep(time.Second)

	col.mu.Lock()
	if len(col.bad) > 0 {
		col.mu.Unlock()
		t.Fatalf("bad results: %v", col.bad[:min(5, len(col.bad))])
	}
	totals := map[string]int64{}
	var errs []string
	redelivered := 0
	for k, rs := range col.byKey {
		if !inRange(k) {
			continue
		}
		ids := map[string]bool{}
		for _, r := range rs {
			ids[r.MsgID] = true
		}
		if len(ids) != 1 {
			errs = append(errs, fmt.Sprintf("window %v under %d msg_ids: %v", k, len(ids), rs))
		}
		if len(rs) > 1 {
			redelivered++
		}
		totals[k.sensor] += rs[len(rs)-1].Count
	}
	col.mu.Unlock()
	t.Logf("%d window results received more than once (same msg_id)", redelivered)
	for s := 0; s < sensorsM; s++ {
		id := fmt.Sprintf("m%04d", s)
		if totals[id] != n/sensorsM {
			errs = append(errs, fmt.Sprintf("sensor %s: total %d, want %d", id, totals[id], n/sensorsM))
		}
	}
	if len(errs) > 0 {
		t.Fatalf("%d problems, first: %v", len(errs), errs[:min(10, len(errs))])
	}
	code := nd.terminate(30 * time.Second)
	nd.cmd = nil
	if code != 0 {
		t.Fatalf("edged exited %d after SIGTERM\n%s", code, nd.logTail())
	}
	t.Logf("done in %v", time.Since(start).Round(time.Millisecond))
}
