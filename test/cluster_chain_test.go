package test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgedio/edged/internal/testutil"
)

// A chain of SIGKILLs under MQTT load, each before the cluster settled
// from the one before: the leader a is killed and b takes over; a is
// started again with its data at once and follows b; b, the new leader,
// is killed before it could hand the leadership back, so a takes over
// from it; b is started again and follows a; then worker c is killed
// while b is still being moved back in, and started again. Every window
// of every sensor is exact with one result id, no poll saw two nodes
// each say it leads, no node's epoch went backward, and the leader's
// GET /cluster records the takeovers.
func TestClusterChainedKillsLeaderThenNewLeader(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with three subprocesses and SIGKILL")
	}
	members := startCluster(t, true)
	l := newClusterLoad(t, members)
	a, b, c := members[0], members[1], members[2]
	client := &http.Client{Timeout: time.Second}
	testutil.Eventually(t, 30*time.Second, "the leader sees every node alive", func() bool {
		s, err := a.leaderStatus(client)
		return err == nil && s.alive() == 3 && s.Leader == "a" && s.keyedOn("a") > 0
	})
	lp := startLeaderPoller(t, members)
	// released waits until what node m's log holds is covered by
	// completed checkpoints: what a node acknowledged above them would be
	// late when it returns (the ingest log is not replicated).
	released := func(m *clusterMember, want uint64) {
		t.Helper()
		testutil.Eventually(t, 60*time.Second, "node "+m.id+"'s log released what it was sent", func() bool {
			rel, err := m.released(client)
			return err == nil && rel >= want
		})
	}
	leads := func(m *clusterMember, dead string) {
		t.Helper()
		testutil.Eventually(t, 60*time.Second, "node "+m.id+" leads with no keyed subtask on "+dead, func() bool {
			s, err := m.leaderStatus(client)
			return err == nil && s.Leader == m.id && s.keyedOn(dead) == 0 && s.keyedOn(m.id) > 0
		})
	}
	follower := func(m *clusterMember) {
		m.readyFn = func(client *http.Client) bool {
			_, err := m.hosted(client)
			return err == nil && brokerUp(m.brokerAddr)
		}
	}
	ingested := func(m *clusterMember) uint64 {
		t.Helper()
		var in struct {
			Pipelines []struct {
				Pipeline string `json:"pipeline"`
				Next     uint64 `json:"next_offset"`
			} `json:"pipelines"`
		}
		if err := m.get(client, "/ingest", &in); err != nil || len(in.Pipelines) == 0 {
			t.Fatalf("GET /ingest of %s: %v", m.id, err)
		}
		return in.Pipelines[0].Next
	}

	const n = 45_000
	l.publish(0, 9_000)
	released(a, ingested(a))
	l.kill(0)
	leads(b, "a")
	t.Logf("b took over")
	l.publish(9_000, 15_000)

	// a comes back and follows b; it gets no devices until it runs its
	// split again (what it took in before would be late).
	follower(a)
	l.restart(0)
	l.disconnect(0)
	l.down[0] = true
	testutil.Eventually(t, 30*time.Second, "a follows b", func() bool {
		s, err := a.leaderStatus(client)
		return err == nil && s.Leader == "b"
	})
	l.publish(15_000, 18_000)
	released(b, ingested(b))
	l.kill(1) // the new leader, before its hand-back to a
	leads(a, "b")
	t.Logf("a took over from b")
	l.connect(0)
	delete(l.down, 0)
	l.publish(18_000, 27_000)

	follower(b)
	l.restart(1)
	l.disconnect(1)
	l.down[1] = true
	testutil.Eventually(t, 30*time.Second, "b follows a", func() bool {
		s, err := b.leaderStatus(client)
		return err == nil && s.Leader == "a"
	})
	l.publish(27_000, 30_000)
	released(c, ingested(c))
	l.kill(2) // a worker, while b is moved back in
	leads(a, "c")
	l.publish(30_000, 33_000)
	follower(c)
	l.restart(2)
	testutil.Eventually(t, 90*time.Second, "every node runs keyed subtasks, a leads", func() bool {
		s, err := a.leaderStatus(client)
		return err == nil && s.Leader == "a" && s.alive() == 3 && s.keyedOn("a") > 0 && s.keyedOn("b") > 0 && s.keyedOn("c") > 0
	})
	l.connect(1)
	delete(l.down, 1)
	l.publish(33_000, n)
	l.finish(n, 120*time.Second)
	lp.check(t)
	s, err := a.leaderStatus(client)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range s.Takeovers {
		t.Logf("a's failover record: %+v", f)
	}
	t.Logf("a: failovers_total %d, epoch %d", s.FailoversTotal, s.Epoch)
}

