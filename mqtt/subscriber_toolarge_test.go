package mqtt

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"runtime"
	"strings"
	"testing"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/edgedio/edged/mqtt/ingestlog"
)

// hugeStream is a peer's byte stream: a PUBLISH header claiming a body of
// claimed bytes, then that body made up on demand (never held), then
// tail. It records the largest read asked of it.
type hugeStream struct {
	head    []byte
	body    int64 // bytes of the claimed body still to serve
	tail    []byte
	maxRead int
}

func (h *hugeStream) Read(p []byte) (int, error) {
	h.maxRead = max(h.maxRead, len(p))
	switch {
	case len(h.head) > 0:
		n := copy(p, h.head)
		h.head = h.head[n:]
		return n, nil
	case h.body > 0:
		n := int(min(int64(len(p)), h.body))
		clear(p[:n])
		for i := 0; i < n; i += 4096 {
			p[i] = 'x'
		}
		h.body -= int64(n)
		return n, nil
	case len(h.tail) > 0:
		n := copy(p, h.tail)
		h.tail = h.tail[n:]
		return n, nil
	}
	return 0, io.EOF
}

// hugePublish returns a QoS 1 PUBLISH head (fixed header, remaining
// length, topic, packet identifier) for a packet whose remaining length
// is the largest MQTT allows, and the payload bytes that follow it.
func hugePublish(topic string, id uint16) ([]byte, int64) {
	const remaining = 268435455
	head := []byte{0x32, 0xff, 0xff, 0xff, 0x7f, byte(len(topic) >> 8), byte(len(topic))}
	head = append(head, topic...)
	head = append(head, byte(id>>8), byte(id))
	return head, remaining - int64(2+len(topic)+2)
}

// A peer that claims a 256 MB PUBLISH costs the direct reader no more
// than its read buffer and the bytes it keeps: readPacket refuses the
// packet from its remaining length, before it allocates anything for
// the body, readTooLarge keeps the topic, the packet identifier and the
// first DeadLetterKeep bytes and discards the rest through the read
// buffer, and the next packet on the stream is read as usual.
func TestDirectReaderMemoryBoundedForAHugePacket(t *testing.T) {
	head, payload := hugePublish("sensors/cam", 7)
	next := encode(t, packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1}, PacketID: 8,
		TopicName: "sensors/a", Payload: []byte(`{"seq":8}`)})
	src := &hugeStream{head: head, body: payload, tail: next}
	dc := &directConn{r: bufio.NewReaderSize(src, connReadBuffer), maxPacket: 1 << 20}

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	fh, body, err := dc.readPacket()
	if !errors.Is(err, errPacketTooLarge) || fh.Type != packets.Publish || body != nil {
		t.Fatalf("readPacket = %v, %d bytes, %v; want the PUBLISH refused as too large", fh, len(body), err)
	}
	in, size, err := dc.readTooLarge(fh, DeadLetterKeep)
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	if in.topic != "sensors/cam" || in.id != 7 || len(in.payload) != DeadLetterKeep || in.payload[0] != 'x' ||
		size != 1+4+268435455 {
		t.Fatalf("read topic %q, id %d, %d payload bytes, size %d", in.topic, in.id, len(in.payload), size)
	}
	alloc := after.TotalAlloc - before.TotalAlloc
	if alloc > 1<<20 {
		t.Fatalf("reading a %d-byte packet allocated %d bytes (bound 1 MiB)", size, alloc)
	}
	t.Logf("a %d-byte PUBLISH read with %d bytes allocated, reads of at most %d bytes", size, alloc, src.maxRead)
	if src.maxRead > connReadBuffer {
		t.Fatalf("a read of %d bytes was asked of the connection (buffer %d)", src.maxRead, connReadBuffer)
	}
	if src.body != 0 {
		t.Fatalf("%d bytes of the packet left unread", src.body)
	}
	fh, body, err = dc.readPacket()
	if err != nil {
		t.Fatalf("the packet after: %v", err)
	}
	if in, err := decodeInbound(fh, body); err != nil || in.id != 8 || string(in.payload) != `{"seq":8}` {
		t.Fatalf("the packet after: %+v, %v", in, err)
	}

	// Any other packet that large is malformed; so is a too-large
	// PUBLISH whose topic runs past it.
	dc = &directConn{r: bufio.NewReader(bytes.NewReader([]byte{0x90, 0xff, 0xff, 0xff, 0x7f})), maxPacket: 1 << 20}
	if _, _, err := dc.readPacket(); !errors.Is(err, ErrMalformedPacket) || !errors.Is(err, errPacketTooLarge) {
		t.Fatalf("a 256 MB SUBACK: %v", err)
	}
	dc = &directConn{r: bufio.NewReader(bytes.NewReader([]byte{0x30, 0x80, 0x01, 0xff, 0xff})), maxPacket: 64}
	fh, _, err = dc.readPacket()
	if !errors.Is(err, errPacketTooLarge) {
		t.Fatalf("a 131-byte PUBLISH with a bound of 64: %v", err)
	}
	if _, _, err := dc.readTooLarge(fh, DeadLetterKeep); !errors.Is(err, ErrMalformedPacket) {
		t.Fatalf("a topic length beyond the packet: %v", err)
	}
}

