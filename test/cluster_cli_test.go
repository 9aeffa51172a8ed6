package test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgedio/edged/internal/testutil"
)

// The user's paths through the CLI on a running cluster: a rescale by
// edged stop and edged run --from-savepoint, rebalances asked twice in a
// row and a drain of the leader, the status and checkpoint listings while
// a node is down, and hostile payloads sent to every node.

// runCLI runs edged with args and returns its exit code, stdout and
// stderr; it fails the test if edged cannot run or does not end within
// timeout.
func runCLI(t *testing.T, timeout time.Duration, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, edgedBin, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("edged %s did not end within %v\nstdout: %s\nstderr: %s", strings.Join(args, " "), timeout, stdout.String(), stderr.String())
	}
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("edged %s: %v", strings.Join(args, " "), err)
		}
		code = ee.ExitCode()
	}
	t.Logf("edged %s: exit %d after %v: %s%s", strings.Join(args, " "), code, time.Since(start).Round(time.Millisecond),
		strings.TrimSpace(stdout.String()), strings.TrimSpace(stderr.String()))
	return code, stdout.String(), stderr.String()
}

// mustCLI runs `edged args... --addr addr`, waiting up to timeout, fails
// the test unless it exits 0, and returns its stdout.
func mustCLI(t *testing.T, timeout time.Duration, addr string, args ...string) string {
	t.Helper()
	code, stdout, stderr := runCLI(t, timeout, append(args, "--addr", addr)...)
	if code != 0 {
		t.Fatalf("edged %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, stdout, stderr)
	}
	return stdout
}

// setParallelism rewrites the pipeline's parallelism in m's config.
func setParallelism(t *testing.T, m *clusterMember, from, to int) {
	t.Helper()
	b, err := os.ReadFile(m.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	old := fmt.Sprintf("    parallelism: %d\n", from)
	if !bytes.Contains(b, []byte(old)) {
		t.Fatalf("node %s's config has no %q", m.id, old)
	}
	cfg := strings.Replace(string(b), old, fmt.Sprintf("    parallelism: %d\n", to), 1)
	if err := os.WriteFile(m.cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
}

// windowSubtasks returns the window subtasks GET /cluster on m places,
// by node.
func windowSubtasks(client *http.Client, m *clusterMember) (map[string]int, error) {
	s, err := m.status(client)
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	for _, p := range s.Placement {
		for _, st := range p.Subtasks {
			if strings.HasSuffix(st.Operator, "window") {
				out[p.Node]++
			}
		}
	}
	return out, nil
}

// A running three-node cluster job is rescaled as a user does it with the
// CLI, under MQTT load: edged stop on the leader (a savepoint), readings
// go on into the leader's ingest log while the job is stopped, every node
// is stopped with SIGTERM, the leader last, each config's parallelism goes
// from 3 to 2, and the nodes are started again, the leader first with
// --from-savepoint. The
// job runs two window subtasks, restored from that savepoint, and every
// window of every sensor is exact with one result id.
func TestClusterCLIRescaleStopResume(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with three subprocesses")
	}
	members := startCluster(t, true)
	a := members[0]
	l := newClusterLoad(t, members)
	client := &http.Client{Timeout: time.Second}
	const n = 30_000
	l.publish(0, n/3)
	sp := cliStop(t, a.node, "sensors")
	// The nodes serve on with the job stopped: the leader's broker takes
	// readings into its ingest log, which the restored job reads. Only
	// the leader's: the leader deploys the restored job as soon as it
	// sees a majority, so a worker that starts after that runs in no
	// first deployment, and readings waiting in its log would be read
	// only once its split is handed back, behind the watermark the other
	// splits moved on (late, as the README says). The leader is in every
	// deployment.
	l.down[1], l.down[2] = true, true
	l.publish(n/3, n/2)
	for _, i := range []int{1, 2, 0} {
		l.stop(i)
	}
	for _, m := range members {
		setParallelism(t, m, 3, 2)
	}
	// The leader first: it leads the nodes that come back after it. (The
	// workers first could take the job masters over from it once it
	// stayed away three failure-detection times.)
	a.readyFn = a.hostsAndServes
	a.start("--from-savepoint", sp)
	delete(l.down, 0)
	l.connect(0)
	for _, i := range []int{1, 2} {
		l.restart(i)
	}
	testutil.Eventually(t, 30*time.Second, "the job runs on the three nodes", func() bool {
		return allHostTasks(client, members[1:])
	})
	a.checkRestoredFrom(t, sp)
	testutil.Eventually(t, 30*time.Second, "two window subtasks placed", func() bool {
		w, err := windowSubtasks(client, a)
		total := 0
		for _, c := range w {
			total += c
		}
		return err == nil && total == 2
	})
	l.publish(n/2, n)
	l.finishChecked(n, 120*time.Second)
	for _, m := range members {
		m.failIfExited(t)
	}
}

// Under MQTT load, `edged cluster rebalance` is asked twice in a row (the
// second waits out the gap between rebalances) and `edged cluster drain`
// of the leader is refused with its reason; every window stays exact.
func TestClusterCLIRebalanceTwiceAndDrainLeader(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with three subprocesses")
	}
	members := startCluster(t, true)
	a := members[0]
	l := newClusterLoad(t, members)
	waitAllAlive(t, a, 3)
	const n = 30_000
	l.publish(0, n/4)
	for k := range 2 {
		done := make(chan struct{})
		var code int
		var stdout, stderr string
		go func() {
			defer close(done)
			code, stdout, stderr = runCLI(t, 60*time.Second, "cluster", "rebalance", "--addr", a.apiAddr)
		}()
		l.publish(n/4+k*n/8, n/4+(k+1)*n/8)
		<-done
		if code != 0 || !strings.HasPrefix(stdout, "rebalanced: ") {
			t.Fatalf("edged cluster rebalance #%d: exit %d, stdout %q, stderr %q", k+1, code, stdout, stderr)
		}
	}
	code, stdout, stderr := runCLI(t, 30*time.Second, "cluster", "drain", "a", "--addr", a.apiAddr)
	if code != 1 || stdout != "" || !strings.Contains(stderr, `node "a" runs the job masters and cannot be drained`) || !strings.Contains(stderr, "HTTP 409") {
		t.Fatalf("edged cluster drain a: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	l.publish(n/2, n)
	l.finishChecked(n, 120*time.Second)
	for _, m := range members {
		m.failIfExited(t)
	}
}

// With a worker SIGKILLed and left down, the CLI shows what a user needs:
// edged cluster status on the leader shows it dead and its key groups on
// the live nodes, on the live worker names the leader to ask for the
// placement, and edged checkpoints lists checkpoints completed after the
// failover; asked of the dead node, both say that it does not answer.
func TestClusterCLIStatusWhileANodeIsDown(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with three subprocesses")
	}
	members := startCluster(t, true)
	a, b, c := members[0], members[1], members[2]
	l := newClusterLoad(t, members)
	client := &http.Client{Timeout: time.Second}
	waitAllAlive(t, a, 3)
	const n = 15_000
	l.publish(0, n/3)
	// Readings c acknowledged that no checkpoint covers would be lost
	// with it (see "What a failover guarantees"): it goes down once its
	// log released every one.
	sentToC := uint64(0)
	for i := range n / 3 {
		if i%3 == 2 {
			sentToC++
		}
	}
	testutil.Eventually(t, 60*time.Second, "node c's log released all it was sent", func() bool {
		rel, err := c.released(client)
		return err == nil && rel >= sentToC
	})
	l.kill(2)
	testutil.Eventually(t, 30*time.Second, "c's key groups on the live nodes", func() bool {
		w, err := windowSubtasks(client, a)
		return err == nil && w["c"] == 0 && w["a"]+w["b"] == 3
	})
	l.publish(n/3, 2*n/3)

	_, out, _ := runCLI(t, 30*time.Second, "cluster", "status", "--addr", a.apiAddr)
	// The node asked names its own API too, as its peers know it.
	if !strings.Contains(out, "2 of 3 members alive") || !containsRow(out, "c", "dead") || containsRow(out, "c", "sensors/sensors/window") ||
		!containsRow(out, "a", a.apiAddr) || !containsRow(out, "b", b.apiAddr) {
		t.Fatalf("edged cluster status on the leader:\n%s", out)
	}
	_, out, _ = runCLI(t, 30*time.Second, "cluster", "status", "--addr", b.apiAddr)
	if !containsRow(out, "c", "dead") || !strings.Contains(out, "kept by the leader, node a") || !strings.Contains(out, a.apiAddr) {
		t.Fatalf("edged cluster status on a worker:\n%s", out)
	}

	// A checkpoint completed after the failover is listed.
	ids, err := a.checkpointIDs(client)
	if err != nil || len(ids) == 0 {
		t.Fatalf("checkpoints after the failover: %v %v", ids, err)
	}
	var after uint64
	testutil.Eventually(t, 30*time.Second, "a checkpoint completed after the failover", func() bool {
		got, status, err := a.checkpointStatus(client)
		if err != nil || len(got) == 0 || got[len(got)-1] <= ids[len(ids)-1] || status != "completed" {
			return false
		}
		after = got[len(got)-1]
		return true
	})
	code, out, stderr := runCLI(t, 30*time.Second, "checkpoints", "sensors", "--addr", a.apiAddr)
	if code != 0 || !containsRow(out, fmt.Sprint(after), "completed") {
		t.Fatalf("edged checkpoints on the leader: exit %d, stderr %q:\n%s", code, stderr, out)
	}
	for _, args := range [][]string{{"cluster", "status"}, {"checkpoints", "sensors"}} {
		code, out, stderr = runCLI(t, 30*time.Second, append(args, "--addr", c.apiAddr)...)
		if code != 1 || out != "" || !strings.Contains(stderr, "connection refused") {
			t.Fatalf("edged %s of the dead node: exit %d, stdout %q, stderr %q", strings.Join(args, " "), code, out, stderr)
		}
	}
	l.publish(2*n/3, n)
	l.finishChecked(n, 120*time.Second)
}

// containsRow reports whether a line of out starts with the field first
// and holds the field word.
func containsRow(out, first, word string) bool {
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && f[0] == first && strings.Contains(line, word) {
			return true
		}
	}
	return false
}

// hostilePayloads returns payloads none of which is a reading the
// pipeline counts: each one a dead letter of the source split that reads
// it. now is an event time in the workload's range.
func hostilePayloads(now int64) [][]byte {
	garbage := make([]byte, 5000)
	for i := range garbage {
		garbage[i] = byte(i*131 + 7)
	}
	deep := strings.Repeat("[", 100_000)
	nested := fmt.Sprintf(`{"sensor":"s001","t":1,"ts":%d,"x":%s1%s}`, now, strings.Repeat("[", 70), strings.Repeat("]", 70))
	return [][]byte{
		[]byte(fmt.Sprintf(`{"sensor":"s001","t":NaN,"ts":%d}`, now)),
		[]byte(fmt.Sprintf(`{"sensor":"s001","t":Infinity,"ts":%d}`, now)),
		[]byte(fmt.Sprintf(`{"sensor":"s001","t":1e999,"ts":%d}`, now)),
		[]byte(fmt.Sprintf(`{"sensor":"s001","t":"hot","ts":%d}`, now)),
		[]byte(fmt.Sprintf(`{"sensor":5,"t":1,"ts":%d}`, now)),
		[]byte(fmt.Sprintf(`{"sensor":null,"t":1,"ts":%d}`, now)),
		[]byte(`{"sensor":"s001","t":1,"ts":"x"}`),
		[]byte(`{"sensor":"s001","t":1,"ts":1e30}`),
		[]byte(`{"sensor":"s001","t":1,"ts":-9223372036854775808}`),
		[]byte(fmt.Sprintf(`{"sensor":"s001","t":1,"ts":%d}`, time.Now().Add(3*time.Hour).UnixMilli())),
		[]byte(fmt.Sprintf(`{"sensor":"s001","sensor":"s002","t":1,"ts":%d}`, now)),
		[]byte(fmt.Sprintf(`{"sensor":"%s","t":1,"ts":%d}`, strings.Repeat("k", 20_000), now)),
		[]byte(fmt.Sprintf("{\"sensor\":\"\xff\xfe\",\"t\":1,\"ts\":%d}", now)),
		[]byte(fmt.Sprintf(`{"sensor":"s001","t":1,"ts":%d`, now)),
		[]byte(nested),
		[]byte(deep),
		garbage,
		[]byte(`[1,2,3]`),
		[]byte(`null`),
		{},
	}
}

// dlCollector counts the dead letters published to deadletter/# on a
// node's broker.
type dlCollector struct {
	mu     sync.Mutex
	byNode map[string]int
	bad    []string
}

func (d *dlCollector) handle(_ paho.Client, m paho.Message) {
	var dl struct {
		Pipeline string `json:"pipeline"`
		Error    string `json:"error"`
		MsgID    string `json:"msg_id"`
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := json.Unmarshal(m.Payload(), &dl); err != nil || dl.Pipeline != "sensors" || dl.MsgID == "" {
		d.bad = append(d.bad, fmt.Sprintf("%s: %.200q (%v)", m.Topic(), m.Payload(), err))
		return
	}
	for _, id := range []string{"a", "b", "c"} {
		if strings.Contains(dl.Error, ", node "+id+", ") {
			d.byNode[id]++
			return
		}
	}
	d.bad = append(d.bad, "no node named: "+dl.Error)
}

func (d *dlCollector) counts() map[string]int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return maps.Clone(d.byNode)
}

// Hostile payloads (NaN and Infinity, wrong types, out-of-range and
// future event times, a key given twice, a key over 16 KiB, invalid
// UTF-8, truncated JSON, JSON nested 70 and 100,000 deep, binary garbage,
// arrays, null, an empty message) are published to each node of a
// three-node cluster between the readings of the MQTT load. No node
// exits; each one is a dead letter of the node that read it, counted by
// the master per node and published once on that node's
// deadletter/sensors; and every window of the good readings is exact.
func TestClusterHostilePayloads(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with three subprocesses")
	}
	members := startCluster(t, false)
	l := newClusterLoad(t, members)
	dls := &dlCollector{byNode: map[string]int{}}
	for _, m := range members {
		opts := paho.NewClientOptions().AddBroker("tcp://" + m.brokerAddr).SetClientID("deadletters-" + m.id).
			SetCleanSession(false).SetAutoReconnect(false)
		c := connect(t, opts)
		if tok := c.Subscribe("deadletter/#", 1, dls.handle); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			t.Fatalf("subscribe to node %s: %v", m.id, tok.Error())
		}
		t.Cleanup(func() { c.Disconnect(0) })
	}
	const n = 30_000
	l.publish(0, n/3)
	hostile := hostilePayloads(epochMS + n/3)
	for i, m := range members {
		for k, p := range hostile {
			if tok := l.pubs[i][k%devicesPerNode].Publish("sensors/s001/temperature", 1, false, p); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
				t.Fatalf("publish hostile payload %d to %s: %v", k, m.id, tok.Error())
			}
		}
	}
	l.publish(n/3, n)
	l.finishChecked(n, 120*time.Second)

	want := map[string]int{"a": len(hostile), "b": len(hostile), "c": len(hostile)}
	client := &http.Client{Timeout: 5 * time.Second}
	var byNode map[string]int
	ok := testutil.Within(30*time.Second, func() bool {
		var jl struct {
			Jobs []struct {
				ByNode map[string]int `json:"dead_letters_by_node"`
			} `json:"jobs"`
		}
		if err := members[0].get(client, "/jobs", &jl); err != nil || len(jl.Jobs) != 1 {
			return false
		}
		byNode = jl.Jobs[0].ByNode
		return maps.Equal(byNode, want)
	})
	if !ok {
		t.Fatalf("dead letters by node on the master: %v, want %v", byNode, want)
	}
	testutil.Eventually(t, 30*time.Second, fmt.Sprintf("%v dead letters published", want), func() bool {
		return maps.Equal(dls.counts(), want)
	})
	dls.mu.Lock()
	defer dls.mu.Unlock()
	if len(dls.bad) > 0 {
		t.Fatalf("%d unexpected dead-letter messages, first: %s", len(dls.bad), dls.bad[0])
	}
	for _, m := range members {
		m.failIfExited(t)
	}
}

