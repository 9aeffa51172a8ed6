package test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgedio/edged/internal/testutil"
)

// Rebalances that move source splits and drain nodes by handover, with
// real edged processes under MQTT load.

// rebalanceModes is what GET /cluster says of each rebalance: its
// trigger, outcome, mode and pauses.
type rebalanceModes struct {
	Epoch          uint64 `json:"epoch"`
	FailoversTotal int64  `json:"failovers_total"`
	Rebalances     []struct {
		Trigger  string             `json:"trigger"`
		Outcome  string             `json:"outcome"`
		Mode     string             `json:"mode"`
		PauseMS  map[string]float64 `json:"pause_ms"`
		Unpaused []string           `json:"unpaused"`
		Error    string             `json:"error"`
	} `json:"rebalances"`
}

// A fourth node joins a three-node cluster (four configured) mid-stream
// under MQTT load, with no placement pinned: the join moves every
// subtask whose home is the new node back to it — its source split (which
// ran idle on another node meanwhile) and the subtasks downstream of it —
// by handovers in the running deployment, not by a redeployment: the
// rebalance is recorded as done by handover with the split's pause, the
// job's epoch is the same, the new node's devices publish to it once it
// owns its split, and every window of every sensor arrives exactly once
// with the exact count.
func TestClusterJoinHandsOverSourceSplit(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with four subprocesses")
	}
	maybeBurn(t)
	members := startClusterOf(t, []string{"a", "b", "c", "d"}, 3, 4)
	a, d := members[0], members[3]
	l := newPartialLoad(t, members, 3)
	client := &http.Client{Timeout: 2 * time.Second}
	waitAllAlive(t, a, 3)
	const n = 40_000
	next := 0
	l.publish(next, n/4)
	next = n / 4
	checkpointsSettled(t, a)
	var before rebalanceModes
	if err := a.get(client, "/cluster", &before); err != nil {
		t.Fatal(err)
	}
	republishes := countRepublished(members)
	d.start()
	l.connect(3)
	for next < n/2 && keyGroupsOn(t, a, "d") == 0 {
		l.publish(next, next+500)
		next += 500
	}
	testutil.Eventually(t, 90*time.Second, "node d owns key groups", func() bool { return keyGroupsOn(t, a, "d") > 0 })
	var after rebalanceModes
	testutil.Eventually(t, 90*time.Second, "the join rebalance ended", func() bool {
		if err := a.get(client, "/cluster", &after); err != nil {
			return false
		}
		for _, r := range after.Rebalances[len(before.Rebalances):] {
			if r.Trigger == "join" && r.Outcome != "running" {
				return true
			}
		}
		return false
	})
	moved := false
	for _, r := range after.Rebalances[len(before.Rebalances):] {
		t.Logf("rebalance: %+v", r)
		if r.Trigger != "join" {
			continue
		}
		if r.Outcome != "done" || r.Mode != "handover" {
			t.Fatalf("the join: outcome %q mode %q (%s), want done by handover", r.Outcome, r.Mode, r.Error)
		}
		for k := range r.PauseMS {
			moved = moved || strings.HasSuffix(k, "/source/3")
		}
	}
	if !moved {
		t.Fatal("the join did not move the source split of d by handover")
	}
	if after.Epoch != before.Epoch {
		t.Fatalf("the job's epoch went from %d to %d: it restarted", before.Epoch, after.Epoch)
	}
	delete(l.down, 3)
	l.publish(next, n)
	l.finishChecked(n, 120*time.Second)
	d.checkTookRecords(t, client)
	checkPublishedOnceOverHandovers(t, members, republishes)
}

// countRepublished returns, by node, how many times its write-ahead sinks
// published again what a restored snapshot held, in its current run.
func countRepublished(members []*clusterMember) map[string]int {
	n := make(map[string]int, len(members))
	for _, m := range members {
		n[m.id] = len(republished(m))
	}
	return n
}

// checkPublishedOnceOverHandovers fails t if a node's write-ahead sinks
// published again what a restored snapshot held since before
// (countRepublished): in a job whose epoch did not change, only its
// handovers restored snapshots, and the old instance of a handed-over
// sink published what it held (README, "The results a moved subtask's
// write-ahead sink held at the barrier go out once").
func checkPublishedOnceOverHandovers(t *testing.T, members []*clusterMember, before map[string]int) {
	t.Helper()
	for _, m := range members {
		for _, line := range republished(m)[before[m.id]:] {
			t.Errorf("node %s published again what a handed-over sink held: %s", m.id, line)
		}
	}
}

