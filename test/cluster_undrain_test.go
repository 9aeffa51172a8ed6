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

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgedio/edged/internal/testutil"
)

// startDevices connects node i's devices again after stopDevices: its
// share of the readings goes to it again.
func (l *clusterLoad) startDevices(i int) {
	m := l.members[i]
	for k := range devicesPerNode {
		opts := paho.NewClientOptions().AddBroker("tcp://" + m.brokerAddr).SetClientID(fmt.Sprintf("devices-%s-%d", m.id, k)).
			SetCleanSession(true).SetAutoReconnect(false).SetWriteTimeout(5 * time.Second)
		l.pubs[i] = append(l.pubs[i], connect(l.t, opts))
	}
	delete(l.down, i)
}

// A worker drained with `edged cluster drain b` under MQTT load (its
// devices moved to the other nodes first) hands its subtasks over and
// leaves the membership; `edged cluster undrain b` then brings it back
// without a restart: it rejoins the membership, the join the undrain
// queued invites it into the running deployment again and hands its
// subtasks back to it (both rebalances by handover, in the job's same
// epoch; its devices publish to it again once it owns its split: the
// pipeline has no idle timeout, so its silent split would hold the
// windows back), and every window stays exact.
func TestClusterNodeUndrainedRejoins(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with three subprocesses")
	}
	maybeBurn(t)
	members := startCluster(t, true)
	a := members[0]
	l := newClusterLoad(t, members)
	client := &http.Client{Timeout: time.Second}
	waitAllAlive(t, a, 3)
	const n = 30_000
	l.publish(0, n/4)
	l.stopDevices(1)

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cli := func(args ...string) string {
		t.Helper()
		return mustCLI(t, 3*time.Minute, a.apiAddr, args...)
	}
	var before rebalanceModes
	if err := a.get(client, "/cluster", &before); err != nil {
		t.Fatal(err)
	}
	if out := cli("cluster", "drain", "b"); !strings.HasPrefix(out, "drained b: done,") {
		t.Fatalf("edged cluster drain printed %q", out)
	}
	testutil.Eventually(t, 30*time.Second, "the master sees b left", func() bool {
		s, err := a.rebalances(client)
		return err == nil && s.state("b") == "left" && s.keyedOn("b") == 0
	})
	l.publish(n/4, n/2)

	if out := cli("cluster", "undrain", "b"); !strings.HasPrefix(out, "undrained b: done,") {
		t.Fatalf("edged cluster undrain printed %q", out)
	}
	s, err := a.rebalances(client)
	if err != nil {
		t.Fatal(err)
	}
	if s.state("b") != "alive" || s.keyedOn("b") == 0 || len(s.Rebalances) == 0 || s.Rebalances[0].Trigger != "join" ||
		s.Rebalances[0].Outcome != "done" || s.Rebalances[0].MovedKeyGroups == 0 {
		t.Fatalf("after the undrain: b %s with %d keyed subtasks, rebalances %+v", s.state("b"), s.keyedOn("b"), s.Rebalances)
	}
	// Both moved by handover in the running deployment: the drain and
	// the undrain's join, in the same epoch.
	var modes rebalanceModes
	if err := a.get(client, "/cluster", &modes); err != nil {
		t.Fatal(err)
	}
	var got []string // newest first
	for _, r := range modes.Rebalances[:len(modes.Rebalances)-len(before.Rebalances)] {
		got = append(got, r.Trigger+" "+r.Outcome+" "+r.Mode)
	}
	if strings.Join(got, ", ") != "join done handover, drain done handover" || modes.Epoch != before.Epoch {
		t.Fatalf("rebalances %v in epoch %d (%d before): want a drain and a join done by handover in the same epoch", got, modes.Epoch, before.Epoch)
	}
	// Undrained again: refused.
	var stderr bytes.Buffer
	again := exec.CommandContext(ctx, edgedBin, "cluster", "undrain", "b", "--addr", a.apiAddr)
	again.Stderr = &stderr
	if err := again.Run(); err == nil || !strings.Contains(stderr.String(), "409") {
		t.Fatalf("second undrain: %v %s", err, stderr.String())
	}
	l.startDevices(1)
	l.publish(n/2, n)
	l.finishChecked(n, 120*time.Second)
}

