package cluster

import (
	"fmt"
	"time"
)

// ReceiverStats counts what a receiver did. Every field only grows.
type ReceiverStats struct {
	// Delivered counts frames handed to the task; Batches the batches
	// among them.
	Delivered, Batches int64
	// Duplicates counts frames dropped as duplicates within the window.
	Duplicates int64
	// EpochDropped counts frames of another epoch, dropped.
	EpochDropped int64
	// Acks counts acknowledgements transmitted.
	Acks int64
}

// Receiver is the receiving end of one cross-node channel: a pure machine.
// It delivers frames to the task strictly in sequence, drops duplicates it
// has delivered recently, fails the channel on a gap, an old duplicate, a
// sender over its credits or in-flight bytes or a lost connection, and
// acknowledges frames once the task has processed them, so that the
// acknowledgement is the sender's credit: at once when nothing delivered
// is left to process, else once every quarter of the credits or of the
// in-flight bytes (see advance).
//
// Control frames (watermarks, status, barriers, end of stream) hold no
// credit: they count as processed once every batch before them is.
//
// Not safe for concurrent use: its owner serialises Step.
type Receiver struct {
	id  ChannelID
	cfg ChannelConfig

	expected  uint64  // next sequence number to deliver
	queue     []entry // delivered, not yet processed, in order
	batches   int     // batches in queue
	bytes     int     // the body bytes of the batches in queue
	processed uint64  // every frame up to here is processed
	unacked   int     // batches processed since the last ack
	unackedB  int     // their body bytes
	eos       uint64  // sequence number of the end of stream, 0 before
	done      bool
	err       error

	now                 time.Time
	ackAt               time.Time // when the last ack was transmitted
	ackSeq, ackReceived uint64    // what it said

	stats ReceiverStats
}

type entry struct {
	seq   uint64
	kind  Kind
	bytes int // a batch's body bytes
}

// NewReceiver returns the receiver of channel id. cfg must be valid.
func NewReceiver(id ChannelID, cfg ChannelConfig) *Receiver {
	return &Receiver{id: id, cfg: cfg, expected: 1}
}

// ID returns the receiver's channel.
func (r *Receiver) ID() ChannelID { return r.id }

// Err returns the error the channel failed with, or nil.
func (r *Receiver) Err() error { return r.err }

// Stats returns the receiver's counters.
func (r *Receiver) Stats() ReceiverStats { return r.stats }

// Held returns the number of batches delivered and not yet processed.
func (r *Receiver) Held() int { return r.batches }

// HeldBytes returns the body bytes of the batches delivered and not yet
// processed.
func (r *Receiver) HeldBytes() int { return r.bytes }

// Step feeds one input to the receiver and returns what to do. A failed
// receiver ignores its inputs; a finished one still answers ticks, so that
// a lost final acknowledgement is repeated.
func (r *Receiver) Step(in Input) []Action {
	if r.err != nil {
		return nil
	}
	switch in := in.(type) {
	case Receive:
		if r.done {
			return r.receiveDone(in.Frame)
		}
		return r.receive(in.Frame)
	case Processed:
		return r.process(in.Seq)
	case Tick:
		return r.tick(in.Now)
	case Disconnected:
		if r.done {
			return nil
		}
		return r.fail(ErrDisconnected, "%v", in.Reason)
	case Send:
		return r.fail(ErrProtocol, "send at a receiver")
	}
	return r.fail(ErrProtocol, "unknown input %T", in)
}

func (r *Receiver) receive(f Frame) []Action {
	if f.Channel.Epoch != r.id.Epoch {
		r.stats.EpochDropped++
		return nil
	}
	switch {
	case f.Channel != r.id:
		return r.fail(ErrProtocol, "frame for channel %s", f.Channel)
	case f.Kind == KindAck:
		return r.fail(ErrProtocol, "ack seq %d at the receiver", f.Seq)
	case f.Seq == 0:
		return r.fail(ErrProtocol, "%s frame with seq 0", f.Kind)
	case f.Seq > r.expected:
		return r.fail(ErrGap, "expected seq %d, got %s seq %d", r.expected, f.Kind, f.Seq)
	case f.Seq < r.expected:
		if r.expected-f.Seq > uint64(r.cfg.DuplicateWindow) {
			return r.fail(ErrStaleDuplicate, "%s seq %d with seq %d expected, window %d", f.Kind, f.Seq, r.expected, r.cfg.DuplicateWindow)
		}
		r.stats.Duplicates++
		return nil
	}
	if f.Kind == KindBatch && r.batches >= r.cfg.Credits {
		return r.fail(ErrCreditExceeded, "batch seq %d with %d batches unprocessed, credits %d (cluster.channels.credits must be the same on every node)", f.Seq, r.batches, r.cfg.Credits)
	}
	if f.Kind == KindBatch && r.batches > 0 && r.bytes+len(f.Body) > r.cfg.MaxInFlightBytes {
		return r.fail(ErrCreditExceeded, "batch seq %d of %d bytes with %d bytes unprocessed, max_inflight_bytes %d (cluster.channels.max_inflight_bytes must be the same on every node)", f.Seq, len(f.Body), r.bytes, r.cfg.MaxInFlightBytes)
	}
	r.expected++
	r.stats.Delivered++
	var n int
	if f.Kind == KindBatch {
		n = len(f.Body)
		r.batches++
		r.bytes += n
		r.stats.Batches++
	}
	if f.Kind == KindEndOfStream {
		r.eos = f.Seq
	}
	r.queue = append(r.queue, entry{f.Seq, f.Kind, n})
	acts := []Action{Deliver{Frame: f}}
	return append(acts, r.advance(false)...)
}