// A worker drained with `edged cluster drain b` under paced MQTT load
// (its devices moved to the other nodes first): its subtasks, its source
// split included, move away by handover in the running deployment, it
// leaves the deployment and the membership, and stopped afterwards (with
// SIGTERM: it asks for no drain again) it is no failure: no failover, the
// job's epoch is the same, and every window stays exact. The window
// subtasks that do not move (those on a and c) keep processing all the
// while: drainUnderPacedLoad.
func TestClusterDrainHandsOverAndStops(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with three subprocesses")
	}
	drainUnderPacedLoad(t, func(t *testing.T, ctx context.Context, a, b *clusterMember) func() error {
		var stdout, stderr bytes.Buffer
		cli := exec.CommandContext(ctx, edgedBin, "cluster", "drain", "b", "--addr", a.apiAddr)
		cli.Stdout, cli.Stderr = &stdout, &stderr
		if err := cli.Start(); err != nil {
			t.Fatal(err)
		}
		return func() error {
			if err := cli.Wait(); err != nil {
				return fmt.Errorf("edged cluster drain b: %w\nstdout: %s\nstderr: %s", err, stdout.String(), stderr.String())
			}
			t.Logf("edged cluster drain b: %s", strings.TrimSpace(stdout.String()))
			return refusesReadings(b)
		}
	})
}

// refusesReadings checks that drained node m's embedded broker refuses a
// reading (its connection ends, no PUBACK: the device keeps it) and
// counts it, rather than acknowledging what nobody would read.
func refusesReadings(m *clusterMember) error {
	opts := paho.NewClientOptions().AddBroker("tcp://" + m.brokerAddr).SetClientID("late-device").
		SetCleanSession(true).SetAutoReconnect(false)
	c := paho.NewClient(opts)
	if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		return fmt.Errorf("connect to the drained node: %v", tok.Error())
	}
	defer c.Disconnect(0)
	topic, p := payloadOf(0)
	tok := c.Publish(topic, 1, false, p)
	if !testutil.Within(10*time.Second, func() bool { return !c.IsConnectionOpen() }) {
		return errors.New("the drained node's broker kept the connection of a device publishing a reading")
	}
	if tok.WaitTimeout(10*time.Millisecond) && tok.Error() == nil {
		return errors.New("the drained node's broker acknowledged a reading")
	}
	resp, err := http.Get("http://" + m.apiAddr + "/metrics")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if !strings.Contains(string(body), "edged_broker_readings_refused_total 1") {
		return errors.New("the refusal is not counted in edged_broker_readings_refused_total")
	}
	return nil
}

// A worker stopped with SIGTERM under paced MQTT load (its devices moved
// to the other nodes first) asks the master to drain it before it exits:
// its subtasks move away by handover in the running deployment, it exits
// 0, and its exit is no failure (no failover, the job's epoch is the
// same); the window subtasks that do not move keep processing, and every
// window stays exact: drainUnderPacedLoad.
func TestClusterWorkerSIGTERMDrainsByHandover(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with three subprocesses")
	}
	drainUnderPacedLoad(t, func(t *testing.T, ctx context.Context, a, b *clusterMember) func() error {
		if err := b.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		return func() error {
			select {
			case <-b.done:
			case <-ctx.Done():
				return fmt.Errorf("b did not exit after SIGTERM: %w", ctx.Err())
			}
			if code := b.cmd.ProcessState.ExitCode(); code != 0 {
				return fmt.Errorf("b exited with %d after SIGTERM\n%s", code, b.logTail())
			}
			if !strings.Contains(b.logTailN(400000), "drained before stopping") {
				return fmt.Errorf("b did not drain before stopping:\n%s", b.logTail())
			}
			return nil
		}
	})
}

