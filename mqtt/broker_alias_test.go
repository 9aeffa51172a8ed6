package mqtt

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/mqtt/ingestlog"
)

// publish5 encodes an MQTT 5 PUBLISH by hand: topic (may be empty),
// packet id pid for qos > 0, and a Topic Alias property when alias >= 0
// (0 included, which mochi's encoder leaves out).
func publish5(qos byte, pid uint16, topic string, alias int, payload []byte) []byte {
	var vh bytes.Buffer
	vh.Write(binary.BigEndian.AppendUint16(nil, uint16(len(topic))))
	vh.WriteString(topic)
	if qos > 0 {
		vh.Write(binary.BigEndian.AppendUint16(nil, pid))
	}
	var props []byte
	if alias >= 0 {
		props = append([]byte{packets.PropTopicAlias}, binary.BigEndian.AppendUint16(nil, uint16(alias))...)
	}
	vh.Write(varint(len(props)))
	vh.Write(props)
	vh.Write(payload)
	out := []byte{packets.Publish<<4 | qos<<1}
	out = append(out, varint(vh.Len())...)
	return append(out, vh.Bytes()...)
}

// varint encodes n as an MQTT variable byte integer.
func varint(n int) []byte {
	var b []byte
	for {
		d := byte(n % 128)
		n /= 128
		if n > 0 {
			d |= 0x80
		}
		b = append(b, d)
		if n == 0 {
			return b
		}
	}
}

func (c *rawClient) write(b []byte) {
	c.t.Helper()
	if _, err := c.conn.Write(b); err != nil {
		c.t.Fatal(err)
	}
}

// expectDisconnect reads the next packet, which must be a DISCONNECT with
// reason code, and then the end of the connection.
func (c *rawClient) expectDisconnect(code byte) {
	c.t.Helper()
	pk, err := c.read()
	if err != nil {
		c.t.Fatalf("waiting for DISCONNECT 0x%x: %v", code, err)
	}
	if pk.FixedHeader.Type != packets.Disconnect || pk.ReasonCode != code {
		c.t.Fatalf("got packet type %d (reason 0x%x, id %d), want DISCONNECT with reason 0x%x", pk.FixedHeader.Type, pk.ReasonCode, pk.PacketID, code)
	}
	if pk, err := c.read(); err == nil {
		c.t.Fatalf("after the DISCONNECT: packet type %d, want the connection closed", pk.FixedHeader.Type)
	}
}

// loggedMessages returns the topic and payload of every record of l.
func loggedMessages(t *testing.T, l *ingestlog.Log) []string {
	t.Helper()
	var out []string
	for _, r := range readAll(t, l) {
		out = append(out, r.Topic+" "+string(r.Payload))
	}
	return out
}

// An MQTT 5 PUBLISH with an empty topic and a topic alias the client
// never set is a protocol error (MQTT 5, 3.3.2.3.4): the broker never
// acknowledges it, logs nothing of it and ends the connection with
// DISCONNECT 0x94 (Topic Alias invalid), so the device knows and can
// resend it with its topic. A known alias stands for its topic.
func TestBrokerRefusesAnUnknownTopicAlias(t *testing.T) {
	for _, qos := range []byte{0, 1, 2} {
		t.Run(fmt.Sprintf("qos%d", qos), func(t *testing.T) {
			l := openLog(t, t.TempDir(), ingestlog.DefaultOptions())
			b := startBrokerCfg(t, l, BrokerConfig{}, nil)
			c, _ := dialRaw5(t, b.Addr(), "dev")
			c.write(publish5(1, 1, "sensors/a", 1, []byte("one")))
			c.expect(packets.Puback, 1)
			c.write(publish5(1, 2, "", 1, []byte("two"))) // the alias set above
			c.expect(packets.Puback, 2)

			var pid uint16
			if qos > 0 {
				pid = 3
			}
			c.write(publish5(qos, pid, "", 2, []byte("three"))) // alias 2 was never set
			c.expectDisconnect(packets.ErrTopicAliasInvalid.Code)
			if got, want := fmt.Sprint(loggedMessages(t, l)), "[sensors/a one sensors/a two]"; got != want {
				t.Fatalf("logged %s, want %s", got, want)
			}
		})
	}
}

