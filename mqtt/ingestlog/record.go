package ingestlog

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"time"
)

// MaxPayloadBytes is the longest payload a record can hold: the largest
// MQTT packet.
const MaxPayloadBytes = 268435455

const (
	// maxTopicBytes is the longest MQTT topic name.
	maxTopicBytes = 65535
	// frameHeaderSize is the length and checksum before each record body.
	frameHeaderSize = 8
	// minBodySize is the shortest body: flags, time, and two zero lengths.
	minBodySize = 4
	// maxMarkSize is the longest commit mark: a uvarint offset.
	maxMarkSize = binary.MaxVarintLen64
	// maxBodySize is the longest body a valid message encodes to.
	maxBodySize = 1 + binary.MaxVarintLen64 + 3 + 3 + maxTopicBytes + 5 + MaxPayloadBytes + maxMarkSize

	flagQoS      = 0x03 // bits 0-1: QoS 0, 1 or 2
	flagRetain   = 0x04 // bit 2: the retain flag
	flagPacketID = 0x08 // bit 3: a packet identifier follows the receive time
	flagMark     = 0x10 // bit 4: a commit mark ends the body
	flagTooLarge = 0x20 // bit 5: a dead letter: the size of the payload not kept follows the packet identifier
	flagNote     = 0x40 // bit 6: a redelivery note (Message.Note); needs bit 3
	flagsKnown   = flagQoS | flagRetain | flagPacketID | flagMark | flagTooLarge | flagNote
)

// recordOverhead is the most bytes a record's frame adds to its topic and
// payload, without a commit mark: frame header, flags, receive time,
// packet identifier, and the two lengths.
const recordOverhead = frameHeaderSize + 1 + binary.MaxVarintLen64 + 3 + 3 + 5

// MaxMessageBytes returns the most topic and payload bytes, together, of
// a message the log can always append: a larger one may not fit in one
// segment (Options.SegmentBytes less the segment header) or in
// Options.MaxBytes, and Append refuses it (ErrTooLarge). 0 if the options
// leave no room.
func (o Options) MaxMessageBytes() int64 {
	frame := o.SegmentBytes - headerSize
	if o.MaxBytes > 0 && o.MaxBytes < frame {
		frame = o.MaxBytes
	}
	return max(0, frame-recordOverhead)
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// errShortFrame means the bytes at hand hold only part of a frame.
var errShortFrame = errors.New("ingestlog: incomplete record frame")

// Message is what Append stores: one MQTT message as the source received
// it.
type Message struct {
	// Topic is the MQTT topic name, at most 65535 bytes.
	Topic string
	// Payload is the message body, at most MaxPayloadBytes.
	Payload []byte
	// QoS is the MQTT quality of service it was published with: 0, 1 or 2.
	QoS byte
	// Retain is the MQTT retain flag.
	Retain bool
	// Received is when the broker or client received the message, kept so
	// that a replay sees the same ingestion time as the first run. It is
	// stored in nanoseconds since the Unix epoch; the zero Time (unknown)
	// and the epoch itself both read back as the zero Time.
	Received time.Time
	// PacketID is the MQTT packet identifier the message arrived with
	// (1..65535), or 0 when there is none (QoS 0) or it is not known
	// (records written before the field existed, or by a writer that does
	// not set it). A broker resends an unacknowledged QoS 1/2 message
	// with its original packet identifier, so together with the topic and
	// payload it identifies a redelivery; see the mqtt package's
	// Subscriber. It is stored only when non-zero.
	PacketID uint16
	// TooLarge marks a dead letter: a message of TooLarge bytes (its MQTT
	// PUBLISH packet, as the writer received it) that was too large to
	// keep (larger than the writer's maximum message size, or than a
	// record can be). Payload holds only the first bytes of its payload,
	// the rest was discarded; a reader of the log is to treat the record
	// as a dead letter, not as the message. 0 for every other message; it
	// is stored only when non-zero, and is then at least len(Payload).
	TooLarge int64
	// Note marks a redelivery note, not a message: the broker resent,
	// under PacketID, a message the log already holds (an earlier record
	// with the same packet identifier, topic and payload), and the
	// subscriber noted it again so that the log's tail, which it reloads
	// at start to recognise redeliveries, still shows it (see the mqtt
	// package's Subscriber). Readers of the messages skip notes. A note
	// has a packet identifier; its other fields are the message's.
	Note bool
}

// Record is a Message read back from the log with its offset.
type Record struct {
	// Offset is the record's position in the log: 0 for the first record
	// ever appended, then dense and increasing across segments.
	Offset uint64
	Message
}

func (m *Message) validate() error {
	switch {
	case m.QoS > 2:
		return fmt.Errorf("%w: QoS %d", ErrInvalidMessage, m.QoS)
	case len(m.Topic) > maxTopicBytes:
		return fmt.Errorf("%w: topic of %d bytes (at most %d)", ErrInvalidMessage, len(m.Topic), maxTopicBytes)
	case len(m.Payload) > MaxPayloadBytes:
		return fmt.Errorf("%w: payload of %d bytes (at most %d)", ErrInvalidMessage, len(m.Payload), MaxPayloadBytes)
	case m.TooLarge < 0 || (m.TooLarge > 0 && int64(len(m.Payload)) > m.TooLarge):
		return fmt.Errorf("%w: too-large size %d with %d payload bytes kept", ErrInvalidMessage, m.TooLarge, len(m.Payload))
	case m.Note && m.PacketID == 0:
		return fmt.Errorf("%w: a redelivery note without a packet identifier", ErrInvalidMessage)
	}
	return nil
}

func (m *Message) unixNano() int64 {
	if m.Received.IsZero() {
		return 0
	}
	return m.Received.UnixNano()
}

// frameSize is the number of bytes appendFrame adds for m: the frame
// without a commit mark (addMark adds markSize more).
func frameSize(m *Message) int64 {
	n := frameHeaderSize + 1 + varintLen(m.unixNano()) +
		uvarintLen(uint64(len(m.Topic))) + len(m.Topic) +
		uvarintLen(uint64(len(m.Payload))) + len(m.Payload)
	if m.PacketID != 0 {
		n += uvarintLen(uint64(m.PacketID))
	}
	if m.TooLarge != 0 {
		n += uvarintLen(uint64(m.TooLarge))
	}
	return int64(n)
}

// markSize is the number of bytes addMark adds for the mark d.
func markSize(d uint64) int64 { return int64(uvarintLen(d)) }

// appendFrame appends the frame of m (length, CRC32C, body) to dst,
// without a commit mark. m must be valid.
func appendFrame(dst []byte, m *Message) []byte {
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0, 0, 0, 0, 0)
	body := len(dst)
	flags := m.QoS & flagQoS
	if m.Retain {
		flags |= flagRetain
	}
	if m.PacketID != 0 {
		flags |= flagPacketID
	}
	if m.TooLarge != 0 {
		flags |= flagTooLarge
	}
	if m.Note {
		flags |= flagNote
	}
	dst = append(dst, flags)
	dst = binary.AppendVarint(dst, m.unixNano())
	if m.PacketID != 0 {
		dst = binary.AppendUvarint(dst, uint64(m.PacketID))
	}
	if m.TooLarge != 0 {
		dst = binary.AppendUvarint(dst, uint64(m.TooLarge))
	}
	dst = binary.AppendUvarint(dst, uint64(len(m.Topic)))
	dst = append(dst, m.Topic...)
	dst = binary.AppendUvarint(dst, uint64(len(m.Payload)))
	dst = append(dst, m.Payload...)
	binary.LittleEndian.PutUint32(dst[start:], uint32(len(dst)-body))
	binary.LittleEndian.PutUint32(dst[start+4:], crc32.Checksum(dst[body:], castagnoli))
	return dst
}

