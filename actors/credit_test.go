package actors

import (
	"context"
	"github.com/edgedio/edged/internal/testutil"
	"sync/atomic"
	"testing"

	"github.com/edgedio/edged/codec"
	"github.com/edgedio/edged/operators"
)

// countingSource emits 0..n-1 as fast as it may and counts what it emitted.
type countingSource struct {
	operators.Base
	n, next int64
	emitted *atomic.Int64
}

func (s *countingSource) Poll(out operators.Collector[int64], max int) (operators.Status, error) {
	for k := 0; k < max && s.next < s.n; k++ {
		out.Collect(s.next)
		s.next++
		s.emitted.Add(1)
	}
	if s.next == s.n {
		return operators.EndOfInput, nil
	}
	return operators.MoreAvailable, nil
}

func (s *countingSource) Available() <-chan struct{} { return nil }

// gateSink blocks on its first record until gate is closed, then counts.
type gateSink struct {
	operators.Base
	gate  <-chan struct{}
	count *atomic.Int64
}

func (g *gateSink) Collect(int64) {
	<-g.gate
	g.count.Add(1)
}

func intType() *Type[int64] { return TypeOf(codec.For[int64](), nil) }

// twoStageJob is source -(rebalance)-> sink, both parallelism 1.
func twoStageJob(src operators.Source[int64], sink operators.Sink[int64]) *Job {
	s := &Vertex{ID: 0, Name: "src", UID: "src", Parallelism: 1, Out: intType(),
		NewSource: func(*operators.Context) (operators.Operator, error) { return src, nil }}
	k := &Vertex{ID: 1, Name: "sink", UID: "sink", Parallelism: 1, In: intType(),
		NewOperator: func(*operators.Context, any) (operators.Operator, any, error) { return sink, sink, nil }}
	return &Job{Name: "credits", Vertices: []*Vertex{s, k}, Edges: []*Edge{{From: s, To: k, Partition: Rebalance}}}
}

// runUntilFull runs twoStageJob job with credits and batch size batch
// until the source has used every credit of its channel (it then
// blocks), and returns the runner and the channel of Run's error.
func runUntilFull(t *testing.T, job *Job, credits, batch int) (*Runner, <-chan error) {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Credits, cfg.BatchSize = credits, batch
	r, err := NewRunner(job, cfg)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- r.Run(context.Background()) }()
	<-r.Started()
	testutil.Eventually(t, 0, "the channel to fill", func() bool {
		return len(r.hosts[0].chans) == 1 && r.hosts[0].chans[0].maxInFlight.Load() == int64(credits)
	})
	return r, errc
}

// A fast source and a blocked consumer: the source stops once the channel's
// credits are used up, and never more batches are in flight than credits.
func TestCreditsBoundInFlightBatches(t *testing.T) {
	const credits, batch, n = 3, 100, 1_000_000
	var emitted, consumed atomic.Int64
	gate := make(chan struct{})
	job := twoStageJob(&countingSource{n: n, emitted: &emitted}, &gateSink{gate: gate, count: &consumed})
	r, errc := runUntilFull(t, job, credits, batch)
	// The source is blocked: it cannot have emitted more than the batches
	// that fit in the credits plus the one it was filling.
	before := emitted.Load()
	if max := int64((credits + 1) * batch); before > max {
		t.Fatalf("source emitted %d records with %d credits of %d: not bounded (max %d)", before, credits, batch, max)
	}
	close(gate)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if consumed.Load() != n {
		t.Fatalf("consumed %d, want %d", consumed.Load(), n)
	}
	st := r.Stats()
	if len(st.Channels) != 1 || st.Channels[0].MaxInFlight > credits || st.Channels[0].MaxInFlight != credits {
		t.Fatalf("channel stats %+v: in-flight must reach and never exceed %d", st.Channels, credits)
	}
	if got := st.Channels[0].Batches; got < n/batch {
		t.Fatalf("%d batches for %d records of batch size %d", got, n, batch)
	}
}

// Cancelling the context stops a job whose tasks are blocked on credit.
func TestCancelUnblocksTasks(t *testing.T) {
	var emitted, consumed atomic.Int64
	gate := make(chan struct{})
	job := twoStageJob(&countingSource{n: 1 << 40, emitted: &emitted}, &gateSink{gate: gate, count: &consumed})
	r, err := NewRunner(job, DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- r.Run(ctx) }()
	<-r.Started()
	testutil.Eventually(t, 0, "the source to block", func() bool {
		return len(r.hosts[0].chans) == 1 && r.hosts[0].chans[0].maxInFlight.Load() == int64(DefaultConfig().Credits)
	})
	cancel()
	close(gate) // let the sink's blocked Collect return so its actor can stop
	if err := <-errc; err != context.Canceled {
		t.Fatalf("got %v, want context.Canceled", err)
	}
}

// A vertex whose records are sized (RecordBytes, BatchBytes) sends a
// batch once its records' bytes reach the cap: with a blocked consumer
// the channel's credits then hold credits × (cap + one record) bytes,
// not credits × batch size records.
func TestBatchBytesBoundInFlightRecords(t *testing.T) {
	const credits, batch, n = 3, 100, 10_000
	const recordBytes, capBytes = 10_000, 25_000 // a batch is sent at its third record
	var emitted, consumed atomic.Int64
	gate := make(chan struct{})
	job := twoStageJob(&countingSource{n: n, emitted: &emitted}, &gateSink{gate: gate, count: &consumed})
	job.Vertices[0].RecordBytes = func(int64) int { return recordBytes }
	job.Vertices[0].BatchBytes = capBytes
	r, errc := runUntilFull(t, job, credits, batch)
	perBatch := int64((capBytes + recordBytes - 1) / recordBytes)
	if got, max := emitted.Load(), (credits+1)*perBatch; got > max {
		t.Fatalf("source emitted %d records of %d bytes with %d credits and batches capped at %d bytes: not bounded (max %d; %d with the batch size alone)",
			got, recordBytes, credits, capBytes, max, (credits+1)*batch)
	}
	close(gate)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if consumed.Load() != n {
		t.Fatalf("consumed %d, want %d", consumed.Load(), n)
	}
	if got := r.Stats().Channels[0].Batches; got < n/perBatch {
		t.Fatalf("%d batches for %d records of %d bytes in batches capped at %d bytes: want %d or more", got, n, recordBytes, capBytes, n/perBatch)
	}
}
