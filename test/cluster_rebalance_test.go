package test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgedio/edged/internal/testutil"
)

// Rebalancing tests with real edged processes: a node joining under load,
// a node drained with the CLI and stopped, a worker stopped with SIGTERM
// that drains first. Set EDGED_E2E_BURNERS to run them beside that many
// CPU burner processes.

// writeClusterConfigP is writeClusterConfig with the pipeline at
// parallelism p.
func writeClusterConfigP(t *testing.T, dir string, me *clusterMember, members []*clusterMember, p int) string {
	t.Helper()
	path := writeClusterConfig(t, dir, me, members)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	cfg := strings.Replace(string(b), "    parallelism: 3\n", fmt.Sprintf("    parallelism: %d\n", p), 1)
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// startClusterOf starts the edged processes of a cluster of the nodes ids
// with gossip membership, the pipeline at parallelism p: the workers of
// the first `running` ids first, then the master (ids[0]); the others are
// configured but not started. It waits until every started worker hosts
// tasks of the job.
func startClusterOf(t *testing.T, ids []string, running, p int) []*clusterMember {
	t.Helper()
	return startClusterPlaced(t, ids, running, p, "")
}

// keepLog copies a failed test's node log to EDGED_E2E_KEEP_LOGS, or
// logs its tail without it.
func keepLog(t *testing.T, m *clusterMember) {
	dir := os.Getenv("EDGED_E2E_KEEP_LOGS")
	if dir == "" {
		t.Logf("node %s log tail:\n%s", m.id, m.logTailN(60000))
		return
	}
	b, err := os.ReadFile(m.logPath)
	if err == nil {
		dst := filepath.Join(dir, fmt.Sprintf("%s-%s-%d.log", t.Name(), m.id, time.Now().UnixNano()))
		if err = os.WriteFile(dst, b, 0o644); err == nil {
			t.Logf("node %s log kept in %s", m.id, dst)
			return
		}
	}
	t.Logf("node %s log not kept: %v", m.id, err)
}

// finishChecked is clusterLoad.finish that, when results are missing,
// says which windows and sensors they are first.
func (l *clusterLoad) finishChecked(n int, timeout time.Duration) {
	l.publish(n, n+len(l.members)*tail)
	windows := n / windowMS
	want := windows * sensors
	if !testutil.Within(timeout, func() bool { return countWindows(l.col, windows) >= want }) {
		l.col.mu.Lock()
		var missing []string
		byWindow := map[int]int{}
		for w := range windows {
			for s := range sensors {
				if len(l.col.byKey[winKey{sensorOf(s), epochMS + int64(w)*windowMS}]) == 0 {
					byWindow[w]++
					if len(missing) < 20 {
						missing = append(missing, fmt.Sprintf("%s@%d", sensorOf(s), w))
					}
				}
			}
		}
		l.col.mu.Unlock()
		client := &http.Client{Timeout: 2 * time.Second}
		for _, m := range l.members {
			for _, path := range []string{"/ingest", "/jobs"} {
				if resp, err := client.Get("http://" + m.apiAddr + path); err == nil {
					var b bytes.Buffer
					b.ReadFrom(resp.Body)
					resp.Body.Close()
					l.t.Logf("node %s %s: %s", m.id, path, b.String())
				}
			}
		}
		l.t.Fatalf("%d of %d window results after %v; missing per window %v, first %v", countWindows(l.col, windows), want, timeout, byWindow, missing)
	}
	checkExactWindows(l.t, l.col, windows)
}

// newPartialLoad is newClusterLoad for a cluster whose members from
// index running on are not started yet: they count as down.
func newPartialLoad(t *testing.T, members []*clusterMember, running int) *clusterLoad {
	l := &clusterLoad{t: t, members: members, col: newCollector(), down: map[int]bool{},
		subs: make([]paho.Client, len(members)), pubs: make([][]paho.Client, len(members))}
	for i := range members {
		if i < running {
			l.connect(i)
		} else {
			l.down[i] = true
		}
	}
	t.Cleanup(func() {
		for i := range members {
			l.disconnect(i)
		}
	})
	return l
}

// stopDevices disconnects node i's devices (none of their publishes in
// flight: every reading it acknowledged is in its ingest log) and sends
// its share of the readings to the next live node; its results
// subscriber stays.
func (l *clusterLoad) stopDevices(i int) {
	disconnectAll(l.pubs[i], 0)
	l.pubs[i] = nil
	l.down[i] = true
}

// rebalanceStatus is what the rebalancing tests read of GET /cluster.
type rebalanceStatus struct {
	clusterStatus
	RebalancesTotal int64 `json:"rebalances_total"`
	Rebalances      []struct {
		Trigger        string             `json:"trigger"`
		Outcome        string             `json:"outcome"`
		MovedKeyGroups int                `json:"moved_key_groups"`
		BytesShipped   int64              `json:"bytes_shipped"`
		PauseMS        map[string]float64 `json:"pause_ms"`
		Error          string             `json:"error"`
	} `json:"rebalances"`
}

func (m *clusterMember) rebalances(client *http.Client) (rebalanceStatus, error) {
	var s rebalanceStatus
	err := m.get(client, "/cluster", &s)
	return s, err
}

func (s rebalanceStatus) state(id string) string {
	for _, m := range s.Members {
		if m.ID == id {
			return m.State
		}
	}
	return ""
}

// keyGroupsOn counts the key groups the status places on node.
func keyGroupsOn(t *testing.T, m *clusterMember, node string) int {
	t.Helper()
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get("http://" + m.apiAddr + "/cluster")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var s struct {
		Placement []struct {
			Node     string `json:"node"`
			Subtasks []struct {
				KeyGroups [2]int `json:"key_groups"`
			} `json:"subtasks"`
		} `json:"placement"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, p := range s.Placement {
		if p.Node == node {
			for _, st := range p.Subtasks {
				n += st.KeyGroups[1] - st.KeyGroups[0] + 1
			}
		}
	}
	return n
}

func maybeBurn(t *testing.T) {
	if os.Getenv("EDGED_E2E_BURNERS") != "" {
		b := startBurners(t)
		t.Cleanup(func() { b.report(t) })
	}
}

// waitAllAlive waits until the master sees want members alive.
func waitAllAlive(t *testing.T, master *clusterMember, want int) {
	t.Helper()
	client := &http.Client{Timeout: time.Second}
	testutil.Eventually(t, 60*time.Second, fmt.Sprintf("the master sees %d members alive", want), func() bool {
		s, err := master.status(client)
		if err != nil {
			return false
		}
		alive := 0
		for _, m := range s.Members {
			if m.State == "alive" {
				alive++
			}
		}
		return alive == want
	})
}

// checkpointsSettled waits until the job's three newest finished
// checkpoints on the master completed: it runs steadily (a declined
// checkpoint restarts it, and a restart places every live node's subtasks
// on it, which would move a joining node in ahead of its rebalance).
func checkpointsSettled(t *testing.T, master *clusterMember) {
	t.Helper()
	client := &http.Client{Timeout: time.Second}
	testutil.Eventually(t, 60*time.Second, "three checkpoints in a row completed", func() bool {
		resp, err := client.Get("http://" + master.apiAddr + "/jobs/sensors/checkpoints")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var l struct {
			Checkpoints []struct {
				Kind   string `json:"kind"`
				Status string `json:"status"`
			} `json:"checkpoints"`
		}
		if json.NewDecoder(resp.Body).Decode(&l) != nil {
			return false
		}
		ok := 0
		for i := len(l.Checkpoints) - 1; i >= 0 && ok < 3; i-- {
			switch l.Checkpoints[i].Status {
			case "in_progress":
			case "completed":
				ok++
			default:
				return false
			}
		}
		return ok == 3
	})
}

// A fourth node joins a three-node cluster (four configured: a majority
// is three) mid-stream under MQTT load: the master sees it join, waits
// the settle delay, and rebalances from a savepoint; the new node owns
// key groups afterwards (its home window subtask moved back to it, with
// its state), and every window of every sensor arrives exactly once with
// the exact count and one result id. Its devices publish to it once it
// owns its split: readings it took before would wait in its ingest log
// while the others' watermarks pass them.
func TestClusterNodeJoinsUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with four subprocesses")
	}
	maybeBurn(t)
	members := startClusterOf(t, []string{"a", "b", "c", "d"}, 3, 4)
	a, d := members[0], members[3]
	l := newPartialLoad(t, members, 3)
	client := &http.Client{Timeout: time.Second}
	waitAllAlive(t, a, 3)
	if n := keyGroupsOn(t, a, "d"); n != 0 {
		t.Fatalf("node d owns %d key groups before it started", n)
	}
	const n = 40_000
	next := 0
	l.publish(next, n/4)
	next = n / 4
	checkpointsSettled(t, a)
	// d starts; readings keep flowing to a, b and c while it joins.
	d.start()
	l.connect(3)
	for next < n/2 && keyGroupsOn(t, a, "d") == 0 {
		l.publish(next, next+500)
		next += 500
	}
	testutil.Eventually(t, 90*time.Second, "node d owns key groups", func() bool { return keyGroupsOn(t, a, "d") > 0 })
	t.Logf("node d owns %d key groups after %d readings", keyGroupsOn(t, a, "d"), next)
	delete(l.down, 3)
	l.publish(next, n)
	l.finishChecked(n, 120*time.Second)
	s, err := a.rebalances(client)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Rebalances) == 0 {
		t.Fatal("no rebalance recorded")
	}
	// The join is recorded. It moved d's subtasks in, unless a restart of
	// the job after a failure in between placed them on d already (every
	// deployment places a live node's subtasks on it): then it moved
	// nothing and restarted nothing.
	var join bool
	for _, r := range s.Rebalances {
		t.Logf("rebalance: %+v", r)
		if r.Trigger != "join" || r.Outcome != "done" {
			continue
		}
		join = true
		if r.MovedKeyGroups > 0 && (r.BytesShipped == 0 || len(r.PauseMS) == 0) {
			t.Errorf("join rebalance without bytes shipped or pauses: %+v", r)
		}
	}
	if !join {
		t.Fatalf("no join rebalance done: %+v", s.Rebalances)
	}
	if got := keyGroupsOn(t, a, "d"); got == 0 {
		t.Fatal("node d owns no key groups at the end")
	}
	d.checkTookRecords(t, client)
}

// A worker is drained with `edged cluster drain b` under MQTT load (its
// devices moved to the other nodes first): the CLI returns once its
// subtasks run elsewhere from a savepoint, it leaves the membership, and
// stopped afterwards it exits 0. Every window stays exact.
func TestClusterNodeDrainedAndStopped(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with three subprocesses")
	}
	maybeBurn(t)
	members := startCluster(t, true)
	a, b := members[0], members[1]
	l := newClusterLoad(t, members)
	client := &http.Client{Timeout: time.Second}
	waitAllAlive(t, a, 3)
	const n = 30_000
	l.publish(0, n/3)
	l.stopDevices(1)

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cli := exec.CommandContext(ctx, edgedBin, "cluster", "drain", "b", "--addr", a.apiAddr)
	cli.Stdout, cli.Stderr = &stdout, &stderr
	start := time.Now()
	if err := cli.Start(); err != nil {
		t.Fatal(err)
	}
	cliDone := make(chan error, 1)
	go func() { cliDone <- cli.Wait() }()
	// The load goes on (to a and c) while b drains.
	l.publish(n/3, n/2)
	if err := <-cliDone; err != nil {
		t.Fatalf("edged cluster drain b: %v\nstdout: %s\nstderr: %s", err, stdout.String(), stderr.String())
	}
	t.Logf("edged cluster drain b after %v: %s", time.Since(start).Round(time.Millisecond), strings.TrimSpace(stdout.String()))
	if !strings.HasPrefix(stdout.String(), "drained b: done,") {
		t.Fatalf("edged cluster drain printed %q", stdout.String())
	}
	s, err := a.rebalances(client)
	if err != nil {
		t.Fatal(err)
	}
	if s.keyedOn("b") != 0 || len(s.Rebalances) == 0 || s.Rebalances[0].Trigger != "drain" || s.Rebalances[0].Outcome != "done" ||
		s.Rebalances[0].MovedKeyGroups == 0 || s.Rebalances[0].BytesShipped == 0 || len(s.Rebalances[0].PauseMS) == 0 {
		t.Fatalf("after the drain: %d subtasks on b, rebalances %+v", s.keyedOn("b"), s.Rebalances)
	}
	testutil.Eventually(t, 30*time.Second, "the master sees b left", func() bool {
		s, err := a.rebalances(client)
		return err == nil && s.state("b") == "left"
	})
	// Everything b's sink published reached the subscriber, then b stops.
	drain(t, "tcp://"+b.brokerAddr, "agg/_marker", l.col)
	l.stop(1)
	l.publish(n/2, n)
	l.finishChecked(n, 120*time.Second)
	if s, err = a.rebalances(client); err == nil && s.keyedOn("b") != 0 {
		t.Fatalf("b owns subtasks again: %+v", s.Placement)
	}
}

// A worker stopped with SIGTERM under MQTT load (its devices moved to the
// other nodes first) asks the master to drain it: its subtasks move away
// from a savepoint before it exits (no failover follows its exit), it
// exits 0, and every window stays exact.
func TestClusterWorkerSIGTERMDrains(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with three subprocesses")
	}
	maybeBurn(t)
	members := startCluster(t, true)
	a, b := members[0], members[1]
	l := newClusterLoad(t, members)
	client := &http.Client{Timeout: time.Second}
	waitAllAlive(t, a, 3)
	const n = 30_000
	l.publish(0, n/3)
	before, err := a.rebalances(client)
	if err != nil {
		t.Fatal(err)
	}
	if before.keyedOn("b") == 0 {
		t.Fatal("b owns no subtasks before the SIGTERM")
	}
	l.stopDevices(1)
	start := time.Now()
	if err := b.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// The load goes on (to a and c) while b drains.
	l.publish(n/3, n/2)
	if code := b.waitExit(t, 2*time.Minute); code != 0 {
		t.Fatalf("b exited with %d after SIGTERM\n%s", code, b.logTail())
	}
	t.Logf("b exited 0 %v after SIGTERM", time.Since(start).Round(time.Millisecond))
	blog := b.logTailN(400000)
	if !strings.Contains(blog, "drained before stopping") {
		t.Fatalf("b did not drain before stopping:\n%s", b.logTail())
	}
	l.disconnect(1)
	l.down[1] = true
	s, err := a.rebalances(client)
	if err != nil {
		t.Fatal(err)
	}
	if s.keyedOn("b") != 0 || len(s.Rebalances) == 0 || s.Rebalances[0].Trigger != "drain" || s.Rebalances[0].Outcome != "done" ||
		s.Rebalances[0].MovedKeyGroups == 0 || s.Rebalances[0].BytesShipped == 0 || len(s.Rebalances[0].PauseMS) == 0 {
		t.Fatalf("after b's SIGTERM: %d subtasks on b, rebalances %+v", s.keyedOn("b"), s.Rebalances)
	}
	t.Logf("drain: %+v", s.Rebalances[0])
	l.publish(n/2, n)
	l.finishChecked(n, 120*time.Second)
	// Its work had moved before it exited: its exit caused no failover.
	if s, err = a.rebalances(client); err != nil || s.FailoversTotal != before.FailoversTotal {
		t.Fatalf("failovers %d after b's exit, %d before (%v): its work had not moved", s.FailoversTotal, before.FailoversTotal, err)
	}
}

// checkTookRecords checks that the member hosts the one job and that its
// tasks took records in.
func (m *clusterMember) checkTookRecords(t *testing.T, client *http.Client) {
	t.Helper()
	jobs, err := m.hosted(client)
	if err != nil || len(jobs) != 1 {
		t.Fatalf("node %s hosts %v (%v)", m.id, jobs, err)
	}
	var in int64
	for _, ts := range jobs[0].Tasks {
		in += ts.RecordsIn
	}
	if in == 0 {
		t.Fatalf("node %s's tasks took no record in: %+v", m.id, jobs[0].Tasks)
	}
}
