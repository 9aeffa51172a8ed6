package test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/edgedio/edged/internal/testutil"
)

// logCount returns how many lines of node m's current run contain s.
func logCount(m *clusterMember, s string) int {
	return strings.Count(m.runLog(), s)
}

// startCLI starts edged with args and returns a function that waits for
// it and returns its exit code, stdout and stderr.
func startCLI(t *testing.T, ctx context.Context, args ...string) func() (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, edgedBin, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	return func() (int, string, string) {
		<-done
		code := cmd.ProcessState.ExitCode()
		t.Logf("edged %s: exit %d: %s%s", strings.Join(args, " "), code, strings.TrimSpace(stdout.String()), strings.TrimSpace(stderr.String()))
		return code, stdout.String(), stderr.String()
	}
}

// A worker is SIGKILLed while `edged cluster drain` of it hands its
// subtasks over, under MQTT load (its devices moved to the other nodes
// first). The drain ends, whatever its outcome, the master places the
// dead node's share on the live nodes, the node comes back, and every
// window of every sensor is exact with one result id.
func TestClusterNodeKilledDuringItsDrain(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with three subprocesses and SIGKILL")
	}
	members := startCluster(t, true)
	a := members[0]
	l := newClusterLoad(t, members)
	client := &http.Client{Timeout: time.Second}
	waitAllAlive(t, a, 3)
	const n = 30_000
	l.publish(0, n/3)
	l.stopDevices(1)
	moving := logCount(a, "cluster: rebalance by handover: moving")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	wait := startCLI(t, ctx, "cluster", "drain", "b", "--addr", a.apiAddr)
	l.killWhen(1, 30*time.Second, func() bool {
		return logCount(a, "cluster: rebalance by handover: moving") > moving
	})
	code, stdout, stderr := wait()
	if ctx.Err() != nil {
		t.Fatalf("edged cluster drain b did not end: exit %d, %q %q", code, stdout, stderr)
	}
	testutil.Eventually(t, 60*time.Second, "the master runs the job without b", func() bool {
		s, err := a.status(client)
		return err == nil && s.keyedOn("b") == 0 && allHostTasks(client, members[2:])
	})
	restartBAndFinish(t, l, client, members, n)
}

// Node c is SIGKILLed and, once the master failed over from it, comes
// back: the master's join moves c's subtasks back to it by handover,
// under MQTT load, and node b is SIGKILLed as soon as that rebalance's
// handover starts. The master places b's share on
// the live nodes, b comes back, and every window of every sensor is
// exact with one result id.
func TestClusterNodeKilledDuringARebalance(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with three subprocesses and SIGKILL")
	}
	members := startCluster(t, true)
	a := members[0]
	l := newClusterLoad(t, members)
	client := &http.Client{Timeout: time.Second}
	waitAllAlive(t, a, 3)
	const n = 36_000
	l.publish(0, n/4)
	// What c acknowledged is covered by completed checkpoints before the
	// kill (readings only c's disk holds are late when it returns: see
	// the README's cluster guarantees).
	testutil.Eventually(t, 60*time.Second, "node c's log released all it was sent", func() bool {
		rel, err := members[2].released(client)
		return err == nil && rel >= n/4/3
	})
	l.kill(2)
	// c comes back once the master saw it dead and failed over: its
	// return is then a join, which the master moves in by handover.
	testutil.Eventually(t, 60*time.Second, "the master saw c dead and runs the job without c", func() bool {
		s, err := a.status(client)
		if err != nil || s.keyedOn("c") != 0 || s.FailoversTotal == 0 || !allHostTasks(client, members[1:2]) {
			return false
		}
		for _, m := range s.Members {
			if m.ID == "c" {
				return m.State == "dead"
			}
		}
		return false
	})
	l.publish(n/4, n/3)
	moving := logCount(a, "handover starting")
	// c's restart waits for c to host tasks: b is killed as soon as the
	// join's handover starts instead.
	members[2].readyFn = func(client *http.Client) bool { return brokerUp(members[2].brokerAddr) }
	l.restart(2)
	l.killWhen(1, 60*time.Second, func() bool {
		return logCount(a, "handover starting") > moving
	})
	if logCount(a, "handover starting") == moving {
		t.Fatal("no handover of the join seen within 60 s of c's restart")
	}
	var last string
	if !testutil.Within(90*time.Second, func() bool {
		s, err := a.status(client)
		ok := err == nil && s.keyedOn("b") == 0 && s.keyedOn("c") > 0 && allHostTasks(client, members[2:])
		if !ok {
			jobs, herr := members[2].hosted(client)
			last = fmt.Sprintf("status: %+v (err %v); c hosts %+v (err %v)", s, err, jobs, herr)
		}
		return ok
	}) {
		t.Fatalf("timed out after 90 s waiting for the master to run the job on a and c; last seen: %s", last)
	}
	restartBAndFinish(t, l, client, members, n)
}

