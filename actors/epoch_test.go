package actors

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/edgedio/edged/internal/testutil"
)

// Reports and commands of an older epoch are dropped and counted: a
// stale failure does not fail the job, a stale completion does not reach
// the tasks, and the job of the current epoch runs to its end.
func TestStaleEpochMessagesDropped(t *testing.T) {
	var emitted, consumed atomic.Int64
	gate := make(chan struct{})
	job := twoStageJob(&countingSource{n: 10_000, emitted: &emitted}, &gateSink{gate: gate, count: &consumed})
	r, err := newRunner(job, DefaultConfig(), 5)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- r.Run(context.Background()) }()
	<-r.Started()
	if r.Epoch() != 5 {
		t.Fatalf("epoch %d, want 5", r.Epoch())
	}
	h := r.hosts[0]
	// A host of epoch 4 reports a failure and a finished task.
	old := hostReport{epoch: 4, node: h.node, kind: reportFailed, err: errors.New("stale failure")}
	r.reports <- old
	old.kind = reportFinished
	r.reports <- old
	// The master of epoch 4 tells the tasks a checkpoint completed.
	h.command(4, completeMsg{id: 1, ack: true})
	testutil.Eventually(t, 0, "the stale messages to be counted", func() bool { return r.StaleMessages() == 3 })
	close(gate)
	if err := <-errc; err != nil {
		t.Fatalf("the job failed: %v", err)
	}
	if consumed.Load() != 10_000 {
		t.Fatalf("consumed %d, want 10000", consumed.Load())
	}
	if n := r.StaleMessages(); n != 3 {
		t.Fatalf("%d stale messages counted, want 3", n)
	}
}

// The same failure report in the current epoch fails the job: the check
// above is the epoch's, not an ignored report.
func TestCurrentEpochFailureFails(t *testing.T) {
	var emitted, consumed atomic.Int64
	gate := make(chan struct{})
	job := twoStageJob(&countingSource{n: 1 << 40, emitted: &emitted}, &gateSink{gate: gate, count: &consumed})
	r, err := newRunner(job, DefaultConfig(), 5)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- r.Run(context.Background()) }()
	<-r.Started()
	want := errors.New("current failure")
	r.reports <- hostReport{epoch: 5, kind: reportFailed, err: want}
	close(gate) // let the sink's blocked Collect return so its actor can stop
	err = <-errc
	if !errors.Is(err, want) {
		t.Fatalf("got %v, want the current epoch's failure", err)
	}
}