// A user rescales a three-node cluster's job through the CLI, 3 → 2 → 1
// → 2, under MQTT load: the first rescale while worker c is dead (SIGKILL,
// failed over; its config edited while it is down), the second right
// after c came back, while its join waits to be moved in, the third with
// every node up. Each rescale is edged stop on the leader, every node
// stopped with SIGTERM (the leader last), the parallelism edited, and the
// leader started first with --from-savepoint. The job runs the new number
// of window subtasks each time, and every window of every sensor is exact
// with one result id.
func TestClusterCLIRescaleWhileANodeIsDownOrJoining(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with three subprocesses")
	}
	members := startCluster(t, true)
	a, c := members[0], members[2]
	l := newClusterLoad(t, members)
	client := &http.Client{Timeout: time.Second}
	windowsOn := func(want int) {
		t.Helper()
		testutil.Eventually(t, 60*time.Second, fmt.Sprintf("%d window subtasks placed", want), func() bool {
			w, err := windowSubtasks(client, a)
			total := 0
			for _, c := range w {
				total += c
			}
			return err == nil && total == want
		})
	}
	// rescale stops the job on the leader, stops the nodes up (the leader
	// last), edits every config and starts the leader from the savepoint,
	// then the workers named by restart.
	rescale := func(from, to int, up []int, restart []int) {
		t.Helper()
		sp := cliStop(t, a.node, "sensors")
		for _, i := range up {
			if i != 0 {
				l.stop(i)
			}
		}
		l.stop(0)
		for _, m := range members {
			setParallelism(t, m, from, to)
		}
		a.readyFn = a.hostsAndServes
		a.start("--from-savepoint", sp)
		delete(l.down, 0)
		l.connect(0)
		for _, i := range restart {
			members[i].readyFn = members[i].hostsAndServes
			l.restart(i)
		}
		a.checkRestoredFrom(t, sp)
		windowsOn(to)
		// A node that joins after the leader placed the job gets its
		// source split back only by the join's handover; readings it
		// takes in before a peer sees it back can be late (see the
		// README), so its devices wait for it to host its subtasks.
		var restarted []*clusterMember // the workers (the leader's tasks are its master's)
		for _, i := range restart {
			restarted = append(restarted, members[i])
		}
		testutil.Eventually(t, 60*time.Second, "every restarted worker hosts tasks", func() bool {
			return allHostTasks(client, restarted)
		})
	}

	const n = 30_000
	l.publish(0, 6_000)
	l.killReleasedAndFailOver(2)
	l.publish(6_000, 9_000)

	// 3 → 2 with c down.
	rescale(3, 2, []int{0, 1}, []int{1})
	l.publish(9_000, 14_000)

	// c comes back; 2 → 1 at once, before its join moved it in.
	c.readyFn = c.hostsAndServes
	l.restart(2)
	l.disconnect(2)
	l.down[2] = true
	l.publish(14_000, 16_000)
	rescale(2, 1, []int{0, 1, 2}, []int{1, 2})
	l.publish(16_000, 21_000)

	// 1 → 2 with every node up.
	rescale(1, 2, []int{0, 1, 2}, []int{1, 2})
	l.connect(2)
	delete(l.down, 2)
	l.publish(21_000, n)
	l.finishChecked(n, 120*time.Second)
	for _, m := range members {
		m.failIfExited(t)
	}
}

// runCLIAsync starts edged with args and returns a channel that gets its
// exit code, stdout and stderr.
func runCLIAsync(t *testing.T, timeout time.Duration, args ...string) <-chan [3]string {
	out := make(chan [3]string, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		var stdout, stderr bytes.Buffer
		cmd := exec.CommandContext(ctx, edgedBin, args...)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		code := "0"
		if ee, ok := err.(*exec.ExitError); ok {
			code = strconv.Itoa(ee.ExitCode())
		} else if err != nil {
			code = err.Error()
		}
		out <- [3]string{code, stdout.String(), stderr.String()}
	}()
	return out
}

