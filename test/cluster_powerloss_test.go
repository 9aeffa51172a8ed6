package test

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgedio/edged/internal/testutil"
)

// powerLoss runs the first part of the whole-site power-loss tests: a
// three-node cluster with gossip, a leading, under MQTT load. Everything
// node a acknowledged is covered by completed checkpoints; then its
// devices go to b and c, which take readings [n1, n2) — acknowledged,
// in their ingest logs, partly above the latest completed checkpoint —
// and all three processes are SIGKILLed back to back. It returns the
// members, the load and the highest epoch b had seen.
func powerLoss(t *testing.T, n1, n2 int) ([]*clusterMember, *clusterLoad, uint64) {
	t.Helper()
	members := startCluster(t, true)
	l := newClusterLoad(t, members)
	a, b := members[0], members[1]
	client := &http.Client{Timeout: time.Second}
	testutil.Eventually(t, 30*time.Second, "a leads, every node alive", func() bool {
		s, err := a.leaderStatus(client)
		return err == nil && s.alive() == 3 && s.Leader == "a" && s.keyedOn("a") > 0
	})
	l.publish(0, n1)
	// a's disk is lost with its board: what it acknowledged must be in
	// completed checkpoints before the power goes.
	testutil.Eventually(t, 60*time.Second, "node a's log released all it was sent", func() bool {
		rel, err := a.released(client)
		return err == nil && rel >= uint64(n1/3)
	})
	// a's results subscriber stays: what its sink publishes meanwhile is
	// read before the power goes.
	l.stopDevices(0)
	l.publish(n1, n2)
	s, err := b.leaderStatus(client)
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range members {
		m.kill()
		l.down[i] = true
	}
	for i := range members {
		l.disconnect(i)
	}
	t.Logf("power loss: a, b and c SIGKILLed; b had seen epoch %d", s.Epoch)
	return members, l, s.Epoch
}

// A whole-site power loss: the three nodes of a cluster with gossip are
// SIGKILLed at once under MQTT load, and only b and c, a majority, come
// back (a's board is dead). They never followed a leader in this run,
// yet the cluster ran before (their data dirs hold the epochs they
// took part in): once a has stayed away for the grace of the failure
// detection, b, the lowest live node, takes over, restores the job from
// the newest checkpoint the cluster replicated (a's state files from
// b's and c's copies), places a's subtasks on b and c and deploys in a
// newer epoch; c runs no job master. Every window stays exact, with one
// result id. Node a then comes back: it follows b, which hands the
// leadership back to it, and the windows after are exact too.
func TestClusterPowerLossMajorityRestarts(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with three subprocesses and SIGKILL")
	}
	const n1, n2, n3, n4 = 15_000, 24_000, 36_000, 54_000
	members, l, epochBefore := powerLoss(t, n1, n2)
	a, b, c := members[0], members[1], members[2]
	client := &http.Client{Timeout: time.Second}
	restarted := time.Now()
	l.restart(1)
	l.restart(2)
	if !testutil.Within(60*time.Second, func() bool {
		s, err := b.leaderStatus(client)
		return err == nil && s.Leader == "b" && s.Epoch > epochBefore && s.keyedOn("a") == 0 && s.keyedOn("b")+s.keyedOn("c") == 3
	}) {
		t.Fatalf("b and c, a majority, did not run the job within 60 s of their restart\nb:\n%s\nc:\n%s",
			leaderLines(b.logTail()), leaderLines(c.logTail()))
	}
	t.Logf("b took over %v after b's and c's restart", time.Since(restarted).Round(time.Millisecond))
	if n, err := c.jobMasters(client); err != nil || n != 0 {
		t.Fatalf("node c runs %d job masters (%v), want none", n, err)
	}
	l.publish(n2, n3)
	l.publish(n3, n3+2*tail)
	windows := n3 / windowMS
	if !testutil.Within(90*time.Second, func() bool { return countWindows(l.col, windows) >= windows*sensors }) {
		t.Fatalf("%d of %d window results after the takeover; missing %s", countWindows(l.col, windows), windows*sensors, missingWindows(l.col, windows))
	}
	checkExactWindows(t, l.col, windows)

	// a comes back: it follows b, and b hands the leadership back.
	a.readyFn = a.hostsAndServes
	l.restart(0)
	from := n3 + 2*tail
	const chunk = 300
	leadsAgain := func() bool {
		for _, m := range members {
			s, err := m.leaderStatus(client)
			if err != nil || s.Leader != "a" || s.alive() != 3 {
				return false
			}
		}
		na, err1 := a.jobMasters(client)
		nb, err2 := b.jobMasters(client)
		nc, err3 := c.jobMasters(client)
		return err1 == nil && err2 == nil && err3 == nil && na == 1 && nb == 0 && nc == 0
	}
	back := time.Now()
	for !leadsAgain() {
		if from+chunk > n4 {
			t.Fatalf("a does not lead again %v after its return\nb:\n%s", time.Since(back), leaderLines(b.logTail()))
		}
		l.publish(from, from+chunk)
		from += chunk
		testutil.Within(time.Second, leadsAgain)
	}
	t.Logf("a leads again %v after its return", time.Since(back).Round(time.Millisecond))
	l.publish(from, n4)
	l.finish(n4, 120*time.Second)
}

