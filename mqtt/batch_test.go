package mqtt

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/edgedio/edged/operators"
)

// topicMsg is a message with its topic.
type topicMsg struct {
	topic   string
	payload []byte
}

// waitElements waits until the messages received hold n elements in
// all (a message that is not an array counts as one) and returns them.
func (c *collector) waitElements(t *testing.T, n int) []topicMsg {
	t.Helper()
	msgs, topics := c.waitUntil(t, fmt.Sprintf("%d elements", n), func(msgs [][]byte) bool {
		got := 0
		for _, m := range msgs {
			got += len(elementsOf(t, m))
		}
		return got >= n
	})
	out := make([]topicMsg, len(msgs))
	for i := range msgs {
		out[i] = topicMsg{topics[i], msgs[i]}
	}
	return out
}

// reset forgets the messages received.
func (c *collector) reset() {
	c.mu.Lock()
	c.msgs, c.topics = nil, nil
	c.mu.Unlock()
}

// batchSetup returns a broker's subscriber of agg/# and a publisher to it.
func batchSetup(t *testing.T, clientID string) (*collector, *Publisher) {
	t.Helper()
	b := startBroker(t, nil)
	col := subscribe(t, b.Addr(), "consumer", "agg/#")
	pub, err := NewPublisher(publisherConfig(b, clientID))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	return col, pub
}

// elementsOf returns the elements of a JSON-array payload, or the
// payload itself.
func elementsOf(t *testing.T, payload []byte) []json.RawMessage {
	t.Helper()
	if len(payload) == 0 || payload[0] != '[' {
		return []json.RawMessage{payload}
	}
	var els []json.RawMessage
	if err := json.Unmarshal(payload, &els); err != nil {
		t.Fatalf("array payload %q: %v", payload, err)
	}
	return els
}

// batchLine is the JSON line of a reading.
func batchLine(r reading) string { return fmt.Sprintf(`{"Sensor":%q,"Seq":%d}`, r.Sensor, r.Seq) }

// shared sends every reading to one topic.
func shared(reading) (string, error) { return "agg/all", nil }

// publishBatched publishes recs as the write-ahead MQTT sink does for a
// completed checkpoint (in chunks of 7, uid "agg-sink") with batch and
// returns the messages col received (after forgetting the earlier ones).
func publishBatched(t *testing.T, pub *Publisher, col *collector, topic func(reading) (string, error), recs []reading, batch Batch) []topicMsg {
	t.Helper()
	var chunks [][]reading
	for c := range slices.Chunk(recs, 7) {
		chunks = append(chunks, c)
	}
	col.reset()
	publish := PublishLineChunksFunc(pub, topic, batchLine, func() string { return "agg-sink" }, nil, batch)
	if err := publish(chunks, nil); err != nil {
		t.Fatal(err)
	}
	return col.waitElements(t, len(recs))
}

// element is a decoded element of a result message.
type element struct {
	Sensor string
	Seq    int
	MsgID  string `json:"msg_id"`
}

func decodeElement(t *testing.T, raw []byte) element {
	t.Helper()
	var e element
	if err := json.Unmarshal(raw, &e); err != nil {
		t.Fatalf("element %q: %v", raw, err)
	}
	return e
}

