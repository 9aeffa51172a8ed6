package mqtt

import (
	"errors"
	"fmt"

	"github.com/edgedio/edged/operators"
)

// Sink publishes every record to MQTT: at-least-once. It publishes as
// records arrive (at most PublisherConfig.MaxInflight unacknowledged) and
// at each checkpoint barrier (SnapshotState) and at Finish waits until
// the broker has acknowledged all of them, so a completed checkpoint
// never covers a record the broker has not taken. After a failure the
// records since the last checkpoint are published again; when ID is set,
// each payload carries the record's id (see WithMsgID) so a consumer can
// drop the duplicates.
//
// For exactly-once towards deduplicating consumers use
// operators.NewWriteAheadSink(PublishFunc(...), nil) instead, which
// publishes only completed checkpoints' records with deterministic ids.
//
// Collect cannot return an error: a publish failure is kept and returned
// by the next SnapshotState (failing the checkpoint) or Finish. All
// methods run on the subtask's goroutine.
type Sink[T any] struct {
	operators.Base
	cfg    PublisherConfig
	topic  func(T) (string, error)
	encode func(T) ([]byte, error)
	// ID, when set before Open, gives each record the id put into its
	// payload; it must be deterministic for the record to be useful.
	ID func(T) string
	// Reject, when set before Open, takes a record whose topic or payload
	// cannot be made (with the reason) instead of failing the sink; the
	// sink goes on with the next record.
	Reject func(v T, err error)
	// Batch, when set before Open, packs the records to one topic into
	// JSON-array messages (see Batch): they are held until Max fill a
	// message, the task has no more input waiting (Flush), 16×Max more
	// records came, or the next barrier or Finish.
	Batch   Batch
	pub     *Publisher
	batcher *batcher // nil without batching
	err     error    // first failure since the last SnapshotState
}

var (
	_ operators.Sink[int]   = (*Sink[int])(nil)
	_ operators.Snapshotter = (*Sink[int])(nil)
	_ operators.Flusher     = (*Sink[int])(nil)
)

// NewSink returns a sink publishing encode(v) to topic(v) with cfg (its
// ClientID gets "-<subtask>" appended in Open).
func NewSink[T any](cfg PublisherConfig, topic func(T) (string, error), encode func(T) ([]byte, error)) *Sink[T] {
	return &Sink[T]{cfg: cfg, topic: topic, encode: encode}
}

// TemplateTopic returns a topic function for NewSink and PublishFunc that
// expands tmpl with field(v, name) for each placeholder.
func TemplateTopic[T any](tmpl TopicTemplate, field func(v T, name string) string) func(T) (string, error) {
	return func(v T) (string, error) {
		return tmpl.Expand(func(name string) string { return field(v, name) })
	}
}

// Open creates the publisher; it connects at the first record.
func (s *Sink[T]) Open(ctx *operators.Context) error {
	cfg := s.cfg
	cfg.ClientID = fmt.Sprintf("%s-%d", cfg.ClientID, ctx.Subtask)
	if cfg.Logger == nil {
		cfg.Logger = ctx.Logger
	}
	if err := s.Batch.Validate(); err != nil {
		return fmt.Errorf("mqtt sink: %w", err)
	}
	pub, err := NewPublisher(cfg)
	if err != nil {
		return fmt.Errorf("mqtt sink: %w", err)
	}
	s.pub = pub
	s.batcher = newBatcher(s.Batch)
	return nil
}

// Collect publishes v, waiting only if MaxInflight publishes are
// unacknowledged. A publish that fails (not a record that cannot be
// made, which goes to Reject) fails the task at once: a result is never
// dropped while the job goes on, and the restart strategy decides.
func (s *Sink[T]) Collect(v T) {
	if s.err != nil {
		operators.Fail(s.err)
	}
	var err error
	if s.batcher != nil {
		err = addRecord(s.batcher, s.pub, s.topic, s.encode, v, s.idOf(v))
	} else {
		err = publishRecord(s.pub, s.topic, s.encode, v, s.idOf(v))
	}
	if err != nil {
		var bad *recordError
		if s.Reject != nil && errors.As(err, &bad) {
			s.Reject(v, bad.err)
			return
		}
		s.err = fmt.Errorf("mqtt sink: %w", err)
		operators.Fail(s.err)
	}
}

