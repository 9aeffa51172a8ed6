package mqtt

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/mqtt/ingestlog"
)

// scriptBroker accepts connections on 127.0.0.1 and hands each to the
// test as a scriptConn, so that a test can script exactly what a broker
// sends, including what no well-behaved broker would.
type scriptBroker struct {
	ln    net.Listener
	conns chan *scriptConn
}

func startScriptBroker(t *testing.T) *scriptBroker {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fb := &scriptBroker{ln: ln, conns: make(chan *scriptConn, 16)}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fb.conns <- &scriptConn{t: t, c: c, r: bufio.NewReader(c)}
		}
	})
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
		close(fb.conns)
		for c := range fb.conns {
			c.c.Close()
		}
	})
	return fb
}

// next returns the next connection the subscriber opened.
func (fb *scriptBroker) next(t *testing.T) *scriptConn {
	t.Helper()
	select {
	case c := <-fb.conns:
		t.Cleanup(func() { c.c.Close() })
		return c
	case <-time.After(waitBound):
		t.Fatal("the subscriber did not connect")
		return nil
	}
}

// scriptConn is the broker's end of one connection.
type scriptConn struct {
	t *testing.T
	c net.Conn
	r *bufio.Reader
}

// read reads the next packet the subscriber sent, decoded with mochi.
func (sc *scriptConn) read() (packets.Packet, error) {
	_ = sc.c.SetReadDeadline(time.Now().Add(waitBound))
	hb, err := sc.r.ReadByte()
	if err != nil {
		return packets.Packet{}, err
	}
	pk := packets.Packet{ProtocolVersion: 4}
	if err := pk.FixedHeader.Decode(hb); err != nil {
		return pk, err
	}
	n, _, err := packets.DecodeLength(sc.r)
	if err != nil {
		return pk, err
	}
	pk.FixedHeader.Remaining = n
	body := make([]byte, n)
	if _, err := io.ReadFull(sc.r, body); err != nil {
		return pk, err
	}
	switch pk.FixedHeader.Type {
	case packets.Connect:
		err = pk.ConnectDecode(body)
	case packets.Subscribe:
		err = pk.SubscribeDecode(body)
	case packets.Puback:
		err = pk.PubackDecode(body)
	case packets.Pubrec:
		err = pk.PubrecDecode(body)
	case packets.Pubcomp:
		err = pk.PubcompDecode(body)
	}
	return pk, err
}

// expect reads the next packet and fails the test unless it is of type typ.
func (sc *scriptConn) expect(typ byte) packets.Packet {
	sc.t.Helper()
	pk, err := sc.read()
	if err != nil {
		sc.t.Fatalf("read %s: %v", packets.PacketNames[typ], err)
	}
	if pk.FixedHeader.Type != typ {
		sc.t.Fatalf("got %s, want %s", packets.PacketNames[pk.FixedHeader.Type], packets.PacketNames[typ])
	}
	return pk
}

// send writes raw bytes.
func (sc *scriptConn) send(b []byte) {
	sc.t.Helper()
	if _, err := sc.c.Write(b); err != nil {
		sc.t.Fatalf("write: %v", err)
	}
}

// encode returns pk encoded by mochi, as MQTT 3.1.1.
func encode(t testing.TB, pk packets.Packet) []byte {
	t.Helper()
	return encodeVersion(t, 4, pk)
}

