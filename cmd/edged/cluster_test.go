package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgedio/edged/cluster"
	"github.com/edgedio/edged/daemon"
	"github.com/edgedio/edged/pipeline"
)

// fakeCluster is a StatusProvider with a fixed status that records the
// drains asked of it and refuses rebalances when refuse is set.
type fakeCluster struct {
	mu        sync.Mutex // guards the fields below
	status    cluster.Status
	drained   []string
	undrained []string
	refuse    string
}

func (f *fakeCluster) Status() cluster.Status {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.status
}

func (f *fakeCluster) Drain(_ context.Context, node string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.drained = append(f.drained, node)
	f.status.Rebalances = append(f.status.Rebalances, cluster.Rebalance{At: time.Now(), Trigger: cluster.TriggerDrain,
		MovedKeyGroups: 64, BytesShipped: 3 << 20, PauseMS: map[string]float64{"window/1": 42, "window/0": 7}, Outcome: cluster.RebalanceDone,
		Mode: cluster.RebalanceRedeploy})
	return nil
}

// Undrain ends the drain of a node drained before, recording the join it
// ran; a node not drained is refused as the daemon's cluster refuses it.
func (f *fakeCluster) Undrain(_ context.Context, node string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	i := slices.Index(f.drained, node)
	if i < 0 {
		return fmt.Errorf("%w: node %q takes subtasks already", daemon.ErrNotDrained, node)
	}
	f.drained = slices.Delete(f.drained, i, i+1)
	f.undrained = append(f.undrained, node)
	f.status.Rebalances = append(f.status.Rebalances, cluster.Rebalance{At: time.Now(), Trigger: cluster.TriggerJoin,
		MovedKeyGroups: 32, BytesShipped: 1 << 20, PauseMS: map[string]float64{"window/1": 9}, Outcome: cluster.RebalanceDone})
	return nil
}

func (f *fakeCluster) Rebalance(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.refuse != "" {
		return fmt.Errorf("%w: %s", cluster.ErrRefused, f.refuse)
	}
	return nil
}

// startClusterNode runs a small job with cluster p behind a token and
// returns the API's address.
func startClusterNode(t *testing.T, p cluster.StatusProvider) string {
	t.Helper()
	cfg, err := pipeline.Parse([]byte(`
pipelines:
  - name: ticking
    source:
      generator: {count: 0, rate: 100, keys: 4}
    sinks: [{stdout: {}}]
`))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan net.Addr, 1)
	errc := make(chan error, 1)
	go func() {
		errc <- daemon.Run(ctx, cfg, daemon.Options{Listen: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler),
			Token: "t0k", RequireToken: true, Cluster: p, Ready: func(a net.Addr) { ready <- a }})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-errc:
		case <-time.After(waitLimit):
			t.Error("Run did not return after cancel")
		}
		http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	})
	select {
	case a := <-ready:
		return a.String()
	case err := <-errc:
		errc <- err
		t.Fatalf("Run: %v", err)
	case <-time.After(waitLimit):
		t.Fatal("node not ready")
	}
	return ""
}

func clusterOfThree() cluster.Status {
	return cluster.Status{Enabled: true, Node: "n1", Leader: "n1", Epoch: 5,
		Members: []cluster.MemberStatus{
			{ID: "n1", Address: "127.0.0.1:7001", API: "127.0.0.1:8081", State: cluster.StateAlive, Leader: true, SeesMajority: true, Capacity: 1},
			{ID: "n2", Address: "127.0.0.1:7002", API: "127.0.0.1:8082", State: cluster.StateAlive, SeesMajority: true, Capacity: 2},
			{ID: "n3", Address: "127.0.0.1:7003", API: "127.0.0.1:8083", State: cluster.StateDead, Capacity: 1},
		},
		Placement: []cluster.NodePlacement{
			{Node: "n1", Subtasks: []cluster.PlacedSubtask{{Operator: "window", UID: "w", Subtask: 0, KeyGroups: cluster.KeyGroups{0, 63}}}},
			{Node: "n2", Subtasks: []cluster.PlacedSubtask{{Operator: "window", UID: "w", Subtask: 1, KeyGroups: cluster.KeyGroups{64, 127}}}},
		},
		Replicas:  []cluster.CheckpointReplicas{{Checkpoint: 9, Files: []cluster.ReplicaFile{{File: "window-0.snap", Size: 2048, Nodes: []string{"n1", "n2"}}}}},
		Failovers: []cluster.Failover{{At: time.Now().Add(-time.Minute), DeadNode: "n3", Epoch: 5, DetectionMS: 1500, PlacementMS: 30, RestoreMS: 400, FirstRecordMS: 70}},
		// Each node's record of a hand-back holds the steps it timed:
		// n1 took over in the first (the restore), and handed over in
		// the second, which failed (the savepoint, the replication and
		// the take-over message).
		Handbacks: []cluster.Handback{
			{At: time.Now().Add(-time.Minute), From: "n2", To: "n1", Epoch: 4, Savepoints: map[string]uint64{"j": 8}, RestoreMS: 1600, Outcome: "done"},
			{At: time.Now().Add(-time.Hour), From: "n1", To: "n2", Epoch: 3, Savepoints: map[string]uint64{"j": 6},
				SavepointMS: 250, ReplicateMS: 20, TakeoverMS: 5, Outcome: "failed", Error: "refused"},
		},
		HandbacksTotal: 2,
	}
}

