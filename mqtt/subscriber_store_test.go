package mqtt

import (
	"fmt"
	"slices"
	"testing"

	"github.com/eclipse/paho.mqtt.golang/packets"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/mqtt/ingestlog"
)

// The subscriber's paho store keeps no copy of inbound PUBLISH packets
// (paho discards them on reconnect anyway) but keeps everything else paho
// relies on: inbound PUBRELs of QoS 2 until the PUBCOMP, outbound
// packets until their acknowledgement.
func TestSubscriberStoreSkipsInboundPublish(t *testing.T) {
	s := newSubscriberStore()
	pub := func(qos byte) packets.ControlPacket {
		p := packets.NewControlPacket(packets.Publish).(*packets.PublishPacket)
		p.Qos, p.MessageID = qos, 5
		return p
	}
	s.Put("i.5", pub(1))
	s.Put("i.6", pub(2))
	if keys := s.All(); len(keys) != 0 || s.Get("i.5") != nil {
		t.Fatalf("inbound PUBLISH stored: %v", keys)
	}
	s.Del("i.5") // the PUBACK: nothing to delete
	rel := packets.NewControlPacket(packets.Pubrel)
	sub := packets.NewControlPacket(packets.Subscribe)
	out := pub(1)
	s.Put("i.6", rel)
	s.Put("o.1", sub)
	s.Put("o.2", out)
	keys := s.All()
	slices.Sort(keys)
	if !slices.Equal(keys, []string{"i.6", "o.1", "o.2"}) || s.Get("i.6") != rel || s.Get("o.2") != out {
		t.Fatalf("stored %v", keys)
	}
	s.Del("i.6")
	if s.Get("i.6") != nil || len(s.All()) != 2 {
		t.Fatalf("after Del: %v", s.All())
	}
	s.Reset()
	if len(s.All()) != 0 {
		t.Fatalf("after Reset: %v", s.All())
	}
	s.Del("o.1")
}

// A QoS 2 subscription goes through the store's PUBREL path: every
// message is appended once and acknowledged (PUBREC, then PUBCOMP for the
// broker's PUBREL), and the store ends empty.
func TestSubscriberQoS2(t *testing.T) { forEachClient(t, testSubscriberQoS2) }

func testSubscriberQoS2(t *testing.T, client string) {
	const n = 300
	br := startBroker(t, nil)
	l := openLog(t, t.TempDir(), ingestlog.DefaultOptions())
	sub := startSubscriberWith(t, SubscriberConfig{Broker: "tcp://" + br.Addr(), ClientID: "edged-qos2",
		Topics: []string{"sensors/#"}, QoS: 2, Client: client}, l)
	pub := connect(t, br.Addr(), "publisher-qos2")
	for i := range n {
		tok := pub.Publish(fmt.Sprintf("sensors/%d", i%7), 2, false, fmt.Appendf(nil, `{"seq":%d}`, i))
		if !tok.WaitTimeout(waitBound) || tok.Error() != nil {
			t.Fatalf("publish %d: %v", i, tok.Error())
		}
	}
	waitAppends(t, l, n)
	// Every PUBREL went through the store (the path under test), and
	// left it with its PUBCOMP.
	if client == ClientPaho {
		testutil.Eventually(t, waitBound, "the store kept every PUBREL and is empty again", func() bool {
			return sub.store.stored.Load() >= n && len(sub.store.All()) == 0
		})
	}
	// The broker holds no message for the subscriber any more: every
	// PUBREC reached it, and every PUBREL was answered with PUBCOMP.
	testutil.Eventually(t, waitBound, "the broker's inflight for the subscriber is empty", func() bool {
		cl, ok := br.server.Clients.Get("edged-qos2")
		return ok && cl.State.Inflight.Len() == 0
	})
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	if next := l.Stats().NextOffset; next != n {
		t.Fatalf("log holds %d records, want %d", next, n)
	}
}
