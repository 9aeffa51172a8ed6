package cluster

import (
	"encoding/binary"
	"fmt"
	"math"
)

// Kind is the kind of message a frame carries. Every kind but KindAck
// travels in the channel's sequence, so barriers, watermarks, stream status
// and end of stream keep their place among the record batches.
type Kind uint8

const (
	// KindBatch carries a record batch encoded with the runtime codec
	// (timestamps, then the records: see BatchEncoder), or several one
	// after the other when batches joined one waiting for credit
	// (Send.Merge); it holds one credit either way.
	KindBatch Kind = iota + 1
	// KindWatermark carries an event-time watermark in Value.
	KindWatermark
	// KindStatus carries the stream status: Value 1 idle, 0 active.
	KindStatus
	// KindBarrier carries checkpoint Value's barrier.
	KindBarrier
	// KindEndOfStream follows the channel's last message.
	KindEndOfStream
	// KindAck travels from receiver to sender: every frame up to Seq has
	// been processed, and the batches among them are credits again; Value
	// is the highest sequence number received, processed or not.
	KindAck

	maxKind = KindAck
)

// String names the kind.
func (k Kind) String() string {
	switch k {
	case KindBatch:
		return "batch"
	case KindWatermark:
		return "watermark"
	case KindStatus:
		return "status"
	case KindBarrier:
		return "barrier"
	case KindEndOfStream:
		return "eos"
	case KindAck:
		return "ack"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Frame is one message on a cross-node channel.
type Frame struct {
	// Channel names the channel; an ack names the channel it acknowledges.
	Channel ChannelID
	// Seq is the frame's sequence number on its channel, from 1; for an
	// ack, the highest sequence number processed.
	Seq uint64
	// Kind says what the frame carries.
	Kind Kind
	// Value is the watermark, the barrier's checkpoint id, the status (1
	// idle, 0 active), or an ack's highest sequence number received; 0 for
	// other kinds.
	Value int64
	// Body is a batch's encoded records; nil for other kinds. A decoded
	// Body aliases the decoded bytes.
	Body []byte
}

// Frame format, version 4 (version 1 carried the strings of a batch's
// records inline, where version 2 numbers them per channel, version 3
// writes the int64 fields of a struct of scalars after a batch's first
// record as their differences from the record before: see
// codec.DictEncoder and codec.AppendBatchDict; and version 4 writes a
// timestamp that all of a batch's records share once: see BatchEncoder):
//
//	magic    2 bytes  "eF"
//	version  1 byte   4
//	kind     1 byte
//	job      uvarint length, then the name (at most MaxJobName bytes)
//	epoch    uvarint
//	edge     uvarint
//	from     uvarint
//	to       uvarint
//	seq      uvarint
//	body     batch: the rest of the frame; watermark, barrier, ack: one
//	         zig-zag varint; status: one byte 0 or 1; eos: nothing
//
// The transport carries each frame whole, so the body needs no length.
const (
	frameMagic0, frameMagic1 = 'e', 'F'
	frameVersion             = 4
	// MaxJobName is the longest job name a frame carries, in bytes.
	MaxJobName = 255
	// FrameOverhead bounds the header of a frame with a job name of at most
	// MaxJobName bytes: magic, version, kind, the name and six uvarints.
	FrameOverhead = 4 + 2 + MaxJobName + 6*binary.MaxVarintLen64
)

// AppendFrame appends f's encoding to dst. It fails, returning dst
// unchanged, if f cannot be encoded: an unknown kind, a job name longer
// than MaxJobName, a negative edge or subtask, a body on a kind without
// one, a status other than 0 or 1.
func AppendFrame(dst []byte, f *Frame) ([]byte, error) {
	id := f.Channel
	switch {
	case f.Kind == 0 || f.Kind > maxKind:
		return dst, fmt.Errorf("%w: %d", ErrBadKind, f.Kind)
	case len(id.Job) > MaxJobName:
		return dst, fmt.Errorf("%w: job name of %d bytes exceeds %d", ErrCorruptFrame, len(id.Job), MaxJobName)
	case !inInt32(id.Edge) || !inInt32(id.From) || !inInt32(id.To):
		return dst, fmt.Errorf("%w: edge or subtask out of range in %s", ErrCorruptFrame, id)
	case f.Kind != KindBatch && f.Body != nil:
		return dst, fmt.Errorf("%w: %s frame with a body", ErrCorruptFrame, f.Kind)
	case f.Kind == KindStatus && f.Value != 0 && f.Value != 1:
		return dst, fmt.Errorf("%w: status %d", ErrCorruptFrame, f.Value)
	case (f.Kind == KindBatch || f.Kind == KindEndOfStream) && f.Value != 0:
		return dst, fmt.Errorf("%w: %s frame with value %d", ErrCorruptFrame, f.Kind, f.Value)
	}
	dst = append(dst, frameMagic0, frameMagic1, frameVersion, byte(f.Kind))
	dst = binary.AppendUvarint(dst, uint64(len(id.Job)))
	dst = append(dst, id.Job...)
	dst = binary.AppendUvarint(dst, id.Epoch)
	dst = binary.AppendUvarint(dst, uint64(id.Edge))
	dst = binary.AppendUvarint(dst, uint64(id.From))
	dst = binary.AppendUvarint(dst, uint64(id.To))
	dst = binary.AppendUvarint(dst, f.Seq)
	switch f.Kind {
	case KindBatch:
		dst = append(dst, f.Body...)
	case KindWatermark, KindBarrier, KindAck:
		dst = binary.AppendVarint(dst, f.Value)
	case KindStatus:
		dst = append(dst, byte(f.Value))
	}
	return dst, nil
}

// EncodedSize returns the length of f's encoding.
func (f *Frame) EncodedSize() int {
	n := 4 + uvarintLen(uint64(len(f.Channel.Job))) + len(f.Channel.Job) +
		uvarintLen(f.Channel.Epoch) + uvarintLen(uint64(f.Channel.Edge)) +
		uvarintLen(uint64(f.Channel.From)) + uvarintLen(uint64(f.Channel.To)) + uvarintLen(f.Seq)
	switch f.Kind {
	case KindBatch:
		n += len(f.Body)
	case KindWatermark, KindBarrier, KindAck:
		n += varintLen(f.Value)
	case KindStatus:
		n++
	}
	return n
}

// DecodeFrame decodes one frame from src, which must hold exactly the
// frame. The returned Body aliases src. It never panics: bad input gives an
// error wrapping ErrBadMagic, ErrBadVersion, ErrBadKind, ErrShortFrame or
// ErrCorruptFrame.
func DecodeFrame(src []byte) (Frame, error) {
	var f Frame
	if len(src) < 4 {
		return f, fmt.Errorf("%w: %d bytes", ErrShortFrame, len(src))
	}
	if src[0] != frameMagic0 || src[1] != frameMagic1 {
		return f, fmt.Errorf("%w: %#x %#x", ErrBadMagic, src[0], src[1])
	}
	if src[2] != frameVersion {
		return f, fmt.Errorf("%w: %d", ErrBadVersion, src[2])
	}
	f.Kind = Kind(src[3])
	if f.Kind == 0 || f.Kind > maxKind {
		return Frame{}, fmt.Errorf("%w: %d", ErrBadKind, src[3])
	}
	r := reader{b: src[4:]}
	n := r.uvarint("job length")
	if r.err == nil && n > MaxJobName {
		r.err = fmt.Errorf("%w: job name of %d bytes", ErrCorruptFrame, n)
	}
	if r.err == nil && n > uint64(len(r.b)) {
		r.err = fmt.Errorf("%w: job name of %d bytes, %d left", ErrShortFrame, n, len(r.b))
	}
	if r.err == nil {
		f.Channel.Job = string(r.b[:n])
		r.b = r.b[n:]
	}
	f.Channel.Epoch = r.uvarint("epoch")
	f.Channel.Edge = r.int("edge")
	f.Channel.From = r.int("from")
	f.Channel.To = r.int("to")
	f.Seq = r.uvarint("seq")
	if r.err != nil {
		return Frame{}, r.err
	}
	switch f.Kind {
	case KindBatch:
		// Capped at its length: an append to the body must not write
		// into what follows it in a received buffer.
		f.Body = r.b[:len(r.b):len(r.b)]
		r.b = nil
	case KindWatermark, KindBarrier, KindAck:
		v, k := binary.Varint(r.b)
		if k == 0 {
			return Frame{}, fmt.Errorf("%w: %s value", ErrShortFrame, f.Kind)
		}
		if k < 0 || k != varintLen(v) {
			return Frame{}, fmt.Errorf("%w: %s value overflows or is not minimal", ErrCorruptFrame, f.Kind)
		}
		f.Value = v
		r.b = r.b[k:]
	case KindStatus:
		if len(r.b) == 0 {
			return Frame{}, fmt.Errorf("%w: status", ErrShortFrame)
		}
		if r.b[0] > 1 {
			return Frame{}, fmt.Errorf("%w: status %d", ErrCorruptFrame, r.b[0])
		}
		f.Value = int64(r.b[0])
		r.b = r.b[1:]
	}
	if len(r.b) != 0 {
		return Frame{}, fmt.Errorf("%w: %d bytes after a %s frame", ErrCorruptFrame, len(r.b), f.Kind)
	}
	return f, nil
}

// reader reads uvarints, keeping the first error.
type reader struct {
	b   []byte
	err error
}

func (r *reader) uvarint(what string) uint64 {
	if r.err != nil {
		return 0
	}
	v, k := binary.Uvarint(r.b)
	if k == 0 {
		r.err = fmt.Errorf("%w: %s", ErrShortFrame, what)
		return 0
	}
	if k < 0 || k != uvarintLen(v) {
		// Overflowing or not minimal: one value has one encoding.
		r.err = fmt.Errorf("%w: %s overflows or is not minimal", ErrCorruptFrame, what)
		return 0
	}
	r.b = r.b[k:]
	return v
}

func (r *reader) int(what string) int {
	v := r.uvarint(what)
	if r.err == nil && v > math.MaxInt32 {
		r.err = fmt.Errorf("%w: %s %d out of range", ErrCorruptFrame, what, v)
		return 0
	}
	return int(v)
}

func uvarintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

func varintLen(v int64) int {
	u := uint64(v) << 1
	if v < 0 {
		u = ^u
	}
	return uvarintLen(u)
}

func inInt32(v int) bool { return v >= 0 && v <= math.MaxInt32 }