// Results of several keys to one topic go out as JSON arrays of at most
// batch elements, in order, each with the msg_id the same result has
// without batching; publishing the same records again with another batch
// gives the same ids.
func TestBatchedLinesShareATopic(t *testing.T) {
	const n = 103
	col, pub := batchSetup(t, "batched")
	recs := make([]reading, n)
	for i := range recs {
		recs[i] = reading{Sensor: fmt.Sprintf("s%d", i%5), Seq: i}
	}

	unbatched := publishBatched(t, pub, col, shared, recs, Batch{})
	if len(unbatched) != n {
		t.Fatalf("without batch: %d messages, want %d", len(unbatched), n)
	}
	want := make([]string, n) // the ids without batching, by seq
	for _, m := range unbatched {
		if m.payload[0] != '{' {
			t.Fatalf("without batch: payload %q is not one object", m.payload)
		}
		e := decodeElement(t, m.payload)
		want[e.Seq] = e.MsgID
		if e.MsgID != operators.RecordID("agg-sink", batchLine(recs[e.Seq])) {
			t.Fatalf("without batch: seq %d has msg_id %s", e.Seq, e.MsgID)
		}
	}

	for _, max := range []int{10, 4, 500} {
		msgs := publishBatched(t, pub, col, shared, recs, Batch{Max: max})
		if wantMsgs := (n + max - 1) / max; len(msgs) != wantMsgs {
			t.Fatalf("batch %d: %d messages, want %d", max, len(msgs), wantMsgs)
		}
		seq := 0
		for _, m := range msgs {
			els := elementsOf(t, m.payload)
			if m.payload[0] != '[' || len(els) > max || m.topic != "agg/all" {
				t.Fatalf("batch %d: message on %s of %d elements: %.80q", max, m.topic, len(els), m.payload)
			}
			for _, raw := range els {
				e := decodeElement(t, raw)
				if e.Seq != seq || e.MsgID != want[seq] {
					t.Fatalf("batch %d: element %d is seq %d with msg_id %s, want seq %d with %s", max, seq, e.Seq, e.MsgID, seq, want[seq])
				}
				seq++
			}
		}
	}
}

// A message stays within MaxBytes: a batch that would pass it is split
// (before the element that would), and a single record larger than the
// bound goes alone, whole, in an array of one.
func TestBatchedLinesByteBoundSplits(t *testing.T) {
	col, pub := batchSetup(t, "bounded")
	recs := make([]reading, 40)
	for i := range recs {
		recs[i] = reading{Sensor: fmt.Sprintf("s%d", i%3), Seq: i}
	}
	big := reading{Sensor: strings.Repeat("x", 600), Seq: len(recs)}
	recs = append(recs, big, reading{Sensor: "s0", Seq: len(recs) + 1})
	const bound = 400
	msgs := publishBatched(t, pub, col, shared, recs, Batch{Max: 100, MaxBytes: bound})
	seq, sawBig := 0, false
	for _, m := range msgs {
		els := elementsOf(t, m.payload)
		if len(m.payload) > bound {
			if len(els) != 1 || decodeElement(t, els[0]).Seq != big.Seq {
				t.Fatalf("a message of %d bytes > %d: %.80q", len(m.payload), bound, m.payload)
			}
			sawBig = true
		}
		for _, raw := range els {
			if e := decodeElement(t, raw); e.Seq != seq {
				t.Fatalf("element seq %d, want %d", e.Seq, seq)
			}
			seq++
		}
	}
	if !sawBig || len(msgs) < 4 {
		t.Fatalf("%d messages, the large record alone: %v; want several, split by the bound", len(msgs), sawBig)
	}
}

// With a templated topic each topic gets its own arrays: elements of one
// message share its topic, and each topic's elements keep their order.
func TestBatchedLinesPerTopic(t *testing.T) {
	col, pub := batchSetup(t, "per-topic")
	recs := make([]reading, 60)
	for i := range recs {
		recs[i] = reading{Sensor: fmt.Sprintf("s%d", i%3), Seq: i}
	}
	msgs := publishBatched(t, pub, col, readingTopic, recs, Batch{Max: 8})
	last := map[string]int{}
	for _, m := range msgs {
		els := elementsOf(t, m.payload)
		if m.payload[0] != '[' || len(els) > 8 {
			t.Fatalf("message on %s: %.80q", m.topic, m.payload)
		}
		for _, raw := range els {
			e := decodeElement(t, raw)
			if m.topic != "agg/"+e.Sensor {
				t.Fatalf("element of %s in a message on %s", e.Sensor, m.topic)
			}
			if prev, ok := last[e.Sensor]; ok && e.Seq <= prev {
				t.Fatalf("%s: seq %d after %d", e.Sensor, e.Seq, prev)
			}
			last[e.Sensor] = e.Seq
		}
	}
	// 20 records per topic in arrays of at most 8: 3 messages each.
	if len(msgs) != 9 {
		t.Fatalf("%d messages, want 9 (3 topics × ⌈20/8⌉)", len(msgs))
	}
}