// A worker drained with `edged cluster drain b` and undrained with
// `edged cluster undrain b` gets its subtasks back by handover in the
// same epoch (README: TestClusterNodeUndrainedRejoins). The job must
// then keep running in that epoch: no channel of a handed-over subtask
// may fail it afterwards. Before the fix, a subtask that sent on a
// channel re-pointed by the drain's handover (source[1] on a, whose
// reader timestamps[1] moved from b to c in a later wave) kept that
// re-pointed sender open when it was itself handed back to b by the
// undrain: its last frame, which the reader took on the old channel
// before swapping, was never acknowledged, and 10 s later (ack_timeout)
// the channel failed the job: `acknowledgement timeout: sender: seq N
// sent, N-1 received`, a full restart in a new epoch.
func TestClusterUndrainDoesNotFailTheJobLater(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with three subprocesses")
	}
	members := startCluster(t, true)
	a := members[0]
	l := newClusterLoad(t, members)
	client := &http.Client{Timeout: time.Second}
	waitAllAlive(t, a, 3)
	const n = 24_000
	l.publish(0, n/4)
	l.stopDevices(1)
	cli := func(args ...string) string {
		t.Helper()
		return mustCLI(t, 3*time.Minute, a.apiAddr, args...)
	}
	cli("cluster", "drain", "b")
	testutil.Eventually(t, 30*time.Second, "the master sees b left", func() bool {
		s, err := a.rebalances(client)
		return err == nil && s.state("b") == "left" && s.keyedOn("b") == 0
	})
	l.publish(n/4, n/2)
	cli("cluster", "undrain", "b")
	var after rebalanceModes
	if err := a.get(client, "/cluster", &after); err != nil {
		t.Fatal(err)
	}
	l.startDevices(1)
	// Keep the job busy past the channels' ack_timeout (10 s): what is
	// checked is that nothing happens in that time, so the test paces its
	// load over it rather than waiting on a condition.
	deadline := time.Now().Add(14 * time.Second)
	next := n / 2
	for time.Now().Before(deadline) && next < 3*n/4 {
		l.publish(next, next+300)
		next += 300
		time.Sleep(150 * time.Millisecond)
	}
	time.Sleep(time.Until(deadline))
	var later rebalanceModes
	if err := a.get(client, "/cluster", &later); err != nil {
		t.Fatal(err)
	}
	var logs []string
	for _, m := range members {
		for _, line := range strings.Split(m.runLog(), "\n") {
			if strings.Contains(line, "acknowledgement timeout") || strings.Contains(line, "job failed; restarting") {
				logs = append(logs, m.id+": "+line)
			}
		}
	}
	if later.Epoch != after.Epoch || len(logs) > 0 {
		t.Fatalf("the job left epoch %d for %d within 14 s of the undrain; logs:\n%s", after.Epoch, later.Epoch, strings.Join(logs, "\n"))
	}
	l.publish(next, n)
	l.finishChecked(n, 120*time.Second)
}

// probeRescale is TestClusterCLIRescaleStopResume at another target
// parallelism: `edged stop` on the leader under load, every node
// stopped, parallelism 3 -> to in every config, the leader started

