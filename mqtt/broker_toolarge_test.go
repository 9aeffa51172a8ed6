package mqtt

import (
	"bufio"
	"bytes"
	"io"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/mqtt/ingestlog"
)

// A PUBLISH over max_message_bytes from an MQTT 3.1.1 device, which
// cannot be told the bound, becomes a dead-letter record (its topic, size
// and first DeadLetterKeep bytes), acknowledged once durable, neither
// retained nor routed to subscribers: the device is not left resending it
// at every reconnect, and its next message flows. PacketsTooLarge and
// DeadLetters count it, and it is logged.
func TestBrokerDeadLettersAPublishOverTheBound(t *testing.T) {
	b, l, logs := startSmallBroker(t)

	sub := connect(t, b.Addr(), "watcher")
	got := make(chan string, 10)
	if tok := sub.Subscribe("sensors/#", 1, func(_ paho.Client, m paho.Message) { got <- string(m.Payload()) }); !tok.WaitTimeout(waitBound) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}

	c, _ := dialRaw(t, b.Addr(), "big", false)
	big := bytes.Repeat([]byte("0123456789"), 400)
	c.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1, Retain: true}, PacketID: 1, TopicName: "sensors/cam", Payload: big})
	c.expect(packets.Puback, 1)
	c.publish(1, 2, "sensors/a", []byte(`{"seq":2}`), false)
	c.expect(packets.Puback, 2)

	recs := readAll(t, l)
	if len(recs) != 2 || recs[0].Topic != "sensors/cam" || recs[0].TooLarge != publishSize(len("sensors/cam"), len(big), 1) ||
		!bytes.Equal(recs[0].Payload, big[:DeadLetterKeep]) || !recs[0].Retain || recs[1].TooLarge != 0 || string(recs[1].Payload) != `{"seq":2}` {
		t.Fatalf("log holds %+v", recs)
	}
	if b.PacketsTooLarge() != 1 || b.DeadLetters() != 1 {
		t.Fatalf("PacketsTooLarge %d, DeadLetters %d; want 1 and 1", b.PacketsTooLarge(), b.DeadLetters())
	}
	testutil.Eventually(t, waitBound, "the dead letter logged", func() bool {
		return strings.Contains(logs.String(), "message too large (over max_message_bytes, or over an ingest-log record); its payload discarded")
	})
	// The subscriber got the next message only, and nothing was retained.
	if m := testutil.Receive(t, waitBound, "the message after the big one", got); m != `{"seq":2}` {
		t.Fatalf("subscriber got %q first", m)
	}
	late := connect(t, b.Addr(), "late")
	retained := make(chan string, 1)
	if tok := late.Subscribe("sensors/cam", 1, func(_ paho.Client, m paho.Message) { retained <- string(m.Payload()) }); !tok.WaitTimeout(waitBound) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	c.publish(0, 0, "sensors/cam", []byte("after"), false) // the sync point: it reaches "late" after any retained message would
	if m := testutil.Receive(t, waitBound, "the message after the subscription", retained); m != "after" {
		t.Fatalf("a new subscriber got %q: the cut message was retained", m)
	}
}

// A broker that feeds no ingest log acknowledges a 3.1.1 device's PUBLISH
// over the bound and routes nothing of it: its subscribers never see the
// cut packet.
func TestBrokerWithoutLogsDropsAPublishOverTheBound(t *testing.T) {
	cfg := DefaultBrokerConfig()
	cfg.MaxMessageBytes = 1024
	b := startBrokerCfg(t, nil, cfg, nil)
	sub := connect(t, b.Addr(), "watcher")
	got := make(chan string, 10)
	if tok := sub.Subscribe("sensors/#", 1, func(_ paho.Client, m paho.Message) { got <- string(m.Payload()) }); !tok.WaitTimeout(waitBound) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	c, _ := dialRaw(t, b.Addr(), "big", true)
	c.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1}, PacketID: 1, TopicName: "sensors/cam", Payload: bytes.Repeat([]byte("x"), 4096)})
	c.expect(packets.Puback, 1)
	c.publish(1, 2, "sensors/a", []byte("small"), false)
	c.expect(packets.Puback, 2)
	if m := testutil.Receive(t, waitBound, "the message after the big one", got); m != "small" {
		t.Fatalf("subscriber got %q first", m)
	}
	if n := b.PacketsTooLarge(); n != 1 {
		t.Fatalf("PacketsTooLarge %d, want 1", n)
	}
}

