package test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/operators"
)

// withAlertsPipeline adds to a cluster node's config a second pipeline,
// "alerts": the alerts workload's readings on machines/+/temperature,
// an alert held for alertForMS and silent keys, written batched to MQTT
// (write-ahead) and to an exactly-once file sink under the node's own
// data dir.
func withAlertsPipeline(cfg string) string {
	var data string
	for _, line := range strings.Split(cfg, "\n") {
		if v, ok := strings.CutPrefix(line, "  data_dir: "); ok {
			data = v
		}
	}
	if data == "" {
		panic("withAlertsPipeline: no data_dir in:\n" + cfg)
	}
	return cfg + fmt.Sprintf(`  - name: alerts
    parallelism: 3
    source:
      mqtt:
        topics: [machines/+/temperature]
        qos: 1
        format: json
        fields:
          id: {type: string, path: $.sensor}
          temp: {type: float, path: $.t}
          ts: {type: time, path: $.ts, unit: ms}
    event_time: {field: ts, max_out_of_orderness: %[2]dms}
    key: id
    alerts: [{name: hot, when: temp > 38, for: %[3]dms}]
    silent: {for: %[4]dms}
    sinks:
      - mqtt: {topic: "alerts/all", batch: 5}
      - file: {dir: %[5]q}
    checkpoint:
      dir: %[1]s/checkpoints-alerts
      interval: 300ms
      mode: exactly_once
    restart:
      strategy: fixed_delay
      attempts: 100
      delay: 200ms
`, data, alertOOOMS, alertForMS, alertSilent, filepath.Join(data, "out-alerts"))
}

// ingestOf returns node m's released and next offsets of pipeline's
// ingest log.
func (m *clusterMember) ingestOf(client *http.Client, pipeline string) (released, next uint64, err error) {
	var in struct {
		Pipelines []struct {
			Pipeline string `json:"pipeline"`
			Released uint64 `json:"released_offset"`
			Next     uint64 `json:"next_offset"`
		} `json:"pipelines"`
	}
	if err := m.get(client, "/ingest", &in); err != nil {
		return 0, 0, err
	}
	for _, p := range in.Pipelines {
		if p.Pipeline == pipeline {
			return p.Released, p.Next, nil
		}
	}
	return 0, 0, fmt.Errorf("node %s: no ingest log of pipeline %s", m.id, pipeline)
}

// ingestCovered reports whether completed checkpoints cover everything
// node m's ingest log of pipeline sensors holds.
func (m *clusterMember) ingestCovered(client *http.Client) bool {
	rel, next, err := m.ingestOf(client, "sensors")
	return err == nil && rel >= next
}

// allReleased reports whether completed checkpoints cover everything
// node m's ingest logs of both pipelines hold.
func (m *clusterMember) allReleased(client *http.Client) bool {
	for _, p := range []string{"sensors", "alerts"} {
		rel, next, err := m.ingestOf(client, p)
		if err != nil || rel < next {
			return false
		}
	}
	return true
}

// alertLoad publishes the alerts workload to a cluster (reading i to node
// i%3, or the next live one) and collects the alerts from every node's
// broker.
type alertLoad struct {
	l    *clusterLoad
	rs   []alertReading
	next int
	col  *alertCollector
	subs []paho.Client
	pubs []paho.Client
}

func newAlertLoad(l *clusterLoad) *alertLoad {
	a := &alertLoad{l: l, rs: alertReadings(),
		col:  &alertCollector{byMsgID: map[string]string{}, idsOf: map[string]map[string]bool{}, markers: map[string]bool{}},
		subs: make([]paho.Client, len(l.members)), pubs: make([]paho.Client, len(l.members))}
	for i := range l.members {
		a.connect(i)
	}
	l.t.Cleanup(func() {
		for i := range l.members {
			a.disconnect(i)
		}
	})
	return a
}

func (a *alertLoad) connect(i int) {
	t, m := a.l.t, a.l.members[i]
	c := connect(t, paho.NewClientOptions().AddBroker("tcp://"+m.brokerAddr).SetClientID("alerts-"+m.id).
		SetCleanSession(false).SetAutoReconnect(false).SetDefaultPublishHandler(a.col.handle))
	if tok := c.Subscribe("alerts/#", 1, a.col.handle); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe to alerts of node %s: %v", m.id, tok.Error())
	}
	a.subs[i] = c
	a.pubs[i] = connect(t, paho.NewClientOptions().AddBroker("tcp://"+m.brokerAddr).SetClientID("machines-"+m.id).
		SetCleanSession(true).SetAutoReconnect(false).SetWriteTimeout(5*time.Second))
}