// addMark turns frame, one frame without a mark made by appendFrame,
// into the same record carrying the commit mark d: "every record before
// offset d was fsynced before this one was written". It sets the flag,
// appends the uvarint, and rewrites the length and checksum.
func addMark(frame []byte, d uint64) []byte {
	frame[frameHeaderSize] |= flagMark
	frame = binary.AppendUvarint(frame, d)
	body := frame[frameHeaderSize:]
	binary.LittleEndian.PutUint32(frame, uint32(len(body)))
	binary.LittleEndian.PutUint32(frame[4:], crc32.Checksum(body, castagnoli))
	return frame
}

// parseFrameHeader returns the body length and checksum in the 8 bytes at
// the start of b, or ErrRecordLength for a length no record can have.
func parseFrameHeader(b []byte) (bodyLen int64, sum uint32, err error) {
	n := binary.LittleEndian.Uint32(b)
	sum = binary.LittleEndian.Uint32(b[4:])
	if n < minBodySize || n > maxBodySize {
		return 0, 0, fmt.Errorf("%w: %d bytes", ErrRecordLength, n)
	}
	return int64(n), sum, nil
}

// body is a parsed record body; topic and payload alias the input.
type body struct {
	flags    byte
	received int64
	packetID uint16
	tooLarge int64
	topic    []byte
	payload  []byte
	mark     uint64 // the commit mark, if flags has flagMark
}

// hasMark reports whether the record carries a commit mark.
func (p *body) hasMark() bool { return p.flags&flagMark != 0 }

