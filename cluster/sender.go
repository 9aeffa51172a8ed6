package cluster

import (
	"fmt"
	"time"
)

// SenderStats counts what a sender did. Every field only grows.
type SenderStats struct {
	// Frames and Batches count the frames and batches transmitted.
	Frames, Batches int64
	// Bytes counts the frame bytes transmitted (encoded size).
	Bytes int64
	// MaxInFlight is the most batches ever unacknowledged at once: never
	// more than the channel's credits.
	MaxInFlight int
	// MaxInFlightBytes is the most batch body bytes ever unacknowledged at
	// once: never more than ChannelConfig.MaxInFlightBytes, but for a
	// single frame larger than it.
	MaxInFlightBytes int
	// StaleAcks counts acknowledgements that acknowledged nothing new
	// (repeated or reordered).
	StaleAcks int64
	// EpochDropped counts acknowledgements of another epoch, dropped.
	EpochDropped int64
	// ByteWaits counts the batches that waited with a credit free: the
	// bytes in flight left no room for them (MaxInFlightBytes).
	ByteWaits int64
	// Merged counts the batches that joined a batch waiting for credit
	// (Send.Merge): they crossed in its frame, not in one of their own.
	Merged int64
}

// Sender is the sending end of one cross-node channel: a pure machine.
// It numbers every message of the channel in one sequence, sends a batch
// only while it holds a credit and the batches in flight leave room for
// its bytes (ChannelConfig.MaxInFlightBytes; one batch of any size when
// nothing is in flight), and takes credits back from the
// receiver's acknowledgements. Messages behind a batch waiting for credit
// wait with it, so order holds; a batch sent with Merge behind it joins
// it instead, in the same frame, while there is room. A batch sent with
// Merge while half the credits or bytes or more are in flight waits for the next
// acknowledgement too, taking the batches after it: a saturated channel
// sends fewer, larger frames.
//
// Not safe for concurrent use: its owner serialises Step. The owner steps
// acknowledgements as they arrive, not from the sending task's mailbox, so
// a task blocked on credit still sees them.
type Sender struct {
	id  ChannelID
	cfg ChannelConfig

	next     uint64   // sequence number of the next message
	tx       uint64   // highest sequence number transmitted
	acked    uint64   // highest sequence number acknowledged as processed
	received uint64   // highest sequence number the receiver reported received
	inflight []flight // transmitted, unacknowledged batches, in order
	bytes    int      // the body bytes of inflight
	pending  []Frame  // messages waiting for a credit, in order
	merging  bool     // the last of pending is a batch that takes Merge batches
	waiting  bool     // a Resume is owed
	eos      uint64   // sequence number of the end of stream, 0 before
	done     bool
	err      error

	now        time.Time
	progressAt time.Time // when the receiver last reported a new frame received

	stats SenderStats
}

// flight is a transmitted batch: its sequence number and body bytes.
type flight struct {
	seq   uint64
	bytes int
}

// NewSender returns the sender of channel id. cfg must be valid.
func NewSender(id ChannelID, cfg ChannelConfig) *Sender {
	return &Sender{id: id, cfg: cfg, next: 1}
}

// ID returns the sender's channel.
func (s *Sender) ID() ChannelID { return s.id }

// Err returns the error the channel failed with, or nil.
func (s *Sender) Err() error { return s.err }

// Blocked reports whether the sender waits for credit: the sending task
// must send nothing more until a Resume. While the batch waiting for
// credit takes Merge batches and is less than half full (of
// ChannelConfig.MaxMergeBytes), the sender is not blocked: the task goes
// on filling it.
func (s *Sender) Blocked() bool {
	if !s.waiting {
		return false
	}
	return !s.merging || len(s.pending[len(s.pending)-1].Body) >= s.cfg.mergeBytes()/2
}

