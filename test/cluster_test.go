package test

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgedio/edged/internal/testutil"
)

// clusterMember is one edged process of a cluster test.
type clusterMember struct {
	*node
	id        string
	transport string
}

// writeClusterConfig writes node me's config of a cluster of members: the
// e2e pipeline (1 s tumbling count per sensor, exactly-once to MQTT) at
// parallelism 3, each node's sink publishing to its own embedded broker.
func writeClusterConfig(t *testing.T, dir string, me *clusterMember, members []*clusterMember) string {
	t.Helper()
	data := filepath.Join(dir, "data")
	var peers strings.Builder
	for _, m := range members {
		if m == me {
			continue
		}
		fmt.Fprintf(&peers, "    - {id: %s, address: %q, api: %q}\n", m.id, m.transport, m.apiAddr)
	}
	cfg := fmt.Sprintf(`node:
  data_dir: %[1]s
  broker: %[2]s
  listen: %[3]s
cluster:
  node: %[4]s
  listen: %[5]q
  peers:
%[6]spipelines:
  - name: sensors
    parallelism: 3
    source:
      mqtt:
        topics: [sensors/+/temperature]
        qos: 1
        format: json
        fields:
          id: {type: string, path: $.sensor}
          temp: {type: float, path: $.t}
          ts: {type: time, path: $.ts, unit: ms}
    event_time:
      field: ts
      max_out_of_orderness: 1s
    key: id
    window:
      type: tumbling
      size: 1s
      aggregates:
        - {name: count, fn: count}
    sinks:
      - mqtt: {topic: "agg/{id}", qos: 1}
    checkpoint:
      dir: %[1]s/checkpoints
      interval: 200ms
      mode: exactly_once
    restart:
      strategy: fixed_delay
      attempts: 100
      delay: 200ms
`, data, me.brokerAddr, me.apiAddr, me.id, me.transport, peers.String())
	p := filepath.Join(dir, "edged.yaml")
	if err := os.WriteFile(p, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// workerJob is what GET /cluster/worker says of a hosted job.
type workerJob struct {
	Job   string `json:"job"`
	Epoch uint64 `json:"epoch"`
	Tasks []struct {
		Chain     string `json:"Chain"`
		RecordsIn int64  `json:"RecordsIn"`
	} `json:"tasks"`
}

// hosted returns what a worker hosts.
func (m *clusterMember) hosted(client *http.Client) ([]workerJob, error) {
	resp, err := client.Get("http://" + m.apiAddr + "/cluster/worker")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var w struct {
		Jobs []workerJob `json:"jobs"`
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /cluster/worker: %s", resp.Status)
	}
	return w.Jobs, json.NewDecoder(resp.Body).Decode(&w)
}

// startCluster starts three edged processes on loopback that run one
// MQTT pipeline together: "a" (the job master) and the workers "b" and
// "c"; the workers first, so the master's first deployment finds them.
func startCluster(t *testing.T) []*clusterMember {
	t.Helper()
	var members []*clusterMember
	for _, id := range []string{"a", "b", "c"} {
		dir := filepath.Join(t.TempDir(), id)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		m := &clusterMember{id: id, transport: freeAddr(t),
			node: &node{t: t, brokerAddr: freeAddr(t), apiAddr: freeAddr(t), logPath: filepath.Join(dir, "edged.log")}}
		m.cfgPath = filepath.Join(dir, "edged.yaml")
		members = append(members, m)
	}
	for _, m := range members {
		writeClusterConfig(t, filepath.Dir(m.cfgPath), m, members)
		if m.id != "a" {
			m.readyFn = func(client *http.Client) bool {
				_, err := m.hosted(client)
				return err == nil && brokerUp(m.brokerAddr)
			}
		}
	}
	t.Cleanup(func() {
		for _, m := range members {
			if m.cmd == nil {
				continue
			}
			select {
			case <-m.done:
			default:
				_ = m.cmd.Process.Kill()
				<-m.done
			}
			if t.Failed() {
				t.Logf("node %s log tail:\n%s", m.id, m.logTailN(4000))
			}
		}
	})
	for _, m := range []*clusterMember{members[1], members[2], members[0]} {
		m.start()
	}
	// The job runs once both workers host their tasks of its deployment.
	client := &http.Client{Timeout: time.Second}
	ok := testutil.Within(30*time.Second, func() bool {
		for _, m := range members[1:] {
			jobs, err := m.hosted(client)
			if err != nil || len(jobs) != 1 || len(jobs[0].Tasks) == 0 {
				return false
			}
		}
		return true
	})
	if !ok {
		t.Fatal("the workers do not host the job's tasks after 30 s")
	}
	return members
}

func brokerUp(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// Three edged processes on loopback run one MQTT pipeline with static
// placement: each node ingests what its devices publish to its own
// embedded broker (one source split per node), the readings are keyed
// across the nodes to the window subtask owning their key group, and
// each node publishes the results of its window subtask. Every window
// of every sensor arrives exactly once with the exact count, and every
// node did part of the work.
func TestThreeNodeClusterExactTotals(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with three subprocesses")
	}
	members := startCluster(t)
	const n = 30_000
	col := newCollector()
	var subs, pubs []paho.Client
	for i, m := range members {
		opts := paho.NewClientOptions().AddBroker("tcp://"+m.brokerAddr).SetClientID(fmt.Sprintf("results-%d", i)).
			SetCleanSession(true).SetAutoReconnect(false).SetOrderMatters(false).SetDefaultPublishHandler(col.handle)
		c := connect(t, opts)
		if tok := c.Subscribe("agg/#", 1, col.handle); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			t.Fatalf("subscribe to node %s: %v", m.id, tok.Error())
		}
		subs = append(subs, c)
		for k := range 4 {
			opts := paho.NewClientOptions().AddBroker("tcp://"+m.brokerAddr).SetClientID(fmt.Sprintf("devices-%d-%d", i, k)).
				SetCleanSession(true).SetAutoReconnect(false).SetWriteTimeout(5 * time.Second)
			pubs = append(pubs, connect(t, opts))
		}
	}
	defer func() {
		disconnectAll(subs, 100)
		disconnectAll(pubs, 100)
	}()
	// Reading i goes to node i%3 (so every node's split carries every
	// window), on one of its connections; a tail per node moves each
	// split's watermark past the last window.
	publish := func(i int, toNode int) paho.Token {
		topic, p := payloadOf(i)
		return pubs[toNode*4+(i/3)%4].Publish(topic, 1, false, p)
	}
	const inFlight = 600
	var toks []paho.Token
	for i := range n + 3*tail {
		node := i % 3
		toks = append(toks, publish(i, node))
		if len(toks) == inFlight {
			for _, tok := range toks {
				if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
					t.Fatalf("publish: %v", tok.Error())
				}
			}
			toks = toks[:0]
		}
	}
	for _, tok := range toks {
		if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			t.Fatalf("publish: %v", tok.Error())
		}
	}
	windows := n / windowMS
	want := windows * sensors
	if !testutil.Within(90*time.Second, func() bool { return countWindows(col, windows) >= want }) {
		t.Fatalf("%d of %d window results after 90 s", countWindows(col, windows), want)
	}
	checkExactWindows(t, col, windows)

	// Every node ran part of the job: the workers host tasks that took
	// records in.
	client := &http.Client{Timeout: time.Second}
	for _, m := range members[1:] {
		jobs, err := m.hosted(client)
		if err != nil || len(jobs) != 1 {
			t.Fatalf("node %s hosts %v (%v)", m.id, jobs, err)
		}
		var in int64
		for _, ts := range jobs[0].Tasks {
			in += ts.RecordsIn
		}
		if in == 0 {
			t.Fatalf("node %s hosts tasks that took no record in: %+v", m.id, jobs[0].Tasks)
		}
		t.Logf("node %s: epoch %d, %d tasks, %d records in", m.id, jobs[0].Epoch, len(jobs[0].Tasks), in)
	}
}

