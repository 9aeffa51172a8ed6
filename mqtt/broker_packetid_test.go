package mqtt

import (
	"testing"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/mqtt/ingestlog"
)

// TestSubscribeWithThePacketIDOfAnOutboundMessage: a client's packet ids
// and the broker's are assigned independently (MQTT 3.1.1 section 2.3.1),
// so a SUBSCRIBE or UNSUBSCRIBE may carry the id of a message the broker
// has in flight to that client, as it does when a persistent-session
// consumer reconnects while its queued results are being sent. Both are
// granted and answered under the client's own id, and the message in
// flight stays in flight.
func TestSubscribeWithThePacketIDOfAnOutboundMessage(t *testing.T) {
	b := startBroker(t, openLog(t, t.TempDir(), ingestlog.DefaultOptions()), "in/#")
	addr := b.Addr()

	c, _ := dialRaw(t, addr, "consumer", false)
	c.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Subscribe}, PacketID: 1,
		Filters: packets.Subscriptions{{Filter: "out/a", Qos: 1}}})
	if ack := c.expect(packets.Suback, 1); len(ack.ReasonCodes) != 1 || ack.ReasonCodes[0] != 1 {
		t.Fatalf("first SUBACK codes %v, want [1]", ack.ReasonCodes)
	}

	p, _ := dialRaw(t, addr, "producer", true)
	p.publish(1, 7, "out/a", []byte("r1"), false)
	p.expect(packets.Puback, 7)

	// The result in flight to the consumer, not acknowledged.
	msg := c.expect(packets.Publish, 0)
	id := msg.PacketID

	c.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Subscribe}, PacketID: id,
		Filters: packets.Subscriptions{{Filter: "out/b", Qos: 1}}})
	ack := c.expect(packets.Suback, id)
	if len(ack.ReasonCodes) != 1 || ack.ReasonCodes[0] != 1 {
		t.Fatalf("SUBACK of a SUBSCRIBE with the id %d of a message in flight: codes %v, want [1] (QoS 1 granted)", id, ack.ReasonCodes)
	}
	p.publish(1, 8, "out/b", []byte("r2"), false)
	p.expect(packets.Puback, 8)
	if got := c.expect(packets.Publish, 0); string(got.Payload) != "r2" {
		t.Fatalf("after the SUBSCRIBE got %q, want r2", got.Payload)
	}

	c.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Unsubscribe}, PacketID: id,
		Filters: packets.Subscriptions{{Filter: "out/b"}}})
	c.expect(packets.Unsuback, id)
	p.publish(1, 9, "out/b", []byte("r3"), false)
	p.expect(packets.Puback, 9)
	p.publish(1, 10, "out/a", []byte("r4"), false)
	p.expect(packets.Puback, 10)
	if got := c.expect(packets.Publish, 0); string(got.Payload) != "r4" {
		t.Fatalf("after the UNSUBSCRIBE of out/b got %q, want r4 (of out/a)", got.Payload)
	}

	// The first result is still in flight: a reconnect gets it again.
	c.conn.Close()
	c2, present := dialRaw(t, addr, "consumer", false)
	if !present {
		t.Fatal("session not present")
	}
	seen := map[string]bool{}
	for range 3 {
		seen[string(c2.expect(packets.Publish, 0).Payload)] = true
	}
	if !seen["r1"] || seen["r3"] {
		t.Fatalf("messages resent after the reconnect %v: want r1 (in flight during the SUBSCRIBE), r2 and r4, not r3", seen)
	}
}