// A peer transport address in the leader's config that nothing listens on
// (the peer itself is up: its gossip and API answer) leaves the job
// undeployed; the job's error names the address the leader's config gives
// that peer, so that the mistake can be found from `GET /jobs` (before,
// only `nodes ["c"] not deployed within 10s`).
func TestClusterWrongPeerTransportAddressIsNamed(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with three subprocesses")
	}
	wrong := freeAddr(t)
	re := regexp.MustCompile(`\{id: c, address: "[^"]*"`)
	members := startClusterHosting(t, true, func(cfg string) string {
		if !strings.Contains(cfg, "\n  node: a\n") {
			return cfg
		}
		return re.ReplaceAllString(cfg, `{id: c, address: "`+wrong+`"`)
	})
	a := members[0]
	client := &http.Client{Timeout: 2 * time.Second}
	var last string
	ok := testutil.Within(40*time.Second, func() bool {
		var l struct {
			Jobs []struct {
				Status      string `json:"status"`
				Error       string `json:"error"`
				LastFailure string `json:"last_failure"`
			} `json:"jobs"`
		}
		if err := a.get(client, "/jobs", &l); err != nil || len(l.Jobs) != 1 {
			return false
		}
		j := l.Jobs[0]
		last = j.Status + ": " + j.Error + "; last failure: " + j.LastFailure
		return strings.Contains(j.Error+j.LastFailure, wrong)
	})
	if !ok {
		t.Fatalf("after 40 s the job's error does not name the address %s that node a cannot reach c at: %s", wrong, last)
	}
}