// encodeVersion returns pk encoded by mochi for protocol version v.
func encodeVersion(t testing.TB, v byte, pk packets.Packet) []byte {
	t.Helper()
	pk.ProtocolVersion = v
	var buf bytes.Buffer
	var err error
	switch pk.FixedHeader.Type {
	case packets.Connect:
		if pk.Connect.ProtocolName == nil {
			pk.Connect.ProtocolName = []byte("MQTT")
		}
		err = pk.ConnectEncode(&buf)
	case packets.Connack:
		err = pk.ConnackEncode(&buf)
	case packets.Suback:
		err = pk.SubackEncode(&buf)
	case packets.Publish:
		err = pk.PublishEncode(&buf)
	case packets.Puback:
		err = pk.PubackEncode(&buf)
	case packets.Pubrel:
		err = pk.PubrelEncode(&buf)
	case packets.Pingreq:
		err = pk.PingreqEncode(&buf)
	default:
		t.Fatalf("encode %d", pk.FixedHeader.Type)
	}
	if err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// handshake answers CONNECT with CONNACK code and, if code is 0,
// SUBSCRIBE with SUBACK codes; it returns the CONNECT.
func (sc *scriptConn) handshake(code byte, subCodes ...byte) packets.Packet {
	sc.t.Helper()
	conn := sc.expect(packets.Connect)
	sc.send(encode(sc.t, packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Connack}, ReasonCode: code}))
	if code != 0 {
		return conn
	}
	sub := sc.expect(packets.Subscribe)
	sc.send(encode(sc.t, packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Suback}, PacketID: sub.PacketID, ReasonCodes: subCodes}))
	return conn
}

// closed waits until the subscriber closed its end.
func (sc *scriptConn) closed() {
	sc.t.Helper()
	for {
		pk, err := sc.read()
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || strings.Contains(err.Error(), "reset") {
				return
			}
			sc.t.Fatalf("waiting for the subscriber to close: %v", err)
		}
		_ = pk // acks of what was sent before
	}
}

func startDirect(t *testing.T, cfg SubscriberConfig, l *ingestlog.Log) (*Subscriber, *testutil.Buffer) {
	t.Helper()
	logs := &testutil.Buffer{}
	cfg.Client = ClientDirect
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	s, err := NewSubscriber(cfg, l)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, logs
}

func publishPacket(t *testing.T, id uint16, dup bool, topic, payload string) []byte {
	return encode(t, packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1, Dup: dup},
		PacketID: id, TopicName: topic, Payload: []byte(payload)})
}

// The direct reader connects with a persistent session, the keep-alive
// and the URL's user name and password, subscribes at the configured QoS,
// and acknowledges a message only once it is in the log. A malformed
// packet from the broker closes the connection (no panic); the reader
// reconnects, the broker redelivers the unacknowledged message with DUP,
// and it is dropped as the redelivery of the record in the log: nothing
// lost, nothing twice.
func TestDirectMalformedPacketReconnects(t *testing.T) {
	fb := startScriptBroker(t)
	l := openLog(t, t.TempDir(), ingestlog.DefaultOptions())
	sub, logs := startDirect(t, SubscriberConfig{Broker: "tcp://user:secret@" + fb.ln.Addr().String(), ClientID: "edged-malformed",
		Topics: []string{"sensors/#"}, QoS: 2}, l)
	c1 := fb.next(t)
	conn := c1.handshake(0, 2)
	if conn.Connect.Clean || conn.Connect.ClientIdentifier != "edged-malformed" || conn.Connect.Keepalive != 30 ||
		string(conn.Connect.Username) != "user" || string(conn.Connect.Password) != "secret" {
		t.Fatalf("CONNECT %+v", conn.Connect)
	}
	// A QoS 1 message, then a PUBLISH whose topic length runs past its end.
	c1.send(append(publishPacket(t, 1, false, "sensors/a", `{"seq":1}`), 0x32, 0x03, 0x00, 0x09, 'x'))
	c1.closed()
	testutil.Eventually(t, waitBound, "the malformed packet logged", func() bool {
		return strings.Contains(logs.String(), "malformed packet from the broker")
	})

	c2 := fb.next(t)
	c2.handshake(0, 2)
	c2.send(publishPacket(t, 1, true, "sensors/a", `{"seq":1}`))
	if ack := c2.expect(packets.Puback); ack.PacketID != 1 {
		t.Fatalf("PUBACK of %d, want 1", ack.PacketID)
	}
	if got := l.Stats().DurableOffset; got != 1 {
		t.Fatalf("log holds %d records, want 1", got)
	}
	if sub.Dropped() != 1 || sub.connects.Load() != 2 {
		t.Fatalf("dropped %d, connects %d; want 1 and 2", sub.Dropped(), sub.connects.Load())
	}
}