// TestPublishWithThePacketIDOfAnOutboundMessage: a device that subscribes
// at QoS 1 and publishes at QoS 1 on one session may publish under the id
// of a message the broker has in flight to it. The publish is taken and
// acknowledged under its id, and the message in flight stays in flight: a
// reconnect before the device acknowledged it gets it again. Before, the
// broker dropped it from the session at the publish, and the reconnect got
// nothing.
func TestPublishWithThePacketIDOfAnOutboundMessage(t *testing.T) {
	l := openLog(t, t.TempDir(), ingestlog.DefaultOptions())
	b := startBroker(t, l, "in/#")
	addr := b.Addr()

	c, _ := dialRaw(t, addr, "dev", false)
	c.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Subscribe}, PacketID: 1,
		Filters: packets.Subscriptions{{Filter: "cmd/a", Qos: 1}}})
	c.expect(packets.Suback, 1)
	p, _ := dialRaw(t, addr, "producer", true)
	p.publish(1, 7, "cmd/a", []byte("c1"), false)
	p.expect(packets.Puback, 7)

	// The command in flight to the device, not acknowledged; the device
	// publishes a reading under the same id.
	msg := c.expect(packets.Publish, 0)
	c.publish(1, msg.PacketID, "in/x", []byte("reading"), false)
	c.expect(packets.Puback, msg.PacketID)
	if n := l.Stats().NextOffset; n != 1 {
		t.Fatalf("ingest log holds %d messages after the PUBACK, want 1 (the reading)", n)
	}

	c.conn.Close()
	c2, present := dialRaw(t, addr, "dev", false)
	if !present {
		t.Fatal("session not present")
	}
	again := c2.expect(packets.Publish, msg.PacketID)
	if string(again.Payload) != "c1" {
		t.Fatalf("resent %q under id %d, want c1", again.Payload, msg.PacketID)
	}
	// Acknowledged now, it is not sent again. The broker answers a
	// PINGREQ after it handled the packets before it: the PUBACK is
	// handled before the next connection takes the session over.
	c2.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Puback}, PacketID: msg.PacketID})
	c2.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Pingreq}})
	c2.expect(packets.Pingresp, 0)
	c2.conn.Close()
	c3, _ := dialRaw(t, addr, "dev", false)
	p.publish(1, 8, "cmd/a", []byte("c2"), false)
	p.expect(packets.Puback, 8)
	if got := c3.expect(packets.Publish, 0); string(got.Payload) != "c2" {
		t.Fatalf("after the acknowledgement got %q, want c2 (c1 was acknowledged)", got.Payload)
	}
}

// TestPublishWithThePacketIDOfAnOutboundPubrel: a result sent at QoS 2
// whose PUBREC the device sent waits for the device's PUBCOMP, the broker
// holding its PUBREL in flight under the result's id. A QoS 1 publish of
// the device under that id keeps the PUBREL in flight: a reconnect before
// the PUBCOMP gets the PUBREL again. Before, the broker dropped it from
// the session at the publish, and the reconnect got nothing.
func TestPublishWithThePacketIDOfAnOutboundPubrel(t *testing.T) {
	l := openLog(t, t.TempDir(), ingestlog.DefaultOptions())
	b := startBroker(t, l, "in/#")
	addr := b.Addr()

	c, _ := dialRaw(t, addr, "dev", false)
	c.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Subscribe}, PacketID: 1,
		Filters: packets.Subscriptions{{Filter: "cmd/a", Qos: 2}}})
	c.expect(packets.Suback, 1)
	p, _ := dialRaw(t, addr, "producer", true)
	p.publish(2, 7, "cmd/a", []byte("c1"), false)
	p.expect(packets.Pubrec, 7)
	p.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Pubrel, Qos: 1}, PacketID: 7})
	p.expect(packets.Pubcomp, 7)

	msg := c.expect(packets.Publish, 0)
	if msg.FixedHeader.Qos != 2 {
		t.Fatalf("result at QoS %d, want 2", msg.FixedHeader.Qos)
	}
	c.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Pubrec}, PacketID: msg.PacketID})
	c.expect(packets.Pubrel, msg.PacketID)

	// The PUBREL in flight, not completed; the device publishes a reading
	// under the same id.
	c.publish(1, msg.PacketID, "in/x", []byte("reading"), false)
	c.expect(packets.Puback, msg.PacketID)

	c.conn.Close()
	c2, present := dialRaw(t, addr, "dev", false)
	if !present {
		t.Fatal("session not present")
	}
	c2.expect(packets.Pubrel, msg.PacketID)
	c2.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Pubcomp}, PacketID: msg.PacketID})
	p.publish(1, 8, "cmd/a", []byte("c2"), false)
	p.expect(packets.Puback, 8)
	if got := c2.expect(packets.Publish, 0); string(got.Payload) != "c2" {
		t.Fatalf("after the PUBCOMP got %q, want c2", got.Payload)
	}
}