func (s *Sink[T]) idOf(v T) string {
	if s.ID == nil {
		return ""
	}
	return s.ID(v)
}

// Flush publishes the batches being filled, without waiting for their
// acknowledgements; without batching it does nothing. The runtime calls
// it whenever the task has no more input waiting, so a batch never waits
// for more records. A failure fails the task, as Collect's does.
func (s *Sink[T]) Flush() error {
	s.publishBatches()
	return s.err
}

// publishBatches publishes the batches being filled, keeping a failure.
func (s *Sink[T]) publishBatches() {
	if s.batcher == nil || s.err != nil {
		return
	}
	if err := s.batcher.flush(s.pub); err != nil {
		s.err = fmt.Errorf("mqtt sink: %w", err)
	}
}

// SnapshotState publishes the batches being filled and waits until the
// broker has acknowledged every record before the barrier; the sink
// keeps no state.
func (s *Sink[T]) SnapshotState(int64) ([]byte, error) {
	return nil, s.settle()
}

// settle publishes what is batched and waits for every acknowledgement,
// returning the first failure since the last settle.
func (s *Sink[T]) settle() error {
	s.publishBatches()
	if err := s.pub.Flush(); err != nil && s.err == nil {
		s.err = fmt.Errorf("mqtt sink: %w", err)
	}
	err := s.err
	s.err = nil
	return err
}

// Finish publishes what is batched and waits for the acknowledgements of
// every record.
func (s *Sink[T]) Finish() error { return s.settle() }

// Close disconnects without waiting for acknowledgements.
func (s *Sink[T]) Close() error {
	if s.pub == nil {
		return nil
	}
	return s.pub.Close()
}

// publishRecord encodes v, adds id when not empty, and publishes it.
func publishRecord[T any](p *Publisher, topic func(T) (string, error), encode func(T) ([]byte, error), v T, id string) error {
	t, payload, err := makeRecord(topic, encode, v)
	if err != nil {
		return err
	}
	if id != "" {
		payload = WithMsgID(payload, id)
	}
	return p.Publish(t, payload)
}

// addRecord is publishRecord through b.
func addRecord[T any](b *batcher, p *Publisher, topic func(T) (string, error), encode func(T) ([]byte, error), v T, id string) error {
	t, payload, err := makeRecord(topic, encode, v)
	if err != nil {
		return err
	}
	return b.add(p, t, payload, id)
}

// makeRecord returns the topic and payload of v, or a *recordError.
func makeRecord[T any](topic func(T) (string, error), encode func(T) ([]byte, error), v T) (string, []byte, error) {
	t, err := topic(v)
	if err != nil {
		return "", nil, &recordError{err}
	}
	payload, err := encode(v)
	if err != nil {
		return "", nil, &recordError{fmt.Errorf("encode record for %s: %w", t, err)}
	}
	return t, payload, nil
}

// PublishFunc returns the publish function of an
// operators.NewWriteAheadSink: it publishes each record of a completed
// checkpoint with its deterministic id (operators.WriteAheadSink.ID: the
// sink's UID and the record's identity, never the subtask or a position)
// put into the payload by WithMsgID, and returns once the broker
// acknowledged them all. A re-publish after recovery, at any parallelism,
// carries the same ids, so a consumer that drops duplicate msg_ids sees
// each record once. p is owned by the write-ahead sink's subtask; close
// it after the job.
//
// A record whose topic or payload cannot be made (topic or encode
// returns an error) is given to reject, when it is not nil, and skipped:
// one bad record must not fail the job over and over from a checkpoint
// that holds it. With reject nil the error fails the publish.
func PublishFunc[T any](p *Publisher, topic func(T) (string, error), encode func(T) ([]byte, error), reject func(v T, err error)) operators.Publish[T] {
	return func(records []T, id func(i int) string) error {
		for i, v := range records {
			if err := publishRecord(p, topic, encode, v, id(i)); err != nil {
				var bad *recordError
				if reject != nil && errors.As(err, &bad) {
					reject(v, bad.err)
					continue
				}
				return fmt.Errorf("mqtt: %w", err)
			}
		}
		if err := p.Flush(); err != nil {
			return fmt.Errorf("mqtt: %w", err)
		}
		return nil
	}
}

