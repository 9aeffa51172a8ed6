package mqtt

import (
	"fmt"
	"testing"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/edgedio/edged/mqtt/ingestlog"
)

// An MQTT 3.1.1 device may keep any number of QoS 2 messages open (sent,
// not yet released by its PUBREL): 3.1.1 has no Receive Maximum, so the
// device cannot know of one. A device that queued readings while the
// node was stopped sends them all when it reconnects, each waiting for
// its PUBREC, which waits for the fsync. Before, the broker closed the
// connection at the 1025th open message ("receive maximum exceeded",
// the broker library's default Receive Maximum, which only an MQTT 5
// device is told), and the device, resending them all at each reconnect,
// was closed again and again: seen with a paho device at 700 QoS 2
// readings/s across an `edged stop` and start, disconnected every few
// seconds for over a minute, its readings arriving late. Both protocol
// versions: 5 devices are told their bound, and kept to it.
func TestBrokerTakesMoreOpenQoS2MessagesThanTheReceiveMaximumFromA311Device(t *testing.T) {
	l := openLog(t, t.TempDir(), ingestlog.DefaultOptions())
	b := startBrokerCfg(t, l, BrokerConfig{DataDir: t.TempDir()}, nil)
	for _, clean := range []bool{true, false} {
		c, _ := dialRaw(t, b.Addr(), fmt.Sprintf("dev-%t", clean), clean)
		const n = 1100
		for i := 1; i <= n; i++ {
			c.publish(2, uint16(i), "sensors/a", fmt.Appendf(nil, "%t-%d", clean, i), false)
		}
		for i := 1; i <= n; i++ {
			pk, err := c.read()
			if err != nil || pk.FixedHeader.Type != packets.Pubrec || pk.PacketID != uint16(i) {
				t.Fatalf("clean session %t: PUBREC %d of %d open messages: got type %d id %d code %#x, %v",
					clean, i, n, pk.FixedHeader.Type, pk.PacketID, pk.ReasonCode, err)
			}
		}
		for i := 1; i <= n; i++ {
			c.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Pubrel}, PacketID: uint16(i)})
		}
		for i := 1; i <= n; i++ {
			c.expect(packets.Pubcomp, uint16(i))
		}
	}
	if got := l.Stats().NextOffset; got != 2200 {
		t.Fatalf("%d messages in the log, want 2200", got)
	}
}
