package mqtt

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/mochi-mqtt/server/v2/packets"
)

// An MQTT 3.1.1 device cannot be told the broker's maximum packet size,
// and a broker that closes its connection on a PUBLISH over the bound
// gets it again at every reconnect: at QoS 1 and 2 the device resends it
// first, and nothing after it ever gets through. So the embedded broker
// reads such a PUBLISH as the direct reader does (readTooLarge): a
// cutReader beneath mochi's reader passes every byte of the connection
// through unchanged, except a PUBLISH over the bound from a client that
// did not connect with MQTT 5. It keeps that packet's topic, packet id
// and first DeadLetterKeep payload bytes, discards the rest through a
// small buffer as it arrives, and hands mochi a small PUBLISH in its
// place whose payload is the broker's cut mark (a random secret of the
// broker's, which no client can forge), the original packet's size and
// retain flag, and the kept bytes. OnPublish recognises the mark (uncut)
// and appends a dead-letter record, acknowledged once durable like any
// other message; mochi neither retains nor routes it. An MQTT 5 client
// learns the bound from the CONNACK and is disconnected with "packet
// too large" as MQTT 5 says.

// cutMarkLen is the length of the broker's cut mark.
const cutMarkLen = 16

// cutHeadLen is the cut PUBLISH's payload before the kept bytes: the
// mark, the original packet's size (8 bytes, big endian) and its retain
// flag.
const cutHeadLen = cutMarkLen + 8 + 1

// connectHead is how many bytes of a CONNECT's body the cutReader looks
// at for the protocol level (a 2-byte name length, "MQTT" or "MQIsdp",
// the level).
const connectHead = 2 + 6 + 1

// newCutMark returns a random cut mark.
func newCutMark() [cutMarkLen]byte {
	var m [cutMarkLen]byte
	if _, err := rand.Read(m[:]); err != nil {
		panic(fmt.Sprintf("mqtt: no randomness for the broker's cut mark: %v", err))
	}
	return m
}

// cutReader is the connection as mochi reads it; see above. It is read
// by mochi's read loop only.
type cutReader struct {
	r    io.Reader
	max  int64 // a packet whose remaining length + 1 exceeds it is too large (mochi's test)
	mark [cutMarkLen]byte

	// The stream as handed out: held are the bytes of a fixed header not
	// complete yet (never handed out before it is), body the bytes of the
	// current packet's body still to pass.
	held []byte
	body int64
	// packets counts the packets whose fixed header passed; the first is
	// the CONNECT, whose first body bytes (head) tell the protocol level.
	packets int
	head    []byte
	level   bool // the protocol level is known
	v5      bool
	// off is set once the stream is not MQTT the cutReader can follow (a
	// malformed header or a first packet that is not CONNECT): from
	// there it passes everything, and mochi ends the connection.
	off bool

	// pending is a too-large PUBLISH found (its fixed header's first byte,
	// remaining length and size), not read yet; unread are bytes read
	// past its fixed header, which are read before the connection's; out
	// is the cut packet, handed out before anything else.
	pending *cutPublish
	unread  []byte
	out     []byte
	scratch []byte
}

// cutPublish is a PUBLISH over the bound, its fixed header read.
type cutPublish struct {
	flags     byte  // the fixed header's first byte
	remaining int64 // its remaining length
	size      int64 // the whole packet: fixed header and remaining length
}

func newCutReader(r io.Reader, max int64, mark [cutMarkLen]byte) *cutReader {
	return &cutReader{r: r, max: max, mark: mark}
}

