package mqtt

import (
	"sync"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// packetIDHook lets a client SUBSCRIBE and UNSUBSCRIBE with a packet id
// the broker uses for a message in flight to it. The two sides assign
// packet ids independently (MQTT 3.1.1 section 2.3.1, MQTT 5 section
// 2.2.1), but mochi looks the id of a SUBSCRIBE or UNSUBSCRIBE up among
// the client's in-flight messages, which are the broker's, and refuses
// it when found: a SUBACK with 0x91 (Packet Identifier in use) for every
// filter, which is no valid code in MQTT 3.1.1 (mosquitto_sub exits:
// "All subscription requests were denied"), and an UNSUBSCRIBE that
// unsubscribes nothing. A persistent-session consumer that subscribes
// again when it reconnects while the broker sends its queued results
// meets it whenever its id is one of theirs.
//
// OnPacketRead gives such a SUBSCRIBE or UNSUBSCRIBE an id the broker has
// just reserved for this client (Client.NextPacketID, which then goes on
// past it), and OnPacketEncode puts the client's own id back into the
// SUBACK or UNSUBACK. mochi handles the packet and writes its answer on
// the connection's read goroutine before it reads the next packet, so a
// client has at most one such id pending.
type packetIDHook struct {
	mochi.HookBase
	// mu guards pending: a client's id (the value) under the one its
	// packet was handled with, per client.
	mu      sync.Mutex
	pending map[*mochi.Client]idSwap
}

// idSwap is a SUBSCRIBE's or UNSUBSCRIBE's packet id (client) and the id
// the broker handled it with (broker).
type idSwap struct {
	client, broker uint16
	ack            byte // the packet type of the answer: Suback or Unsuback
}

func newPacketIDHook() *packetIDHook {
	return &packetIDHook{pending: map[*mochi.Client]idSwap{}}
}

func (h *packetIDHook) ID() string { return "edged-packet-ids" }

func (h *packetIDHook) Provides(b byte) bool {
	return b == mochi.OnPacketRead || b == mochi.OnPacketEncode || b == mochi.OnDisconnect
}

// OnPacketRead swaps the id of a SUBSCRIBE or UNSUBSCRIBE that the
// broker uses for a message in flight to the client.
func (h *packetIDHook) OnPacketRead(cl *mochi.Client, pk packets.Packet) (packets.Packet, error) {
	var ack byte
	switch pk.FixedHeader.Type {
	case packets.Subscribe:
		ack = packets.Suback
	case packets.Unsubscribe:
		ack = packets.Unsuback
	default:
		return pk, nil
	}
	h.mu.Lock()
	delete(h.pending, cl)
	h.mu.Unlock()
	if pk.PacketID == 0 {
		return pk, nil // refused by mochi's validation
	}
	if _, ok := cl.State.Inflight.Get(pk.PacketID); !ok {
		return pk, nil
	}
	id, err := cl.NextPacketID()
	if err != nil {
		return pk, nil // every id in flight: mochi refuses it as before
	}
	h.mu.Lock()
	h.pending[cl] = idSwap{client: pk.PacketID, broker: uint16(id), ack: ack}
	h.mu.Unlock()
	pk.PacketID = uint16(id)
	return pk, nil
}

// OnPacketEncode puts the client's own id into the answer to a packet
// OnPacketRead swapped the id of.
func (h *packetIDHook) OnPacketEncode(cl *mochi.Client, pk packets.Packet) packets.Packet {
	t := pk.FixedHeader.Type
	if t != packets.Suback && t != packets.Unsuback {
		return pk
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if s, ok := h.pending[cl]; ok && s.ack == t && s.broker == pk.PacketID {
		pk.PacketID = s.client
		delete(h.pending, cl)
	}
	return pk
}

// OnDisconnect forgets a swap whose answer was not written.
func (h *packetIDHook) OnDisconnect(cl *mochi.Client, _ error, _ bool) {
	h.mu.Lock()
	delete(h.pending, cl)
	h.mu.Unlock()
}