// Under MQTT load, with a node-local exactly-once file sink beside the
// MQTT sink: `edged cluster drain b` asked twice at once (b hosts a file
// sink subtask), b stopped and started again (its restart undrains it and
// its join moves its subtasks back), then `edged cluster rebalance` asked
// twice at once. Every CLI call ends with an answer, every window of every
// sensor is exact with one result id over MQTT, and the union of the
// nodes' file-sink dirs holds every window once.
func TestClusterDrainOfTheSinkNodeAndRebalanceAskedTwiceAtOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with three subprocesses")
	}
	members := startClusterEdited(t, true, withNodeLocalFileSink)
	a, b := members[0], members[1]
	l := newClusterLoad(t, members)
	client := &http.Client{Timeout: time.Second}
	waitAllAlive(t, a, 3)
	const n = 36_000
	l.publish(0, 6_000)
	l.stopDevices(1)
	d1 := runCLIAsync(t, 3*time.Minute, "cluster", "drain", "b", "--addr", a.apiAddr)
	d2 := runCLIAsync(t, 3*time.Minute, "cluster", "drain", "b", "--addr", a.apiAddr)
	l.publish(6_000, 10_000)
	for _, d := range []<-chan [3]string{d1, d2} {
		r := <-d
		t.Logf("edged cluster drain b: exit %s: %s%s", r[0], strings.TrimSpace(r[1]), strings.TrimSpace(r[2]))
		if r[0] != "0" || !strings.HasPrefix(r[1], "drained b: done") {
			t.Errorf("edged cluster drain b: exit %s, printed %q", r[0], r[1])
		}
	}
	testutil.Eventually(t, 30*time.Second, "the master sees b left", func() bool {
		s, err := a.rebalances(client)
		return err == nil && s.state("b") == "left" && s.keyedOn("b") == 0
	})
	drain(t, "tcp://"+b.brokerAddr, "agg/_marker", l.col)
	l.stop(1)
	l.publish(10_000, 14_000)
	b.readyFn = b.hostsAndServes
	l.restart(1)
	l.stopDevices(1)
	testutil.Eventually(t, 90*time.Second, "b owns key groups again", func() bool {
		s, err := a.status(client)
		return err == nil && s.keyedOn("b") > 0
	})
	l.connect(1)
	delete(l.down, 1)
	l.publish(14_000, 20_000)
	r1 := runCLIAsync(t, 3*time.Minute, "cluster", "rebalance", "--addr", a.apiAddr)
	r2 := runCLIAsync(t, 3*time.Minute, "cluster", "rebalance", "--addr", a.apiAddr)
	l.publish(20_000, 26_000)
	for _, r := range []<-chan [3]string{r1, r2} {
		res := <-r
		t.Logf("edged cluster rebalance: exit %s: %s%s", res[0], strings.TrimSpace(res[1]), strings.TrimSpace(res[2]))
		if res[0] != "0" {
			t.Errorf("edged cluster rebalance exited %s", res[0])
		}
	}
	l.publish(26_000, n)
	l.finishChecked(n, 120*time.Second)
	checkFileSinkUnion(t, members, n/windowMS, 60*time.Second)
	if s, err := a.rebalances(client); err == nil {
		for _, r := range s.Rebalances {
			t.Logf("rebalance: %+v", r)
		}
	}
}

// Worker c is SIGKILLed under MQTT load and started again with its data
// at once, while the others are still seeing its old run die and moving
// its subtasks away; three times, at different points: right away, once
// the master placed its subtasks elsewhere, and while it is being moved
// back in. Every window of every sensor is exact with one result id.
func TestClusterWorkerRestartedWhileFailedOver(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with three subprocesses and SIGKILL")
	}
	members := startCluster(t, true)
	a, c := members[0], members[2]
	l := newClusterLoad(t, members)
	client := &http.Client{Timeout: time.Second}
	waitAllAlive(t, a, 3)
	var in struct {
		Pipelines []struct {
			Next uint64 `json:"next_offset"`
		} `json:"pipelines"`
	}
	releasedAll := func() {
		t.Helper()
		if err := c.get(client, "/ingest", &in); err != nil || len(in.Pipelines) != 1 {
			t.Fatalf("GET /ingest of c: %v", err)
		}
		testutil.Eventually(t, 60*time.Second, "c's log released what it took in", func() bool {
			rel, err := c.released(client)
			return err == nil && rel >= in.Pipelines[0].Next
		})
	}
	owns := func() {
		t.Helper()
		testutil.Eventually(t, 90*time.Second, "c owns key groups again", func() bool {
			s, err := a.status(client)
			return err == nil && s.keyedOn("c") > 0 && s.alive() == 3
		})
	}
	restart := func() {
		c.readyFn = c.hostsAndServes
		l.restart(2)
		l.stopDevices(2)
	}
	const n = 30_000
	l.publish(0, 6_000)

	releasedAll()
	l.kill(2)
	restart()
	l.publish(6_000, 9_000)
	owns()
	l.connect(2)
	delete(l.down, 2)
	l.publish(9_000, 12_000)

	releasedAll()
	l.kill(2)
	testutil.Eventually(t, 60*time.Second, "c's subtasks failed over", func() bool {
		s, err := a.status(client)
		return err == nil && s.FailoversTotal >= 1 && s.alive() == 2 && s.keyedOn("c") == 0 && s.keyedOn("a") > 0 && s.keyedOn("b") > 0
	})
	restart()
	l.publish(12_000, 15_000)
	// c's join is moved in by a rebalance after the settle delay; c is
	// killed again as soon as the master logs that it moves c in.
	testutil.Eventually(t, 60*time.Second, "the join's rebalance moves c in", func() bool {
		return strings.Contains(a.logTailN(1<<20), "cluster: rebalance by handover: moving")
	})
	l.kill(2)
	l.publish(15_000, 18_000)
	restart()
	owns()
	l.connect(2)
	delete(l.down, 2)
	l.publish(18_000, n)
	l.finishChecked(n, 120*time.Second)
	if s, err := a.rebalances(client); err == nil {
		t.Logf("failovers_total %d, failovers %+v", s.FailoversTotal, s.Failovers)
		for _, r := range s.Rebalances {
			t.Logf("rebalance: %s %s", r.Trigger, r.Outcome)
		}
	}
	if os.Getenv("EDGED_E2E_KEEP_LOGS") != "" {
		for _, m := range members {
			keepLog(t, m)
		}
	}
}

