package test

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/operators"
)

// clusterMember is one edged process of a cluster test.
type clusterMember struct {
	*node
	id        string
	transport string
	gossip    string // "" without membership
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
		if m.gossip != "" {
			fmt.Fprintf(&peers, "    - {id: %s, address: %q, api: %q, gossip: %q}\n", m.id, m.transport, m.apiAddr, m.gossip)
			continue
		}
		fmt.Fprintf(&peers, "    - {id: %s, address: %q, api: %q}\n", m.id, m.transport, m.apiAddr)
	}
	gossip := ""
	if me.gossip != "" {
		// Gossip is encrypted, so that the key's path is the one the
		// cluster tests run.
		gossip = fmt.Sprintf("  gossip: %q\n  secret_key: %s\n", me.gossip, testGossipKey)
	}
	cfg := fmt.Sprintf(`node:
  data_dir: %[1]s
  broker: %[2]s
  listen: %[3]s
cluster:
  node: %[4]s
  listen: %[5]q
%[7]s  peers:
%[6]s`, data, me.brokerAddr, me.apiAddr, me.id, me.transport, peers.String(), gossip) + sensorsPipeline(data, 3, 100, "200ms")
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
	var w struct {
		Jobs []workerJob `json:"jobs"`
	}
	err := m.get(client, "/cluster/worker", &w)
	return w.Jobs, err
}

// startCluster starts three edged processes on loopback that run one
// MQTT pipeline together: "a" (the job master) and the workers "b" and
// "c"; the workers first, so the master's first deployment finds them.
// testGossipKey is the cluster tests' cluster.secret_key (AES-128).
const testGossipKey = "ZWRnZWQtdGVzdC1rZXkxNg=="

func startCluster(t *testing.T, gossip bool) []*clusterMember {
	t.Helper()
	return startClusterEdited(t, gossip, nil)
}

// startClusterEdited is startCluster with each node's config passed
// through edit, when it is not nil, before the nodes start.
func startClusterEdited(t *testing.T, gossip bool, edit func(cfg string) string) []*clusterMember {
	t.Helper()
	return startClusterHosting(t, gossip, edit, "b", "c")
}

