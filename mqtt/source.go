package mqtt

import (
	"encoding/binary"
	"fmt"

	"github.com/edgedio/edged/mqtt/ingestlog"
	"github.com/edgedio/edged/operators"
)

// Message is one MQTT message as the Source emits it.
type Message struct {
	// Topic is the MQTT topic name it was published to.
	Topic string
	// Payload is the message body; the Message owns it.
	Payload []byte
	// Offset is the message's position in the ingest log: dense,
	// increasing, and the same in every replay.
	Offset uint64
}

// sourceStateVersion is the first byte of the Source's snapshot.
const sourceStateVersion = 1

// Source emits the messages of an ingest log, the replayable copy of what
// the broker (or an MQTT subscriber) received; it implements
// operators.Source[Message], Snapshotter, Restorer and CheckpointListener.
//
// One log is one split: only subtask 0 reads it, and the other subtasks
// report EndOfInput at once. A log must feed a single Source, since the
// Source truncates it.
//
// Positions: a fresh Source (nothing restored) starts at the oldest
// record still in the log, that is everything no completed checkpoint has
// covered. SnapshotState stores the offset of the next record to emit;
// RestoreState seeks there, so recovery replays the log from the
// checkpointed offset, and truncates the log before it (a reopened log
// counts every record on disk against its size bound until the first
// Truncate). NotifyCheckpointComplete truncates the log before the offset
// that checkpoint recorded, deleting whole segments that are no longer
// needed; restoring from a checkpoint older than the latest completed one
// (an old savepoint) fails with ingestlog.ErrTruncated once the records
// it needs are gone.
//
// All methods are called on the subtask's goroutine; Poll never blocks,
// and Available returns a channel that is closed when new records are
// durable. The caller owns the log: it opens it before the job and closes
// it after the Source.
type Source struct {
	operators.Base
	log     *ingestlog.Log
	active  bool
	pos     uint64            // next offset to emit while reader is nil
	reader  *ingestlog.Reader // opened at the first Poll
	pending map[int64]uint64  // checkpoint id -> offset it recorded
	closed  chan struct{}     // always closed; Available of an idle subtask
}

var (
	_ operators.Source[Message]    = (*Source)(nil)
	_ operators.Snapshotter        = (*Source)(nil)
	_ operators.Restorer           = (*Source)(nil)
	_ operators.CheckpointListener = (*Source)(nil)
)

// NewSource returns a source reading log. It reads nothing until Poll.
func NewSource(log *ingestlog.Log) *Source {
	closed := make(chan struct{})
	close(closed)
	return &Source{log: log, pending: make(map[int64]uint64), closed: closed}
}

// Open makes subtask 0 the reader, starting at the oldest record in the
// log unless RestoreState says otherwise.
func (s *Source) Open(ctx *operators.Context) error {
	s.active = ctx.Subtask == 0
	if s.active {
		s.pos = s.log.Stats().FirstOffset
	}
	return nil
}

// Close releases the log reader; the log stays open.
func (s *Source) Close() error {
	if s.reader == nil {
		return nil
	}
	err := s.reader.Close()
	s.reader = nil
	return err
}

// Offset returns the offset of the next record Poll emits.
func (s *Source) Offset() uint64 {
	if s.reader != nil {
		return s.reader.Offset()
	}
	return s.pos
}

// Poll emits up to limit durable records without blocking.
func (s *Source) Poll(out operators.Collector[Message], limit int) (operators.Status, error) {
	if !s.active {
		return operators.EndOfInput, nil
	}
	if s.reader == nil {
		r, err := s.log.Reader(s.pos)
		if err != nil {
			return operators.NothingAvailable, fmt.Errorf("mqtt source: read log from offset %d: %w", s.pos, err)
		}
		s.reader = r
	}
	for range max(limit, 1) {
		rec, ok, err := s.reader.TryNext()
		if err != nil {
			return operators.NothingAvailable, fmt.Errorf("mqtt source: read log at offset %d: %w", s.reader.Offset(), err)
		}
		if !ok {
			return operators.NothingAvailable, nil
		}
		out.Collect(Message{Topic: rec.Topic, Payload: rec.Payload, Offset: rec.Offset})
	}
	return operators.MoreAvailable, nil
}

// Available returns a channel closed when Poll may have records again.
func (s *Source) Available() <-chan struct{} {
	if s.reader == nil {
		return s.closed
	}
	return s.reader.Ready()
}

// SnapshotState returns the offset of the next record to emit, and
// remembers it as checkpoint id's for NotifyCheckpointComplete.
func (s *Source) SnapshotState(id int64) ([]byte, error) {
	if !s.active {
		return nil, nil
	}
	off := s.Offset()
	s.pending[id] = off
	return binary.AppendUvarint([]byte{sourceStateVersion}, off), nil
}

// RestoreState seeks subtask 0 to the offset old subtask 0 snapshotted
// (states[0]) and releases the log before it; whatever the parallelism,
// only subtask 0 read. The other subtasks ignore their state.
func (s *Source) RestoreState(states [][]byte, _ int) error {
	if !s.active || len(states) == 0 || len(states[0]) == 0 {
		return nil
	}
	off, err := decodeSourceState(states[0])
	if err != nil {
		return err
	}
	if s.reader != nil {
		if err := s.reader.Close(); err != nil {
			return fmt.Errorf("mqtt source: %w", err)
		}
		s.reader = nil
	}
	s.pos = off
	if err := s.log.Truncate(off); err != nil {
		return fmt.Errorf("mqtt source: release log before restored offset %d: %w", off, err)
	}
	return nil
}

func decodeSourceState(b []byte) (uint64, error) {
	if len(b) < 2 || b[0] != sourceStateVersion {
		return 0, fmt.Errorf("%w: %x", ErrCorruptState, b)
	}
	off, n := binary.Uvarint(b[1:])
	if n <= 0 || n != len(b)-1 {
		return 0, fmt.Errorf("%w: %x", ErrCorruptState, b)
	}
	return off, nil
}

// NotifyCheckpointComplete truncates the log before the offset checkpoint
// id recorded: no restore will need those records again. Checkpoints up
// to id are forgotten.
func (s *Source) NotifyCheckpointComplete(id int64) error {
	off, ok := s.pending[id]
	for cp := range s.pending {
		if cp <= id {
			delete(s.pending, cp)
		}
	}
	if !ok {
		return nil
	}
	if err := s.log.Truncate(off); err != nil {
		return fmt.Errorf("mqtt source: truncate log before offset %d (checkpoint %d): %w", off, id, err)
	}
	return nil
}

// NotifyCheckpointAborted forgets checkpoint id's offset.
func (s *Source) NotifyCheckpointAborted(id int64) error {
	delete(s.pending, id)
	return nil
}