// edged cluster status, drain and rebalance against a node with a
// cluster, through its token.
func TestClusterCommands(t *testing.T) {
	f := &fakeCluster{status: clusterOfThree()}
	addr := startClusterNode(t, f)
	t.Setenv("EDGED_TOKEN", "t0k")
	cli := func(args ...string) (string, string, int) {
		var out, errb bytes.Buffer
		code := run(context.Background(), append(args, "--addr", addr), &out, &errb)
		return out.String(), errb.String(), code
	}

	out, errs, code := cli("cluster", "status")
	if code != 0 {
		t.Fatalf("cluster status: %d\n%s", code, errs)
	}
	for _, want := range []string{
		"node n1, leader n1, epoch 5, 2 of 3 members alive",
		"MEMBERS", "PLACEMENT (epoch 5)", "REPLICAS", "FAILOVERS", "REBALANCES",
		"window-0.snap", "n1,n2", "2.0 KiB",
		"1.5s", "2s", // the failover's detection and total
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	lines := strings.Split(out, "\n")
	row := func(prefix string) []string {
		for _, l := range lines {
			if strings.HasPrefix(l, prefix) {
				return strings.Fields(l)
			}
		}
		t.Fatalf("no line starting %q in:\n%s", prefix, out)
		return nil
	}
	// The majority is known for this node only (n1, the leader: its
	// mark is the third field).
	if f := row("n1 "); f[1] != "alive" || f[3] != "yes" {
		t.Errorf("member row n1: %q", f)
	}
	if f := row("n2 "); !slices.Equal(f[:8], []string{"n2", "alive", "-", "2", "1", "1", "64", "127.0.0.1:7002"}) { // capacity 2, weight 1
		t.Errorf("member row n2: %q", f)
	}
	if f := row("n3 "); f[1] != "dead" || f[2] != "-" {
		t.Errorf("member row n3: %q", f)
	}
	if f := row("n1    window"); !slices.Equal(f, []string{"n1", "window", "w", "0", "0-63", "(64)"}) {
		t.Errorf("placement row of n1: %q", f)
	}
	if !strings.Contains(out, "REBALANCES (newest first; 0 since the node started)\n(none)") {
		t.Errorf("no rebalance shown as (none):\n%s", out)
	}
	// The steps the other node timed show as "-", not as 0s.
	for _, want := range [][]string{
		{"n2", "n1", "4", "done", "-", "-", "-", "1.6s"},
		{"n1", "n2", "3", "failed", "250ms", "20ms", "5ms", "-", "refused"},
	} {
		handback := ""
		for _, l := range lines {
			if strings.Contains(l, " "+want[0]+"    "+want[1]+" ") {
				handback = l
			}
		}
		if f := strings.Fields(handback); len(f) < 2+len(want) || !slices.Equal(f[2:2+len(want)], want) {
			t.Errorf("hand-back row %q, want %q, in:\n%s", handback, want, out)
		}
	}

	out, errs, code = cli("cluster", "status", "-json")
	var s cluster.Status
	if code != 0 || json.Unmarshal([]byte(out), &s) != nil || !s.Enabled || len(s.Members) != 3 || s.Placement[1].Subtasks[0].KeyGroups != (cluster.KeyGroups{64, 127}) {
		t.Fatalf("cluster status -json: %d %s\n%s", code, errs, out)
	}

	out, errs, code = cli("cluster", "drain", "n2")
	if code != 0 || !strings.Contains(out, "drained n2: done, 64 key groups moved, 3.0 MiB shipped, longest pause 42ms (window/1)") {
		t.Fatalf("cluster drain: %d %q %s", code, out, errs)
	}
	f.mu.Lock()
	drained := slices.Clone(f.drained)
	f.mu.Unlock()
	if !slices.Equal(drained, []string{"n2"}) {
		t.Fatalf("drained %v", drained)
	}
	out, _, _ = cli("cluster", "status")
	if !strings.Contains(out, "drain    done     redeploy") || !strings.Contains(out, "window/1 42ms, window/0 7ms") {
		t.Errorf("status after the drain lacks the rebalance:\n%s", out)
	}

	if _, errs, code = cli("cluster", "drain", "n9"); code != 1 || !strings.Contains(errs, "unknown node") || !strings.Contains(errs, "404") {
		t.Errorf("drain of an unknown node: %d %s", code, errs)
	}
	f.mu.Lock()
	f.refuse = "a checkpoint is in progress"
	f.mu.Unlock()
	if _, errs, code = cli("cluster", "rebalance"); code != 1 || !strings.Contains(errs, "a checkpoint is in progress") || !strings.Contains(errs, "409") {
		t.Errorf("refused rebalance: %d %s", code, errs)
	}
	if _, errs, code = cli("cluster", "status", "--token", "wrong"); code != 1 || !strings.Contains(errs, "401") {
		t.Errorf("wrong token: %d %s", code, errs)
	}
}

// Against a node without a cluster, status says so and the actions fail
// with the node's reason.
func TestClusterCommandsStandalone(t *testing.T) {
	addr := startClusterNode(t, nil)
	t.Setenv("EDGED_TOKEN", "t0k")
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"cluster", "status", "--addr", addr}, &out, &errb); code != 0 || out.String() != "this node runs no cluster\n" {
		t.Errorf("status: %d %q %s", code, out.String(), errb.String())
	}
	out.Reset()
	if code := run(context.Background(), []string{"cluster", "status", "-json", "--addr", addr}, &out, &errb); code != 0 || strings.Join(strings.Fields(out.String()), "") != `{"enabled":false}` {
		t.Errorf("status -json: %d %q", code, out.String())
	}
	errb.Reset()
	if code := run(context.Background(), []string{"cluster", "rebalance", "--addr", addr}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "runs no cluster") || !strings.Contains(errb.String(), "501") {
		t.Errorf("rebalance: %d %s", code, errb.String())
	}
}