// startSmallBroker starts a broker whose max_message_bytes is 1024,
// ingesting into a log; it returns them and the broker's log output.
func startSmallBroker(t *testing.T) (*Broker, *ingestlog.Log, *testutil.Buffer) {
	t.Helper()
	l := openLog(t, t.TempDir(), ingestlog.DefaultOptions())
	logs := &testutil.Buffer{}
	cfg := DefaultBrokerConfig()
	cfg.MaxMessageBytes = 1024
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	return startBrokerCfg(t, l, cfg, nil), l, logs
}

// A device that streams a 32 MB PUBLISH costs the broker its read buffers
// and the bytes it keeps, not the payload: the rest is discarded as it
// arrives.
func TestBrokerCutsAHugePublishInBoundedMemory(t *testing.T) {
	b, l, _ := startSmallBroker(t)
	c, _ := dialRaw(t, b.Addr(), "huge", true)
	const payload = 32 << 20
	var head bytes.Buffer
	head.WriteByte(0x32)
	if err := writeLength(&head, int64(2+len("sensors/cam")+2+payload)); err != nil {
		t.Fatal(err)
	}
	head.Write([]byte{0, byte(len("sensors/cam"))})
	head.WriteString("sensors/cam")
	head.Write([]byte{0, 9})
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	if _, err := c.conn.Write(head.Bytes()); err != nil {
		t.Fatal(err)
	}
	chunk := bytes.Repeat([]byte("z"), 64<<10)
	for sent := 0; sent < payload; sent += len(chunk) {
		if _, err := c.conn.Write(chunk); err != nil {
			t.Fatal(err)
		}
	}
	c.expect(packets.Puback, 9)
	runtime.ReadMemStats(&after)
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > payload/8 {
		t.Fatalf("the broker allocated %d bytes for a %d-byte payload", alloc, payload)
	}
	recs := readAll(t, l)
	if len(recs) != 1 || recs[0].TooLarge != int64(head.Len())+payload || len(recs[0].Payload) != DeadLetterKeep {
		t.Fatalf("log holds %+v", recs)
	}
}

// An MQTT 5 client is told the bound in CONNACK (Maximum Packet Size); a
// packet over it ends its connection without being read, counted and
// logged, and the next client's messages flow.
func TestBrokerRefusesAnMQTT5PacketTooLarge(t *testing.T) {
	b, l, logs := startSmallBroker(t)

	c5, _ := dialRaw5(t, b.Addr(), "big5")
	// A PUBLISH claiming 256 MB: only its head is sent.
	head, _ := hugePublish("sensors/cam", 1)
	if _, err := c5.conn.Write(head); err != nil {
		t.Fatal(err)
	}
	for {
		pk, err := c5.read()
		if err != nil {
			break
		}
		if pk.FixedHeader.Type != packets.Disconnect {
			t.Fatalf("the broker answered a 256 MB PUBLISH with packet type %d", pk.FixedHeader.Type)
		}
	}
	// The refusal is counted, then logged: both, in that order.
	testutil.Eventually(t, waitBound, "the refusal counted and logged", func() bool {
		return strings.Contains(logs.String(), "packet larger than max_message_bytes")
	})
	if n := b.PacketsTooLarge(); n != 1 {
		t.Fatalf("%d refusals counted, want 1", n)
	}

	c2, _ := dialRaw(t, b.Addr(), "small", true)
	c2.publish(1, 1, "sensors/a", bytes.Repeat([]byte("p"), 1024-1-2-2-len("sensors/a")-2), false)
	c2.expect(packets.Puback, 1)
	if n := l.Stats().NextOffset; n != 1 {
		t.Fatalf("log holds %d records, want 1", n)
	}

	// MQTT 5: the CONNACK carries the bound.
	conn, err := net.Dial("tcp", b.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var buf bytes.Buffer
	connect := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Connect}, ProtocolVersion: 5,
		Connect: packets.ConnectParams{ProtocolName: []byte("MQTT"), ClientIdentifier: "v5", Clean: true, Keepalive: 60}}
	if err := connect.ConnectEncode(&buf); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write(buf.Bytes()); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(waitBound))
	r := bufio.NewReader(conn)
	hb, err := r.ReadByte()
	if err != nil {
		t.Fatal(err)
	}
	ack := packets.Packet{ProtocolVersion: 5}
	if err := ack.FixedHeader.Decode(hb); err != nil {
		t.Fatal(err)
	}
	n, _, err := packets.DecodeLength(r)
	if err != nil {
		t.Fatal(err)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		t.Fatal(err)
	}
	if err := ack.ConnackDecode(body); err != nil {
		t.Fatal(err)
	}
	if ack.FixedHeader.Type != packets.Connack || ack.Properties.MaximumPacketSize != 1024 {
		t.Fatalf("CONNACK type %d with Maximum Packet Size %d, want 1024", ack.FixedHeader.Type, ack.Properties.MaximumPacketSize)
	}
}