// drainUnderPacedLoad drains worker b of a three-node cluster under
// paced MQTT load (2,000 readings a second to a and c: b's devices are
// moved away first) with start, which starts the drain and returns a
// function that waits for its end: the edged cluster drain command, or
// b's SIGTERM. It checks that the drain is recorded done by handover,
// b's source split among the subtasks moved; that the window subtasks
// not on b, sampled every 100 ms, never stood still for 500 ms from the
// drain's start until it ended and are recorded unpaused; that b left;
// that b stopped is no failure (same epoch, no failover); and that every
// window is exact.
func drainUnderPacedLoad(t *testing.T, start func(t *testing.T, ctx context.Context, a, b *clusterMember) func() error) {
	maybeBurn(t)
	const (
		period = 100 * time.Millisecond
		gap    = 5 * period
	)
	members := startCluster(t, true)
	a, b := members[0], members[1]
	l := newClusterLoad(t, members)
	client := &http.Client{Timeout: 2 * time.Second}
	waitAllAlive(t, a, 3)
	const n, pace, chunk = 60_000, 20 * time.Millisecond, 40
	l.publish(0, n/4)
	l.stopDevices(1)
	checkpointsSettled(t, a)
	var before rebalanceModes
	if err := a.get(client, "/cluster", &before); err != nil {
		t.Fatal(err)
	}
	republishes := countRepublished(members)
	moved := -1
	for _, sub := range []int{0, 1, 2} {
		if nodeOfWindow(t, a, sub) == "b" {
			moved = sub
		}
	}
	if moved < 0 {
		t.Fatal("node b runs no window subtask")
	}
	sampler := startWindowSampler(members, period)
	defer sampler.close()

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	from := time.Now()
	wait := start(t, ctx, a, b)
	done := make(chan error, 1)
	go func() { done <- wait() }()
	// The load goes on, paced (to a and c), while b drains: for up to 15 s
	// at 2,000 readings a second.
	next := n / 4
	tick := time.NewTicker(pace)
	defer tick.Stop()
	var derr error
	for ended := false; !ended; {
		select {
		case derr = <-done:
			ended = true
		case <-tick.C:
			if next < n*3/4 {
				l.publish(next, next+chunk)
				next += chunk
			}
		}
	}
	to := time.Now()
	sampler.close()
	if derr != nil {
		t.Fatal(derr)
	}
	if next >= n*3/4 {
		t.Fatalf("the paced load ran out (%d readings) before the drain ended", next-n/4)
	}
	t.Logf("the drain of b took %v, %d readings published meanwhile", to.Sub(from).Round(time.Millisecond), next-n/4)
	var after rebalanceModes
	if err := a.get(client, "/cluster", &after); err != nil {
		t.Fatal(err)
	}
	if len(after.Rebalances) <= len(before.Rebalances) {
		t.Fatal("no drain recorded")
	}
	r := after.Rebalances[0] // the newest
	t.Logf("rebalance: %+v", r)
	if r.Trigger != "drain" || r.Outcome != "done" || r.Mode != "handover" {
		t.Fatalf("the drain: trigger %q outcome %q mode %q (%s), want a drain done by handover", r.Trigger, r.Outcome, r.Mode, r.Error)
	}
	split := false
	for k := range r.PauseMS {
		split = split || strings.HasSuffix(k, "/source/1")
	}
	if !split {
		t.Fatalf("the drain did not move b's source split by handover: pauses %v", r.PauseMS)
	}
	// The window subtasks that did not move kept processing.
	for sub := range 3 {
		if sub == moved {
			continue
		}
		if !slices.ContainsFunc(r.Unpaused, func(u string) bool { return strings.HasSuffix(u, fmt.Sprintf("/window/%d", sub)) }) {
			t.Errorf("window subtask %d is not recorded unpaused: %v", sub, r.Unpaused)
		}
		longest, began, samples := sampler.gaps(sub, from, to)
		if longest > 0 {
			t.Logf("window subtask %d: %d samples, longest standstill %v, from %v after the drain started", sub, samples, longest, began.Sub(from))
		} else {
			t.Logf("window subtask %d: %d samples, its records-in grew between every two", sub, samples)
		}
		if samples < int(to.Sub(from)/(4*period)) {
			t.Errorf("window subtask %d: %d samples in %v: the sampler did not reach it", sub, samples, to.Sub(from))
		}
		if longest >= gap {
			t.Errorf("window subtask %d stood still for %v during the drain while readings flowed", sub, longest)
		}
	}
	select {
	case <-b.done:
		// Stopped with SIGTERM: it drained first.
		l.disconnect(1)
		l.down[1] = true
	default:
		testutil.Eventually(t, 30*time.Second, "the master sees b left", func() bool {
			s, err := a.rebalances(client)
			return err == nil && s.state("b") == "left"
		})
		// Everything b's sink published reached the subscriber, then b
		// stops.
		drain(t, "tcp://"+b.brokerAddr, "agg/_marker", l.col)
		l.stop(1)
	}
	l.publish(next, n)
	l.finishChecked(n, 120*time.Second)
	var end rebalanceModes
	if err := a.get(client, "/cluster", &end); err != nil {
		t.Fatal(err)
	}
	if end.Epoch != before.Epoch || end.FailoversTotal != before.FailoversTotal {
		t.Fatalf("the job went from epoch %d to %d, failovers from %d to %d: b's drain or stop restarted it",
			before.Epoch, end.Epoch, before.FailoversTotal, end.FailoversTotal)
	}
	checkPublishedOnceOverHandovers(t, members, republishes)
}

// nodeOfWindow returns the node the master's status places window
// subtask sub on; "" if none.
func nodeOfWindow(t *testing.T, m *clusterMember, sub int) string {
	t.Helper()
	s, err := m.status(&http.Client{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range s.Placement {
		for _, st := range p.Subtasks {
			if isWindowChain(st.Operator) && st.Subtask == sub {
				return p.Node
			}
		}
	}
	return ""
}