// A worker drained under the leader that took over is undrained after
// the leadership went back to the old leader: the leader a is SIGKILLed
// under MQTT load, b takes over, a comes back and `edged cluster drain c`
// is asked of b before the hand-back; once a leads again, `edged cluster
// undrain c` is asked of a. The drained mark was b's alone: before, a
// answered `node not drained: node "c" takes subtasks already` (HTTP 409)
// though c had left the membership and took no subtask, and c stayed out
// (its broker refusing readings) until it was restarted. a now asks such a
// node, which it does not see in the membership, to rejoin: a node that
// had left is undrained, moved in by the join, and every window is exact
// with one result id.
func TestClusterNodeDrainedBeforeAHandbackIsUndrained(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with three subprocesses")
	}
	members := startCluster(t, true)
	a, b, c := members[0], members[1], members[2]
	l := newClusterLoad(t, members)
	client := &http.Client{Timeout: time.Second}
	waitAllAlive(t, a, 3)
	const n = 40_000
	l.publish(0, n/5)
	covered := func(m *clusterMember) func() bool {
		return func() bool { return m.ingestCovered(client) }
	}
	l.killWhen(0, 30*time.Second, covered(a))
	testutil.Eventually(t, 30*time.Second, "node b runs the job masters", func() bool {
		m, err := b.jobMasters(client)
		return err == nil && m == 1
	})
	l.publish(n/5, 2*n/5)
	// a comes back as a follower: ready once its broker and API answer,
	// before the hand-back.
	a.readyFn = func(cl *http.Client) bool {
		var s map[string]any
		return brokerUp(a.brokerAddr) && a.get(cl, "/cluster", &s) == nil
	}
	l.restart(0)
	// b refuses a drain that would leave it alone (no majority) until
	// it sees a alive again.
	waitAllAlive(t, b, 3)
	l.stopDevices(2)
	if out := mustCLI(t, 3*time.Minute, b.apiAddr, "cluster", "drain", "c"); !strings.HasPrefix(out, "drained c: done,") {
		t.Fatalf("edged cluster drain c on b printed %q", out)
	}
	l.publish(2*n/5, 3*n/5)
	testutil.Eventually(t, 120*time.Second, "node a runs the job masters again", func() bool {
		m, err := a.jobMasters(client)
		return err == nil && m == 1
	})
	if out := mustCLI(t, 3*time.Minute, a.apiAddr, "cluster", "undrain", "c"); !strings.HasPrefix(out, "undrained c: done,") {
		t.Fatalf("edged cluster undrain c on a printed %q", out)
	}
	testutil.Eventually(t, 60*time.Second, "c runs keyed subtasks again", func() bool {
		s, err := a.status(client)
		return err == nil && s.keyedOn("c") > 0
	})
	l.startDevices(2)
	l.publish(3*n/5, n)
	l.finishChecked(n, 120*time.Second)
	_ = c
}

// `edged cluster undrain b` asked while b's drain still runs (the drain
// command's --timeout ended first) waits for that drain and then brings
// b back: it answers once b's join moved its subtasks back, and b is
// alive with them. Before, the undrain went ahead at once (b had not
// left yet, so it did not rejoin), the drain then made b leave, and the
// undrain answered `undrained b: done, 0 key groups moved` (exit 0)
// while b stayed out of the cluster, refusing readings, until it was
// undrained again.
func TestClusterUndrainAskedWhileItsDrainRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with three subprocesses")
	}
	members := startCluster(t, true)
	a := members[0]
	l := newClusterLoad(t, members)
	client := &http.Client{Timeout: time.Second}
	waitAllAlive(t, a, 3)
	const n = 18_000
	l.publish(0, n/3)
	l.stopDevices(1)

	// The undrain must come while the drain runs: a drain that ended
	// within the CLI's timeout (a quiet machine hands over in about a
	// second) is undone and asked again with a shorter timeout; one the
	// timeout cut before it was asked is asked again.
	running := false
	for _, timeout := range []string{"1s", "500ms", "300ms", "200ms", "500ms", "300ms"} {
		code, stdout, stderr := runCLI(t, time.Minute, "cluster", "drain", "b", "--timeout", timeout, "--addr", a.apiAddr)
		if code == 1 && strings.Contains(stderr, "was asked and is still queued or in progress") {
			running = true
			break
		}
		t.Logf("edged cluster drain b --timeout %s: exit %d, %s%s", timeout, code, stdout, stderr)
		if code == 0 {
			mustCLI(t, 3*time.Minute, a.apiAddr, "cluster", "undrain", "b")
			testutil.Eventually(t, time.Minute, "b to own key groups again", func() bool {
				s, err := a.rebalances(client)
				return err == nil && s.state("b") == "alive" && s.keyedOn("b") > 0
			})
		}
	}
	if !running {
		t.Fatal("no drain of b was still running when its CLI's timeout ended: the undrain could not be asked during one")
	}
	out := mustCLI(t, 3*time.Minute, a.apiAddr, "cluster", "undrain", "b")
	s, err := a.rebalances(client)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out, "undrained b: done,") || strings.Contains(out, " 0 key groups moved") ||
		s.state("b") != "alive" || s.keyedOn("b") == 0 {
		t.Fatalf("undrain asked during the drain printed %q; then b %s with %d keyed subtasks, rebalances %+v",
			out, s.state("b"), s.keyedOn("b"), s.Rebalances)
	}
	l.startDevices(1)
	l.publish(n/3, n)
	l.finishChecked(n, 120*time.Second)
}