// The leader is SIGKILLed while `edged cluster drain c` hands c's
// subtasks over, under MQTT load (c's devices moved to the other nodes
// first, everything the leader acknowledged covered by checkpoints). The
// drain's CLI ends with an error, b takes the job masters over, the
// leader comes back, and every window of every sensor is exact with one
// result id.
func TestClusterLeaderKilledDuringADrain(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with three subprocesses and SIGKILL")
	}
	members := startCluster(t, true)
	a, b := members[0], members[1]
	l := newClusterLoad(t, members)
	client := &http.Client{Timeout: time.Second}
	waitAllAlive(t, a, 3)
	const n = 30_000
	l.publish(0, n/3)
	testutil.Eventually(t, 60*time.Second, "node a's log released all it was sent", func() bool {
		rel, err := a.released(client)
		return err == nil && rel >= n/3/3
	})
	l.stopDevices(2)
	moving := logCount(a, "handover starting")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	wait := startCLI(t, ctx, "cluster", "drain", "c", "--addr", a.apiAddr)
	l.killWhen(0, 30*time.Second, func() bool {
		return logCount(a, "handover starting") > moving
	})
	if logCount(a, "handover starting") == moving {
		t.Fatal("no handover of the drain seen within 30 s")
	}
	code, stdout, stderr := wait()
	if ctx.Err() != nil || code == 0 {
		t.Fatalf("edged cluster drain c: exit %d, %q %q; want an error", code, stdout, stderr)
	}
	testutil.Eventually(t, 60*time.Second, "node b took over and runs the job", func() bool {
		s, err := b.leaderStatus(client)
		return err == nil && s.Leader == "b" && s.keyedOn("a") == 0 && s.keyedOn("b")+s.keyedOn("c") > 0
	})
	if s, err := b.leaderStatus(client); err == nil {
		t.Logf("after the takeover: %+v, subtasks on b %d, on c %d", s.Members, s.keyedOn("b"), s.keyedOn("c"))
	}

	l.publish(n/3, n/2)
	a.readyFn = func(client *http.Client) bool {
		_, err := a.hosted(client)
		return err == nil && brokerUp(a.brokerAddr)
	}
	l.restart(0)
	// The drain went with the leader, as the CLI said: once a has the
	// leadership back, it is asked again (b alone could not drain c: a
	// majority must stay).
	from, last := n/2, time.Now()
	testutil.Eventually(t, 60*time.Second, "a to get the leadership back", func() bool {
		if s, err := a.leaderStatus(client); err == nil && s.Leader == "a" && s.alive() == 3 {
			if jm, err := a.jobMasters(client); err == nil && jm == 1 {
				return true
			}
		}
		// The devices go on publishing meanwhile, 300 readings a second,
		// up to three quarters of them.
		if time.Since(last) >= time.Second && from+300 <= 3*n/4 {
			l.publish(from, from+300)
			from, last = from+300, time.Now()
		}
		return false
	})
	mustCLI(t, 2*time.Minute, a.apiAddr, "cluster", "drain", "c")
	l.publish(from, n)
	l.finishChecked(n, 120*time.Second)
	for _, m := range members {
		m.failIfExited(t)
	}
}

// restartBAndFinish publishes the readings from n/3 to n/2 with b down,
// restarts b, waits until b and c host tasks, publishes the rest, and
// checks every window of every sensor and that no node exited.
func restartBAndFinish(t *testing.T, l *clusterLoad, client *http.Client, members []*clusterMember, n int) {
	t.Helper()
	l.publish(n/3, n/2)
	l.restart(1)
	testutil.Eventually(t, 60*time.Second, "b hosts tasks again", func() bool {
		return allHostTasks(client, members[1:])
	})
	l.publish(n/2, n)
	l.finishChecked(n, 120*time.Second)
	for _, m := range members {
		m.failIfExited(t)
	}
}