// holdPublishHook holds the handling of a PUBLISH to topic in OnPublish
// until release is closed, once entered is; done is closed once the
// broker's hooks have seen it processed.
type holdPublishHook struct {
	mochi.HookBase
	topic                  string
	read                   bool
	entered, release, done chan struct{}
}

func newHoldPublishHook(t *testing.T, b *Broker, topic string) *holdPublishHook {
	h := &holdPublishHook{topic: topic, entered: make(chan struct{}), release: make(chan struct{}), done: make(chan struct{})}
	if err := b.server.AddHook(h, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.let)
	return h
}

// let lets the held PUBLISH go on.
func (h *holdPublishHook) let() {
	select {
	case <-h.release:
	default:
		close(h.release)
	}
}

func (h *holdPublishHook) ID() string { return "test-hold-publish" }
func (h *holdPublishHook) Provides(b byte) bool {
	return b == mochi.OnPacketRead || b == mochi.OnPublish || b == mochi.OnPacketProcessed
}

// OnPacketRead holds the PUBLISH when read is set: before mochi handles
// it (the broker's hooks have read it), else in OnPublish.
func (h *holdPublishHook) OnPacketRead(_ *mochi.Client, pk packets.Packet) (packets.Packet, error) {
	if h.read && pk.FixedHeader.Type == packets.Publish && pk.TopicName == h.topic {
		close(h.entered)
		<-h.release
	}
	return pk, nil
}

func (h *holdPublishHook) OnPublish(_ *mochi.Client, pk packets.Packet) (packets.Packet, error) {
	if !h.read && pk.TopicName == h.topic {
		close(h.entered)
		<-h.release
	}
	return pk, nil
}
func (h *holdPublishHook) OnPacketProcessed(_ *mochi.Client, pk packets.Packet, _ error) {
	if pk.FixedHeader.Type == packets.Publish && pk.TopicName == h.topic {
		close(h.done)
	}
}

// TestPublishWithThePacketIDOfAnOutboundMessageDuringATakeover: the
// device reconnects (a new connection takes its session over) while the
// broker still handles its QoS 1 publish under the id of a result in
// flight to it. mochi copies the session's messages in flight to the new
// connection while that result is out of flight, and the old connection
// cannot write the PUBACK: the result goes to the new connection, sent
// again. Before, it was put back on the old connection only, and the
// device never got it again (until the broker restarted). Taken over
// before mochi handles the publish, mochi copies the result with the
// session.
func TestPublishWithThePacketIDOfAnOutboundMessageDuringATakeover(t *testing.T) {
	for _, read := range []bool{false, true} {
		name := "while handled"
		if read {
			name = "before handled"
		}
		t.Run(name, func(t *testing.T) { testPublishDuringATakeover(t, read) })
	}
}