// parseBody parses a record body whose checksum has been verified. It
// accepts exactly the encodings appendFrame produces.
func parseBody(b []byte) (body, error) {
	var r body
	if len(b) < minBodySize {
		return r, fmt.Errorf("%w: %d bytes", ErrRecordBody, len(b))
	}
	r.flags = b[0]
	if r.flags&^flagsKnown != 0 || r.flags&flagQoS == 3 || r.flags&(flagNote|flagPacketID) == flagNote {
		return r, fmt.Errorf("%w: flags %#02x", ErrRecordBody, r.flags)
	}
	b = b[1:]
	t, n := binary.Varint(b)
	if n <= 0 || n != varintLen(t) {
		return r, fmt.Errorf("%w: bad receive time", ErrRecordBody)
	}
	r.received = t
	b = b[n:]
	if r.flags&flagPacketID != 0 {
		id, n := binary.Uvarint(b)
		if n <= 0 || n != uvarintLen(id) || id == 0 || id > 65535 {
			return r, fmt.Errorf("%w: bad packet identifier", ErrRecordBody)
		}
		r.packetID = uint16(id)
		b = b[n:]
	}
	if r.flags&flagTooLarge != 0 {
		v, n := binary.Uvarint(b)
		if n <= 0 || n != uvarintLen(v) || v == 0 || v > math.MaxInt64 {
			return r, fmt.Errorf("%w: bad too-large size", ErrRecordBody)
		}
		r.tooLarge = int64(v)
		b = b[n:]
	}
	var err error
	if r.topic, b, err = lengthPrefixed(b, maxTopicBytes, "topic"); err != nil {
		return r, err
	}
	if r.payload, b, err = lengthPrefixed(b, MaxPayloadBytes, "payload"); err != nil {
		return r, err
	}
	if r.tooLarge != 0 && int64(len(r.payload)) > r.tooLarge {
		return r, fmt.Errorf("%w: too-large size %d below the %d payload bytes kept", ErrRecordBody, r.tooLarge, len(r.payload))
	}
	if r.hasMark() {
		d, n := binary.Uvarint(b)
		if n <= 0 || n != uvarintLen(d) {
			return r, fmt.Errorf("%w: bad commit mark", ErrRecordBody)
		}
		r.mark = d
		b = b[n:]
	}
	if len(b) != 0 {
		return r, fmt.Errorf("%w: %d trailing bytes", ErrRecordBody, len(b))
	}
	return r, nil
}

// lengthPrefixed splits a uvarint length and that many bytes (at most max)
// off the front of b.
func lengthPrefixed(b []byte, max uint64, what string) (field, rest []byte, err error) {
	l, n := binary.Uvarint(b)
	if n <= 0 || n != uvarintLen(l) {
		return nil, nil, fmt.Errorf("%w: bad %s length", ErrRecordBody, what)
	}
	b = b[n:]
	if l > max || l > uint64(len(b)) {
		return nil, nil, fmt.Errorf("%w: %s length %d with %d bytes left", ErrRecordBody, what, l, len(b))
	}
	return b[:l:l], b[l:], nil
}

// decodeFrame decodes the frame at the start of b into a Message whose
// topic and payload are copies, and returns the frame's size. It returns
// errShortFrame when b holds only part of the frame; it never panics.
func decodeFrame(b []byte) (Message, int64, error) {
	p, n, err := parseFrame(b)
	if err != nil {
		return Message{}, 0, err
	}
	return p.message(string(p.topic)), n, nil
}

// parseFrame parses the frame at the start of b (the body aliases b) and
// returns its size; errShortFrame when b holds only part of it. It never
// panics.
func parseFrame(b []byte) (body, int64, error) {
	if len(b) < frameHeaderSize {
		return body{}, 0, errShortFrame
	}
	n, sum, err := parseFrameHeader(b)
	if err != nil {
		return body{}, 0, err
	}
	if int64(len(b)-frameHeaderSize) < n {
		return body{}, 0, errShortFrame
	}
	raw := b[frameHeaderSize : frameHeaderSize+n]
	if crc32.Checksum(raw, castagnoli) != sum {
		return body{}, 0, ErrChecksum
	}
	p, err := parseBody(raw)
	if err != nil {
		return body{}, 0, err
	}
	return p, frameHeaderSize + n, nil
}

// message builds a Message owning a copy of the payload, with the given
// topic string (which the caller may have interned).
func (p *body) message(topic string) Message {
	m := Message{
		Topic:    topic,
		Payload:  bytes.Clone(p.payload),
		QoS:      p.flags & flagQoS,
		Retain:   p.flags&flagRetain != 0,
		PacketID: p.packetID,
		TooLarge: p.tooLarge,
		Note:     p.flags&flagNote != 0,
	}
	if p.received != 0 {
		m.Received = time.Unix(0, p.received)
	}
	return m
}

func uvarintLen(x uint64) int {
	n := 1
	for x >= 0x80 {
		x >>= 7
		n++
	}
	return n
}

func varintLen(x int64) int {
	ux := uint64(x) << 1
	if x < 0 {
		ux = ^ux
	}
	return uvarintLen(ux)
}