// A record whose topic cannot be made goes to reject, batched or not,
// and the others are published.
func TestBatchedLinesReject(t *testing.T) {
	col, pub := batchSetup(t, "reject")
	var rejected []string
	publish := PublishLineFunc(pub, readingTopic, batchLine, func() string { return "u" }, func(r reading, err error) {
		if !errors.Is(err, ErrTopic) {
			t.Errorf("reject %v: %v, want ErrTopic", r, err)
		}
		rejected = append(rejected, r.Sensor)
	}, Batch{Max: 10})
	recs := []reading{{"s1", 1}, {"#", 2}, {"s1", 3}, {"a+b", 4}, {"s1", 5}}
	if err := publish(recs, nil); err != nil {
		t.Fatal(err)
	}
	if want := []string{"#", "a+b"}; !slices.Equal(rejected, want) {
		t.Fatalf("rejected %q, want %q", rejected, want)
	}
	msgs := col.waitElements(t, 3)
	if len(msgs) != 1 || len(elementsOf(t, msgs[0].payload)) != 3 {
		t.Fatalf("messages %q, want one array of the three good records", msgs)
	}
}

// The at-least-once sink with a batch publishes when a batch is full and
// on Flush (the task idle), so a partial batch never waits for more
// records; each element carries the record's id.
func TestSinkBatched(t *testing.T) {
	b := startBroker(t, nil)
	col := subscribe(t, b.Addr(), "consumer", "agg/#")
	sink := NewSink(publisherConfig(b, "sink"), shared, encodeReading)
	sink.ID = func(r reading) string { return operators.RecordID(r.Sensor, fmt.Sprint(r.Seq)) }
	sink.Batch = Batch{Max: 4}
	if err := sink.Open(opCtx(0)); err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	for i := range 6 {
		sink.Collect(reading{Sensor: fmt.Sprintf("s%d", i%2), Seq: i})
	}
	first := col.waitElements(t, 4)
	if len(first) != 1 || len(elementsOf(t, first[0].payload)) != 4 {
		t.Fatalf("before Flush: %q, want the one full batch of 4", first)
	}
	if err := sink.Flush(); err != nil {
		t.Fatal(err)
	}
	msgs := col.waitElements(t, 6)
	if len(msgs) != 2 {
		t.Fatalf("%d messages, want 2", len(msgs))
	}
	seq := 0
	for _, m := range msgs {
		for _, raw := range elementsOf(t, m.payload) {
			e := decodeElement(t, raw)
			if e.Seq != seq || e.MsgID != operators.RecordID(e.Sensor, fmt.Sprint(e.Seq)) {
				t.Fatalf("element %s", raw)
			}
			seq++
		}
	}
	// A barrier publishes the partial batch too and waits for it.
	sink.Collect(reading{Sensor: "s9", Seq: 6})
	if _, err := sink.SnapshotState(1); err != nil {
		t.Fatal(err)
	}
	if out := sink.pub.Outstanding(); out != 0 {
		t.Fatalf("%d publishes unacknowledged after the barrier", out)
	}
	if msgs := col.waitElements(t, 7); len(msgs) != 3 {
		t.Fatalf("%d messages after the barrier, want 3", len(msgs))
	}
	if err := sink.Finish(); err != nil {
		t.Fatal(err)
	}
}