func testPublishDuringATakeover(t *testing.T, read bool) {
	l := openLog(t, t.TempDir(), ingestlog.DefaultOptions())
	b := startBroker(t, l, "in/#")
	addr := b.Addr()
	hold := newHoldPublishHook(t, b, "in/held")
	hold.read = read

	c, _ := dialRaw(t, addr, "dev", false)
	c.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Subscribe}, PacketID: 1,
		Filters: packets.Subscriptions{{Filter: "cmd/a", Qos: 1}}})
	c.expect(packets.Suback, 1)
	p, _ := dialRaw(t, addr, "producer", true)
	p.publish(1, 7, "cmd/a", []byte("c1"), false)
	p.expect(packets.Puback, 7)
	msg := c.expect(packets.Publish, 0)

	c.publish(1, msg.PacketID, "in/held", []byte("reading"), false)
	testutil.Receive(t, waitBound, "the publish held", hold.entered)
	c2, present := dialRaw(t, addr, "dev", false)
	if !present {
		t.Fatal("session not present")
	}
	hold.let()
	again := c2.expect(packets.Publish, msg.PacketID)
	if string(again.Payload) != "c1" {
		t.Fatalf("after the takeover got %q under id %d, want c1", again.Payload, msg.PacketID)
	}
	// Acknowledged now, it is not sent again. The broker answers a
	// PINGREQ after it handled the packets before it: the PUBACK is
	// handled before the next connection takes the session over.
	c2.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Puback}, PacketID: msg.PacketID})
	c2.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Pingreq}})
	c2.expect(packets.Pingresp, 0)
	c2.conn.Close()
	c3, _ := dialRaw(t, addr, "dev", false)
	p.publish(1, 8, "cmd/a", []byte("c2"), false)
	p.expect(packets.Puback, 8)
	if got := c3.expect(packets.Publish, 0); string(got.Payload) != "c2" {
		t.Fatalf("after the acknowledgement got %q, want c2 (c1 was acknowledged)", got.Payload)
	}
}

// TestPublishWithThePacketIDOfAnOutboundMessageDuringACleanTakeover: a
// device that reconnects with a clean session while the broker handles
// its QoS 1 publish under the id of a result in flight to it does not get
// that result: its old session, the result included, is gone.
func TestPublishWithThePacketIDOfAnOutboundMessageDuringACleanTakeover(t *testing.T) {
	l := openLog(t, t.TempDir(), ingestlog.DefaultOptions())
	b := startBroker(t, l, "in/#")
	addr := b.Addr()
	hold := newHoldPublishHook(t, b, "in/held")

	c, _ := dialRaw(t, addr, "dev", false)
	c.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Subscribe}, PacketID: 1,
		Filters: packets.Subscriptions{{Filter: "cmd/a", Qos: 1}}})
	c.expect(packets.Suback, 1)
	p, _ := dialRaw(t, addr, "producer", true)
	p.publish(1, 7, "cmd/a", []byte("c1"), false)
	p.expect(packets.Puback, 7)
	msg := c.expect(packets.Publish, 0)

	c.publish(1, msg.PacketID, "in/held", []byte("reading"), false)
	testutil.Receive(t, waitBound, "the publish held", hold.entered)
	c2, present := dialRaw(t, addr, "dev", true)
	if present {
		t.Fatal("session present after a clean connect")
	}
	hold.let()
	testutil.Receive(t, waitBound, "the held publish processed", hold.done)
	c2.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Subscribe}, PacketID: 1,
		Filters: packets.Subscriptions{{Filter: "cmd/a", Qos: 1}}})
	c2.expect(packets.Suback, 1)
	p.publish(1, 8, "cmd/a", []byte("c2"), false)
	p.expect(packets.Puback, 8)
	if got := c2.expect(packets.Publish, 0); string(got.Payload) != "c2" {
		t.Fatalf("the clean session got %q first, want c2 (c1 was its old session's)", got.Payload)
	}
}