// startClusterHosting is startClusterEdited that waits for the workers
// named by hosts (rather than both) to host the job's tasks.
func startClusterHosting(t *testing.T, gossip bool, edit func(cfg string) string, hosts ...string) []*clusterMember {
	t.Helper()
	var members []*clusterMember
	// Every address at once, so that no two of the twelve are the same.
	addrs := distinctAddrs(t, 12)
	for _, id := range []string{"a", "b", "c"} {
		dir := filepath.Join(t.TempDir(), id)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		take := func() string {
			a := addrs[0]
			addrs = addrs[1:]
			return a
		}
		m := &clusterMember{id: id, transport: take(),
			node: &node{t: t, brokerAddr: take(), apiAddr: take(), logPath: filepath.Join(dir, "edged.log")}}
		m.cfgPath = filepath.Join(dir, "edged.yaml")
		if g := take(); gossip {
			m.gossip = g
		}
		members = append(members, m)
	}
	for _, m := range members {
		p := writeClusterConfig(t, filepath.Dir(m.cfgPath), m, members)
		if edit != nil {
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, []byte(edit(string(b))), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if m.id != "a" {
			m.readyFn = m.hostsAndServes
		}
	}
	killMembersAtCleanup(t, members, keepLog)
	for _, m := range []*clusterMember{members[1], members[2], members[0]} {
		m.start()
	}
	// The job runs once both workers host their tasks of its deployment.
	client := &http.Client{Timeout: time.Second}
	var hosting []*clusterMember
	for _, m := range members {
		if slices.Contains(hosts, m.id) {
			hosting = append(hosting, m)
		}
	}
	ok := testutil.Within(30*time.Second, func() bool {
		return allHostTasks(client, hosting)
	})
	if !ok {
		t.Fatalf("the workers %v do not host the job's tasks after 30 s", hosts)
	}
	return members
}

// distinctAddrs returns n free loopback addresses, all different, from
// the test's port range (testutil.FreeAddr: below the ephemeral ports, so
// no connection of the machine takes one before the node that is given it
// binds it; free for UDP too, which gossip takes).
func distinctAddrs(t *testing.T, n int) []string {
	t.Helper()
	seen := make(map[string]bool)
	var out []string
	for len(out) < n {
		if a := freeAddr(t); !seen[a] {
			seen[a] = true
			out = append(out, a)
		}
	}
	return out
}

func brokerUp(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// clusterLoad publishes the e2e workload to a cluster's nodes and
// collects the results from every node's broker.
type clusterLoad struct {
	t       *testing.T
	members []*clusterMember
	col     *collector
	subs    []paho.Client   // by node: its results subscriber
	pubs    [][]paho.Client // by node: its device connections
	down    map[int]bool    // nodes killed and not yet restarted
	// payload makes reading i's topic and payload; nil is payloadOf.
	payload func(i int) (topic string, payload []byte)
	// deadLetters has the results subscribers take the dead letters too.
	deadLetters bool
	// inFlight is how many readings publish sends before it waits for
	// their PUBACKs; 0 is 600. A node's broker logs the readings of its
	// devicesPerNode connections in any order, so the readings in flight
	// at once must be less than max_out_of_orderness apart in event time.
	inFlight int
}

const devicesPerNode = 4

func newClusterLoad(t *testing.T, members []*clusterMember) *clusterLoad {
	l := &clusterLoad{t: t, members: members, col: newCollector(), down: map[int]bool{},
		subs: make([]paho.Client, len(members)), pubs: make([][]paho.Client, len(members))}
	for i := range members {
		l.connect(i)
	}
	t.Cleanup(func() {
		for i := range members {
			l.disconnect(i)
		}
	})
	return l
}

// connect connects node i's results subscriber (a persistent session in
// the node's broker, so results published while it is away wait for it)
// and its devices.
func (l *clusterLoad) connect(i int) {
	m := l.members[i]
	opts := paho.NewClientOptions().AddBroker("tcp://" + m.brokerAddr).SetClientID(fmt.Sprintf("results-%s", m.id)).
		SetCleanSession(false).SetAutoReconnect(false).SetOrderMatters(false).SetDefaultPublishHandler(l.col.handle)
	c := connect(l.t, opts)
	if tok := c.Subscribe("agg/#", 1, l.col.handle); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		l.t.Fatalf("subscribe to node %s: %v", m.id, tok.Error())
	}
	if l.deadLetters {
		if tok := c.Subscribe("deadletter/#", 1, l.col.handle); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			l.t.Fatalf("subscribe to node %s's dead letters: %v", m.id, tok.Error())
		}
	}
	l.subs[i] = c
	l.pubs[i] = nil
	for k := range devicesPerNode {
		opts := paho.NewClientOptions().AddBroker("tcp://" + m.brokerAddr).SetClientID(fmt.Sprintf("devices-%s-%d", m.id, k)).
			SetCleanSession(true).SetAutoReconnect(false).SetWriteTimeout(5 * time.Second)
		l.pubs[i] = append(l.pubs[i], connect(l.t, opts))
	}
}

// takeDeadLetters has the results subscribers take the dead letters too,
// from now on and after every reconnect.
func (l *clusterLoad) takeDeadLetters() {
	l.deadLetters = true
	for i, c := range l.subs {
		if c == nil {
			continue
		}
		if tok := c.Subscribe("deadletter/#", 1, l.col.handle); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			l.t.Fatalf("subscribe to node %s's dead letters: %v", l.members[i].id, tok.Error())
		}
	}
}

func (l *clusterLoad) disconnect(i int) {
	if l.subs[i] != nil {
		l.subs[i].Disconnect(0)
	}
	disconnectAll(l.pubs[i], 0)
	l.subs[i], l.pubs[i] = nil, nil
}