// leaderLines returns a node's log lines about the leader, the
// membership, the majority and the jobs' deployments.
func leaderLines(log string) string {
	var out []string
	for _, line := range strings.Split(log, "\n") {
		for _, k := range []string{"cluster: leader", "who leads", "takes over", "took over", "leader died", "membership changed",
			"no majority", "not deployed", "restoring the job", "hand-back", "power loss", "history", "edged run"} {
			if strings.Contains(line, k) {
				out = append(out, line)
				break
			}
		}
	}
	return strings.Join(out, "\n")
}

// lastRun returns the log of a member's latest run.
func (m *clusterMember) lastRun() string {
	log := m.logTailN(1 << 20)
	if i := strings.LastIndex(log, "===== edged run"); i >= 0 {
		return log[i:]
	}
	return log
}

// A whole-site power loss after which only a, the leader, comes back: a
// minority. No peer answers it, so it leads, but its job master deploys
// nothing: its log says it sees 1 of 3 nodes, no majority, nothing
// runs, and that the job is not deployed and is tried again; it hosts
// no task and publishes no result. Then b and c come back (the whole
// cluster has restarted): they follow a, which names itself the leader,
// the job runs on the three nodes in a newer epoch from the newest
// checkpoint, and every window is exact, with one result id.
func TestClusterPowerLossLeaderAloneWaits(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with three subprocesses and SIGKILL")
	}
	const n1, n2, n3 = 15_000, 24_000, 40_000
	members, l, epochBefore := powerLoss(t, n1, n2)
	a, b, c := members[0], members[1], members[2]
	client := &http.Client{Timeout: time.Second}
	l.col.mu.Lock()
	results := len(l.col.byMsgID)
	l.col.mu.Unlock()
	a.readyFn = a.hostsAndServes
	l.restart(0)
	testutil.Eventually(t, 30*time.Second, "a logs that it sees no majority and deploys nothing", func() bool {
		log := a.lastRun()
		return strings.Contains(log, `sees 1 of 3 nodes ([a]): no majority, nothing runs`) &&
			strings.Contains(log, "job not deployed; trying again until the cluster places it")
	})
	s, err := a.leaderStatus(client)
	if err != nil || s.Leader != "a" {
		t.Fatalf("a names leader %q (%v), want itself", s.Leader, err)
	}
	if jobs, err := a.hosted(client); err != nil || hostedTasks(jobs) != 0 {
		t.Fatalf("a, alone, hosts %+v (%v)", jobs, err)
	}
	l.col.mu.Lock()
	after := len(l.col.byMsgID)
	l.col.mu.Unlock()
	if after != results {
		t.Fatalf("a, alone, published %d results", after-results)
	}
	t.Logf("a alone:\n%s", leaderLines(a.lastRun()))

	l.restart(1)
	l.restart(2)
	testutil.Eventually(t, 60*time.Second, "the job runs on a, b and c in a newer epoch, a leading", func() bool {
		for _, m := range members {
			s, err := m.leaderStatus(client)
			if err != nil || s.Leader != "a" || s.alive() != 3 {
				return false
			}
		}
		s, err := a.leaderStatus(client)
		return err == nil && s.Epoch > epochBefore && s.keyedOn("a") > 0 && allHostTasks(client, members[1:])
	})
	for _, m := range []*clusterMember{b, c} {
		if n, err := m.jobMasters(client); err != nil || n != 0 {
			t.Fatalf("node %s runs %d job masters (%v), want none", m.id, n, err)
		}
	}
	l.publish(n2, n3)
	l.finish(n3, 120*time.Second)
}

// missingWindows names the first (sensor, window) results missing among
// the first windows windows, and how many each window lacks.
func missingWindows(col *collector, windows int) string {
	col.mu.Lock()
	defer col.mu.Unlock()
	var first []string
	byWindow := map[int]int{}
	for w := range windows {
		for s := range sensors {
			if len(col.byKey[winKey{sensorOf(s), epochMS + int64(w)*windowMS}]) == 0 {
				byWindow[w]++
				if len(first) < 20 {
					first = append(first, fmt.Sprintf("%s@%d", sensorOf(s), w))
				}
			}
		}
	}
	return fmt.Sprintf("per window %v, first %v", byWindow, first)
}