// A drain or undrain given an empty node id, or more than one, is a
// usage error that says which: it is never sent to the node (which
// answered an empty id with 405 Method Not Allowed).
func TestClusterNodeIDUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"cluster", "drain", "", "--addr", "127.0.0.1:1"}, "edged cluster drain: a node id is required"},
		{[]string{"cluster", "undrain", " ", "--addr", "127.0.0.1:1"}, "edged cluster undrain: a node id is required"},
		{[]string{"cluster", "drain", "a", "b", "--addr", "127.0.0.1:1"}, `edged cluster drain: takes one node id, got 2: "a" "b"`},
	} {
		var out, errb bytes.Buffer
		if code := run(context.Background(), tc.args, &out, &errb); code != 2 || !strings.HasPrefix(errb.String(), tc.want+"\n") {
			t.Errorf("%q: exit %d, stderr %q; want 2 and %q", tc.args, code, errb.String(), tc.want)
		}
	}
}

func TestClusterUsageErrorsExit2(t *testing.T) {
	for _, args := range [][]string{
		{"cluster"},
		{"cluster", "frobnicate"},
		{"cluster", "drain"},
		{"cluster", "drain", "a", "b"},
		{"cluster", "rebalance", "extra"},
		{"cluster", "status", "--no-such-flag"},
		{"cluster", "drain", "n1", "-json"},
		{"cluster", "undrain"},
		{"cluster", "undrain", "a", "b"},
	} {
		var out, errb bytes.Buffer
		if code := run(context.Background(), args, &out, &errb); code != 2 {
			t.Errorf("%q: exit %d, want 2; stderr:\n%s", args, code, errb.String())
		}
	}
}