// kill SIGKILLs node i with none of its publishes in flight (every
// reading it acknowledged is in its ingest log); its readings go to the
// next live node until restart.
func (l *clusterLoad) kill(i int) {
	l.disconnect(i)
	l.members[i].kill()
	l.down[i] = true
	l.t.Logf("killed node %s", l.members[i].id)
}

// killWhen is kill, the SIGKILL sent as soon as cond holds once the
// node's publishers are gone (polled as testutil.Within polls), or after
// limit.
func (l *clusterLoad) killWhen(i int, limit time.Duration, cond func() bool) {
	l.disconnect(i)
	testutil.Within(limit, cond)
	l.members[i].kill()
	l.down[i] = true
	l.t.Logf("killed node %s", l.members[i].id)
}

// stop stops node i with SIGTERM (none of its publishes in flight) and
// checks that it exited cleanly; its readings go to the next live node
// until restart.
func (l *clusterLoad) stop(i int) {
	l.disconnect(i)
	if code := l.members[i].terminate(60 * time.Second); code != 0 {
		l.t.Fatalf("node %s exited with %d after SIGTERM\n%s", l.members[i].id, code, l.members[i].logTail())
	}
	l.down[i] = true
	l.t.Logf("stopped node %s", l.members[i].id)
}

// restart starts node i again with its data and reconnects to it.
func (l *clusterLoad) restart(i int) {
	l.members[i].start()
	delete(l.down, i)
	l.connect(i)
	l.t.Logf("restarted node %s", l.members[i].id)
}

// publish sends readings [from, to) in lock step: reading i to node i%3,
// or the next live one; at most l.inFlight unacknowledged at once.
func (l *clusterLoad) publish(from, to int) {
	inFlight := l.inFlight
	if inFlight == 0 {
		inFlight = 600
	}
	var toks []paho.Token
	wait := func() {
		for _, tok := range toks {
			if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
				l.t.Fatalf("publish: %v", tok.Error())
			}
		}
		toks = toks[:0]
	}
	for i := from; i < to; i++ {
		node := i % len(l.members)
		for l.down[node] {
			node = (node + 1) % len(l.members)
		}
		payload := payloadOf
		if l.payload != nil {
			payload = l.payload
		}
		topic, p := payload(i)
		toks = append(toks, l.pubs[node][(i/len(l.members))%devicesPerNode].Publish(topic, 1, false, p))
		if len(toks) == inFlight {
			wait()
		}
	}
	wait()
}

// finish publishes a tail to every node, moving each split's watermark
// past the last window, and checks that each window of every sensor
// arrived exactly once with the exact count.
func (l *clusterLoad) finish(n int, timeout time.Duration) {
	l.publish(n, n+len(l.members)*tail)
	windows := n / windowMS
	want := windows * sensors
	if !testutil.Within(timeout, func() bool { return countWindows(l.col, windows) >= want }) {
		l.t.Fatalf("%d of %d window results after %v", countWindows(l.col, windows), want, timeout)
	}
	checkExactWindows(l.t, l.col, windows)
}

// checkWorkers checks that every worker hosts tasks of the job that took
// records in.
func (l *clusterLoad) checkWorkers() {
	client := &http.Client{Timeout: time.Second}
	for _, m := range l.members[1:] {
		jobs, err := m.hosted(client)
		if err != nil || len(jobs) != 1 {
			l.t.Fatalf("node %s hosts %v (%v)", m.id, jobs, err)
		}
		var in int64
		for _, ts := range jobs[0].Tasks {
			in += ts.RecordsIn
		}
		if in == 0 {
			l.t.Fatalf("node %s hosts tasks that took no record in: %+v", m.id, jobs[0].Tasks)
		}
		l.t.Logf("node %s: epoch %d, %d tasks, %d records in", m.id, jobs[0].Epoch, len(jobs[0].Tasks), in)
	}
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
	l := newClusterLoad(t, startCluster(t, false))
	const n = 30_000
	l.publish(0, n)
	l.finish(n, 90*time.Second)
	l.checkWorkers()
}