// A whole-site power loss after which all three nodes come back at
// about the same time (b, c, then a, each started as soon as the one
// before has its broker up). a leads again: at once when it starts
// within the others' wait for it, else through b's takeover and a
// hand-back (logged). The job runs on the three in a newer epoch, with
// the job master on a only, and every window is exact, with one result
// id.
func TestClusterPowerLossAllRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with three subprocesses and SIGKILL")
	}
	const n1, n2, n3, n4 = 15_000, 24_000, 36_000, 54_000
	members, l, epochBefore := powerLoss(t, n1, n2)
	a, b, c := members[0], members[1], members[2]
	client := &http.Client{Timeout: time.Second}
	for _, m := range []*clusterMember{b, c, a} {
		m.readyFn = func(*http.Client) bool { return brokerUp(m.brokerAddr) }
	}
	restarted := time.Now()
	l.restart(1)
	l.restart(2)
	l.restart(0)
	t.Logf("b, c and a restarted within %v", time.Since(restarted).Round(time.Millisecond))
	from := n2
	const chunk = 300
	runs := func() bool {
		for _, m := range members {
			s, err := m.leaderStatus(client)
			if err != nil || s.Leader != "a" || s.alive() != 3 {
				return false
			}
		}
		s, err := a.leaderStatus(client)
		if err != nil || s.Epoch <= epochBefore || s.keyedOn("a") == 0 || !allHostTasks(client, members[1:]) {
			return false
		}
		na, err1 := a.jobMasters(client)
		nb, err2 := b.jobMasters(client)
		nc, err3 := c.jobMasters(client)
		return err1 == nil && err2 == nil && err3 == nil && na == 1 && nb == 0 && nc == 0
	}
	for !runs() {
		if from+chunk > n3 {
			t.Fatalf("the job does not run with a leading %v after the restart\na:\n%s\nb:\n%s", time.Since(restarted),
				leaderLines(a.lastRun()), leaderLines(b.lastRun()))
		}
		l.publish(from, from+chunk)
		from += chunk
		testutil.Within(time.Second, runs)
	}
	sb, err := b.leaderStatus(client)
	if err != nil {
		t.Fatal(err)
	}
	if len(sb.Takeovers) > 0 {
		t.Logf("a started after b's wait: b took over, then handed the leadership back (%+v)", sb.Handbacks)
	} else {
		t.Logf("a led at once")
	}
	t.Logf("the job runs with a leading %v after the restart", time.Since(restarted).Round(time.Millisecond))
	l.publish(from, n4)
	l.finish(n4, 120*time.Second)
}

// A whole-site power loss during which b's device is replaced: the three
// nodes are SIGKILLed under MQTT load once everything a and b
// acknowledged is covered by completed checkpoints (their disks are
// lost), b's data dir is emptied, and only b and c start again. b, the
// lowest live node, took part in no deployment; c, which did, defers to
// it. b adopts the cluster's history from c (the highest epoch c saw, the
// metadata of c's newest snapshot) and takes over once a has stayed away
// for the grace: the job restores from the checkpoint the cluster
// replicated (every state file from c's copies) on b and c in a newer
// epoch, c runs no job master, and every window is exact, with one
// result id.
func TestClusterPowerLossReplacedLowestNode(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with three subprocesses and SIGKILL")
	}
	const n1, n2 = 15_000, 33_000
	members := startCluster(t, true)
	l := newClusterLoad(t, members)
	a, b, c := members[0], members[1], members[2]
	client := &http.Client{Timeout: time.Second}
	testutil.Eventually(t, 30*time.Second, "a leads, every node alive", func() bool {
		s, err := a.leaderStatus(client)
		return err == nil && s.alive() == 3 && s.Leader == "a" && s.keyedOn("a") > 0
	})
	l.publish(0, n1)
	testutil.Eventually(t, 60*time.Second, "nodes a and b released all they were sent", func() bool {
		ra, err1 := a.released(client)
		rb, err2 := b.released(client)
		return err1 == nil && err2 == nil && ra >= uint64(n1/3) && rb >= uint64(n1/3)
	})
	s, err := b.leaderStatus(client)
	if err != nil {
		t.Fatal(err)
	}
	epochBefore := s.Epoch
	for i, m := range members {
		m.kill()
		l.down[i] = true
	}
	for i := range members {
		l.disconnect(i)
	}
	// b's device is replaced: same node id and config, empty data dir.
	if err := os.RemoveAll(filepath.Join(filepath.Dir(b.cfgPath), "data")); err != nil {
		t.Fatal(err)
	}
	t.Logf("power loss: a, b and c SIGKILLed, b's data dir emptied; b had seen epoch %d", epochBefore)
	restarted := time.Now()
	l.restart(1)
	l.restart(2)
	if !testutil.Within(60*time.Second, func() bool {
		s, err := b.leaderStatus(client)
		return err == nil && s.Leader == "b" && s.Epoch > epochBefore && s.keyedOn("a") == 0 && s.keyedOn("b")+s.keyedOn("c") == 3
	}) {
		t.Fatalf("b (replaced) and c did not run the job within 60 s of their restart\nb:\n%s\nc:\n%s",
			leaderLines(b.logTail()), leaderLines(c.logTail()))
	}
	t.Logf("b took over %v after b's and c's restart", time.Since(restarted).Round(time.Millisecond))
	if !strings.Contains(b.lastRun(), "adopts the cluster's history") {
		t.Fatalf("b did not log that it adopted the cluster's history:\n%s", leaderLines(b.lastRun()))
	}
	if n, err := c.jobMasters(client); err != nil || n != 0 {
		t.Fatalf("node c runs %d job masters (%v), want none", n, err)
	}
	l.publish(n1, n2)
	l.finish(n2, 120*time.Second)
}