func (a *alertLoad) disconnect(i int) {
	if a.subs[i] != nil {
		a.subs[i].Disconnect(0)
	}
	if a.pubs[i] != nil {
		a.pubs[i].Disconnect(0)
	}
	a.subs[i], a.pubs[i] = nil, nil
}

// publish sends the next frac of the readings (all that are left when
// frac is 1), reading i to node i%3 or the next live one; the flush
// readings at the end go to every live node, so that every split's
// watermark passes every alert.
func (a *alertLoad) publish(frac float64) {
	to := min(len(a.rs), a.next+int(frac*float64(len(a.rs))))
	if frac >= 1 {
		to = len(a.rs)
	}
	var toks []paho.Token
	wait := func() {
		for _, tok := range toks {
			if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
				a.l.t.Fatalf("publish alert reading: %v", tok.Error())
			}
		}
		toks = toks[:0]
	}
	send := func(node int, r alertReading) {
		toks = append(toks, a.pubs[node].Publish("machines/"+r.id+"/temperature", 1, false,
			fmt.Sprintf(`{"sensor":%q,"t":%g,"ts":%d}`, r.id, r.temp, r.ts)))
		if len(toks) == alertBatch {
			wait()
		}
	}
	for ; a.next < to; a.next++ {
		r := a.rs[a.next]
		if r.id == "zz" {
			for node := range a.l.members {
				if !a.l.down[node] {
					send(node, r)
				}
			}
			continue
		}
		node := a.next % len(a.l.members)
		for a.l.down[node] {
			node = (node + 1) % len(a.l.members)
		}
		send(node, r)
	}
	wait()
}

// check waits until every alert of the reference arrived over MQTT and
// is committed in the union of the nodes' file-sink dirs (each part
// name once), and checks both hold exactly the reference, each alert
// once.
func (a *alertLoad) check(timeout time.Duration) {
	t := a.l.t
	want := alertReference(a.rs)
	committed := func() []string {
		parts := map[string]bool{}
		var lines []string
		for _, m := range a.l.members {
			dir := filepath.Join(filepath.Dir(m.cfgPath), "data", "out-alerts", "alerts")
			lines = append(lines, committedPartLines(t, dir, parts)...)
		}
		slices.Sort(lines)
		return lines
	}
	if !testutil.Within(timeout, func() bool {
		got := a.col.results()
		for _, w := range want {
			if !got[w] {
				return false
			}
		}
		return len(committed()) >= len(want)
	}) {
		got := a.col.results()
		missing := 0
		for _, w := range want {
			if !got[w] {
				missing++
				if missing <= 10 {
					t.Errorf("alert of the reference not received: %s", w)
				}
			}
		}
		// Where the file sinks committed them: the node whose sink
		// subtask emitted them.
		for _, m := range a.l.members {
			dir := filepath.Join(filepath.Dir(m.cfgPath), "data", "out-alerts", "alerts")
			for _, line := range committedPartLines(t, dir, map[string]bool{}) {
				if !got[line] {
					t.Logf("not received over MQTT, committed on node %s: %s", m.id, line)
				}
			}
		}
		t.Fatalf("after %v: %d alerts of the reference not received of %d, %d lines committed", timeout, missing, len(want), len(committed()))
	}
	// A marker behind the alerts on every node: once it is in, every
	// duplicate the brokers had queued has arrived.
	for i, p := range a.pubs {
		if p == nil {
			continue
		}
		marker := strconv.FormatInt(time.Now().UnixNano(), 10) + "-" + strconv.Itoa(i)
		if tok := p.Publish("alerts/_marker", 1, false, marker); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			t.Fatalf("publish marker: %v", tok.Error())
		}
		testutil.Eventually(t, 30*time.Second, "the marker behind the alerts", func() bool {
			a.col.mu.Lock()
			defer a.col.mu.Unlock()
			return a.col.markers[marker]
		})
	}
	a.col.mu.Lock()
	defer a.col.mu.Unlock()
	for _, b := range a.col.bad {
		t.Error(b)
	}
	wantSet := map[string]bool{}
	for _, w := range want {
		wantSet[w] = true
	}
	for r, ids := range a.col.idsOf {
		if !wantSet[r] {
			t.Errorf("alert not in the reference: %s", r)
		}
		if len(ids) > 1 {
			t.Errorf("alert under %d msg_ids: %s", len(ids), r)
		}
	}
	if lines := committed(); !slices.Equal(lines, want) {
		t.Errorf("committed files hold %d lines, want the %d alerts of the reference once each", len(lines), len(want))
		for i, l := range lines {
			if !wantSet[l] || (i > 0 && lines[i-1] == l) {
				t.Errorf("  committed, not in the reference or twice: %s", l)
			}
		}
	}
	t.Logf("alerts: %d alerts (%d silent) exact over MQTT (%d elements received) and in the files",
		len(want), strings.Count(strings.Join(want, "\n"), `"silent"`), a.col.elements)
}