// A worker and then the job master of a three-process cluster are
// SIGKILLed under MQTT load and restarted: the job restarts from its
// latest checkpoint in a newer epoch each time (the worker fetching the
// state it restores from the master), and every window of every sensor
// still arrives exactly once with the exact count.
func TestClusterNodesKilledExactTotals(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with three subprocesses and SIGKILL")
	}
	members := startCluster(t, false)
	l := newClusterLoad(t, members)
	const n = 60_000
	var epochs []uint64
	client := &http.Client{Timeout: time.Second}
	// nextEpoch waits until worker c hosts a deployment newer than the
	// last one seen.
	nextEpoch := func() {
		var last uint64
		if len(epochs) > 0 {
			last = epochs[len(epochs)-1]
		}
		testutil.Eventually(t, 60*time.Second, "worker c hosts a newer deployment", func() bool {
			jobs, err := members[2].hosted(client)
			if err != nil || len(jobs) != 1 || len(jobs[0].Tasks) == 0 || jobs[0].Epoch <= last {
				return false
			}
			epochs = append(epochs, jobs[0].Epoch)
			return true
		})
	}
	nextEpoch()
	l.publish(0, n/3)
	l.kill(2) // worker c
	l.publish(n/3, n/2)
	l.restart(2)
	nextEpoch()
	l.publish(n/2, 2*n/3)
	l.kill(0) // the job master
	l.publish(2*n/3, 5*n/6)
	l.restart(0)
	nextEpoch()
	l.publish(5*n/6, n)
	l.finish(n, 120*time.Second)
	t.Logf("worker c hosted epochs %v", epochs)
	l.checkWorkers()
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