// A refused CONNACK is logged with its reason and retried; a SUBACK that
// refuses every filter is logged, the connection given up and retried,
// and Ready stays open until a subscription is granted.
func TestDirectRefusalsAreLoggedAndRetried(t *testing.T) {
	fb := startScriptBroker(t)
	l := openLog(t, t.TempDir(), ingestlog.DefaultOptions())
	sub, logs := startDirect(t, SubscriberConfig{Broker: "tcp://" + fb.ln.Addr().String(), ClientID: "edged-refused",
		Topics: []string{"sensors/#"}}, l)
	fb.next(t).handshake(5)
	testutil.Eventually(t, waitBound, "the refusal logged", func() bool {
		return strings.Contains(logs.String(), "broker refused the connection: not authorized (return code 5)")
	})
	c2 := fb.next(t)
	c2.handshake(0, 0x80)
	c2.closed()
	if !strings.Contains(logs.String(), "subscription refused") || !strings.Contains(logs.String(), "broker refused the subscription") {
		t.Fatalf("logs:\n%s", logs.String())
	}
	select {
	case <-sub.Ready():
		t.Fatal("Ready after a refused subscription")
	default:
	}
	fb.next(t).handshake(0, 1)
	testutil.Eventually(t, waitBound, "subscribed", func() bool {
		select {
		case <-sub.Ready():
			return true
		default:
			return false
		}
	})
}

// Against Mosquitto, the direct reader keeps an idle connection alive
// with PINGREQs (a broker drops a client silent for 1.5 keep-alives) and
// reads the PINGRESPs.
func TestDirectKeepAlive(t *testing.T) {
	addr := startMosquitto(t, "")
	l := openLog(t, t.TempDir(), ingestlog.DefaultOptions())
	logs := &testutil.Buffer{}
	s, err := NewSubscriber(SubscriberConfig{Broker: "tcp://" + addr, ClientID: "edged-ping", Topics: []string{"sensors/#"},
		Client: ClientDirect, Logger: slog.New(slog.NewTextHandler(logs, nil))}, l)
	if err != nil {
		t.Fatal(err)
	}
	s.keepAlive = time.Second
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	testutil.Eventually(t, waitBound, "three PINGRESPs", func() bool { return s.pings.Load() >= 3 })
	if n := s.connects.Load(); n != 1 {
		t.Fatalf("%d connections, want 1 (kept alive); logs:\n%s", n, logs)
	}
}

func TestNextBackoff(t *testing.T) {
	for _, c := range []struct{ cur, limit, want time.Duration }{
		{0, 10 * time.Second, time.Second},
		{time.Second, 10 * time.Second, 2 * time.Second},
		{8 * time.Second, 10 * time.Second, 10 * time.Second},
		{10 * time.Second, 10 * time.Second, 10 * time.Second},
	} {
		if got := nextBackoff(c.cur, c.limit); got != c.want {
			t.Errorf("nextBackoff(%v, %v) = %v, want %v", c.cur, c.limit, got, c.want)
		}
	}
}

// The client is chosen by the broker's scheme unless set; direct does not
// dial WebSocket, and an unknown client is refused, naming the key.
func TestSubscriberClientConfig(t *testing.T) {
	base := SubscriberConfig{Pipeline: "p", Topics: []string{"a/#"}}
	for broker, want := range map[string]string{"tcp://h:1": ClientDirect, "ssl://h:1": ClientDirect, "ws://h:1": ClientPaho} {
		c := base
		c.Broker = broker
		if got := c.withDefaults().Client; got != want {
			t.Errorf("%s: client %s, want %s", broker, got, want)
		}
	}
	c := base
	c.Broker, c.Client = "ws://h:1", ClientDirect
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "source.mqtt.client (direct)") {
		t.Errorf("direct over ws: %v", err)
	}
	c.Broker, c.Client = "tcp://h:1", "mosquitto"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), `source.mqtt.client ("mosquitto")`) {
		t.Errorf("unknown client: %v", err)
	}
}