// The cluster's job with at-least-once checkpoints under MQTT load:
// worker c SIGKILLed and left down (failover), then the leader a
// SIGKILLed (b takes over), then both started again. At-least-once may
// count a reading twice, never lose one: every window of every sensor
// has a result whose count is at least the readings published for it.
func TestClusterAtLeastOnceKillsNeverLose(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with three subprocesses and SIGKILL")
	}
	members := startClusterEdited(t, true, func(cfg string) string {
		out := strings.Replace(cfg, "mode: exactly_once", "mode: at_least_once", 1)
		if out == cfg {
			panic("no checkpoint mode in the config")
		}
		return out
	})
	a, b, c := members[0], members[1], members[2]
	l := newClusterLoad(t, members)
	client := &http.Client{Timeout: time.Second}
	waitAllAlive(t, a, 3)
	const n = 30_000
	l.publish(0, 6_000)
	released := func(m *clusterMember) {
		t.Helper()
		var in struct {
			Pipelines []struct {
				Next uint64 `json:"next_offset"`
			} `json:"pipelines"`
		}
		if err := m.get(client, "/ingest", &in); err != nil || len(in.Pipelines) != 1 {
			t.Fatalf("GET /ingest of %s: %v", m.id, err)
		}
		testutil.Eventually(t, 60*time.Second, m.id+"'s log released what it took in", func() bool {
			rel, err := m.released(client)
			return err == nil && rel >= in.Pipelines[0].Next
		})
	}
	released(c)
	l.kill(2)
	testutil.Eventually(t, 60*time.Second, "c's subtasks failed over", func() bool {
		s, err := a.status(client)
		return err == nil && s.FailoversTotal >= 1 && s.keyedOn("c") == 0 && s.alive() == 2
	})
	l.publish(6_000, 12_000)
	released(a)
	l.kill(0)
	c.readyFn = c.hostsAndServes
	l.restart(2)
	testutil.Eventually(t, 60*time.Second, "b took over", func() bool {
		s, err := b.leaderStatus(client)
		return err == nil && s.Leader == "b" && s.keyedOn("a") == 0 && s.keyedOn("b") > 0
	})
	l.publish(12_000, 20_000)
	a.readyFn = func(client *http.Client) bool {
		_, err := a.hosted(client)
		return err == nil && brokerUp(a.brokerAddr)
	}
	l.restart(0)
	l.stopDevices(0)
	testutil.Eventually(t, 90*time.Second, "every node runs keyed subtasks", func() bool {
		s, err := b.leaderStatus(client)
		if err != nil {
			return false
		}
		lead := b
		if s.Leader == "a" {
			lead = a
		}
		s, err = lead.leaderStatus(client)
		return err == nil && s.keyedOn("a") > 0 && s.keyedOn("b") > 0 && s.keyedOn("c") > 0
	})
	l.connect(0)
	delete(l.down, 0)
	l.publish(20_000, n+3*tail)
	windows := n / windowMS
	if !testutil.Within(120*time.Second, func() bool { return countWindows(l.col, windows) >= windows*sensors }) {
		t.Fatalf("%d of %d window results", countWindows(l.col, windows), windows*sensors)
	}
	l.col.mu.Lock()
	defer l.col.mu.Unlock()
	var lost []string
	over, again := 0, 0
	for w := range windows {
		for s := range sensors {
			rs := l.col.byKey[winKey{sensorOf(s), epochMS + int64(w)*windowMS}]
			best := int64(0)
			ids := map[string]bool{}
			for _, r := range rs {
				best = max(best, r.Count)
				ids[r.MsgID] = true
			}
			switch {
			case best < perSensor:
				lost = append(lost, fmt.Sprintf("%s window %d: at most %d of %d", sensorOf(s), w, best, perSensor))
			case best > perSensor:
				over++
			}
			if len(ids) > 1 {
				again++
			}
		}
	}
	t.Logf("%d windows counted over, %d under several msg_ids, of %d", over, again, windows*sensors)
	if len(lost) > 0 {
		t.Fatalf("%d windows lost readings: %v", len(lost), lost[:min(len(lost), 20)])
	}
}
