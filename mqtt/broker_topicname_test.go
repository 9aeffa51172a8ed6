package mqtt

import (
	"errors"
	"fmt"
	"net"
	"testing"

	"github.com/edgedio/edged/mqtt/ingestlog"
	"github.com/mochi-mqtt/server/v2/packets"
)

// A PUBLISH to a topic name a client may not publish to, one with a
// wildcard (MQTT 3.1.1 3.3.2-2, a protocol violation) or a $SYS one (the
// broker's own topics), is neither logged nor acknowledged, and the
// connection ends, so the device knows (MQTT 3.1.1 3.3.5: acknowledge or
// close; MQTT 5: DISCONNECT 0x90, Topic Name invalid). Before, mochi
// dropped it without a word and without an acknowledgement, and the
// device waited for its PUBACK forever: `mosquitto_pub -q 1 -t
// '$SYS/a'` against the node never returned, and a device whose
// messages in flight are bounded stopped sending once they were all
// such ones.
func TestBrokerRefusesAPublishToAnInvalidTopicName(t *testing.T) {
	for _, version := range []byte{4, 5} {
		for _, topic := range []string{"$SYS/a", "$sys/a", "sensors/+/a", "sensors/#"} {
			for _, qos := range []byte{1, 2} {
				t.Run(fmt.Sprintf("v%d/%s/qos%d", version, topic, qos), func(t *testing.T) {
					l := openLog(t, t.TempDir(), ingestlog.DefaultOptions())
					b := startBroker(t, l, "#")
					var c *rawClient
					if version == 5 {
						c, _ = dialRaw5(t, b.Addr(), "dev")
					} else {
						c, _ = dialRaw(t, b.Addr(), "dev", true)
					}
					// The PUBACK of the reading before it still comes.
					c.publish(1, 1, "sensors/a", []byte("one"), false)
					c.publish(qos, 2, topic, []byte("two"), false)
					c.expect(packets.Puback, 1)
					if version == 5 {
						c.expectDisconnect(packets.ErrTopicNameInvalid.Code)
					} else if pk, err := c.read(); err == nil {
						t.Fatalf("packet type %d (id %d), want the connection closed", pk.FixedHeader.Type, pk.PacketID)
					} else if ne := (net.Error)(nil); errors.As(err, &ne) && ne.Timeout() {
						t.Fatalf("no acknowledgement and the connection still open after %v", waitBound)
					}
					if got, want := fmt.Sprint(loggedMessages(t, l)), "[sensors/a one]"; got != want {
						t.Fatalf("logged %s, want %s", got, want)
					}
				})
			}
		}
	}
}