// FuzzDirectReadPackets feeds arbitrary bytes, one byte per read or as
// they come, to the direct reader's packet reading and decoding, with no
// bound on packets or with a small one (bound, plus 16): it never panics,
// a PUBLISH it decodes encodes and decodes to the same message, and a
// PUBLISH over the bound is read by readTooLarge, which keeps at most
// the bytes asked for.
func FuzzDirectReadPackets(f *testing.F) {
	var seed bytes.Buffer
	for _, pk := range []packets.Packet{
		{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1, Dup: true}, PacketID: 7, TopicName: "a/b", Payload: []byte("x")},
		{FixedHeader: packets.FixedHeader{Type: packets.Publish}, TopicName: "t", Payload: []byte(`{"v":1}`)},
		{FixedHeader: packets.FixedHeader{Type: packets.Suback}, PacketID: 1, ReasonCodes: []byte{1, 0x80}},
		{FixedHeader: packets.FixedHeader{Type: packets.Pubrel, Qos: 1}, PacketID: 9},
	} {
		seed.Write(encode(f, pk))
	}
	seed.Write([]byte{0xd0, 0x00}) // PINGRESP
	f.Add(seed.Bytes(), false, uint8(0))
	f.Add(seed.Bytes(), true, uint8(1))
	f.Add([]byte{0x32, 0x03, 0x00, 0x09, 'x'}, true, uint8(0))
	f.Add([]byte{0x30, 0xff, 0xff, 0xff, 0xff, 0x7f}, false, uint8(0))
	f.Add([]byte{0x32, 0x30, 0x00, 0x01, 'a', 0x00, 0x07, 'p', 'q'}, false, uint8(4))
	f.Fuzz(func(t *testing.T, data []byte, oneByte bool, bound uint8) {
		var r io.Reader = bytes.NewReader(data)
		if oneByte {
			r = iotest.OneByteReader(r)
		}
		dc := &directConn{r: bufio.NewReaderSize(r, 64)} // a small buffer: bodies past it too
		if bound > 0 {
			dc.maxPacket = 16 + int64(bound)
		}
		for {
			fh, body, err := dc.readPacket()
			if errors.Is(err, errPacketTooLarge) && fh.Type == packets.Publish {
				in, size, err := dc.readTooLarge(fh, 8)
				if err != nil {
					return
				}
				if size <= dc.maxPacket || len(in.payload) > 8 || int64(len(in.topic)+len(in.payload)) > size ||
					(fh.Qos > 0) != (in.id != 0) {
					t.Fatalf("readTooLarge: topic %q, %d payload bytes, id %d, size %d (bound %d)", in.topic, len(in.payload), in.id, size, dc.maxPacket)
				}
				continue
			}
			if err != nil {
				return
			}
			if dc.maxPacket > 0 && int64(len(body)) >= dc.maxPacket {
				t.Fatalf("read a body of %d bytes with a bound of %d", len(body), dc.maxPacket)
			}
			in, err := decodeInbound(fh, body)
			if err != nil {
				if !errors.Is(err, ErrMalformedPacket) {
					t.Fatalf("decode error %v is not ErrMalformedPacket", err)
				}
				return
			}
			if fh.Type != packets.Publish {
				continue
			}
			pk := packets.Packet{FixedHeader: fh, ProtocolVersion: 4, TopicName: in.topic, Payload: in.payload, PacketID: in.id}
			var buf bytes.Buffer
			if err := pk.PublishEncode(&buf); err != nil {
				t.Fatalf("encode a decoded PUBLISH: %v", err)
			}
			again := &directConn{r: bufio.NewReader(&buf)}
			fh2, body2, err := again.readPacket()
			if err != nil {
				t.Fatal(err)
			}
			in2, err := decodeInbound(fh2, body2)
			if err != nil || in2.topic != in.topic || !bytes.Equal(in2.payload, in.payload) || in2.id != in.id ||
				fh2.Qos != fh.Qos || fh2.Dup != fh.Dup || fh2.Retain != fh.Retain {
				t.Fatalf("PUBLISH %q %q id %d round trip: %q %q id %d, %v", in.topic, in.payload, in.id, in2.topic, in2.payload, in2.id, err)
			}
		}
	})
}

