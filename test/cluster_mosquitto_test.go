package test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgedio/edged/internal/testutil"
)

// withSharedMosquitto makes a cluster node's config read its readings
// from the external broker at url through the shared subscription
// $share/edged/sensors/+/temperature (the same filter on every node, its
// own client id), as the README tells a user to do with an external
// broker.
func withSharedMosquitto(url string) func(cfg string) string {
	return func(cfg string) string {
		var id string
		for _, line := range strings.Split(cfg, "\n") {
			if v, ok := strings.CutPrefix(line, "  node: "); ok {
				id = v
			}
		}
		const topics = "        topics: [sensors/+/temperature]\n"
		if id == "" || !strings.Contains(cfg, topics) {
			panic("withSharedMosquitto: unexpected config:\n" + cfg)
		}
		return strings.Replace(cfg, topics, fmt.Sprintf("        broker: %s\n        client_id: edged-%s\n        topics: [\"$share/edged/sensors/+/temperature\"]\n", url, id), 1)
	}
}

// publishTo publishes readings [from, to) to the clients in turn at QoS 1,
// at most 600 unacknowledged at once.
func publishTo(t *testing.T, clients []paho.Client, from, to int) {
	t.Helper()
	var toks []paho.Token
	wait := func() {
		for _, tok := range toks {
			if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
				t.Fatalf("publish: %v", tok.Error())
			}
		}
		toks = toks[:0]
	}
	for i := from; i < to; i++ {
		topic, p := payloadOf(i)
		toks = append(toks, clients[i%len(clients)].Publish(topic, 1, false, p))
		if len(toks) == 600 {
			wait()
		}
	}
	wait()
}