// committedPartLines returns the lines of the committed parts in dir
// whose names are not in seen yet, and adds their names to it.
func committedPartLines(t *testing.T, dir string, seen map[string]bool) []string {
	t.Helper()
	parts, err := operators.CommittedParts(dir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var lines []string
	for _, p := range parts {
		if seen[filepath.Base(p)] {
			continue
		}
		seen[filepath.Base(p)] = true
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
			if l != "" {
				lines = append(lines, l)
			}
		}
	}
	return lines
}

// keyedJobsOn returns the jobs of which GET /cluster on m places a keyed
// subtask on node.
func (m *clusterMember) keyedJobsOn(client *http.Client, node string) (map[string]bool, error) {
	var s struct {
		Placement []struct {
			Node     string `json:"node"`
			Subtasks []struct {
				Job string `json:"job"`
			} `json:"subtasks"`
		} `json:"placement"`
	}
	if err := m.get(client, "/cluster", &s); err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, p := range s.Placement {
		if p.Node != node {
			continue
		}
		for _, st := range p.Subtasks {
			out[st.Job] = true
		}
	}
	return out, nil
}

// jobsOf returns the jobs node m lists (GET /jobs) by name with their
// status.
func (m *clusterMember) jobsOf(client *http.Client) (map[string]string, error) {
	var js struct {
		Jobs []struct {
			Name   string `json:"name"`
			Status string `json:"status"`
		} `json:"jobs"`
	}
	if err := m.get(client, "/jobs", &js); err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, j := range js.Jobs {
		out[j.Name] = j.Status
	}
	return out, nil
}

// Two pipelines of different shapes on one three-process cluster with
// gossip: "sensors" (1 s tumbling count per sensor, exactly-once to
// MQTT) and "alerts" (an alert held for 2 s and silent keys, batched
// write-ahead MQTT and an exactly-once file sink), reading different
// topics that the devices publish to every node. Under load of both, a
// worker is SIGKILLed (its subtasks of both jobs fail over) and comes
// back, then the leader is SIGKILLed (b takes over both job masters),
// comes back and gets the leadership back by a hand-back. Every window
// of every sensor is exact with one result id, and the alerts over MQTT
// and in the union of the nodes' file-sink dirs are exactly the
// reference's, each once.
func TestClusterTwoPipelinesKillsExact(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with three subprocesses and SIGKILL")
	}
	members := startClusterEdited(t, true, func(cfg string) string { return withAlertsPipeline(cfg) })
	l := newClusterLoad(t, members)
	al := newAlertLoad(l)
	a, b, c := members[0], members[1], members[2]
	client := &http.Client{Timeout: time.Second}
	waitBothJobs(t, a, client)

	const n1, n2, n3, n4 = 12_000, 24_000, 36_000, 60_000
	l.publish(0, n1)
	al.publish(0.2)
	testutil.Eventually(t, 60*time.Second, "node c's logs of both pipelines released", func() bool { return c.allReleased(client) })
	l.kill(2)
	al.disconnect(2)
	testutil.Eventually(t, 60*time.Second, "the leader moved node c's subtasks of both jobs to live nodes", func() bool {
		s, err := a.status(client)
		return err == nil && s.FailoversTotal >= 1 && s.keyedOn("c") == 0
	})
	l.publish(n1, n2)
	al.publish(0.2)
	l.restart(2)
	al.connect(2)
	// The join moves the jobs back one after the other, each source
	// split first: a job whose split on c still runs idle elsewhere
	// would read what c ingests meanwhile behind its event time.
	testutil.Eventually(t, 90*time.Second, "node c owns key groups of both jobs again", func() bool {
		jobs, err := a.keyedJobsOn(client, "c")
		return err == nil && jobs["sensors"] && jobs["alerts"]
	})
	l.publish(n2, n3)
	al.publish(0.2)
	testutil.Eventually(t, 60*time.Second, "node a's logs of both pipelines released", func() bool { return a.allReleased(client) })
	epochBefore := func() uint64 {
		s, err := b.leaderStatus(client)
		if err != nil {
			t.Fatal(err)
		}
		return s.Epoch
	}()
	l.kill(0)
	al.disconnect(0)
	testutil.Eventually(t, 60*time.Second, "node b took over both job masters and placed a's subtasks", func() bool {
		s, err := b.leaderStatus(client)
		if err != nil || s.Leader != "b" || s.keyedOn("a") != 0 || s.Epoch <= epochBefore {
			return false
		}
		js, err := b.jobsOf(client)
		return err == nil && js["sensors"] == "running" && js["alerts"] == "running"
	})
	l.publish(n3, n3+(n4-n3)/2)
	al.publish(0.2)
	a.readyFn = func(client *http.Client) bool {
		_, err := a.hosted(client)
		return err == nil && brokerUp(a.brokerAddr)
	}
	restarted := time.Now()
	l.restart(0)
	al.connect(0)
	from := n3 + (n4-n3)/2
	const chunk = 300
	handedBack := func() bool {
		if !allFollow(client, members, "a") {
			return false
		}
		na, err1 := a.jobMasters(client)
		nb, err2 := b.jobMasters(client)
		return err1 == nil && err2 == nil && na == 2 && nb == 0
	}
	for !handedBack() {
		if time.Since(restarted) > 120*time.Second || from+chunk > n4 {
			t.Fatalf("b did not hand the leadership of both jobs back to a within 120 s (%d readings published)\n%s", from, clusterLines(b.logTail()))
		}
		l.publish(from, from+chunk)
		from += chunk
		testutil.Within(time.Second, handedBack)
	}
	t.Logf("hand-back %v after a's restart", time.Since(restarted).Round(time.Millisecond))
	l.publish(from, n4)
	al.publish(1)
	l.finish(n4, 120*time.Second)
	al.check(120 * time.Second)
	if s, err := a.status(client); err == nil {
		t.Logf("failovers: %+v", s.Failovers)
	}
	js, _ := json.Marshal(func() map[string]string { m, _ := a.jobsOf(client); return m }())
	t.Logf("jobs on a: %s", js)
}

