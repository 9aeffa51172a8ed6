package mqtt

import (
	"bufio"
	"bytes"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/mqtt/ingestlog"
)

// The embedded broker refuses a packet larger than max_message_bytes
// from its fixed header, before it reads or allocates the body: the
// client's connection is closed, PacketsTooLarge counts it, nothing is
// appended, and the next client's messages flow. An MQTT 5 client is
// told the bound in CONNACK (Maximum Packet Size).
func TestBrokerRefusesAPacketTooLarge(t *testing.T) {
	l := openLog(t, t.TempDir(), ingestlog.DefaultOptions())
	logs := &testutil.Buffer{}
	cfg := DefaultBrokerConfig()
	cfg.MaxMessageBytes = 1024
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	b := startBrokerCfg(t, l, cfg, nil)

	c, _ := dialRaw(t, b.Addr(), "big", true)
	// A PUBLISH claiming 256 MB: only its head is sent.
	head, _ := hugePublish("sensors/cam", 1)
	if _, err := c.conn.Write(head); err != nil {
		t.Fatal(err)
	}
	if pk, err := c.read(); err == nil {
		t.Fatalf("the broker answered a 256 MB PUBLISH with packet type %d", pk.FixedHeader.Type)
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
