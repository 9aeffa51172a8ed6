package mqtt

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/edgedio/edged/mqtt/ingestlog"
)

// rawClient speaks MQTT 3.1.1 (or 5, from dialRaw5) packet by packet
// over a net.Conn, for sequences paho cannot produce (a PUBLISH resent
// without its PUBREL, a crash between PUBREC and PUBREL, MQTT 5 topic
// aliases).
type rawClient struct {
	t       *testing.T
	conn    net.Conn
	r       *bufio.Reader
	version byte // protocol version: 4 (3.1.1) or 5
}

// dialRaw connects as id with the given clean-session flag and returns
// the client and the CONNACK's session-present flag.
func dialRaw(t *testing.T, addr, id string, clean bool) (*rawClient, bool) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c := &rawClient{t: t, conn: conn, r: bufio.NewReader(conn), version: 4}
	t.Cleanup(func() { conn.Close() })
	c.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Connect},
		Connect: packets.ConnectParams{ProtocolName: []byte("MQTT"), ClientIdentifier: id, Clean: clean, Keepalive: 60}})
	ack := c.expect(packets.Connack, 0)
	if ack.ReasonCode != 0 {
		t.Fatalf("connect %s: code %d", id, ack.ReasonCode)
	}
	return c, ack.SessionPresent
}

// dialRaw5 connects as id with MQTT 5 and a clean start, and returns the
// client and the CONNACK.
func dialRaw5(t *testing.T, addr, id string) (*rawClient, packets.Packet) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c := &rawClient{t: t, conn: conn, r: bufio.NewReader(conn), version: 5}
	t.Cleanup(func() { conn.Close() })
	c.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Connect},
		Connect: packets.ConnectParams{ProtocolName: []byte("MQTT"), ClientIdentifier: id, Clean: true, Keepalive: 60}})
	ack := c.expect(packets.Connack, 0)
	if ack.ReasonCode != 0 {
		t.Fatalf("connect %s: code %d", id, ack.ReasonCode)
	}
	return c, ack
}

func (c *rawClient) send(pk packets.Packet) {
	c.t.Helper()
	pk.ProtocolVersion = c.version
	var buf bytes.Buffer
	var err error
	switch pk.FixedHeader.Type {
	case packets.Connect:
		err = pk.ConnectEncode(&buf)
	case packets.Publish:
		err = pk.PublishEncode(&buf)
	case packets.Pubrel:
		pk.FixedHeader.Qos = 1
		err = pk.PubrelEncode(&buf)
	case packets.Puback:
		err = pk.PubackEncode(&buf)
	case packets.Pubrec:
		err = pk.PubrecEncode(&buf)
	case packets.Pubcomp:
		err = pk.PubcompEncode(&buf)
	case packets.Subscribe:
		pk.FixedHeader.Qos = 1
		err = pk.SubscribeEncode(&buf)
	case packets.Unsubscribe:
		pk.FixedHeader.Qos = 1
		err = pk.UnsubscribeEncode(&buf)
	case packets.Disconnect:
		err = pk.DisconnectEncode(&buf)
	case packets.Pingreq:
		err = pk.PingreqEncode(&buf)
	}
	if err != nil {
		c.t.Fatal(err)
	}
	if _, err := c.conn.Write(buf.Bytes()); err != nil {
		c.t.Fatalf("send %v: %v", pk.FixedHeader.Type, err)
	}
}

// read returns the next packet, or an error (the connection closed, or
// nothing within waitBound).
func (c *rawClient) read() (packets.Packet, error) {
	c.conn.SetReadDeadline(time.Now().Add(waitBound))
	hb, err := c.r.ReadByte()
	if err != nil {
		return packets.Packet{}, err
	}
	var pk packets.Packet
	if err := pk.FixedHeader.Decode(hb); err != nil {
		return pk, err
	}
	n, _, err := packets.DecodeLength(c.r)
	if err != nil {
		return pk, err
	}
	pk.FixedHeader.Remaining = n
	body := make([]byte, n)
	if _, err := io.ReadFull(c.r, body); err != nil {
		return pk, err
	}
	pk.ProtocolVersion = c.version
	switch pk.FixedHeader.Type {
	case packets.Disconnect:
		err = pk.DisconnectDecode(body)
	case packets.Connack:
		err = pk.ConnackDecode(body)
	case packets.Publish:
		err = pk.PublishDecode(body)
	case packets.Puback:
		err = pk.PubackDecode(body)
	case packets.Pubrec:
		err = pk.PubrecDecode(body)
	case packets.Pubrel:
		err = pk.PubrelDecode(body)
	case packets.Pubcomp:
		err = pk.PubcompDecode(body)
	case packets.Suback:
		err = pk.SubackDecode(body)
	case packets.Unsuback:
		err = pk.UnsubackDecode(body)
	}
	return pk, err
}

// expect reads the next packet and fails unless it is of type typ (and,
// for pid > 0, carries pid).
func (c *rawClient) expect(typ byte, pid uint16) packets.Packet {
	c.t.Helper()
	pk, err := c.read()
	if err != nil {
		c.t.Fatalf("waiting for packet type %d (id %d): %v", typ, pid, err)
	}
	if pk.FixedHeader.Type != typ || (pid > 0 && pk.PacketID != pid) {
		c.t.Fatalf("got packet type %d id %d, want type %d id %d", pk.FixedHeader.Type, pk.PacketID, typ, pid)
	}
	return pk
}

func (c *rawClient) publish(qos byte, pid uint16, topic string, payload []byte, dup bool) {
	c.t.Helper()
	c.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: qos, Dup: dup},
		PacketID: pid, TopicName: topic, Payload: payload})
}

// startBrokerCfg starts a broker with cfg (address 127.0.0.1:0 unless set)
// ingesting into l.
func startBrokerCfg(t *testing.T, l *ingestlog.Log, cfg BrokerConfig, stage func(string, string, uint16) error) *Broker {
	t.Helper()
	return startBrokerWith(t, l, cfg, func(b *Broker) { b.qos2Stage = stage })
}

// startBrokerWith starts a broker as startBrokerCfg does, calling set on
// it before Start.
func startBrokerWith(t *testing.T, l *ingestlog.Log, cfg BrokerConfig, set func(*Broker)) *Broker {
	t.Helper()
	if cfg.Address == "" || cfg.Address == DefaultBrokerAddress {
		// Never the default port: another broker (Mosquitto in CI, a
		// test of another package) may listen there.
		cfg.Address = "127.0.0.1:0"
	}
	if len(cfg.Filters) == 0 {
		cfg.Filters = []string{"#"}
	}
	b, err := NewBroker(cfg, l)
	if err != nil {
		t.Fatal(err)
	}
	set(b)
	if err := b.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// logPayloads reads every record of the log in dir (closed) and counts
// each payload.
func logPayloads(t *testing.T, dir string) map[string]int {
	t.Helper()
	l := openLog(t, dir, ingestlog.DefaultOptions())
	defer l.Close()
	out := map[string]int{}
	for _, rec := range readAll(t, l) {
		out[string(rec.Payload)]++
	}
	return out
}
