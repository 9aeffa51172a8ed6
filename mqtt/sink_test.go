package mqtt

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgedio/edged/operators"
)

type reading struct {
	Sensor string
	Seq    int
}

func encodeReading(r reading) ([]byte, error) { return json.Marshal(r) }

var readingTopic = TemplateTopic(MustParseTopicTemplate("agg/{id}"), func(r reading, name string) string {
	return r.Sensor
})

func publisherConfig(b *Broker, id string) PublisherConfig {
	cfg := DefaultPublisherConfig()
	cfg.Broker = "tcp://" + b.Addr()
	cfg.ClientID = id
	cfg.MaxInflight = 64
	return cfg
}

func TestSinkAtLeastOnce(t *testing.T) {
	const n = 2000
	b := startBroker(t, nil)
	sub := subscribe(t, b.Addr(), "consumer", "agg/#")

	sink := NewSink(publisherConfig(b, "sink"), readingTopic, encodeReading)
	sink.ID = func(r reading) string { return operators.RecordID(r.Sensor, fmt.Sprint(r.Seq)) }
	if err := sink.Open(opCtx(0)); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		sink.Collect(reading{Sensor: fmt.Sprintf("s%d", i%3), Seq: i})
		if i == n/2 {
			if _, err := sink.SnapshotState(1); err != nil {
				t.Fatal(err)
			}
			if out := sink.pub.Outstanding(); out != 0 {
				t.Fatalf("%d publishes unacknowledged after the barrier", out)
			}
		}
	}
	if err := sink.Finish(); err != nil {
		t.Fatal(err)
	}
	if err := sink.Close(); err != nil {
		t.Fatal(err)
	}
	msgs := sub.waitFor(t, n)
	seen := make(map[int]bool)
	for _, m := range msgs {
		var r struct {
			Sensor string
			Seq    int
			MsgID  string `json:"msg_id"`
		}
		if err := json.Unmarshal(m, &r); err != nil {
			t.Fatalf("%q: %v", m, err)
		}
		if r.MsgID != operators.RecordID(r.Sensor, fmt.Sprint(r.Seq)) || seen[r.Seq] {
			t.Fatalf("message %q: bad or repeated msg_id", m)
		}
		seen[r.Seq] = true
	}
	if len(seen) != n {
		t.Fatalf("received %d distinct, want %d", len(seen), n)
	}
}

// A plain sink whose publish fails (here no broker listens) fails its
// task at that record and at every later one, batched or not: before, it
// kept the error for the next barrier and dropped every later result
// meanwhile, which without checkpoints (the only use of this sink in a
// pipeline) meant for ever.
func TestSinkPublishFailureFailsTheTask(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	for _, batch := range []Batch{{}, {Max: 10}} {
		cfg := DefaultPublisherConfig()
		cfg.Broker, cfg.ClientID, cfg.Timeout = "tcp://"+addr, "sink", time.Second
		sink := NewSink(cfg, readingTopic, encodeReading)
		sink.Batch = batch
		if err := sink.Open(opCtx(0)); err != nil {
			t.Fatal(err)
		}
		fails := func(what string, call func()) {
			t.Helper()
			defer func() {
				if f, ok := recover().(*operators.Failure); !ok || f.Err == nil {
					t.Fatalf("batch %d: %s: no task failure (%v)", batch.Max, what, f)
				}
			}()
			call()
		}
		if batch.Max == 0 {
			fails("the first record", func() { sink.Collect(reading{Sensor: "s1", Seq: 1}) })
		} else {
			sink.Collect(reading{Sensor: "s1", Seq: 1}) // batched: not sent yet
			if err := sink.Flush(); err == nil {
				t.Fatalf("batch %d: Flush with no broker returned nil", batch.Max)
			}
		}
		fails("a later record", func() { sink.Collect(reading{Sensor: "s1", Seq: 2}) })
		if err := sink.Close(); err != nil {
			t.Log(err)
		}
	}
}