// A QoS 1 message within the broker's bound but larger than a record of
// the ingest log (its segments are small) is appended as a dead-letter
// record, counted, and acknowledged: the device is not left resending it
// forever. The next message flows.
func TestBrokerDeadLettersAMessageLargerThanARecord(t *testing.T) {
	opts := ingestlog.DefaultOptions()
	opts.SegmentBytes = 1024
	l := openLog(t, t.TempDir(), opts)
	b := startBrokerCfg(t, l, DefaultBrokerConfig(), nil)
	pub := connect(t, b.Addr(), "device")
	for i, payload := range [][]byte{bytes.Repeat([]byte("x"), 4096), []byte(`{"seq":2}`)} {
		tok := pub.Publish("sensors/a", 1, false, payload)
		if !tok.WaitTimeout(waitBound) || tok.Error() != nil {
			t.Fatalf("publish %d: not acknowledged: %v", i, tok.Error())
		}
	}
	recs := readAll(t, l)
	if len(recs) != 2 || recs[0].TooLarge != publishSize(len("sensors/a"), 4096, 1) ||
		len(recs[0].Payload) != DeadLetterKeep || recs[1].TooLarge != 0 || string(recs[1].Payload) != `{"seq":2}` {
		t.Fatalf("log holds %+v", recs)
	}
	if b.DeadLetters() != 1 || b.PacketsTooLarge() != 0 {
		t.Fatalf("DeadLetters %d, PacketsTooLarge %d; want 1 and 0", b.DeadLetters(), b.PacketsTooLarge())
	}
}

// The paho reader reads a packet whole, but a message larger than
// max_message_bytes still ends as one dead-letter record, counted and
// acknowledged (the broker holds nothing in flight for the subscriber
// after it), and the next message flows.
func TestPahoTooLargeMessageIsDeadLettered(t *testing.T) {
	b := startBroker(t, nil)
	l := openLog(t, t.TempDir(), ingestlog.DefaultOptions())
	sub := startSubscriberWith(t, SubscriberConfig{Broker: "tcp://" + b.Addr(), ClientID: "edged-paho-big",
		Topics: []string{"sensors/#"}, Client: ClientPaho, MaxMessageBytes: 1024}, l)
	pub := connect(t, b.Addr(), "device")
	for i, payload := range [][]byte{bytes.Repeat([]byte("x"), 4096), []byte(`{"seq":2}`)} {
		tok := pub.Publish("sensors/a", 1, false, payload)
		if !tok.WaitTimeout(waitBound) || tok.Error() != nil {
			t.Fatalf("publish %d: %v", i, tok.Error())
		}
	}
	testutil.Eventually(t, waitBound, "both in the log", func() bool { return l.Stats().DurableOffset == 2 })
	recs := readAll(t, l)
	if len(recs) != 2 || recs[0].TooLarge != publishSize(len("sensors/a"), 4096, 1) || len(recs[0].Payload) != DeadLetterKeep ||
		recs[1].TooLarge != 0 || sub.TooLarge() != 1 {
		t.Fatalf("log holds %+v; TooLarge %d", recs, sub.TooLarge())
	}
	testutil.Eventually(t, waitBound, "nothing in flight for the subscriber", func() bool {
		cl, ok := b.Server().Clients.Get("edged-paho-big")
		return ok && cl.State.Inflight.Len() == 0
	})
}