// Credits returns the batches the sender may transmit now, as far as the
// credits go (MaxInFlightBytes may let fewer cross).
func (s *Sender) Credits() int {
	if len(s.pending) > 0 {
		return 0
	}
	return s.cfg.Credits - len(s.inflight)
}

// InFlight returns the number of batches transmitted and not acknowledged.
func (s *Sender) InFlight() int { return len(s.inflight) }

// Stats returns the sender's counters.
func (s *Sender) Stats() SenderStats { return s.stats }

// Step feeds one input to the sender and returns what to do. A failed or
// finished sender ignores its inputs.
func (s *Sender) Step(in Input) []Action {
	if s.err != nil || s.done {
		return nil
	}
	switch in := in.(type) {
	case Send:
		return s.send(in)
	case Receive:
		return s.ack(in.Frame)
	case Tick:
		return s.tick(in.Now)
	case Disconnected:
		return s.fail(ErrDisconnected, "%v", in.Reason)
	case Processed:
		return s.fail(ErrProtocol, "processed at a sender")
	}
	return s.fail(ErrProtocol, "unknown input %T", in)
}

func (s *Sender) send(m Send) []Action {
	if s.eos != 0 {
		return s.fail(ErrChannelClosed, "%s after end of stream", m.Kind)
	}
	f := Frame{Channel: s.id, Seq: s.next, Kind: m.Kind, Value: m.Value, Body: m.Body}
	if m.Kind == KindAck || m.Kind == 0 || m.Kind > maxKind {
		return s.fail(ErrProtocol, "cannot send %s", m.Kind)
	}
	if n := f.EncodedSize(); n > s.cfg.MaxFrameBytes {
		return s.fail(ErrFrameTooLarge, "%s frame of %d bytes, limit %d", m.Kind, n, s.cfg.MaxFrameBytes)
	}
	mergeable := m.Kind == KindBatch && m.Merge && s.cfg.mergeBytes() > 0
	if mergeable && s.merging {
		if last := &s.pending[len(s.pending)-1]; len(last.Body)+len(m.Body) <= s.cfg.mergeBytes() {
			last.Body = append(last.Body, m.Body...)
			s.stats.Merged++
			return nil
		}
	}
	s.next++
	if m.Kind == KindEndOfStream {
		s.eos = f.Seq
	}
	fits := f.Kind != KindBatch || s.room(len(f.Body))
	if !fits && len(s.pending) == 0 && len(s.inflight) < s.cfg.Credits {
		s.stats.ByteWaits++
	}
	if len(s.pending) > 0 || !fits || (mergeable && s.saturated()) {
		f.Body = s.keep(f.Body, mergeable)
		s.pending = append(s.pending, f)
		s.merging = mergeable
		if f.Kind == KindBatch {
			s.waiting = true
		}
		return nil
	}
	return []Action{s.transmit(f)}
}

// keep returns a copy of a body that waits for credit: the caller reuses
// its buffer once Step returns. A body that may take the batches after it
// gets room for them, so that merging does not grow it step by step.
func (s *Sender) keep(body []byte, mergeable bool) []byte {
	if body == nil {
		return nil
	}
	n := len(body)
	if mergeable {
		n = max(n, s.cfg.mergeBytes())
	}
	return append(getBuf(n), body...)
}

// room reports whether a batch of n body bytes may be transmitted now: a
// credit is free, and the bytes in flight stay within MaxInFlightBytes
// or nothing is in flight (a batch larger than the window still crosses,
// alone).
func (s *Sender) room(n int) bool {
	if len(s.inflight) >= s.cfg.Credits {
		return false
	}
	return len(s.inflight) == 0 || s.bytes+n <= s.cfg.MaxInFlightBytes
}

