package actors

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/snapshot"
)

func sampleControlMessages() []controlMsg {
	te := &TaskError{Job: "j", Operator: "map", UID: "m", Subtask: 1, Parallelism: 2, Err: fmt.Errorf("wrapped: %w", ErrCheckpointFailure)}
	return []controlMsg{
		{Kind: ctlRegister, Job: "j", Epoch: 3, Node: "node-1", Fingerprint: "f9ca48952407"},
		{Kind: ctlDeploy, Job: "j", Epoch: 3},
		{Kind: ctlDeployed, Job: "j", Epoch: 3, Node: "node-1"},
		{Kind: ctlStart, Job: "j", Epoch: 3},
		{Kind: ctlTrigger, Job: "j", Epoch: 3, Checkpoint: 7, Flag: true},
		{Kind: ctlComplete, Job: "j", Epoch: 3, Checkpoint: 7, Flag: true},
		{Kind: ctlAbort, Job: "j", Epoch: 3, Checkpoint: 8},
		{Kind: ctlCancel, Job: "j", Epoch: 3},
		{Kind: ctlAck, Job: "j", Epoch: 3, Node: "node-1", Checkpoint: 7, Task: snapshot.TaskID{Vertex: "count-sum", Subtask: 1},
			Alignment: 3 * time.Millisecond, State: map[string]snapshot.Handle{
				"count-sum": {File: "count-sum.1.state", Size: 1234, Checksum: 0xdeadbeef, KeyGroups: []byte{1, 2, 3}},
				"sink":      {Pending: []byte("txn-7"), Sources: []byte{9}},
			}},
		{Kind: ctlDecline, Job: "j", Epoch: 3, Checkpoint: 9, Task: snapshot.TaskID{Vertex: "src"}, Err: toWire(errors.New("disk full"))},
		{Kind: ctlFinished, Job: "j", Epoch: 3, Task: snapshot.TaskID{Vertex: "src"}},
		{Kind: ctlFailed, Job: "j", Epoch: 3, Node: "node-2", Err: toWire(te)},
		{Kind: ctlNotified, Job: "j", Epoch: 3},
		{Kind: ctlOutputHeld, Job: "j", Epoch: 3, Node: "node-1", Task: snapshot.TaskID{Vertex: "sink", Subtask: 2}},
		{Kind: ctlHandover, Job: "j", Epoch: 3, Checkpoint: 11, Keys: []PlacedTask{{UID: "count-sum", Subtask: 0}, {UID: "count-sum", Subtask: 1}}},
		{Kind: ctlPrepared, Job: "j", Epoch: 3, Node: "node-1", Checkpoint: 11},
		{Kind: ctlHandoverStep, Job: "j", Epoch: 3, Checkpoint: 11, Step: hoAdopt, Gen: 2, To: "node-2",
			Task: snapshot.TaskID{Vertex: "count-sum", Subtask: 1}, Blob: []byte("metadata"),
			Keys: []PlacedTask{{UID: "src", Subtask: 0, Node: "node-0"}, {UID: "count-sum", Subtask: 1, Node: "node-2"}}},
		{Kind: ctlStepDone, Job: "j", Epoch: 3, Node: "node-2", Checkpoint: 11, Step: hoRetire, Value: -1 << 40,
			Task: snapshot.TaskID{Vertex: "count-sum", Subtask: 1}, Err: toWire(fmt.Errorf("restore: %w", ErrHandover))},
	}
}

// Every control message decodes to what was encoded, and an error keeps
// its text, its TaskError fields and the runtime sentinel it wrapped.
func TestControlMessageRoundTrip(t *testing.T) {
	for _, m := range sampleControlMessages() {
		b, err := appendControl(nil, &m)
		if err != nil {
			t.Fatalf("%d: %v", m.Kind, err)
		}
		got, err := decodeControl(b)
		if err != nil {
			t.Fatalf("%d: %v", m.Kind, err)
		}
		if !reflect.DeepEqual(got, m) {
			t.Fatalf("kind %d: got %+v, want %+v", m.Kind, got, m)
		}
		// Every truncation is an error, never a panic.
		for i := range len(b) {
			if _, err := decodeControl(b[:i]); !errors.Is(err, errControlMsg) {
				t.Fatalf("kind %d cut at %d: %v", m.Kind, i, err)
			}
		}
	}
	failed := sampleControlMessages()[11]
	err := failed.Err.toError("node-2")
	var te *TaskError
	if !errors.As(err, &te) || te.UID != "m" || te.Subtask != 1 || !errors.Is(err, ErrCheckpointFailure) {
		t.Fatalf("rebuilt error %v: want a TaskError of m[1] wrapping ErrCheckpointFailure", err)
	}
	if want := `job "j": operator "map" (uid "m") subtask 1/2 failed: error: node "node-2": wrapped: actors: too many failed checkpoints`; err.Error() != want {
		t.Fatalf("got %q, want %q", err.Error(), want)
	}
}