// A write-ahead sink publishes a checkpoint's records on completion; a
// sink restored from that checkpoint publishes them again with the same
// msg_ids, so a deduplicating consumer sees each once.
func TestWriteAheadSinkSameIDs(t *testing.T) {
	const n = 500
	b := startBroker(t, nil)
	sub := subscribe(t, b.Addr(), "consumer", "agg/#")

	run := func(clientID string, state []byte) []byte {
		pub, err := NewPublisher(publisherConfig(b, clientID))
		if err != nil {
			t.Fatal(err)
		}
		defer pub.Close()
		wal := operators.NewWriteAheadSink(PublishFunc(pub, readingTopic, encodeReading, nil), nil)
		if err := wal.Open(&operators.Context{UID: "agg-sink", Subtask: 0, Parallelism: 1}); err != nil {
			t.Fatal(err)
		}
		if state != nil {
			if err := wal.RestoreState([][]byte{state}, 1); err != nil {
				t.Fatal(err)
			}
			return nil
		}
		for i := range n {
			wal.Collect(reading{Sensor: fmt.Sprintf("s%d", i%4), Seq: i})
		}
		st, err := wal.SnapshotState(1)
		if err != nil {
			t.Fatal(err)
		}
		if err := wal.NotifyCheckpointComplete(1); err != nil {
			t.Fatal(err)
		}
		return st
	}
	state := run("wal-1", nil)
	first := sub.waitFor(t, n)
	run("wal-2", state) // recovery from checkpoint 1 re-publishes
	all := sub.waitFor(t, 2*n)

	ids := func(msgs [][]byte) map[string]int {
		out := make(map[string]int)
		for _, m := range msgs {
			id, ok := ParseMsgID(m)
			if !ok {
				t.Fatalf("message %q without msg_id", m)
			}
			var r reading
			if err := json.Unmarshal(m, &r); err != nil {
				t.Fatal(err)
			}
			if prev, dup := out[id]; dup && prev != r.Seq {
				t.Fatalf("msg_id %s for seq %d and %d", id, prev, r.Seq)
			}
			out[id] = r.Seq
		}
		return out
	}
	firstIDs, allIDs := ids(first[:n]), ids(all)
	if len(firstIDs) != n || len(allIDs) != n {
		t.Fatalf("%d ids in the first run, %d distinct overall, want %d", len(firstIDs), len(allIDs), n)
	}
	for id, seq := range allIDs {
		if firstIDs[id] != seq {
			t.Fatalf("re-published msg_id %s (seq %d) not in the first run", id, seq)
		}
	}
	seqs := make([]int, 0, n)
	for _, s := range allIDs {
		seqs = append(seqs, s)
	}
	slices.Sort(seqs)
	for i, s := range seqs {
		if s != i {
			t.Fatalf("deduplicated seqs %v...", seqs[:i+1])
		}
	}
}

// A record whose topic cannot be made goes to the reject function, with
// the reason, and the others are published: a bad record held in a
// checkpoint does not fail every publish of it. Without reject it fails.
func TestPublishFuncRejectsBadTopics(t *testing.T) {
	b := startBroker(t, nil)
	sub := subscribe(t, b.Addr(), "consumer", "agg/#")
	pub, err := NewPublisher(publisherConfig(b, "rejecting"))
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	var rejected []string
	publish := PublishFunc(pub, readingTopic, encodeReading, func(r reading, err error) {
		if !errors.Is(err, ErrTopic) {
			t.Errorf("reject %v: %v, want ErrTopic", r, err)
		}
		rejected = append(rejected, r.Sensor)
	})
	recs := []reading{{"s1", 1}, {"#", 2}, {"a+b", 3}, {"x\x00y", 4}, {"\xff", 5}, {"s2", 6}}
	if err := publish(recs, func(i int) string { return fmt.Sprint(i) }); err != nil {
		t.Fatal(err)
	}
	if want := []string{"#", "a+b", "x\x00y", "\xff"}; !slices.Equal(rejected, want) {
		t.Fatalf("rejected %q, want %q", rejected, want)
	}
	got := sub.waitFor(t, 2)
	var seqs []int
	for _, m := range got {
		var r reading
		if err := json.Unmarshal(m, &r); err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, r.Seq)
	}
	if !slices.Equal(seqs, []int{1, 6}) {
		t.Fatalf("published %v, want the good records 1 and 6", seqs)
	}
	strict := PublishFunc(pub, readingTopic, encodeReading, nil)
	if err := strict(recs[1:2], func(int) string { return "x" }); !errors.Is(err, ErrTopic) {
		t.Fatalf("without reject: %v, want ErrTopic", err)
	}
}

// PublishLineFunc makes each record's line once, for both its payload and
// its msg_id, and publishes exactly what PublishFunc does for a
// write-ahead sink whose identity is that line: the line with the msg_id
// RecordID(sink UID, line), the same as the sink's ID of the record.
func TestPublishLineFuncMakesEachLineOnce(t *testing.T) {
	const n = 300
	b := startBroker(t, nil)
	sub := subscribe(t, b.Addr(), "consumer", "agg/#")
	pub, err := NewPublisher(publisherConfig(b, "wal-line"))
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	line := func(r reading) string {
		out, err := encodeReading(r)
		if err != nil {
			t.Fatal(err)
		}
		return string(out)
	}
	var calls atomic.Int64
	counted := func(r reading) string {
		calls.Add(1)
		return line(r)
	}
	uid := ""
	wal := operators.NewWriteAheadSink(PublishLineFunc(pub, readingTopic, counted, func() string { return uid }, nil, Batch{}), nil).
		WithIdentity(counted)
	ctx := &operators.Context{UID: "agg-sink", Subtask: 0, Parallelism: 1}
	uid = ctx.UID
	if err := wal.Open(ctx); err != nil {
		t.Fatal(err)
	}
	want := make(map[string]bool, n)
	for i := range n {
		r := reading{Sensor: fmt.Sprintf("s%d", i%4), Seq: i}
		wal.Collect(r)
		want[string(WithMsgID([]byte(line(r)), wal.ID(r)))] = true
	}
	if _, err := wal.SnapshotState(1); err != nil {
		t.Fatal(err)
	}
	calls.Store(0)
	if err := wal.NotifyCheckpointComplete(1); err != nil {
		t.Fatal(err)
	}
	if c := calls.Load(); c != n {
		t.Fatalf("publishing %d records made %d lines, want %d", n, c, n)
	}
	for _, m := range sub.waitFor(t, n) {
		if !want[string(m)] {
			t.Fatalf("published %q: not a record's line with the sink's id", m)
		}
		delete(want, string(m))
	}
	if len(want) != 0 {
		t.Fatalf("%d records not published", len(want))
	}
}