// A PUBLISH whose topic is not valid UTF-8 (a broker that does not check
// its publishers passes one on) is taken as it is, as paho takes it, and
// acknowledged once in the log: refused, it would drop the connection and
// come back on every session, and the subscription would never get past
// it. A topic length beyond the packet is still malformed.
func TestDirectTakesATopicThatIsNotUTF8(t *testing.T) {
	fb := startScriptBroker(t)
	l := openLog(t, t.TempDir(), ingestlog.DefaultOptions())
	startDirect(t, SubscriberConfig{Broker: "tcp://" + fb.ln.Addr().String(), ClientID: "utf8", Topics: []string{"s/#"}, QoS: 1}, l)
	c := fb.next(t)
	c.handshake(0, 1)
	c.send(publishPacket(t, 5, false, "s/\xffa", "x"))
	if ack := c.expect(packets.Puback); ack.PacketID != 5 {
		t.Fatalf("PUBACK of packet %d, want 5", ack.PacketID)
	}
	r, err := l.Reader(0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	rec, ok, err := r.TryNext()
	if err != nil || !ok || rec.Topic != "s/\xffa" || string(rec.Payload) != "x" {
		t.Fatalf("log holds %+v (%v, %v), want the message on topic %q", rec, ok, err, "s/\xffa")
	}

	for _, body := range [][]byte{{0}, {0, 9, 's'}, {0, 1, 's', 0}} {
		if _, _, _, err := rawPublish(packets.FixedHeader{Type: packets.Publish, Qos: 1}, body); err == nil {
			t.Fatalf("rawPublish(%v) took a malformed body", body)
		}
	}
	topic, id, payload, err := rawPublish(packets.FixedHeader{Type: packets.Publish, Qos: 1}, []byte{0, 2, 'a', 0xff, 1, 2, 'p'})
	if err != nil || topic != "a\xff" || id != 258 || string(payload) != "p" {
		t.Fatalf("rawPublish: %q %d %q %v", topic, id, payload, err)
	}
}

// A QoS 2 message the subscriber received and answered with PUBREC, whose
// PUBREL never came (the broker died), is resent by a broker restarted
// from its persistence file on the resumed session under the same packet
// identifier but without DUP: Mosquitto 2.0 does so. Until the PUBREL the
// identifier names that message (MQTT 3.1.1 4.3.3), so it is answered
// with PUBREC again and not logged twice. Once the PUBREL released the
// identifier, a message under it is new and is logged, even with the same
// content; so is one on a session the broker did not resume.
func TestDirectQoS2ResentWithoutDupBeforePubrel(t *testing.T) {
	fb := startScriptBroker(t)
	l := openLog(t, t.TempDir(), ingestlog.DefaultOptions())
	sub, _ := startDirect(t, SubscriberConfig{Broker: "tcp://" + fb.ln.Addr().String(), ClientID: "edged-qos2",
		Topics: []string{"sensors/#"}, QoS: 2}, l)
	qos2 := func(id uint16, dup bool, payload string) []byte {
		return encode(t, packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 2, Dup: dup},
			PacketID: id, TopicName: "sensors/a", Payload: []byte(payload)})
	}
	pubrel := func(id uint16) []byte {
		return encode(t, packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Pubrel, Qos: 1}, PacketID: id})
	}
	expectID := func(sc *scriptConn, typ byte, id uint16) {
		t.Helper()
		if pk := sc.expect(typ); pk.PacketID != id {
			t.Fatalf("%s of %d, want %d", packets.PacketNames[typ], pk.PacketID, id)
		}
	}
	resume := func(present bool) *scriptConn {
		sc := fb.next(t)
		sc.expect(packets.Connect)
		sc.send(encode(t, packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Connack}, SessionPresent: present}))
		if !present {
			sub := sc.expect(packets.Subscribe)
			sc.send(encode(t, packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Suback}, PacketID: sub.PacketID, ReasonCodes: []byte{2}}))
		}
		return sc
	}
	records := func() uint64 { return l.Stats().DurableOffset }

	c1 := fb.next(t)
	c1.handshake(0, 2)
	c1.send(qos2(7, false, `{"v":1}`))
	expectID(c1, packets.Pubrec, 7)
	c1.c.Close() // the broker dies before its PUBREL

	c2 := resume(true)
	c2.send(qos2(7, false, `{"v":1}`)) // resent without DUP
	expectID(c2, packets.Pubrec, 7)
	c2.send(pubrel(7))
	expectID(c2, packets.Pubcomp, 7)
	if n := records(); n != 1 {
		t.Fatalf("the log holds %d records after the resend, want 1", n)
	}
	if sub.Dropped() != 1 {
		t.Fatalf("dropped %d, want 1", sub.Dropped())
	}

	// Released: the same identifier and content is a new message.
	c2.send(qos2(7, false, `{"v":1}`))
	expectID(c2, packets.Pubrec, 7)
	testutil.Eventually(t, waitBound, "the new message under the released identifier logged", func() bool { return records() == 2 })

	// Not released, but the broker does not resume the session: new.
	c2.c.Close()
	c3 := resume(false)
	c3.send(qos2(7, false, `{"v":1}`))
	expectID(c3, packets.Pubrec, 7)
	testutil.Eventually(t, waitBound, "the message on a new session logged", func() bool { return records() == 3 })
	if sub.Dropped() != 1 {
		t.Fatalf("dropped %d, want 1", sub.Dropped())
	}
}