// released returns the offset below which node m's ingest log of the
// pipeline was released: what completed checkpoints cover.
func (m *clusterMember) released(client *http.Client) (uint64, error) {
	resp, err := client.Get("http://" + m.apiAddr + "/ingest")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var in struct {
		Pipelines []struct {
			Pipeline string `json:"pipeline"`
			Released uint64 `json:"released_offset"`
		} `json:"pipelines"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&in); err != nil {
		return 0, err
	}
	for _, p := range in.Pipelines {
		if p.Pipeline == "sensors" {
			return p.Released, nil
		}
	}
	return 0, fmt.Errorf("no ingest log of pipeline sensors")
}

// clusterStatus is what the test reads of GET /cluster.
type clusterStatus struct {
	Epoch          uint64 `json:"epoch"`
	FailoversTotal int64  `json:"failovers_total"`
	Failovers      []struct {
		DeadNode    string  `json:"dead_node"`
		PlacementMS float64 `json:"placement_ms"`
		RestoreMS   float64 `json:"restore_ms"`
	} `json:"failovers"`
	Members []struct {
		ID    string `json:"id"`
		State string `json:"state"`
	} `json:"members"`
	Placement []struct {
		Node     string `json:"node"`
		Subtasks []struct {
			Operator string `json:"operator"`
			Subtask  int    `json:"subtask"`
		} `json:"subtasks"`
	} `json:"placement"`
}

func (m *clusterMember) status(client *http.Client) (clusterStatus, error) {
	var s clusterStatus
	err := m.get(client, "/cluster", &s)
	return s, err
}

// alive returns how many members the status says are alive.
func (s clusterStatus) alive() int {
	n := 0
	for _, m := range s.Members {
		if m.State == "alive" {
			n++
		}
	}
	return n
}

// keyedOn returns how many keyed subtasks the status places on node.
func (s clusterStatus) keyedOn(node string) int {
	for _, p := range s.Placement {
		if p.Node == node {
			return len(p.Subtasks)
		}
	}
	return 0
}

// The job master of a three-process cluster stopped with SIGTERM under
// load stops the job with a savepoint (the workers' sinks commit it) and
// exits cleanly; started again, it resumes from that savepoint, and every
// window stays exact.
func TestClusterMasterStoppedAndResumed(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with three subprocesses")
	}
	members := startCluster(t, false)
	l := newClusterLoad(t, members)
	const n = 30_000
	l.publish(0, n/2)
	l.stop(0)
	if !strings.Contains(members[0].logTailN(200000), "job stopped with savepoint") {
		t.Fatalf("the master did not stop the job with a savepoint:\n%s", members[0].logTail())
	}
	l.publish(n/2, 2*n/3)
	l.restart(0)
	if !strings.Contains(members[0].logTailN(400000), "resuming from the latest snapshot") {
		t.Fatalf("the master did not resume from its snapshot:\n%s", members[0].logTail())
	}
	l.publish(2*n/3, n)
	l.finish(n, 120*time.Second)
	l.checkWorkers()
}

// A worker of a three-node cluster with gossip membership is SIGKILLed
// under MQTT load and stays down: the job master sees it die, places its
// subtasks (and their key groups) on the two live nodes, which restore
// them from the latest checkpoint, and the dead node's source split goes
// idle so the windows keep firing. Every window stays exact. When the
// node comes back it gets its subtasks back, and the windows after are
// exact too.
func TestClusterWorkerFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with three subprocesses and SIGKILL")
	}
	members := startClusterEdited(t, true, withNodeLocalFileSink)
	l := newClusterLoad(t, members)
	a, c := members[0], members[2]
	client := &http.Client{Timeout: time.Second}
	testutil.Eventually(t, 30*time.Second, "the master sees every node alive", func() bool {
		s, err := a.status(client)
		if err != nil {
			return false
		}
		return s.alive() == 3 && s.keyedOn("c") > 0
	})

	const n1, n2, n3 = 15_000, 30_000, 45_000
	l.publish(0, n1)
	// Before the kill, everything node c acknowledged is covered by
	// completed checkpoints (its split released it from its log, which
	// it does only below the retained checkpoints' offsets): the failover
	// must not need c's disk. (The split's record counter would not do: a
	// redeployment under load restarts it.)
	testutil.Eventually(t, 60*time.Second, "node c's log released all it was sent", func() bool {
		rel, err := c.released(client)
		return err == nil && rel >= n1/3
	})
	l.kill(2)
	start := time.Now()
	testutil.Eventually(t, 60*time.Second, "the master moved node c's subtasks to live nodes", func() bool {
		s, err := a.status(client)
		return err == nil && s.FailoversTotal >= 1 && s.keyedOn("c") == 0 && s.keyedOn("a")+s.keyedOn("b") > 0
	})
	t.Logf("failover after %v", time.Since(start).Round(time.Millisecond))
	l.publish(n1, n2)
	// Windows up to n2 fire without node c.
	l.publish(n2, n2+2*tail)
	windows := n2 / windowMS
	if !testutil.Within(90*time.Second, func() bool { return countWindows(l.col, windows) >= windows*sensors }) {
		t.Fatalf("%d of %d window results after the failover", countWindows(l.col, windows), windows*sensors)
	}
	checkExactWindows(t, l.col, windows)

	// Node c comes back and gets its subtasks back.
	l.restart(2)
	testutil.Eventually(t, 60*time.Second, "node c owns key groups again", func() bool {
		s, err := a.status(client)
		return err == nil && s.keyedOn("c") > 0
	})
	l.publish(n2+2*tail, n3)
	l.finish(n3, 120*time.Second)
	if s, err := a.status(client); err == nil {
		t.Logf("failovers: %+v", s.Failovers)
	}
	// The file sink's subtask on c moved to a live node at the failover
	// and back to c by handover: the union of the nodes' dirs holds
	// every window exactly once.
	checkFileSinkUnion(t, members, n3/windowMS, 60*time.Second)
}

// withNodeLocalFileSink adds to a cluster node's config a second sink, an
// exactly-once file sink writing to a dir under the node's own data dir.
func withNodeLocalFileSink(cfg string) string {
	const mqttSink = "      - mqtt: {topic: \"agg/{id}\", qos: 1}\n"
	var data string
	for _, line := range strings.Split(cfg, "\n") {
		if v, ok := strings.CutPrefix(line, "  data_dir: "); ok {
			data = v
		}
	}
	if data == "" || !strings.Contains(cfg, mqttSink) {
		panic("withNodeLocalFileSink: unexpected config:\n" + cfg)
	}
	return strings.Replace(cfg, mqttSink, mqttSink+fmt.Sprintf("      - file: {dir: %q}\n", filepath.Join(data, "out")), 1)
}

// checkFileSinkUnion waits until the union of the members' file-sink dirs
// (withNodeLocalFileSink), each part name taken once, holds a result of
// every sensor for each of the first windows windows, and checks that
// each is there exactly once with the exact count, that a part in two
// dirs has the same content in both, and that some sink subtask moved:
// its parts are in two nodes' dirs.
func checkFileSinkUnion(t *testing.T, members []*clusterMember, windows int, timeout time.Duration) {
	t.Helper()
	var byKey map[winKey][]result
	var wroteOn map[string]map[string]bool // sink subtask -> nodes whose dir holds its parts
	read := func() error {
		byKey = map[winKey][]result{}
		wroteOn = map[string]map[string]bool{}
		parts := map[string][]byte{}
		for _, m := range members {
			dir := filepath.Join(filepath.Dir(m.cfgPath), "data", "out", "windows")
			paths, err := operators.CommittedParts(dir)
			if err != nil && !os.IsNotExist(err) {
				return err
			}
			for _, p := range paths {
				b, err := os.ReadFile(p)
				if err != nil {
					return err
				}
				name := filepath.Base(p)
				sub, _, _ := strings.Cut(strings.TrimPrefix(name, "part-"), "-")
				if wroteOn[sub] == nil {
					wroteOn[sub] = map[string]bool{}
				}
				wroteOn[sub][m.id] = true
				if prev, ok := parts[name]; ok {
					if string(prev) != string(b) {
						t.Fatalf("part %s differs between two nodes' dirs", name)
					}
					continue
				}
				parts[name] = b
			}
		}
		for name, b := range parts {
			for _, line := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
				if line == "" {
					continue
				}
				var r result
				if err := json.Unmarshal([]byte(line), &r); err != nil || r.ID == "" {
					t.Fatalf("part %s: malformed line %q (%v)", name, line, err)
				}
				k := winKey{r.ID, r.WindowStart}
				byKey[k] = append(byKey[k], r)
			}
		}
		return nil
	}
	complete := func() bool {
		if err := read(); err != nil {
			t.Fatal(err)
		}
		for w := range windows {
			for s := range sensors {
				if len(byKey[winKey{sensorOf(s), epochMS + int64(w)*windowMS}]) == 0 {
					return false
				}
			}
		}
		return true
	}
	if !testutil.Within(timeout, complete) {
		var missing []winKey
		for w := range windows {
			for s := range sensors {
				if k := (winKey{sensorOf(s), epochMS + int64(w)*windowMS}); len(byKey[k]) == 0 {
					missing = append(missing, k)
				}
			}
		}
		for _, m := range members {
			dir := filepath.Join(filepath.Dir(m.cfgPath), "data", "out", "windows")
			entries, _ := os.ReadDir(dir)
			var names []string
			for _, e := range entries {
				names = append(names, e.Name())
			}
			t.Logf("node %s: %s holds %v", m.id, dir, names)
		}
		t.Fatalf("the file sinks' dirs lack %d of %d window results after %v, first %v", len(missing), windows*sensors, timeout, missing[0])
	}
	for k, rs := range byKey {
		if len(rs) > 1 {
			t.Fatalf("window %v: %d lines in the file sinks' dirs: committed twice", k, len(rs))
		}
		if k.start < epochMS+int64(windows)*windowMS && rs[0].Count != perSensor {
			t.Fatalf("window %v: count %d in the file sink, want %d", k, rs[0].Count, perSensor)
		}
	}
	moved := false
	for sub, nodes := range wroteOn {
		t.Logf("file sink subtask %s: parts on %d nodes", sub, len(nodes))
		moved = moved || len(nodes) > 1
	}
	if !moved {
		t.Fatal("no file sink subtask committed parts on two nodes: none moved")
	}
	t.Logf("file sinks: %d window results, each once", len(byKey))
}

// A worker is SIGKILLed right after its devices published to it, while
// readings it acknowledged are above every completed checkpoint, and left
// down. Its source split, restored idle on a live node, must not hold the
// windows back: the windows keep firing on the live nodes' readings, and
// those after the kill are exact. (The readings only the dead node holds
// are lost to the windows while it is down; see "The ingest log is not
// replicated".)
func TestClusterWorkerKilledUnderLoadWindowsKeepFiring(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with three subprocesses and SIGKILL")
	}
	members := startCluster(t, true)
	l := newClusterLoad(t, members)
	a, c := members[0], members[2]
	client := &http.Client{Timeout: time.Second}
	testutil.Eventually(t, 30*time.Second, "the master sees every node alive", func() bool {
		s, err := a.status(client)
		return err == nil && s.alive() == 3 && s.keyedOn("c") > 0
	})
	const n1, n2 = 15_000, 30_000
	l.publish(0, n1)
	rel, err := c.released(client)
	if err != nil {
		t.Fatal(err)
	}
	if rel >= n1/3 {
		t.Fatalf("node c's log was released up to %d of %d before the kill: no reading was above the checkpoints, the path this test is for was not reached", rel, n1/3)
	}
	l.kill(2)
	t.Logf("killed node c with its log released up to %d of %d", rel, n1/3)
	testutil.Eventually(t, 60*time.Second, "the master moved node c's subtasks to live nodes", func() bool {
		s, err := a.status(client)
		return err == nil && s.FailoversTotal >= 1 && s.keyedOn("c") == 0
	})
	l.publish(n1, n2)
	l.publish(n2, n2+2*tail)
	windows := n2 / windowMS
	if !testutil.Within(90*time.Second, func() bool { return countWindows(l.col, windows) >= windows*sensors }) {
		t.Fatalf("%d of %d window results with node c down: the windows are held back", countWindows(l.col, windows), windows*sensors)
	}
	// Every window after the kill is exact: its readings went to a and b.
	l.col.mu.Lock()
	defer l.col.mu.Unlock()
	for w := n1/windowMS + 1; w < windows; w++ {
		for s := range sensors {
			k := winKey{sensorOf(s), epochMS + int64(w)*windowMS}
			if rs := l.col.byKey[k]; len(rs) == 0 || rs[0].Count != perSensor {
				t.Fatalf("window %v after the kill: %+v, want one result of %d", k, rs, perSensor)
			}
		}
	}
}

// hostsAndServes is a worker's readiness: it answers GET /cluster/worker
// and its broker listens.
func (m *clusterMember) hostsAndServes(client *http.Client) bool {
	_, err := m.hosted(client)
	return err == nil && brokerUp(m.brokerAddr)
}

// allHostTasks reports whether every member hosts tasks of a job, and
// tasks of every job it hosts.
func allHostTasks(client *http.Client, members []*clusterMember) bool {
	for _, m := range members {
		jobs, err := m.hosted(client)
		if err != nil || len(jobs) == 0 {
			return false
		}
		for _, j := range jobs {
			if len(j.Tasks) == 0 {
				return false
			}
		}
	}
	return true
}

// killMembersAtCleanup kills, when the test ends, every member still
// running, and hands each to onFail if the test failed.
func killMembersAtCleanup(t *testing.T, members []*clusterMember, onFail func(*testing.T, *clusterMember)) {
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
				onFail(t, m)
			}
		}
	})
}

// getJSONFrom decodes the JSON answer of GET url into v; an answer other
// than 200 is an error.
func getJSONFrom(client *http.Client, url string, v any) error {
	resp, err := client.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// get decodes the JSON answer of GET path on m's API into v.
func (m *clusterMember) get(client *http.Client, path string, v any) error {
	return getJSONFrom(client, "http://"+m.apiAddr+path, v)
}