// A worker of a cluster running two pipelines is stopped with SIGTERM
// under load of both: it drains first, handing its subtasks of both
// jobs over (its ingest logs of both pipelines read and checkpointed
// before its splits move), exits 0, and its stop is no failure. Every
// window and every alert is exact.
func TestClusterTwoPipelinesWorkerSIGTERMDrains(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with three subprocesses")
	}
	members := startClusterEdited(t, true, func(cfg string) string { return withAlertsPipeline(cfg) })
	l := newClusterLoad(t, members)
	al := newAlertLoad(l)
	a, c := members[0], members[2]
	client := &http.Client{Timeout: time.Second}
	waitBothJobs(t, a, client)
	const n1, n = 20_000, 40_000
	l.publish(0, n1)
	al.publish(0.5)
	// c's devices go away; its results subscribers stay until it exits,
	// so that what its sinks publish during the drain arrives.
	l.stopDevices(2)
	al.pubs[2].Disconnect(0)
	al.pubs[2] = nil
	if code := c.terminate(90 * time.Second); code != 0 {
		t.Fatalf("c exited with %d after SIGTERM\n%s", code, c.logTail())
	}
	al.publish(1)
	l.publish(n1, n)
	l.finish(n, 120*time.Second)
	al.check(120 * time.Second)
	if !strings.Contains(c.logTailN(400000), "drained before stopping") {
		t.Fatalf("c did not drain before stopping:\n%s", c.logTail())
	}
	s, err := a.status(client)
	if err != nil {
		t.Fatal(err)
	}
	if s.FailoversTotal != 0 {
		t.Fatalf("c's stop after its drain made %d failovers: %+v", s.FailoversTotal, s.Failovers)
	}
	if jobs, err := a.keyedJobsOn(client, "c"); err != nil || len(jobs) != 0 {
		t.Fatalf("c still places keyed subtasks of %v (%v)", jobs, err)
	}
}

// waitBothJobs waits until leader a sees every node alive, places keyed
// subtasks on c and runs the job masters of both pipelines.
func waitBothJobs(t *testing.T, a *clusterMember, client *http.Client) {
	t.Helper()
	testutil.Eventually(t, 30*time.Second, "the leader sees every node alive and runs both jobs", func() bool {
		s, err := a.leaderStatus(client)
		if err != nil || s.alive() != 3 || s.Leader != "a" || s.keyedOn("c") == 0 {
			return false
		}
		n, err := a.jobMasters(client)
		return err == nil && n == 2
	})
}