// PublishLineFunc is PublishFunc for a write-ahead sink whose records'
// identity is their payload, a line of text (WithIdentity(line)): it
// makes each record's line once and takes both the payload and the id
// from it, where PublishFunc makes it twice (encode, then the sink's ID
// through the identity). The id is operators.RecordID(uid(), line): the
// write-ahead sink's ID when uid returns the sink's UID (its
// Context.UID; called at every publish, so it may be set in Open). The
// id func the sink passes is not called.
//
// With batch on, the records to one topic go out in JSON-array messages
// (see Batch), each element with its own id: every message is out
// before the function waits for the acknowledgements, and the ids are
// the same as without batching, so a re-publish that batches the records
// otherwise still repeats only ids a deduplicating consumer has seen.
func PublishLineFunc[T any](p *Publisher, topic func(T) (string, error), line func(T) string, uid func() string, reject func(v T, err error), batch Batch) operators.Publish[T] {
	return func(records []T, _ func(i int) string) error {
		b := newBatcher(batch)
		if err := publishLines(p, b, topic, line, uid(), reject, records); err != nil {
			return err
		}
		return flush(p, b)
	}
}

// PublishLineChunksFunc is PublishLineFunc for
// operators.WriteAheadSink.WithPublishChunks: the records of every chunk
// in order, then one Flush, so the broker's acknowledgements are waited
// for once for all the chunks. With batch on, a message may take records
// of several chunks.
func PublishLineChunksFunc[T any](p *Publisher, topic func(T) (string, error), line func(T) string, uid func() string, reject func(v T, err error), batch Batch) operators.PublishChunks[T] {
	return func(chunks [][]T, _ func(c, i int) string) error {
		u := uid()
		b := newBatcher(batch)
		for _, records := range chunks {
			if err := publishLines(p, b, topic, line, u, reject, records); err != nil {
				return err
			}
		}
		return flush(p, b)
	}
}

// publishLines publishes records as PublishLineFunc does, through b when
// it is not nil, without waiting for their acknowledgements.
func publishLines[T any](p *Publisher, b *batcher, topic func(T) (string, error), line func(T) string, u string, reject func(v T, err error), records []T) error {
	for _, v := range records {
		t, err := topic(v)
		if err != nil {
			if reject != nil {
				reject(v, err)
				continue
			}
			return fmt.Errorf("mqtt: %w", err)
		}
		l := line(v)
		if b != nil {
			if err := b.add(p, t, []byte(l), operators.RecordID(u, l)); err != nil {
				return fmt.Errorf("mqtt: %w", err)
			}
			continue
		}
		if err := p.Publish(t, WithMsgID([]byte(l), operators.RecordID(u, l))); err != nil {
			return fmt.Errorf("mqtt: %w", err)
		}
	}
	return nil
}

// flush publishes what b (when not nil) holds and waits for every
// publish of p.
func flush(p *Publisher, b *batcher) error {
	if b != nil {
		if err := b.flush(p); err != nil {
			return fmt.Errorf("mqtt: %w", err)
		}
	}
	if err := p.Flush(); err != nil {
		return fmt.Errorf("mqtt: %w", err)
	}
	return nil
}

// recordError is a failure of one record (its topic or its encoding), as
// opposed to one of the connection.
type recordError struct{ err error }

func (e *recordError) Error() string { return e.err.Error() }
func (e *recordError) Unwrap() error { return e.err }