// The control message decoder never panics and what it accepts encodes
// back to a message that decodes the same.
func FuzzDecodeControl(f *testing.F) {
	for _, m := range sampleControlMessages() {
		b, err := appendControl(nil, &m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte("eC\x01\x09\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeControl(b)
		if err != nil {
			if !errors.Is(err, errControlMsg) {
				t.Fatalf("error %v does not wrap errControlMsg", err)
			}
			return
		}
		again, err := appendControl(nil, &m)
		if err != nil {
			t.Fatalf("decoded %+v does not encode: %v", m, err)
		}
		m2, err := decodeControl(again)
		if err != nil || !reflect.DeepEqual(m, m2) {
			t.Fatalf("re-encoded message decodes to %+v, %v; want %+v", m2, err, m)
		}
	})
}

// loopNet is an in-process Network for control tests: a sender delivers
// straight to the receiver of the same key and end, credits are ignored,
// and a test can drop every frame or inject its own.
type loopNet struct {
	mu   sync.Mutex
	recv map[ChannelKey]func(RemoteFrame)
	fail map[ChannelKey]func(error)
	seq  map[ChannelKey]uint64
	drop atomic.Bool
	sent atomic.Int64
	// onSend, when set before the first send, sees every frame sent,
	// before it is delivered, on the sender's goroutine.
	onSend func(id ChannelKey, body []byte)
}

func newLoopNet() *loopNet {
	return &loopNet{recv: map[ChannelKey]func(RemoteFrame){}, fail: map[ChannelKey]func(error){}, seq: map[ChannelKey]uint64{}}
}

func (n *loopNet) Fingerprint(j *Job) (string, error) {
	return fmt.Sprintf("%s/%d", j.Name, len(j.Vertices)), nil
}

func (n *loopNet) OpenSender(id ChannelKey, _ string, onFail func(error)) (RemoteSender, error) {
	return &loopSender{n: n, id: id}, nil
}

func (n *loopNet) OpenReceiver(id ChannelKey, _ string, deliver func(RemoteFrame), onFail func(error)) (RemoteReceiver, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.recv[id], n.fail[id] = deliver, onFail
	return loopReceiver{}, nil
}

// inject delivers body on channel id as its next frame; false if nothing
// receives it.
func (n *loopNet) inject(id ChannelKey, body []byte) bool {
	n.mu.Lock()
	d := n.recv[id]
	n.seq[id]++
	seq := n.seq[id]
	n.mu.Unlock()
	if d == nil {
		return false
	}
	d(RemoteFrame{Seq: seq, Kind: FrameBatch, Body: body})
	return true
}

type loopSender struct {
	n  *loopNet
	id ChannelKey
}

func (s *loopSender) Send(_ context.Context, _ FrameKind, _ int64, body []byte) error {
	s.n.sent.Add(1)
	if s.n.onSend != nil {
		s.n.onSend(s.id, body)
	}
	if s.n.drop.Load() {
		return nil
	}
	s.n.inject(s.id, body)
	return nil
}

func (s *loopSender) MaxBody() int { return 1 << 20 }
func (s *loopSender) Close()       {}

type loopReceiver struct{}

func (loopReceiver) Processed(uint64) {}
func (loopReceiver) Close()           {}

// loopCluster returns two nodes on one loopNet; every task runs on the
// first (no data channel crosses), so only control messages travel.
func loopCluster(n *loopNet) *Cluster {
	return &Cluster{Nodes: []Node{{ID: "node-0", Network: n}, {ID: "node-1", Network: n}}}
}

// With a cluster, the master and the hosts talk only by control messages:
// a job runs to its end, and its hosts registered, deployed and started by
// messages the network carried.
func TestControlMessagesCarryTheDeployment(t *testing.T) {
	var emitted, consumed atomic.Int64
	gate := make(chan struct{})
	close(gate)
	job := twoStageJob(&countingSource{n: 10_000, emitted: &emitted}, &gateSink{gate: gate, count: &consumed})
	ln := newLoopNet()
	cfg := DefaultConfig()
	cfg.Cluster = loopCluster(ln)
	r, err := newRunner(job, cfg, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	if consumed.Load() != 10_000 {
		t.Fatalf("consumed %d, want 10000", consumed.Load())
	}
	// 2 registrations, 2 deploys, 2 deployed, 2 starts, 2 finished, 2
	// cancels at least.
	if n := ln.sent.Load(); n < 12 {
		t.Fatalf("%d control messages sent, want at least 12", n)
	}
}

// A host that never registers (its messages are lost) fails the
// deployment with ErrControlTimeout once the control timeout passes on
// the job's clock, and the restart strategy restarts it: the loss never
// hangs the job.
func TestControlRegistrationTimeoutRestarts(t *testing.T) {
	var emitted, consumed atomic.Int64
	gate := make(chan struct{})
	close(gate)
	job := twoStageJob(&countingSource{n: 100, emitted: &emitted}, &gateSink{gate: gate, count: &consumed})
	ln := newLoopNet()
	ln.drop.Store(true)
	clock := clockwork.NewFakeClock()
	cfg := DefaultConfig()
	cfg.Clock = clock
	cfg.Cluster = loopCluster(ln)
	cfg.Cluster.ControlTimeout = 5 * time.Second
	cfg.Cluster.Describe = func(node string) string { return "described " + node }
	exec := NewExecution(job, cfg, &snapshot.FixedDelay{Attempts: 2})
	errc := make(chan error, 1)
	go func() { errc <- exec.Run(context.Background()) }()
	for attempt := 1; attempt <= 3; attempt++ {
		// The master waits for the registrations on the clock's timer.
		if err := clock.BlockUntilContext(context.Background(), 1); err != nil {
			t.Fatal(err)
		}
		clock.Advance(5 * time.Second)
	}
	err := testutil.Receive(t, 0, "the execution to end", errc)
	if !errors.Is(err, ErrControlTimeout) || !errors.Is(err, ErrRestartsExhausted) {
		t.Fatalf("got %v, want restarts exhausted after control timeouts", err)
	}
	// The error names how to find each node that did not answer.
	for _, n := range cfg.Cluster.Nodes {
		if want := n.ID + ": described " + n.ID; !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name node %q as Describe does", err, n.ID)
		}
	}
	if exec.Attempts() != 3 {
		t.Fatalf("%d attempts, want 3 (two restarts)", exec.Attempts())
	}
	// No attempt follows: whoever waits for the next one hears it.
	select {
	case <-exec.Ended():
	default:
		t.Fatal("Ended not closed after Run returned")
	}
	if consumed.Load() != 0 {
		t.Fatalf("%d records consumed by a deployment that never registered", consumed.Load())
	}
}

// Control messages of another epoch are dropped and counted, on the
// master's side and on a host's; a corrupt one fails the deployment with
// ErrControlFailed.
func TestControlStaleAndCorruptMessages(t *testing.T) {
	var emitted, consumed atomic.Int64
	gate := make(chan struct{})
	job := twoStageJob(&countingSource{n: 1 << 40, emitted: &emitted}, &gateSink{gate: gate, count: &consumed})
	ln := newLoopNet()
	cfg := DefaultConfig()
	cfg.Cluster = loopCluster(ln)
	r, err := newRunner(job, cfg, 5)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- r.Run(context.Background()) }()
	<-r.Started()
	testutil.Eventually(t, 0, "records to flow", func() bool { return consumed.Load() > 0 || emitted.Load() > 0 })
	enc := func(m controlMsg) []byte {
		b, err := appendControl(nil, &m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	// A host of epoch 4 reports a failure; the master of epoch 4 tells
	// node-1's host a checkpoint completed.
	if !ln.inject(controlKey("credits", 5, 1, true), enc(controlMsg{Kind: ctlFailed, Job: "credits", Epoch: 4, Node: "node-1", Err: toWire(errors.New("stale"))})) {
		t.Fatal("no master end for node-1")
	}
	if !ln.inject(controlKey("credits", 5, 1, false), enc(controlMsg{Kind: ctlComplete, Job: "credits", Epoch: 4, Checkpoint: 1, Flag: true})) {
		t.Fatal("no host end on node-1")
	}
	testutil.Eventually(t, 0, "the stale messages to be counted", func() bool { return r.StaleMessages() == 2 })
	select {
	case err := <-errc:
		t.Fatalf("the job ended on a stale message: %v", err)
	default:
	}
	// A corrupt message fails the deployment loudly.
	ln.inject(controlKey("credits", 5, 1, true), []byte("eC\x01\x0cgarbage"))
	close(gate)
	err = <-errc
	if !errors.Is(err, ErrControlFailed) {
		t.Fatalf("got %v, want ErrControlFailed", err)
	}
}
