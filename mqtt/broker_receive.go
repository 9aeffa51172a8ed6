package mqtt

import (
	"math"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// v3ReceiveQuota is how many QoS 1 and 2 messages an MQTT 3.1 or 3.1.1
// device may have open at once (a QoS 2 message from its PUBLISH to its
// PUBREL): every packet identifier, as MQTT 3.1.1 bounds them no
// further. The broker library applies its Receive Maximum (1024) to every
// connection and closes one that exceeds it, but only an MQTT 5 device is
// told of it (in its CONNACK): a 3.1.1 device that queued more QoS 2
// readings than that while the node was stopped sent them at its
// reconnect, was closed, resent them all at the next, and was closed
// again, for as long as its backlog lasted.
const v3ReceiveQuota = math.MaxUint16

// receiveQuotaHook gives each MQTT 3.x connection v3ReceiveQuota. MQTT 5
// connections keep the bound their CONNACK told them.
type receiveQuotaHook struct{ mochi.HookBase }

func (*receiveQuotaHook) ID() string { return "edged-receive-quota" }

func (*receiveQuotaHook) Provides(b byte) bool { return b == mochi.OnSessionEstablished }

// OnSessionEstablished runs after the CONNACK and the session's resent
// messages, before the broker reads the connection's first packet.
func (*receiveQuotaHook) OnSessionEstablished(cl *mochi.Client, _ packets.Packet) {
	if cl.Properties.ProtocolVersion < 5 {
		cl.State.Inflight.ResetReceiveQuota(v3ReceiveQuota)
	}
}