// countWindows counts the (sensor, window) results received for the
// first windows windows.
func countWindows(col *collector, windows int) int {
	col.mu.Lock()
	defer col.mu.Unlock()
	n := 0
	for k := range col.byKey {
		if k.start < epochMS+int64(windows)*windowMS {
			n++
		}
	}
	return n
}

// checkExactWindows checks that each of the first windows windows of
// every sensor arrived exactly once with the exact count, and that no
// payload was malformed.
func checkExactWindows(t *testing.T, col *collector, windows int) {
	t.Helper()
	col.mu.Lock()
	defer col.mu.Unlock()
	if len(col.bad) > 0 {
		t.Fatalf("%d bad results, first: %s", len(col.bad), col.bad[0])
	}
	for w := range windows {
		for s := range sensors {
			k := winKey{sensorOf(s), epochMS + int64(w)*windowMS}
			rs := col.byKey[k]
			switch {
			case len(rs) == 0:
				t.Fatalf("window %v: no result", k)
			case len(rs) > 1:
				ids := map[string]bool{}
				for _, r := range rs {
					ids[r.MsgID] = true
				}
				if len(ids) > 1 {
					t.Fatalf("window %v: %d results with %d ids: emitted twice", k, len(rs), len(ids))
				}
			}
			if rs[0].Count != perSensor {
				t.Fatalf("window %v: count %d, want %d", k, rs[0].Count, perSensor)
			}
		}
	}
}