// saturated reports whether half the channel's credits, or half its
// in-flight bytes, or more are in flight: the receiver is behind, and a
// batch that may merge waits for the next acknowledgement rather than
// cross alone. The batches the task sends meanwhile join it, so that a
// saturated channel carries fewer, larger frames (and acknowledgements);
// a channel with credit to spare sends every batch at once.
func (s *Sender) saturated() bool {
	return len(s.inflight) >= max(1, s.cfg.Credits/2) || s.bytes >= max(1, s.cfg.MaxInFlightBytes/2)
}

func (s *Sender) transmit(f Frame) Transmit {
	if s.tx == s.received {
		// Nothing was outstanding: the wait for this frame starts now.
		s.progressAt = s.now
	}
	s.tx = f.Seq
	if f.Kind == KindBatch {
		s.inflight = append(s.inflight, flight{f.Seq, len(f.Body)})
		s.bytes += len(f.Body)
		s.stats.Batches++
		s.stats.MaxInFlight = max(s.stats.MaxInFlight, len(s.inflight))
		s.stats.MaxInFlightBytes = max(s.stats.MaxInFlightBytes, s.bytes)
	}
	s.stats.Frames++
	s.stats.Bytes += int64(f.EncodedSize())
	return Transmit{Frame: f}
}

func (s *Sender) ack(f Frame) []Action {
	if f.Channel.Epoch != s.id.Epoch {
		s.stats.EpochDropped++
		return nil
	}
	switch {
	case f.Channel != s.id:
		return s.fail(ErrProtocol, "ack for channel %s", f.Channel)
	case f.Kind != KindAck:
		return s.fail(ErrProtocol, "%s frame seq %d at the sender", f.Kind, f.Seq)
	case f.Value < 0 || uint64(f.Value) < f.Seq:
		return s.fail(ErrProtocol, "ack of seq %d with %d received", f.Seq, f.Value)
	case uint64(f.Value) > s.tx:
		return s.fail(ErrProtocol, "receiver reports seq %d received, only %d sent", f.Value, s.tx)
	}
	if rcv := uint64(f.Value); rcv > s.received {
		s.received = rcv
		s.progressAt = s.now
	}
	if f.Seq <= s.acked {
		s.stats.StaleAcks++
		return nil
	}
	s.acked = f.Seq
	n := 0
	for n < len(s.inflight) && s.inflight[n].seq <= f.Seq {
		s.bytes -= s.inflight[n].bytes
		n++
	}
	s.inflight = s.inflight[:copy(s.inflight, s.inflight[n:])]
	var acts []Action
	for len(s.pending) > 0 {
		p := s.pending[0]
		if p.Kind == KindBatch && !s.room(len(p.Body)) {
			break
		}
		s.pending[0] = Frame{}
		s.pending = s.pending[1:]
		t := s.transmit(p)
		t.Kept = p.Body != nil
		acts = append(acts, t)
	}
	if len(s.pending) == 0 {
		s.pending, s.merging = nil, false
	}
	if s.waiting && len(s.pending) == 0 && s.cfg.Credits-len(s.inflight) >= max(1, s.cfg.Credits/2) && s.bytes <= s.cfg.MaxInFlightBytes/2 {
		s.waiting = false
		acts = append(acts, Resume{})
	}
	if s.eos != 0 && s.acked >= s.eos {
		s.done = true
		acts = append(acts, Done{})
	}
	return acts
}

func (s *Sender) tick(now time.Time) []Action {
	if now.After(s.now) {
		s.now = now
	}
	if s.progressAt.IsZero() {
		s.progressAt = s.now
	}
	if s.tx > s.received && s.now.Sub(s.progressAt) >= s.cfg.AckTimeout {
		return s.fail(ErrAckTimeout, "seq %d sent, %d received after %s", s.tx, s.received, s.now.Sub(s.progressAt))
	}
	return nil
}

func (s *Sender) fail(cause error, format string, args ...any) []Action {
	s.err = failure(s.id, cause, "sender: %s", fmt.Sprintf(format, args...))
	s.pending, s.merging = nil, false
	return []Action{Fail{Err: s.err}}
}