// TestPublishWithThePacketIDOfAnExpiredOutboundMessage: the expiry pass
// drops the result in flight under the id of the device's QoS 1 publish
// while the broker has read that publish and not yet handled it. The
// result stays dropped: before, the packet-id hook put it back in flight
// once the publish was handled, and a reconnecting device was sent the
// expired result, which the session journal had forgotten.
func TestPublishWithThePacketIDOfAnExpiredOutboundMessage(t *testing.T) {
	l := openLog(t, t.TempDir(), ingestlog.DefaultOptions())
	b := startBroker(t, l, "in/#")
	addr := b.Addr()
	hold := newHoldPublishHook(t, b, "in/held")
	hold.read = true

	c, _ := dialRaw(t, addr, "dev", false)
	c.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Subscribe}, PacketID: 1,
		Filters: packets.Subscriptions{{Filter: "cmd/a", Qos: 1}}})
	c.expect(packets.Suback, 1)
	p, _ := dialRaw(t, addr, "producer", true)
	p.publish(1, 7, "cmd/a", []byte("c1"), false)
	p.expect(packets.Puback, 7)
	msg := c.expect(packets.Publish, 0)

	c.publish(1, msg.PacketID, "in/held", []byte("reading"), false)
	testutil.Receive(t, waitBound, "the publish held", hold.entered)
	cl, ok := b.server.Clients.Get("dev")
	if !ok {
		t.Fatal("no client dev")
	}
	// A pass past the broker's longest message expiry.
	maxExpiry := time.Duration(b.server.Options.Capabilities.MaximumMessageExpiryInterval) * time.Second
	b.expirePass(time.Now().Add(maxExpiry+time.Hour), map[*mochi.Client]time.Time{})
	if _, ok := cl.State.Inflight.Get(msg.PacketID); ok {
		t.Fatal("the expiry pass left the result in flight")
	}
	hold.let()
	testutil.Receive(t, waitBound, "the held publish processed", hold.done)
	c.expect(packets.Puback, msg.PacketID)
	if out, ok := cl.State.Inflight.Get(msg.PacketID); ok {
		t.Fatalf("the expired result %q is in flight again under id %d", out.Payload, msg.PacketID)
	}
}

// TestPublishWithThePacketIDOfAnOutboundMessageDuringATakeoverAndARouting:
// as in the takeover above, and a message is routed to the new connection
// while the old one still handles the publish. The result keeps its id
// in the session, and the routed message gets another: before, the id
// was free on the new connection, the routed message took it, the result
// was not sent, and the device's PUBACK of that id ended the result in
// the session journal: it was never delivered.
func TestPublishWithThePacketIDOfAnOutboundMessageDuringATakeoverAndARouting(t *testing.T) {
	l := openLog(t, t.TempDir(), ingestlog.DefaultOptions())
	b := startBroker(t, l, "in/#")
	addr := b.Addr()
	hold := newHoldPublishHook(t, b, "in/held")

	c, _ := dialRaw(t, addr, "dev", false)
	c.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Subscribe}, PacketID: 1,
		Filters: packets.Subscriptions{{Filter: "cmd/a", Qos: 1}}})
	c.expect(packets.Suback, 1)
	p, _ := dialRaw(t, addr, "producer", true)
	p.publish(1, 7, "cmd/a", []byte("c1"), false)
	p.expect(packets.Puback, 7)
	msg := c.expect(packets.Publish, 0)

	c.publish(1, msg.PacketID, "in/held", []byte("reading"), false)
	testutil.Receive(t, waitBound, "the publish held", hold.entered)
	c2, _ := dialRaw(t, addr, "dev", false)
	again := c2.expect(packets.Publish, msg.PacketID)
	if string(again.Payload) != "c1" {
		t.Fatalf("after the takeover got %q under id %d, want c1", again.Payload, msg.PacketID)
	}
	p.publish(1, 8, "cmd/a", []byte("c2"), false)
	p.expect(packets.Puback, 8)
	routed := c2.expect(packets.Publish, 0)
	if string(routed.Payload) != "c2" || routed.PacketID == msg.PacketID {
		t.Fatalf("routed %q under id %d, want c2 under another id than %d", routed.Payload, routed.PacketID, msg.PacketID)
	}
	hold.let()
	testutil.Receive(t, waitBound, "the held publish processed", hold.done)
	c2.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Puback}, PacketID: routed.PacketID})
	c2.conn.Close()
	// c1 is still unacknowledged: the next connection gets it again.
	c3, _ := dialRaw(t, addr, "dev", false)
	if got := c3.expect(packets.Publish, msg.PacketID); string(got.Payload) != "c1" {
		t.Fatalf("after the reconnect got %q under id %d, want c1", got.Payload, msg.PacketID)
	}
}