// edged cluster undrain asks the node to end a node's drain and prints
// the rebalance that moved it back in; a node not drained or unknown
// exits 1 with the reason and the HTTP status.
func TestClusterUndrainCommand(t *testing.T) {
	f := &fakeCluster{status: clusterOfThree()}
	addr := startClusterNode(t, f)
	t.Setenv("EDGED_TOKEN", "t0k")
	cli := func(args ...string) (string, string, int) {
		var out, errb bytes.Buffer
		code := run(context.Background(), append(args, "--addr", addr), &out, &errb)
		return out.String(), errb.String(), code
	}
	if _, errs, code := cli("cluster", "undrain", "n2"); code != 1 || !strings.Contains(errs, "node not drained") || !strings.Contains(errs, "409") {
		t.Fatalf("undrain of a node not drained: %d %s", code, errs)
	}
	if _, errs, code := cli("cluster", "drain", "n2"); code != 0 {
		t.Fatalf("drain: %d %s", code, errs)
	}
	out, errs, code := cli("cluster", "undrain", "n2")
	if code != 0 || out != "undrained n2: done, 32 key groups moved, 1.0 MiB shipped, longest pause 9ms (window/1)\n" {
		t.Fatalf("cluster undrain: %d %q %s", code, out, errs)
	}
	f.mu.Lock()
	undrained, drained := slices.Clone(f.undrained), slices.Clone(f.drained)
	f.mu.Unlock()
	if !slices.Equal(undrained, []string{"n2"}) || len(drained) != 0 {
		t.Fatalf("undrained %v, drained %v", undrained, drained)
	}
	if _, errs, code := cli("cluster", "undrain", "n9"); code != 1 || !strings.Contains(errs, "unknown node") || !strings.Contains(errs, "404") {
		t.Errorf("undrain of an unknown node: %d %s", code, errs)
	}
	if _, errs, code := cli("cluster", "undrain", "bad id"); code != 1 || !strings.Contains(errs, "400") {
		t.Errorf("undrain of a malformed id: %d %s", code, errs)
	}
}

// TestUsageNamesEveryCommand checks that edged --help lists every command
// the binary runs, the cluster ones included.
func TestUsageNamesEveryCommand(t *testing.T) {
	for _, cmd := range []string{"run", "list", "checkpoints", "savepoint", "stop", "cancel",
		"cluster status", "cluster drain", "cluster undrain", "cluster rebalance"} {
		if !strings.Contains(usage, "  edged "+cmd+" ") {
			t.Errorf("usage does not name edged %s:\n%s", cmd, usage)
		}
		if strings.HasPrefix(cmd, "cluster ") && !strings.Contains(clusterUsage, "  edged "+cmd+" ") {
			t.Errorf("the cluster usage does not name edged %s:\n%s", cmd, clusterUsage)
		}
	}
}

// A member running other pipelines is marked in the members table.
func TestClusterStatusMarksOtherPipelines(t *testing.T) {
	s := clusterOfThree()
	s.Members[1].OtherPipelines = true
	var out bytes.Buffer
	if err := printClusterStatus(&out, s); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(out.String(), "other pipelines"); n != 1 {
		t.Fatalf("%d rows marked:\n%s", n, out.String())
	}
	for _, l := range strings.Split(out.String(), "\n") {
		if strings.HasPrefix(l, "n2 ") { // the members table comes first
			if !strings.Contains(l, "alive (other pipelines)") {
				t.Fatalf("member row n2: %q", l)
			}
			return
		}
	}
	t.Fatalf("no member row n2:\n%s", out.String())
}

// On a worker, which holds none of the placement (the job masters on the
// leader do), edged cluster status names the leader to ask instead of
// showing an empty placement and no subtasks on any node; a worker that
// knows no leader shows the empty placement as it is.
func TestClusterStatusOnAWorkerNamesTheLeader(t *testing.T) {
	s := clusterOfThree()
	s.Node, s.Placement = "n2", nil
	var out bytes.Buffer
	if err := printClusterStatus(&out, s); err != nil {
		t.Fatal(err)
	}
	want := "PLACEMENT (epoch 5)\n(kept by the leader, node n1, which runs the job masters: edged cluster status --addr 127.0.0.1:8081)\n\nREPLICAS"
	if !strings.Contains(out.String(), want) {
		t.Fatalf("no %q in:\n%s", want, out.String())
	}
	for _, l := range strings.Split(out.String(), "\n") {
		if f := strings.Fields(l); len(f) > 7 && (f[0] == "n1" || f[0] == "n2") && f[1] == "alive" {
			if f[len(f)-4] != "-" || f[len(f)-3] != "-" { // subtasks, key groups, before transport and API
				t.Errorf("member row %q: subtasks and key groups not shown as unknown", l)
			}
		}
	}
	s.Leader = ""
	out.Reset()
	if err := printClusterStatus(&out, s); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "PLACEMENT (epoch 5)\n(none)\n") {
		t.Fatalf("no empty placement without a leader:\n%s", out.String())
	}
}