// A worker is SIGKILLed under MQTT load (its devices moved away and its
// ingest log covered by a checkpoint first), and `edged cluster drain`
// of it is asked as soon as the master places its subtasks on the live
// nodes (the job failed on the lost connection and restarted without
// it), before the membership has declared it dead. (Asked between two
// attempts of the job, the drain meets the next attempt's deployment and
// falls back: TestClusterDrainOfAWorkerKilledWhileTheJobRestarts.) The drain redeploys from a
// savepoint, and the dead node, still a member, refuses the copies of
// the savepoint's state files until it is declared dead. Before, the
// three tries of the savepoint came back to back within some 50 ms and
// all failed that way: the drain was refused (exit 1, `savepoint of job
// "sensors" before the redeployment: ... replication failed ... on "c":
// ... connection refused`) and the node was not drained. The tries are
// now one failure detection apart: the drain is done, the node drained,
// and every window is exact with one result id.
func TestClusterDrainOfAJustKilledWorker(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with three subprocesses")
	}
	const n = 20_000
	a, l, client := workerKilledUnderLoad(t, n/2, true)
	code, out, errs := runCLI(t, 3*time.Minute, "cluster", "drain", "c", "--addr", a.apiAddr)
	if code != 0 || !strings.HasPrefix(out, "drained c: done") {
		t.Fatalf("edged cluster drain c of the killed worker: exit %d, %q %q", code, out, errs)
	}
	var s struct {
		Members []struct {
			ID      string `json:"id"`
			Drained bool   `json:"drained"`
		} `json:"members"`
	}
	if err := a.get(client, "/cluster", &s); err != nil {
		t.Fatal(err)
	}
	var drained bool
	for _, m := range s.Members {
		if m.ID == "c" {
			drained = m.Drained
		}
	}
	if !drained {
		t.Fatalf("c is not drained after its drain: %+v", s.Members)
	}
	l.publish(n/2, n)
	l.finishChecked(n, 120*time.Second)
}

// As TestClusterDrainOfAJustKilledWorker, the drain asked while the
// master is still restarting the job after the worker's death (the load
// goes on meanwhile), before the membership declares the worker dead: a
// drain that finds the job's next attempt being deployed tries to hand
// the worker's subtasks over, falls back to the restart without it, and
// then asks the worker to leave the membership, which it cannot answer.
// Before, the drain so answered exit 1, `node "c" drained, but it did not
// leave the membership: Post ".../cluster/leave": ... connection refused`
// (HTTP 500; in 6 of 10 runs of this timing), though the node was dead and
// drained. A drained node whose leave call fails and that the membership
// declares dead within one failure detection needs no leave: the drain
// answers exit 0, and every window is exact with one result id.
func TestClusterDrainOfAWorkerKilledWhileTheJobRestarts(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with three subprocesses")
	}
	const n = 24_000
	a, l, _ := workerKilledUnderLoad(t, n/3, false)
	l.publish(n/3, n/3+5_000)
	code, out, errs := runCLI(t, 3*time.Minute, "cluster", "drain", "c", "--addr", a.apiAddr)
	if code != 0 || !strings.HasPrefix(out, "drained c: ") {
		t.Fatalf("edged cluster drain c of the killed worker: exit %d, %q %q", code, out, errs)
	}
	l.publish(n/3+5_000, n)
	l.finishChecked(n, 120*time.Second)
}

// workerKilledUnderLoad starts a three-node cluster with gossip, publishes
// its first readings, SIGKILLs worker c once checkpoints cover its ingest
// log, and waits until the master a places no keyed subtask on c: with
// onLive, until it places them on a and b (the job's attempt without c
// deployed); without, the status of a job between two attempts, which
// places nothing, will do. It returns a, the load and a client for a's
// API.
func workerKilledUnderLoad(t *testing.T, first int, onLive bool) (*clusterMember, *clusterLoad, *http.Client) {
	t.Helper()
	members := startCluster(t, true)
	a, c := members[0], members[2]
	l := newClusterLoad(t, members)
	client := &http.Client{Timeout: time.Second}
	waitAllAlive(t, a, 3)
	l.publish(0, first)
	l.killWhen(2, 30*time.Second, func() bool { return c.ingestCovered(client) })
	testutil.Eventually(t, 30*time.Second, "the master places no keyed subtask on c", func() bool {
		s, err := a.status(client)
		return err == nil && s.keyedOn("c") == 0 && (!onLive || s.keyedOn("a")+s.keyedOn("b") > 0)
	})
	return a, l, client
}