// A payload that cannot be an array element (not a JSON object) is
// published alone, as without batching, after the records before it on
// its topic.
func TestBatchedNonObjectAlone(t *testing.T) {
	col, pub := batchSetup(t, "plain")
	lines := map[int]string{0: `{"a":0}`, 1: `{"a":1}`, 2: `not json`, 3: `{"a":3}`}
	publish := PublishLineFunc(pub, shared, func(r reading) string { return lines[r.Seq] }, func() string { return "u" }, nil, Batch{Max: 10})
	if err := publish([]reading{{"x", 0}, {"x", 1}, {"x", 2}, {"x", 3}}, nil); err != nil {
		t.Fatal(err)
	}
	msgs := col.waitElements(t, 4)
	want := []string{
		fmt.Sprintf(`[{"a":0,"msg_id":%q},{"a":1,"msg_id":%q}]`, operators.RecordID("u", lines[0]), operators.RecordID("u", lines[1])),
		operators.RecordID("u", lines[2]) + "|not json",
		fmt.Sprintf(`[{"a":3,"msg_id":%q}]`, operators.RecordID("u", lines[3])),
	}
	var got []string
	for _, m := range msgs {
		got = append(got, string(m.payload))
	}
	if !slices.Equal(got, want) {
		t.Fatalf("published\n%q\nwant\n%q", got, want)
	}
}

func TestBatchValidate(t *testing.T) {
	for _, b := range []Batch{{Max: -1}, {Max: MaxBatch + 1}, {Max: 5, MaxBytes: -1}} {
		if err := b.Validate(); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%+v: %v, want ErrInvalidConfig", b, err)
		}
	}
	for _, b := range []Batch{{}, {Max: 1}, {Max: MaxBatch, MaxBytes: 1 << 20}} {
		if err := b.Validate(); err != nil {
			t.Errorf("%+v: %v", b, err)
		}
	}
}

// A record on a quiet topic is not held while a busy topic keeps the
// sink from ever being idle: after flushAfter×Max more records every
// open batch goes out.
func TestSinkBatchedQuietTopicNotHeld(t *testing.T) {
	b := startBroker(t, nil)
	col := subscribe(t, b.Addr(), "consumer", "agg/#")
	sink := NewSink(publisherConfig(b, "sink"), readingTopic, encodeReading)
	sink.Batch = Batch{Max: 2}
	if err := sink.Open(opCtx(0)); err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	sink.Collect(reading{Sensor: "quiet", Seq: 0})
	for i := range flushAfter*2 - 1 {
		sink.Collect(reading{Sensor: "busy", Seq: i + 1})
	}
	// The busy topic's full batches are out, the quiet one's record not.
	msgs := col.waitElements(t, flushAfter*2-2)
	for _, m := range msgs {
		if m.topic != "agg/busy" {
			t.Fatalf("a message on %s before %d more records", m.topic, flushAfter*2)
		}
	}
	sink.Collect(reading{Sensor: "busy", Seq: flushAfter * 2})
	// Nothing calls Flush: the record count publishes the quiet record.
	_, topics := col.waitUntil(t, "the quiet record", func([][]byte) bool {
		col.mu.Lock()
		defer col.mu.Unlock()
		return slices.Contains(col.topics, "agg/quiet")
	})
	if !slices.Contains(topics, "agg/quiet") {
		t.Fatalf("topics %q", topics)
	}
}

// Once one topic has filled a full message, the other topics' open
// messages still reserve about what they hold: 500 quiet topics with one
// small result each took 125 MiB when every new message was sized as the
// largest one so far.
func TestBatchedQuietTopicsReserveWhatTheyHold(t *testing.T) {
	b := newBatcher(Batch{Max: 1000})
	b.size = b.maxBytes // as after a full message on a busy topic
	// The first open message may take the full size (one topic: it will
	// fill); none of the others does.
	const topics = 500
	for i := range topics {
		if err := b.add(nil, fmt.Sprintf("quiet/%d", i), []byte(`{"v":1}`), ""); err != nil {
			t.Fatal(err)
		}
	}
	if len(b.open) != topics {
		t.Fatalf("%d open messages, want %d (none is due yet)", len(b.open), topics)
	}
	reserved := 0
	for _, ob := range b.open {
		reserved += cap(ob.buf)
	}
	if limit := b.maxBytes + topics*4096; reserved > limit {
		t.Fatalf("%d open messages reserve %d bytes, want at most %d", topics, reserved, limit)
	}
	t.Logf("%d open messages reserve %d bytes", topics, reserved)
}