// A three-node cluster reads its readings from one Mosquitto through a
// shared subscription (each message enters one node's ingest log), under
// QoS 1 load: worker c is SIGKILLed and left down while the readings go
// on, then started again. Every window of every sensor is exact with one
// result id.
func TestClusterSharedMosquittoWorkerKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with three subprocesses and Mosquitto")
	}
	url := "tcp://" + startMosquitto(t)
	members := startClusterOnMosquitto(t, url)
	a, c := members[0], members[2]
	client := &http.Client{Timeout: time.Second}
	waitAllAlive(t, a, 3)
	col := newCollector()
	sub := connect(t, paho.NewClientOptions().AddBroker(url).SetClientID("results").SetCleanSession(false).
		SetAutoReconnect(false).SetOrderMatters(false).SetDefaultPublishHandler(col.handle))
	if tok := sub.Subscribe("agg/#", 1, col.handle); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	t.Cleanup(func() { sub.Disconnect(0) })
	// The late readings' dead letters, by msg_id.
	var dlMu sync.Mutex
	late := map[string]int64{} // msg_id -> the reading's event time
	onDL := func(_ paho.Client, m paho.Message) {
		var dl struct {
			Error   string `json:"error"`
			Payload string `json:"payload"`
			MsgID   string `json:"msg_id"`
		}
		var rec struct {
			TS int64 `json:"ts"`
		}
		dlMu.Lock()
		defer dlMu.Unlock()
		if json.Unmarshal(m.Payload(), &dl) != nil || !strings.HasPrefix(dl.Error, "late:") || json.Unmarshal([]byte(dl.Payload), &rec) != nil {
			t.Errorf("unexpected dead letter: %s", m.Payload())
			return
		}
		late[dl.MsgID] = rec.TS
	}
	if tok := sub.Subscribe("deadletter/#", 1, onDL); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	var pubs []paho.Client
	for k := range 4 {
		opts := paho.NewClientOptions().AddBroker(url).SetClientID(fmt.Sprintf("plant-%d", k)).
			SetCleanSession(true).SetAutoReconnect(false).SetWriteTimeout(5 * time.Second)
		pubs = append(pubs, connect(t, opts))
	}
	t.Cleanup(func() { disconnectAll(pubs, 0) })

	const n = 30_000
	publishTo(t, pubs, 0, 9_000)
	var in struct {
		Pipelines []struct {
			Next uint64 `json:"next_offset"`
		} `json:"pipelines"`
	}
	testutil.Eventually(t, 60*time.Second, "c's log released what it took in", func() bool {
		if err := c.get(client, "/ingest", &in); err != nil || len(in.Pipelines) != 1 || in.Pipelines[0].Next == 0 {
			return false
		}
		rel, err := c.released(client)
		return err == nil && rel >= in.Pipelines[0].Next
	})
	c.kill()
	testutil.Eventually(t, 60*time.Second, "c's subtasks failed over", func() bool {
		s, err := a.status(client)
		return err == nil && s.keyedOn("c") == 0 && s.alive() == 2
	})
	publishTo(t, pubs, 9_000, 18_000)
	c.start()
	testutil.Eventually(t, 90*time.Second, "c owns key groups again", func() bool {
		s, err := a.status(client)
		return err == nil && s.keyedOn("c") > 0
	})
	publishTo(t, pubs, 18_000, n+3*tail)
	windows := n / windowMS
	if !testutil.Within(120*time.Second, func() bool { return countWindows(col, windows) >= windows*sensors }) {
		t.Errorf("%d of %d window results", countWindows(col, windows), windows*sensors)
	}
	for _, m := range members {
		var in struct {
			Pipelines []struct {
				Next     uint64 `json:"next_offset"`
				Released uint64 `json:"released_offset"`
			} `json:"pipelines"`
		}
		if err := m.get(client, "/ingest", &in); err == nil {
			t.Logf("node %s ingest: %+v", m.id, in.Pipelines)
		}
	}
	// balanced reports whether every window's readings are counted or
	// late dead letters.
	balanced := func() bool {
		dlMu.Lock()
		lateIn := map[int]int64{}
		for _, ts := range late {
			lateIn[int((ts-epochMS)/windowMS)]++
		}
		dlMu.Unlock()
		col.mu.Lock()
		defer col.mu.Unlock()
		for w := range windows {
			sum := lateIn[w]
			for s := range sensors {
				if rs := col.byKey[winKey{sensorOf(s), epochMS + int64(w)*windowMS}]; len(rs) > 0 {
					sum += rs[0].Count
				}
			}
			if sum != windowMS {
				return false
			}
		}
		return true
	}
	testutil.Within(60*time.Second, balanced)
	// The readings Mosquitto kept for c's session while c was down
	// enter c's log when it returns, behind the watermark the other
	// splits moved on: each is a late dead letter, none vanishes. Every
	// window holds its readings but those, under one msg_id per result,
	// and the windows before the kill are exact.
	dlMu.Lock()
	lateIn := map[int]int64{}
	for _, ts := range late {
		lateIn[int((ts-epochMS)/windowMS)]++
	}
	dlMu.Unlock()
	checkExactWindows(t, col, 9)
	col.mu.Lock()
	defer col.mu.Unlock()
	var short []string
	var lateTotal int64
	for w := range windows {
		sum := int64(0)
		for s := range sensors {
			rs := col.byKey[winKey{sensorOf(s), epochMS + int64(w)*windowMS}]
			ids := map[string]bool{}
			for _, r := range rs {
				ids[r.MsgID] = true
			}
			if len(ids) > 1 {
				t.Errorf("window %d of %s: %d msg_ids", w, sensorOf(s), len(ids))
			}
			if len(rs) > 0 {
				sum += rs[0].Count
			}
		}
		if sum != windowMS {
			short = append(short, fmt.Sprintf("window %d: %d counted, %d late", w, sum, lateIn[w]))
		}
		if sum+lateIn[w] != windowMS {
			t.Errorf("window %d: %d readings counted and %d late dead letters, want %d in all", w, sum, lateIn[w], windowMS)
		}
		lateTotal += lateIn[w]
	}
	t.Logf("%d late readings, in windows %v", lateTotal, short)
}

// startClusterOnMosquitto starts three nodes that read the readings from
// the external broker at url (withSharedMosquitto) and publish their
// results to it (they run no embedded broker), and waits until the
// workers host the job's tasks.
func startClusterOnMosquitto(t *testing.T, url string) []*clusterMember {
	t.Helper()
	addrs := distinctAddrs(t, 12)
	var members []*clusterMember
	for _, id := range []string{"a", "b", "c"} {
		dir := filepath.Join(t.TempDir(), id)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		m := &clusterMember{id: id, transport: addrs[0], gossip: addrs[3],
			node: &node{t: t, brokerAddr: addrs[1], apiAddr: addrs[2], logPath: filepath.Join(dir, "edged.log")}}
		addrs = addrs[4:]
		m.cfgPath = filepath.Join(dir, "edged.yaml")
		members = append(members, m)
	}
	for _, m := range members {
		p := writeClusterConfig(t, filepath.Dir(m.cfgPath), m, members)
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(withSharedMosquitto(url)(string(b))), 0o644); err != nil {
			t.Fatal(err)
		}
		m.readyFn = func(client *http.Client) bool {
			_, err := m.hosted(client)
			return err == nil
		}
	}
	killMembersAtCleanup(t, members, keepLog)
	for _, m := range []*clusterMember{members[1], members[2], members[0]} {
		m.start()
	}
	client := &http.Client{Timeout: time.Second}
	if !testutil.Within(30*time.Second, func() bool { return allHostTasks(client, members[1:]) }) {
		t.Fatal("the workers do not host the job's tasks after 30 s")
	}
	return members
}