// receiveDone answers a frame after the end of stream was processed:
// duplicates are dropped, anything new is a protocol violation.
func (r *Receiver) receiveDone(f Frame) []Action {
	if f.Channel.Epoch != r.id.Epoch {
		r.stats.EpochDropped++
		return nil
	}
	if f.Channel == r.id && f.Seq != 0 && f.Seq <= r.eos && r.eos-f.Seq < uint64(r.cfg.DuplicateWindow) {
		r.stats.Duplicates++
		return nil
	}
	return r.fail(ErrProtocol, "%s seq %d after end of stream seq %d", f.Kind, f.Seq, r.eos)
}

func (r *Receiver) process(seq uint64) []Action {
	if seq <= r.processed {
		return nil
	}
	if seq >= r.expected {
		return r.fail(ErrProtocol, "processed seq %d, only %d delivered", seq, r.expected-1)
	}
	n := 0
	for n < len(r.queue) && r.queue[n].seq <= seq {
		if e := r.queue[n]; e.kind == KindBatch {
			r.batches--
			r.bytes -= e.bytes
			r.unacked++
			r.unackedB += e.bytes
		}
		r.processed = r.queue[n].seq
		n++
	}
	r.queue = r.queue[:copy(r.queue, r.queue[n:])]
	return r.advance(true)
}

// advance counts the control frames at the head of the queue as processed,
// and acknowledges when the end of stream was processed, or batches were:
// at once when no batch delivered is left to process, else once every
// ackEvery batches or a quarter of the in-flight bytes. A receiver behind
// its sender thus sends one acknowledgement for several batches, and the
// sender, which resumes when half its credits and bytes are free, waits
// no longer for it.
func (r *Receiver) advance(batchDone bool) []Action {
	n := 0
	for n < len(r.queue) && r.queue[n].kind != KindBatch {
		r.processed = r.queue[n].seq
		n++
	}
	r.queue = r.queue[:copy(r.queue, r.queue[n:])]
	var acts []Action
	eosDone := r.eos != 0 && r.processed >= r.eos
	due := batchDone && (r.batches == 0 || r.unacked >= r.ackEvery() || r.unackedB >= max(1, r.cfg.MaxInFlightBytes/4))
	if (due || eosDone) && r.processed > r.ackSeq {
		acts = append(acts, r.ack())
	}
	if eosDone && !r.done {
		r.done = true
		acts = append(acts, Done{})
	}
	return acts
}

// ackEvery is how many processed batches a receiver with more to process
// acknowledges at once: a quarter of the credits, so that a blocked sender
// regains the half it resumes at after two acknowledgements.
func (r *Receiver) ackEvery() int { return max(1, r.cfg.Credits/4) }

func (r *Receiver) ack() Action {
	r.ackSeq, r.ackReceived, r.ackAt = r.processed, r.expected-1, r.now
	r.unacked, r.unackedB = 0, 0
	r.stats.Acks++
	return Transmit{Frame: Frame{Channel: r.id, Kind: KindAck, Seq: r.processed, Value: int64(r.expected - 1)}}
}

func (r *Receiver) tick(now time.Time) []Action {
	if now.After(r.now) {
		r.now = now
	}
	if r.expected == 1 {
		return nil // nothing received: nothing to acknowledge
	}
	changed := r.ackSeq != r.processed || r.ackReceived != r.expected-1
	if changed || r.now.Sub(r.ackAt) >= r.cfg.AckInterval {
		return []Action{r.ack()}
	}
	return nil
}

func (r *Receiver) fail(cause error, format string, args ...any) []Action {
	r.err = failure(r.id, cause, "receiver: %s", fmt.Sprintf(format, args...))
	r.queue = nil
	return []Action{Fail{Err: r.err}}
}