// Read hands out the connection's bytes; see cutReader.
func (c *cutReader) Read(p []byte) (int, error) {
	for {
		if len(c.out) > 0 {
			n := copy(p, c.out)
			c.out = c.out[n:]
			return n, nil
		}
		if c.pending != nil {
			if err := c.cut(); err != nil {
				return 0, err
			}
			continue
		}
		if c.off {
			return c.src(p)
		}
		// The held header bytes go first, then what arrives; a p too small
		// for a fixed header is served through scratch.
		buf := p
		if len(buf) < 8 {
			buf = c.buffer(64)
		}
		h := copy(buf, c.held)
		c.held = c.held[:0]
		n, err := c.src(buf[h:])
		n += h
		k := c.scan(buf[:n])
		if k < n && c.pending == nil { // an incomplete fixed header at the end
			if err != nil { // and nothing more: hand it out as it is
				c.off, k = true, n
			} else {
				c.held = append(c.held, buf[k:n]...)
			}
		}
		if k == 0 {
			if err != nil {
				return 0, err
			}
			continue
		}
		if len(p) < 8 {
			m := copy(p, buf[:k])
			c.out = append(c.out[:0:0], buf[m:k]...) // scanned: handed out as they are
			return m, nil
		}
		if k < n {
			err = nil // the rest comes with the next Read
		}
		return k, err
	}
}

// src reads the bytes read past a too-large PUBLISH's head first, then
// the connection.
func (c *cutReader) src(p []byte) (int, error) {
	if len(c.unread) > 0 {
		n := copy(p, c.unread)
		c.unread = c.unread[n:]
		return n, nil
	}
	return c.r.Read(p)
}

// buffer returns c's scratch buffer, at least n bytes long.
func (c *cutReader) buffer(n int) []byte {
	if len(c.scratch) < n {
		c.scratch = make([]byte, n)
	}
	return c.scratch[:n]
}

// scan follows the packets of buf, the stream's next bytes, and returns
// how many of them may be handed out: all of them, unless a fixed header
// is incomplete at the end (held back) or a too-large PUBLISH begins
// (its fixed header is taken into c.pending and what follows it into
// c.unread).
func (c *cutReader) scan(buf []byte) int {
	i := 0
	for i < len(buf) {
		if c.off {
			return len(buf)
		}
		if c.body > 0 {
			take := int(min(c.body, int64(len(buf)-i)))
			if c.packets == 1 && !c.level {
				c.connectBytes(buf[i : i+take])
			}
			c.body -= int64(take)
			i += take
			continue
		}
		var fh packets.FixedHeader
		if err := fh.Decode(buf[i]); err != nil {
			c.off = true
			return len(buf)
		}
		rem, lenBytes, ok := decodeLength(buf[i+1:])
		if !ok {
			return i // incomplete
		}
		if rem < 0 {
			c.off = true
			return len(buf)
		}
		c.packets++
		if c.packets == 1 && fh.Type != packets.Connect {
			c.off = true
			return len(buf)
		}
		hlen := 1 + lenBytes
		if fh.Type == packets.Publish && c.packets > 1 && !c.v5 && c.max > 0 && rem+1 > c.max {
			c.pending = &cutPublish{flags: buf[i], remaining: rem, size: int64(hlen) + rem}
			c.unread = append(append([]byte(nil), buf[i+hlen:]...), c.unread...)
			return i
		}
		c.body = rem
		i += hlen
	}
	return i
}

// connectBytes takes b, the next bytes of the CONNECT's body, into head,
// and the protocol level from it once it is there.
func (c *cutReader) connectBytes(b []byte) {
	c.head = append(c.head, b[:min(len(b), connectHead-len(c.head))]...)
	if len(c.head) < 2 {
		return
	}
	name := int(binary.BigEndian.Uint16(c.head))
	if len(c.head) > 2+name {
		c.v5 = c.head[2+name] == 5
		c.level = true
	} else if len(c.head) == connectHead {
		c.level = true // not MQTT 3.1, 3.1.1 or 5: mochi refuses it
	}
}

// decodeLength decodes an MQTT variable byte integer at the start of b:
// its value and length, ok false if b ends before it does; a value of -1
// if it is malformed.
func decodeLength(b []byte) (v int64, n int, ok bool) {
	var mul int64 = 1
	for n < 4 {
		if n >= len(b) {
			return 0, 0, false
		}
		d := b[n]
		n++
		v += int64(d&0x7f) * mul
		if d&0x80 == 0 {
			return v, n, true
		}
		mul *= 128
	}
	return -1, n, true
}