// publishOfSize returns a QoS 1 PUBLISH of exactly size bytes on topic.
func publishOfSize(t *testing.T, id uint16, dup bool, topic string, size int) []byte {
	t.Helper()
	for n := size - (1 + 2 + 2 + len(topic) + 2); n >= 0; n-- {
		b := publishPacket(t, id, dup, topic, strings.Repeat("p", n))
		if len(b) == size {
			return b
		}
	}
	t.Fatalf("no PUBLISH of %d bytes", size)
	return nil
}

// A QoS 1 message larger than max_message_bytes, read by the direct
// reader, ends as one dead-letter record (its topic, size and first
// bytes) and is acknowledged once that is durable; the next message
// flows, a message of exactly the bound is taken whole, one byte over is
// a dead letter. A redelivery of the too-large message, on the next
// connection or after a restart of the subscriber, is acknowledged
// without a second record: it is a dead letter exactly once. The Source
// hands the record on as a Message whose Err wraps ErrMessageTooLarge.
func TestDirectTooLargeMessageIsDeadLetteredOnceAndAcknowledged(t *testing.T) {
	const bound = 1024
	fb := startScriptBroker(t)
	l := openLog(t, t.TempDir(), ingestlog.DefaultOptions())
	cfg := SubscriberConfig{Broker: "tcp://" + fb.ln.Addr().String(), ClientID: "edged-big", Topics: []string{"s/#"},
		MaxMessageBytes: bound}
	sub, logs := startDirect(t, cfg, l)
	c1 := fb.next(t)
	c1.handshake(0, 1)
	big := publishOfSize(t, 1, false, "s/big", 64<<10)
	var stream []byte
	stream = append(stream, big...)
	stream = append(stream, publishPacket(t, 2, false, "s/a", `{"seq":2}`)...)
	stream = append(stream, publishOfSize(t, 3, false, "s/at", bound)...)
	stream = append(stream, publishOfSize(t, 4, false, "s/over", bound+1)...)
	c1.send(stream)
	for want := uint16(1); want <= 4; want++ {
		if ack := c1.expect(packets.Puback); ack.PacketID != want {
			t.Fatalf("PUBACK of %d, want %d", ack.PacketID, want)
		}
	}
	recs := readAll(t, l)
	if len(recs) != 4 {
		t.Fatalf("log holds %d records, want 4", len(recs))
	}
	if r := recs[0]; r.Topic != "s/big" || r.TooLarge != int64(len(big)) || len(r.Payload) != DeadLetterKeep || r.PacketID != 1 {
		t.Fatalf("record 0: topic %q, too large %d, %d payload bytes, packet id %d", r.Topic, r.TooLarge, len(r.Payload), r.PacketID)
	}
	if r := recs[1]; r.TooLarge != 0 || string(r.Payload) != `{"seq":2}` {
		t.Fatalf("record 1: %+v", r)
	}
	if r := recs[2]; r.TooLarge != 0 || publishSize(len(r.Topic), len(r.Payload), 1) != bound {
		t.Fatalf("record 2: too large %d, a packet of %d bytes", r.TooLarge, publishSize(len(r.Topic), len(r.Payload), 1))
	}
	if r := recs[3]; r.TooLarge != bound+1 || r.Topic != "s/over" {
		t.Fatalf("record 3: topic %q, too large %d", r.Topic, r.TooLarge)
	}
	if sub.TooLarge() != 2 || !strings.Contains(logs.String(), "recorded as a dead letter") {
		t.Fatalf("TooLarge %d; logs:\n%s", sub.TooLarge(), logs)
	}

	// The broker redelivers the dead letter on the next session.
	c1.c.Close()
	c2 := fb.next(t)
	c2.handshake(0, 1)
	c2.send(publishOfSize(t, 1, true, "s/big", 64<<10))
	if ack := c2.expect(packets.Puback); ack.PacketID != 1 {
		t.Fatalf("PUBACK of %d, want 1", ack.PacketID)
	}
	if n := len(readAll(t, l)); n != 4 || sub.Dropped() != 1 {
		t.Fatalf("after the redelivery: %d records, %d dropped; want 4 and 1", n, sub.Dropped())
	}

	// And again after a restart of the subscriber (the window is loaded
	// from the log).
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	sub2, _ := startDirect(t, cfg, l)
	c3 := fb.next(t)
	c3.handshake(0, 1)
	c3.send(publishOfSize(t, 1, true, "s/big", 64<<10))
	if ack := c3.expect(packets.Puback); ack.PacketID != 1 {
		t.Fatalf("PUBACK of %d, want 1", ack.PacketID)
	}
	if n := len(readAll(t, l)); n != 4 || sub2.Dropped() != 1 || sub2.TooLarge() != 0 {
		t.Fatalf("after a restart: %d records, %d dropped, %d too large; want 4, 1, 0", n, sub2.Dropped(), sub2.TooLarge())
	}

	src := NewSource(l)
	if err := src.Open(opCtx(0)); err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	msgs := drain(t, src)
	if len(msgs) != 4 || !errors.Is(msgs[0].Err(), ErrMessageTooLarge) || msgs[1].Err() != nil || msgs[2].Err() != nil ||
		!errors.Is(msgs[3].Err(), ErrMessageTooLarge) {
		t.Fatalf("the source emitted %d messages: %+v", len(msgs), msgs)
	}
	if e := msgs[0].Err().Error(); !strings.Contains(e, `"s/big"`) || !strings.Contains(e, "65536 bytes") {
		t.Fatalf("Err = %q", e)
	}
}