// The subscriber tells whether it holds a connection the broker
// accepted: not before the CONNACK, yes after it, not once the broker
// ends the connection (nor while the next attempt waits for its
// CONNACK), yes again after the next CONNACK, whose log line says how
// long the subscriber was without a connection.
func TestDirectConnectedFollowsTheConnection(t *testing.T) {
	fb := startScriptBroker(t)
	l := openLog(t, t.TempDir(), ingestlog.DefaultOptions())
	sub, logs := startDirect(t, SubscriberConfig{Broker: "tcp://user:secret@" + fb.ln.Addr().String(), ClientID: "edged-connected",
		Topics: []string{"sensors/#"}, QoS: 1}, l)
	c1 := fb.next(t)
	c1.expect(packets.Connect)
	if sub.Connected() {
		t.Fatal("connected before the CONNACK")
	}
	c1.send(encode(t, packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Connack}}))
	sb := c1.expect(packets.Subscribe)
	c1.send(encode(t, packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Suback}, PacketID: sb.PacketID, ReasonCodes: []byte{1}}))
	testutil.Eventually(t, waitBound, "connected after the CONNACK", sub.Connected)
	if n := sub.Connects(); n != 1 {
		t.Fatalf("connects %d, want 1", n)
	}
	if strings.Contains(logs.String(), "down_for") {
		t.Fatalf("the first connection logged an outage:\n%s", logs.String())
	}

	c1.c.Close() // the broker goes away
	testutil.Eventually(t, waitBound, "not connected once the broker ended the connection", func() bool { return !sub.Connected() })
	c2 := fb.next(t)
	c2.expect(packets.Connect)
	if sub.Connected() {
		t.Fatal("connected while the next attempt waits for its CONNACK")
	}
	c2.send(encode(t, packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Connack}}))
	c2.expect(packets.Subscribe)
	testutil.Eventually(t, waitBound, "connected again after the second CONNACK", sub.Connected)
	if n := sub.Connects(); n != 2 {
		t.Fatalf("connects %d, want 2", n)
	}
	if !strings.Contains(logs.String(), "down_for=") {
		t.Fatalf("the reconnection does not say how long the subscriber was down:\n%s", logs.String())
	}
	sub.Close()
	if sub.Connected() {
		t.Fatal("connected after Close")
	}
	// The URL names the broker in every line, without its password.
	if strings.Contains(logs.String(), "secret") || !strings.Contains(logs.String(), "broker=tcp://user:xxxxx@") {
		t.Fatalf("the logs show the broker's password, or no broker:\n%s", logs.String())
	}
	if b := sub.Broker(); b != "tcp://user:xxxxx@"+fb.ln.Addr().String() {
		t.Fatalf("Broker() = %q", b)
	}
}