// A node that takes a drain and ends the connection without an answer
// (it crashed) gets the CLI to say so, not a bare transport error.
// edged stop and edged savepoint whose node ends the connection without
// an answer say that the stop or savepoint may have completed and where
// to look, rather than a bare EOF.
func TestStopConnectionLost(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
			conn.Close()
		}
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	for _, cmd := range []string{"stop", "savepoint"} {
		var out, errb bytes.Buffer
		code := run(context.Background(), []string{cmd, "sensors", "--addr", ln.Addr().String()}, &out, &errb)
		if code != 1 || !strings.Contains(errb.String(), "ended the connection without an answer") ||
			!strings.Contains(errb.String(), "may have completed or not: edged checkpoints sensors") {
			t.Errorf("edged %s: exit %d:\n%s", cmd, code, errb.String())
		}
	}
}

func TestClusterDrainConnectionLost(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
			conn.Close()
		}
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"cluster", "drain", "b", "--addr", ln.Addr().String()}, &out, &errb)
	if code != 1 || !strings.Contains(errb.String(), "ended the connection without an answer") || !strings.Contains(errb.String(), "the drain of b") {
		t.Fatalf("exit %d:\n%s", code, errb.String())
	}
}

// A client command given the address of something that answers, but not
// in HTTP (the node's cluster.listen, a gRPC transport, instead of its
// node.listen) says that the address is not the node's API. Before, a
// drain, an undrain, a rebalance, a stop and a savepoint told the user
// that the node took the request and stopped or crashed, and that the
// drain or stop might be queued or have completed there.
func TestClientCommandAtAnAddressThatDoesNotAnswerHTTP(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			// What a gRPC server sends first: an HTTP/2 SETTINGS frame.
			_, _ = conn.Write([]byte("\x00\x00\x0c\x04\x00\x00\x00\x00\x00\x00\x05\x00\x00\x40\x00\x00\x04\x00\x40\x00\x00"))
			buf := make([]byte, 4096)
			_, _ = conn.Read(buf)
			conn.Close()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
	})
	addr := ln.Addr().String()
	for _, args := range [][]string{
		{"cluster", "drain", "b"}, {"cluster", "undrain", "b"}, {"cluster", "rebalance"}, {"cluster", "status"},
		{"stop", "sensors"}, {"savepoint", "sensors"}, {"list"},
	} {
		var out, errb bytes.Buffer
		code := run(context.Background(), append(args, "--addr", addr, "--timeout", "10s"), &out, &errb)
		msg := errb.String()
		if code != 1 || !strings.Contains(msg, "answers, but not in HTTP: it is not an edged node's API") ||
			strings.Contains(msg, "ended the connection without an answer") {
			t.Errorf("edged %s: exit %d:\n%s", strings.Join(args, " "), code, msg)
		}
	}
}

// edged cluster status asked of a drained node that left the cluster
// says so, rather than that it sees no majority.
func TestClusterStatusOfALeftNode(t *testing.T) {
	s := clusterOfThree()
	s.Node = "n2"
	s.Placement, s.Failovers, s.Handbacks = nil, nil, nil
	s.Members[1].State, s.Members[1].Drained, s.Members[1].SeesMajority = cluster.StateLeft, true, false
	var out bytes.Buffer
	if err := printClusterStatus(&out, s); err != nil {
		t.Fatal(err)
	}
	first, _, _ := strings.Cut(out.String(), "\n")
	if !strings.Contains(first, "1 of 3 members alive (this node was drained and left the cluster: it runs nothing until it is undrained or restarts") ||
		strings.Contains(first, "sees no majority") || !strings.Contains(out.String(), "left (drained)") {
		t.Fatalf("status of a node that left:\n%s", out.String())
	}
}

// edged cluster status shows a failover in progress above the table of
// the done ones (none yet here).
func TestClusterStatusShowsAFailoverInProgress(t *testing.T) {
	s := clusterOfThree()
	s.Failovers, s.FailoversTotal = nil, 0
	s.FailoversInProgress = []cluster.Failover{{At: time.Now(), DeadNode: "n2,n3", DetectionMS: 1200}}
	var out bytes.Buffer
	if err := printClusterStatus(&out, s); err != nil {
		t.Fatal(err)
	}
	_, fo, _ := strings.Cut(out.String(), "FAILOVERS (newest first; 0 since the node started)\n")
	if line, _, _ := strings.Cut(fo, "\n"); !strings.HasPrefix(line, "in progress: n2,n3 seen dead at ") ||
		!strings.Contains(line, "(detection 1.2s); the jobs do not run again on a new placement yet") {
		t.Fatalf("failovers of a cluster failing over:\n%s", out.String())
	}
	if strings.Contains(fo[:strings.Index(fo, "REBALANCES")], "(none)") {
		t.Fatalf("a failover in progress shown with (none):\n%s", out.String())
	}
}
