package test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgedio/edged/internal/testutil"
)

// TestCLIStopWithSavepointAndResume stops a node reading from Mosquitto
// with `edged stop` (a savepoint) after half of the readings, starts a new
// node from that savepoint with `edged run --from-savepoint`, publishes
// the other half, and checks that the split lost and duplicated nothing.
func TestCLIStopWithSavepointAndResume(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with subprocesses and Mosquitto")
	}
	const (
		n        = 200_000
		half     = n / 2
		sensorsM = 1000
		windows  = 20 // 10 s windows of 10,000 readings (ts advances 1 ms per reading)
		winMS    = 10_000
		bad      = 5
		job      = "plant"
	)
	start := time.Now()
	mq := startMosquitto(t)
	url := "tcp://" + mq
	dir := t.TempDir()
	api := freeAddr(t)
	cfgPath := writeMosquittoConfig(t, dir, api, url, job, "edged-e2e-savepoint")

	// The subscriber: window results to the collector, dead letters
	// counted.
	col := newCollector()
	var dead atomic.Int64
	route := func(c paho.Client, m paho.Message) {
		if strings.HasPrefix(m.Topic(), "deadletter/") {
			dead.Add(1)
			return
		}
		col.handle(c, m)
	}
	sub := connect(t, paho.NewClientOptions().AddBroker(url).SetClientID("e2e-savepoint-sub").
		SetCleanSession(false).SetOrderMatters(false).SetDefaultPublishHandler(route))
	defer sub.Disconnect(100)
	if tok := sub.SubscribeMultiple(map[string]byte{"totals/#": 1, "deadletter/#": 1}, route); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}

	logPath := filepath.Join(dir, "edged.log")
	var nodes []*node
	t.Cleanup(func() {
		for _, nd := range nodes {
			select {
			case <-nd.done:
			default:
				_ = nd.cmd.Process.Kill()
				<-nd.done
			}
		}
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			if len(b) > 8000 {
				b = b[len(b)-8000:]
			}
			t.Logf("edged log tail:\n%s", b)
		}
	})

	nd1 := &node{t: t, cfgPath: cfgPath, logPath: logPath, brokerAddr: mq, apiAddr: api}
	nodes = append(nodes, nd1)
	nd1.start()
	t.Logf("node 1 ready after %v", time.Since(start).Round(time.Millisecond))

	pubs := publishers(t, url)
	defer disconnectAll(pubs, 100)
	payload := func(i int) (string, []byte) {
		s := fmt.Sprintf("m%04d", i%sensorsM)
		return "plant/" + s + "/temperature",
			[]byte(fmt.Sprintf(`{"sensor":%q,"t":%d.5,"ts":%d}`, s, 20+i%15, epochMS+int64(i)))
	}
	var toks []paho.Token
	flush := func() {
		t.Helper()
		for _, tok := range toks {
			if !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
				t.Fatalf("publish: %v", tok.Error())
			}
		}
		toks = toks[:0]
	}
	publish := func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			topic, p := payload(i)
			toks = append(toks, pubs[i%len(pubs)].Publish(topic, 1, false, p))
			if len(toks) == batch {
				flush()
			}
		}
		flush()
	}

	// First half, and the malformed payloads.
	publish(0, half)
	for i := 0; i < bad; i++ {
		toks = append(toks, pubs[i%len(pubs)].Publish("plant/x/temperature", 1, false, []byte("not json")))
	}
	flush()
	t.Logf("published %d readings and %d malformed payloads after %v", half, bad, time.Since(start).Round(time.Millisecond))

	// Stop with a savepoint through the CLI.
	stopStart := time.Now()
	spPath := cliStop(t, nd1, job)

	// The node ends by itself once its only job has ended.
	if code := nd1.waitExit(t, 30*time.Second); code != 0 {
		t.Fatalf("node exited %d after the stop with savepoint, want 0", code)
	}
	t.Logf("node 1 exited 0, %v after the stop", time.Since(stopStart).Round(time.Millisecond))

	// A new node from the savepoint, the second half and the tail.
	nd2 := &node{t: t, cfgPath: cfgPath, logPath: logPath, brokerAddr: mq, apiAddr: api}
	nodes = append(nodes, nd2)
	nd2.start("--from-savepoint", spPath)
	t.Logf("node 2 ready after %v", time.Since(start).Round(time.Millisecond))
	publish(half, n+2*winMS)
	t.Logf("published readings %d..%d (with the tail) after %v", half, n+2*winMS-1, time.Since(start).Round(time.Millisecond))

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
		return got >= want && dead.Load() >= bad
	}) {
		t.Fatalf("%d of %d window results and %d of %d dead letters after 90 s", got, want, dead.Load(), bad)
	}
	t.Logf("all %d window results and %d dead letters after %v", want, dead.Load(), time.Since(start).Round(time.Millisecond))

	col.mu.Lock()
	if len(col.bad) > 0 {
		col.mu.Unlock()
		t.Fatalf("bad results: %v", col.bad[:min(5, len(col.bad))])
	}
	totals := map[string]int64{}
	multiID := 0
	var multi []string
	for k, rs := range col.byKey {
		if (k.start-epochMS)/winMS >= windows {
			continue
		}
		totals[k.sensor] += rs[len(rs)-1].Count
		ids := map[string]bool{}
		for _, r := range rs {
			ids[r.MsgID] = true
		}
		if len(ids) > 1 {
			multiID++
			if len(multi) < 5 {
				multi = append(multi, fmt.Sprintf("%s window %d: %v", k.sensor, (k.start-epochMS)/winMS, rs))
			}
		}
	}
	col.mu.Unlock()
	if multiID > 0 {
		t.Errorf("%d windows published under several msg_ids, e.g. %v", multiID, multi)
	}
	for s := 0; s < sensorsM; s++ {
		id := fmt.Sprintf("m%04d", s)
		if totals[id] != n/sensorsM {
			t.Fatalf("sensor %s: total %d over windows 0..%d, want %d", id, totals[id], windows-1, n/sensorsM)
		}
	}
	if d := dead.Load(); d < bad {
		t.Fatalf("%d dead letters on deadletter/%s, want at least %d", d, job, bad)
	}

	if code := nd2.terminate(30 * time.Second); code != 0 {
		t.Fatalf("node 2 exited %d after SIGTERM, want 0", code)
	}
	t.Logf("total %v", time.Since(start).Round(time.Millisecond))
}
