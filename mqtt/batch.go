package mqtt

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// DefaultBatchBytes is the payload bound of a batched message when
// Batch.MaxBytes is 0: 256 KiB, far below the embedded broker's default
// packet bound (DefaultMaxMessageBytes) and Mosquitto's (none by
// default), and small enough for a consumer to parse at once.
const DefaultBatchBytes = 256 << 10

// MaxBatch is the largest Batch.Max: more records per message gain
// little once a message carries hundreds, and a consumer has to hold a
// whole message.
const MaxBatch = 10_000

// Batch packs the records a sink publishes to one topic into messages
// whose payload is a JSON array of the records' JSON objects, each with
// its own msg_id (WithMsgID) when the sink gives ids: a consumer that
// drops repeated msg_ids per element sees each record once, however a
// re-publish batches them. The zero Batch publishes one message per
// record.
//
// A message holds at most Max records and a payload of at most MaxBytes
// (a single record larger than that goes out alone, never split). Only
// records to the same topic share a message, in the order they came; a
// topic template filled per key ("agg/{id}") gives one topic per key, so
// batching pays off with a topic many keys share. A record whose payload
// is not a JSON object (not JSON, for a sink without ids) cannot be an
// element: it is published on its own, as without batching, after the
// records before it on its topic.
type Batch struct {
	// Max is the most records in one message; 0 or 1 publishes one
	// message per record. At most MaxBatch.
	Max int
	// MaxBytes bounds the payload of one message, in bytes; 0 means
	// DefaultBatchBytes. It must stay below the broker's packet bound
	// less the topic and about 10 bytes of header.
	MaxBytes int
}

// Validate reports a bound out of range, naming the YAML keys.
func (b Batch) Validate() error {
	if b.Max < 0 || b.Max > MaxBatch {
		return fmt.Errorf("%w: sink.batch (%d) must be between 0 and %d", ErrInvalidConfig, b.Max, MaxBatch)
	}
	if b.MaxBytes < 0 {
		return fmt.Errorf("%w: sink.batch_bytes (%d) must not be negative", ErrInvalidConfig, b.MaxBytes)
	}
	return nil
}

// on reports whether records are packed.
func (b Batch) on() bool { return b.Max > 1 }

// maxPendingBatches bounds the topics with an unpublished batch: past it
// (many topics, few records each) all of them are published, so what the
// batcher holds stays bounded.
const maxPendingBatches = 1024

// flushAfter is how many times Max records may be added after a batch
// was opened before every open batch is published: a record on a quiet
// topic waits for at most that many records on the others, even when
// the sink is never idle.
const flushAfter = 16

// batcher gathers the records of one publish (a checkpoint's results, or
// what a sink received since it was last idle) into one open message per
// topic. Not safe for concurrent use; one goroutine owns it.
type batcher struct {
	max, maxBytes int
	open          map[string]*openBatch
	order         []*openBatch // open (and published) batches, oldest first
	pending       int          // bytes held by the open batches
	seq           int          // records added
	size          int          // the largest message published: the capacity of the next
}

// openBatch is a message being filled: '[' and the elements, comma
// separated, without the closing ']'.
type openBatch struct {
	topic  string
	buf    []byte
	n      int
	opened int  // the batcher's seq when it was opened
	done   bool // published; dropped from order at the next compaction
}

// newBatcher returns a batcher for b, or nil when b packs nothing.
func newBatcher(b Batch) *batcher {
	if !b.on() {
		return nil
	}
	maxBytes := b.MaxBytes
	if maxBytes == 0 {
		maxBytes = DefaultBatchBytes
	}
	return &batcher{max: b.Max, maxBytes: maxBytes, open: map[string]*openBatch{}}
}