// max_message_bytes is checked: below the smallest packet worth taking,
// above the largest MQTT packet, or above what one record of the log
// holds, it is refused, naming the key.
func TestMaxMessageBytesConfig(t *testing.T) {
	base := SubscriberConfig{Broker: "tcp://127.0.0.1:1", Pipeline: "p", Topics: []string{"a/#"}}
	if got := base.withDefaults().MaxMessageBytes; got != DefaultMaxMessageBytes {
		t.Fatalf("default %d, want %d", got, DefaultMaxMessageBytes)
	}
	for _, v := range []int64{-1, 10, MaxPacketBytes + 1} {
		c := base
		c.MaxMessageBytes = v
		if err := c.Validate(); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "source.mqtt.max_message_bytes") {
			t.Errorf("max_message_bytes %d: %v", v, err)
		}
	}
	opts := ingestlog.DefaultOptions()
	opts.SegmentBytes = 64 << 10
	l := openLog(t, t.TempDir(), opts)
	c := base
	c.MaxMessageBytes = l.MaxMessageBytes() + 1
	if _, err := NewSubscriber(c, l); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "ingest-log record") {
		t.Fatalf("max_message_bytes above a record: %v", err)
	}
	c.MaxMessageBytes = l.MaxMessageBytes()
	if _, err := NewSubscriber(c, l); err != nil {
		t.Fatalf("max_message_bytes of a record: %v", err)
	}
	bc := DefaultBrokerConfig()
	bc.MaxMessageBytes = MaxPacketBytes + 1
	if err := bc.Validate(); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "broker.max_message_bytes") {
		t.Fatalf("broker.max_message_bytes: %v", err)
	}
}

// A message too large whose topic leaves less room in one record than
// DeadLetterKeep (a log with small segments) still becomes a dead-letter
// record, with fewer payload bytes, and is acknowledged: it is not left
// unacknowledged for redelivery forever.
func TestDirectTooLargeWithALongTopicFitsItsDeadLetter(t *testing.T) {
	fb := startScriptBroker(t)
	opts := ingestlog.DefaultOptions()
	opts.SegmentBytes = 1024
	l := openLog(t, t.TempDir(), opts)
	lm := l.MaxMessageBytes()
	cfg := SubscriberConfig{Broker: "tcp://" + fb.ln.Addr().String(), ClientID: "edged-long-topic", Topics: []string{"s/#"}, MaxMessageBytes: lm}
	sub, logs := startDirect(t, cfg, l)
	c := fb.next(t)
	c.handshake(0, 1)
	topic := "s/" + strings.Repeat("t", int(lm)-100)
	c.send(publishPacket(t, 1, false, topic, strings.Repeat("p", 200)))
	c.send(publishPacket(t, 2, false, "s/a", `{"seq":2}`))
	for _, want := range []uint16{1, 2} {
		if p := c.expect(packets.Puback); p.PacketID != want {
			t.Fatalf("PUBACK for %d, want %d; logs:\n%s", p.PacketID, want, logs)
		}
	}
	recs := readAll(t, l)
	if len(recs) != 2 || recs[0].TooLarge == 0 || recs[0].Topic != topic || int64(len(recs[0].Topic)+len(recs[0].Payload)) > lm || recs[1].TooLarge != 0 {
		t.Fatalf("records %d (first too large %d, %d payload bytes), want the dead letter then the message", len(recs), recs[0].TooLarge, len(recs[0].Payload))
	}
	if sub.TooLarge() != 1 {
		t.Errorf("TooLarge = %d, want 1", sub.TooLarge())
	}
}