// LongestCutTopic is the longest topic, in bytes, that a PUBLISH at QoS
// 1 or 2 over the embedded broker's bound maxPacket (its
// max_message_bytes) may have and still be cut to a dead-letter record
// (two bytes more at QoS 0): the cut packet, with its header, must fit
// under the bound itself. Such a PUBLISH with a longer topic ends the
// device's connection.
func LongestCutTopic(maxPacket int64) int64 { return maxPacket - 1 - cutHeadLen - 4 }

// errCutMalformed is returned for a too-large PUBLISH whose topic runs
// past its end.
var errCutMalformed = errors.New("mqtt broker: malformed PUBLISH over max_message_bytes: its topic runs past its end")

// cut reads the pending too-large PUBLISH: its topic and packet id, the
// first payload bytes the cut packet has room for, and the rest
// discarded; the cut packet goes to c.out. A PUBLISH whose topic alone
// leaves no room under the bound ends the connection as mochi would
// have (packets.ErrPacketTooLarge).
func (c *cutReader) cut() error {
	pk := c.pending
	c.pending = nil
	qos := (pk.flags >> 1) & 3
	var tl [2]byte
	if err := c.full(tl[:]); err != nil {
		return err
	}
	topicLen := int64(binary.BigEndian.Uint16(tl[:]))
	vh := 2 + topicLen
	if qos > 0 {
		vh += 2
	}
	if vh > pk.remaining {
		return errCutMalformed
	}
	head := c.buffer(int(vh))
	copy(head, tl[:])
	if err := c.full(head[2:]); err != nil {
		return err
	}
	// The cut packet must be within the bound itself: 1 + remaining.
	keep := min(pk.remaining-vh, DeadLetterKeep, c.max-1-vh-cutHeadLen)
	if keep < 0 {
		return fmt.Errorf("mqtt broker: a PUBLISH of %d bytes, over max_message_bytes (%d), whose topic leaves no room for its dead letter: %w",
			pk.size, c.max, packets.ErrPacketTooLarge)
	}
	rem := vh + cutHeadLen + keep
	var out bytes.Buffer
	out.Grow(int(rem) + 5)
	out.WriteByte(pk.flags &^ 1) // not retained
	_ = writeLength(&out, rem)
	out.Write(head)
	out.Write(c.mark[:])
	var size [8]byte
	binary.BigEndian.PutUint64(size[:], uint64(pk.size))
	out.Write(size[:])
	out.WriteByte(pk.flags & 1)
	kept := out.AvailableBuffer()[:keep]
	if err := c.full(kept); err != nil {
		return err
	}
	out.Write(kept)
	if err := c.discard(pk.remaining - vh - keep); err != nil {
		return err
	}
	c.out = out.Bytes()
	if cap(c.scratch) > 4<<10 {
		c.scratch = nil // a long topic's: not kept for the connection's life
	}
	return nil
}

// full reads len(b) bytes of the stream into b.
func (c *cutReader) full(b []byte) error {
	_, err := io.ReadFull(readerFunc(c.src), b)
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return err
}

// discard reads n bytes of the stream and drops them.
func (c *cutReader) discard(n int64) error {
	buf := make([]byte, min(n, 32<<10))
	for n > 0 {
		k, err := c.src(buf[:min(n, int64(len(buf)))])
		n -= int64(k)
		if err != nil && n > 0 {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
	}
	return nil
}

// readerFunc is an io.Reader of a function.
type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }

// writeLength writes n as an MQTT variable byte integer.
func writeLength(w *bytes.Buffer, n int64) error {
	for {
		d := byte(n % 128)
		n /= 128
		if n > 0 {
			d |= 0x80
		}
		w.WriteByte(d)
		if n == 0 {
			return nil
		}
	}
}

// uncut reports whether payload is the payload of a PUBLISH a cutReader
// of b's cut (it starts with b's mark), and returns the original
// packet's size, its retain flag and the kept payload bytes.
func (b *Broker) uncut(payload []byte) (size int64, retain bool, kept []byte, ok bool) {
	if len(payload) < cutHeadLen || !bytes.Equal(payload[:cutMarkLen], b.cutMark[:]) {
		return 0, false, nil, false
	}
	size = int64(binary.BigEndian.Uint64(payload[cutMarkLen:]))
	return size, payload[cutMarkLen+8] == 1, payload[cutHeadLen:], true
}
