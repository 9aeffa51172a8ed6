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
	pub    *Publisher
	err    error // first failure since the last SnapshotState
}

var (
	_ operators.Sink[int]   = (*Sink[int])(nil)
	_ operators.Snapshotter = (*Sink[int])(nil)
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
	pub, err := NewPublisher(cfg)
	if err != nil {
		return fmt.Errorf("mqtt sink: %w", err)
	}
	s.pub = pub
	return nil
}

// Collect publishes v, waiting only if MaxInflight publishes are
// unacknowledged.
func (s *Sink[T]) Collect(v T) {
	if s.err != nil {
		return
	}
	if err := publishRecord(s.pub, s.topic, s.encode, v, s.idOf(v)); err != nil {
		var bad *recordError
		if s.Reject != nil && errors.As(err, &bad) {
			s.Reject(v, bad.err)
			return
		}
		s.err = fmt.Errorf("mqtt sink: %w", err)
	}
}

func (s *Sink[T]) idOf(v T) string {
	if s.ID == nil {
		return ""
	}
	return s.ID(v)
}

// SnapshotState waits until the broker has acknowledged every record
// before the barrier; the sink keeps no state.
func (s *Sink[T]) SnapshotState(int64) ([]byte, error) {
	return nil, s.flush()
}

func (s *Sink[T]) flush() error {
	if err := s.pub.Flush(); err != nil && s.err == nil {
		s.err = fmt.Errorf("mqtt sink: %w", err)
	}
	err := s.err
	s.err = nil
	return err
}

// Finish waits for the acknowledgements of every record.
func (s *Sink[T]) Finish() error { return s.flush() }

// Close disconnects without waiting for acknowledgements.
func (s *Sink[T]) Close() error {
	if s.pub == nil {
		return nil
	}
	return s.pub.Close()
}

// publishRecord encodes v, adds id when not empty, and publishes it.
func publishRecord[T any](p *Publisher, topic func(T) (string, error), encode func(T) ([]byte, error), v T, id string) error {
	t, err := topic(v)
	if err != nil {
		return &recordError{err}
	}
	payload, err := encode(v)
	if err != nil {
		return &recordError{fmt.Errorf("encode record for %s: %w", t, err)}
	}
	if id != "" {
		payload = WithMsgID(payload, id)
	}
	return p.Publish(t, payload)
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
func PublishLineFunc[T any](p *Publisher, topic func(T) (string, error), line func(T) string, uid func() string, reject func(v T, err error)) operators.Publish[T] {
	return func(records []T, _ func(i int) string) error {
		if err := publishLines(p, topic, line, uid(), reject, records); err != nil {
			return err
		}
		return flush(p)
	}
}

// PublishLineChunksFunc is PublishLineFunc for
// operators.WriteAheadSink.WithPublishChunks: the records of every chunk
// in order, then one Flush, so the broker's acknowledgements are waited
// for once for all the chunks.
func PublishLineChunksFunc[T any](p *Publisher, topic func(T) (string, error), line func(T) string, uid func() string, reject func(v T, err error)) operators.PublishChunks[T] {
	return func(chunks [][]T, _ func(c, i int) string) error {
		u := uid()
		for _, records := range chunks {
			if err := publishLines(p, topic, line, u, reject, records); err != nil {
				return err
			}
		}
		return flush(p)
	}
}

// publishLines publishes records as PublishLineFunc does, without waiting
// for their acknowledgements.
func publishLines[T any](p *Publisher, topic func(T) (string, error), line func(T) string, u string, reject func(v T, err error), records []T) error {
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
		if err := p.Publish(t, WithMsgID([]byte(l), operators.RecordID(u, l))); err != nil {
			return fmt.Errorf("mqtt: %w", err)
		}
	}
	return nil
}

// flush waits for every publish of p.
func flush(p *Publisher) error {
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