// The broker tells an MQTT 5 client its Topic Alias Maximum in CONNACK;
// an alias above it, or alias 0, is refused as an unknown one is.
func TestBrokerRefusesAnInvalidTopicAlias(t *testing.T) {
	l := openLog(t, t.TempDir(), ingestlog.DefaultOptions())
	b := startBrokerCfg(t, l, BrokerConfig{}, nil)
	for _, alias := range []int{0, topicAliasMaximum + 1} {
		c, ack := dialRaw5(t, b.Addr(), fmt.Sprintf("dev-%d", alias))
		if got := ack.Properties.TopicAliasMaximum; got != topicAliasMaximum {
			t.Fatalf("CONNACK's Topic Alias Maximum = %d, want %d", got, topicAliasMaximum)
		}
		c.write(publish5(1, 1, "sensors/a", topicAliasMaximum, []byte("max"))) // the largest alias is taken
		c.expect(packets.Puback, 1)
		c.write(publish5(1, 2, "sensors/b", alias, []byte("bad")))
		c.expectDisconnect(packets.ErrTopicAliasInvalid.Code)
	}
	if got, want := fmt.Sprint(loggedMessages(t, l)), "[sensors/a max sensors/a max]"; got != want {
		t.Fatalf("logged %s, want %s", got, want)
	}
}

// A device whose connection the broker ends for a bad topic alias, known
// or out of range, did not disconnect: its will is published, and goes
// to the ingest log like its readings (MQTT 5, 3.1.2.5).
func TestBrokerSendsTheWillOfAClientRefusedForItsAlias(t *testing.T) {
	l := openLog(t, t.TempDir(), ingestlog.DefaultOptions())
	b := startBroker(t, l, "sensors/#")
	for i, alias := range []int{2, 0, topicAliasMaximum + 1} { // never set, 0, above the maximum
		id := fmt.Sprintf("dev-%d", i)
		conn, err := net.Dial("tcp", b.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		c := &rawClient{t: t, conn: conn, r: bufio.NewReader(conn), version: 5}
		c.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Connect}, Connect: packets.ConnectParams{
			ProtocolName: []byte("MQTT"), ClientIdentifier: id, Clean: true, Keepalive: 60,
			WillFlag: true, WillTopic: "sensors/will/" + id, WillPayload: []byte("offline"), WillQos: 1}})
		c.expect(packets.Connack, 0)
		c.write(publish5(1, 1, "", alias, []byte("bad")))
		c.expectDisconnect(packets.ErrTopicAliasInvalid.Code)
		testutil.Eventually(t, waitBound, "the will of "+id+" in the log", func() bool { return l.Stats().DurableOffset >= uint64(i+1) })
	}
	if got, want := fmt.Sprint(loggedMessages(t, l)), "[sensors/will/dev-0 offline sensors/will/dev-1 offline sensors/will/dev-2 offline]"; got != want {
		t.Fatalf("logged %s, want %s", got, want)
	}
}

// The DISCONNECT for a bad alias reaches the device after the
// acknowledgements of its earlier messages, also when those wait for an
// fsync when the bad PUBLISH arrives: the broker does not close the
// connection with the acknowledgement and the DISCONNECT held unsent.
func TestBrokerTopicAliasDisconnectFollowsHeldAcknowledgements(t *testing.T) {
	for _, c := range []struct {
		name  string
		topic string
		alias int
	}{
		{"unknown", "", 2},
		{"zero", "sensors/b", 0},
		{"above the maximum", "sensors/b", topicAliasMaximum + 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := openLog(t, t.TempDir(), ingestlog.DefaultOptions())
			logs := &testutil.Buffer{}
			release := make(chan struct{})
			var once sync.Once
			b := startBrokerWith(t, l, BrokerConfig{Logger: slog.New(slog.NewTextHandler(logs, nil))}, func(b *Broker) {
				b.durableWait = func(lg *ingestlog.Log, off uint64) error {
					<-release
					return lg.WaitDurable(off)
				}
			})
			t.Cleanup(func() { once.Do(func() { close(release) }) }) // before the broker's Close
			dev, _ := dialRaw5(t, b.Addr(), "dev")
			dev.write(publish5(1, 1, "sensors/a", 1, []byte("one"))) // its PUBACK waits for release
			dev.write(publish5(1, 2, c.topic, c.alias, []byte("bad")))
			testutil.Eventually(t, waitBound, "the broker to refuse the alias", func() bool {
				return strings.Contains(logs.String(), "PUBLISH with an invalid topic alias")
			})
			once.Do(func() { close(release) })
			dev.expect(packets.Puback, 1)
			dev.expectDisconnect(packets.ErrTopicAliasInvalid.Code)
			if got, want := fmt.Sprint(loggedMessages(t, l)), "[sensors/a one]"; got != want {
				t.Fatalf("logged %s, want %s", got, want)
			}
		})
	}
}