// add queues payload for topic with id (none when empty) and publishes
// what is complete: the topic's message when payload would take it past
// MaxBytes (before adding it) or when it holds Max records (after).
func (b *batcher) add(p *Publisher, topic string, payload []byte, id string) error {
	ob := b.open[topic]
	var start int
	if ob != nil {
		start = len(ob.buf)
		ob.buf = append(ob.buf, ',')
	} else {
		ob = &openBatch{topic: topic, buf: b.newBuf(0)}
	}
	buf, ok := appendElement(ob.buf, payload, id)
	if !ok {
		// Not an element: alone, after the topic's records so far.
		ob.buf = ob.buf[:max(start, 1)]
		if ob.n > 0 {
			if err := b.publish(p, ob); err != nil {
				return err
			}
		}
		if id != "" {
			payload = WithMsgID(payload, id)
		}
		return p.Publish(topic, payload)
	}
	ob.buf = buf
	b.seq++
	if ob.n == 0 {
		ob.opened = b.seq
		b.open[topic] = ob
		b.order = append(b.order, ob)
	} else if len(ob.buf)+1 > b.maxBytes {
		// The element starts after the comma at start: the message so far
		// goes out without it and it opens the next one.
		elem := ob.buf[start+1:]
		next := &openBatch{topic: topic, buf: append(b.newBuf(len(elem)), elem...)}
		ob.buf = ob.buf[:start]
		if err := b.publish(p, ob); err != nil {
			return err
		}
		ob, start = next, 0
		ob.opened = b.seq
		b.open[topic] = ob
		b.order = append(b.order, ob)
	}
	ob.n++
	b.pending += len(ob.buf) - start
	if ob.n >= b.max || len(ob.buf)+1 >= b.maxBytes {
		if err := b.publish(p, ob); err != nil {
			return err
		}
	}
	if len(b.open) > maxPendingBatches || b.pending > 4*b.maxBytes || b.seq-b.oldest() >= flushAfter*b.max {
		return b.flush(p)
	}
	return nil
}

// oldest returns when the oldest open batch was opened (seq when none
// is), dropping the published ones before it from order.
func (b *batcher) oldest() int {
	for len(b.order) > 0 && b.order[0].done {
		b.order[0] = nil
		b.order = b.order[1:]
	}
	if len(b.order) == 0 {
		return b.seq
	}
	return b.order[0].opened
}

// newBuf returns '[' in a buffer for n more bytes, at least 4 KiB. When
// no other message is open (one topic, or the first of several) the
// buffer takes the size of the largest message so far, so a full message
// is filled without growing it step by step; the others grow as they
// fill, so many quiet topics reserve what they hold, not a full message
// each.
func (b *batcher) newBuf(n int) []byte {
	c := max(min(b.maxBytes, 4096), n+2)
	if len(b.open) == 0 {
		c = max(c, b.size)
	}
	buf := make([]byte, 1, c)
	buf[0] = '['
	return buf
}

// publish sends ob, closed, and forgets it. The payload is not reused:
// paho may hold it until the broker's acknowledgement.
func (b *batcher) publish(p *Publisher, ob *openBatch) error {
	delete(b.open, ob.topic)
	ob.done = true
	b.pending -= len(ob.buf)
	payload := append(ob.buf, ']')
	ob.buf = nil
	b.size = min(max(b.size, len(payload)), b.maxBytes)
	if len(b.order) > 2*len(b.open)+16 {
		kept := b.order[:0]
		for _, o := range b.order {
			if !o.done {
				kept = append(kept, o)
			}
		}
		clear(b.order[len(kept):])
		b.order = kept
	}
	return p.Publish(ob.topic, payload)
}

// flush publishes every open message, oldest first.
func (b *batcher) flush(p *Publisher) error {
	order := b.order
	b.order = nil
	for i, ob := range order {
		if ob.done {
			continue
		}
		if err := b.publish(p, ob); err != nil {
			// The unpublished ones stay open for the next flush.
			for _, o := range order[i+1:] {
				if !o.done {
					b.order = append(b.order, o)
				}
			}
			return err
		}
	}
	b.pending = 0
	return nil
}

// appendElement appends payload, with id when not empty, to dst as an
// element of a JSON array: a JSON object gets the msg_id member as
// WithMsgID gives it; without an id any JSON value is taken as it is.
// ok is false (and dst unchanged) for anything else.
func appendElement(dst, payload []byte, id string) ([]byte, bool) {
	trimmed := bytes.TrimSpace(payload)
	if id == "" {
		if !json.Valid(trimmed) {
			return dst, false
		}
		return append(dst, trimmed...), true
	}
	if !isJSONObject(trimmed) {
		return dst, false
	}
	return appendObjectWithID(dst, trimmed, id), true
}
