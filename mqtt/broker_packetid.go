package mqtt

import (
	"sync"
	"sync/atomic"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/mochi-mqtt/server/v2/system"
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
//
// A QoS 1 PUBLISH from the client meets the same confusion: mochi deletes
// the broker's message in flight under its id ([MQTT-4.3.2-5] read for
// the wrong direction), without telling the hooks, so the message (or the
// PUBREL of a QoS 2 one awaiting its PUBCOMP) was not sent again when the
// client reconnected before acknowledging it, and its entry in the session
// journal stayed until the broker restarted (then resent). OnPacketRead
// keeps that message aside and OnPacketProcessed puts it back in flight
// once mochi has handled the PUBLISH (its PUBACK is then written: the id
// is free again). mochi leaves its PUBACK in flight under the id when it
// could not write it (the connection closed meanwhile): the message takes
// its place again. When a new connection took the session over meanwhile
// (mochi copied the session's messages in flight to it, maybe before the
// message was back), the message goes to that connection, sent again as
// a duplicate, unless it holds it already. A QoS 2
// PUBLISH keeps the id for its PUBREC until the PUBREL, so its collision
// is not mended: the message in flight under that id is dropped from the
// session as before (a device that publishes at QoS 2 and subscribes at
// QoS 1 or 2 on one session may miss a result after a reconnect).
type packetIDHook struct {
	mochi.HookBase
	// info is the broker's statistics, whose in-flight count mochi
	// lowered when it deleted a message put back.
	info *system.Info
	// mu guards pending and aside.
	mu sync.Mutex
	// pending is a client's id (the value) under the one its packet was
	// handled with, per client.
	pending map[*mochi.Client]idSwap
	// aside is, per client, the broker's message in flight under the id
	// of the QoS 1 PUBLISH being handled; asides counts its entries, so
	// that the PUBLISHes that meet no such message (nearly all) take no
	// lock.
	aside  map[*mochi.Client]packets.Packet
	asides atomic.Int64
	// current is, per client id, the connection whose session mochi
	// last established; handoff, per client id, a message put back by a
	// connection whose session was taken over before that connection's
	// session was established, which then takes it.
	current map[string]*mochi.Client
	handoff map[string]packets.Packet
}

// outbound reports whether pk, in flight to a client, is one of the
// broker's flows: a PUBLISH awaiting its PUBACK or PUBREC, or the PUBREL
// of a QoS 2 one awaiting its PUBCOMP. (A PUBREC in flight is the
// client's QoS 2 PUBLISH, whose id mochi refuses to reuse.)
func outbound(pk packets.Packet) bool {
	return pk.FixedHeader.Type == packets.Publish || pk.FixedHeader.Type == packets.Pubrel
}

// idSwap is a SUBSCRIBE's or UNSUBSCRIBE's packet id (client) and the id
// the broker handled it with (broker).
type idSwap struct {
	client, broker uint16
	ack            byte // the packet type of the answer: Suback or Unsuback
}

func newPacketIDHook(info *system.Info) *packetIDHook {
	return &packetIDHook{info: info, pending: map[*mochi.Client]idSwap{}, aside: map[*mochi.Client]packets.Packet{},
		current: map[string]*mochi.Client{}, handoff: map[string]packets.Packet{}}
}

func (h *packetIDHook) ID() string { return "edged-packet-ids" }

func (h *packetIDHook) Provides(b byte) bool {
	switch b {
	case mochi.OnPacketRead, mochi.OnPacketEncode, mochi.OnPacketProcessed, mochi.OnQosDropped,
		mochi.OnSessionEstablish, mochi.OnSessionEstablished, mochi.OnDisconnect:
		return true
	}
	return false
}

// OnPacketRead swaps the id of a SUBSCRIBE or UNSUBSCRIBE that the
// broker uses for a message in flight to the client, and keeps aside the
// message in flight under the id of a QoS 1 PUBLISH.
func (h *packetIDHook) OnPacketRead(cl *mochi.Client, pk packets.Packet) (packets.Packet, error) {
	var ack byte
	switch pk.FixedHeader.Type {
	case packets.Subscribe:
		ack = packets.Suback
	case packets.Unsubscribe:
		ack = packets.Unsuback
	case packets.Publish:
		if pk.FixedHeader.Qos != 1 || pk.PacketID == 0 {
			return pk, nil
		}
		if out, ok := cl.State.Inflight.Get(pk.PacketID); ok && outbound(out) {
			h.mu.Lock()
			if _, had := h.aside[cl]; !had {
				h.asides.Add(1)
			}
			h.aside[cl] = out
			h.mu.Unlock()
		}
		return pk, nil
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

// OnPacketProcessed puts back in flight the message OnPacketRead kept
// aside for the PUBLISH mochi has handled, if mochi deleted it, or hands
// it to the connection that took the session over. (Should the id have
// been given to another message meanwhile, which takes the client's other
// 65,534 ids in flight first, the message stays dropped, as without this
// hook.)
func (h *packetIDHook) OnPacketProcessed(cl *mochi.Client, pk packets.Packet, _ error) {
	if pk.FixedHeader.Type != packets.Publish || h.asides.Load() == 0 {
		return
	}
	out, ok := h.takeAside(cl)
	if !ok || out.PacketID != pk.PacketID {
		return
	}
	if in, taken := cl.State.Inflight.Get(out.PacketID); !taken || in.FixedHeader.Type == packets.Puback {
		// A PUBACK in flight is mochi's own for this PUBLISH, not
		// written: the client sends the PUBLISH again.
		if cl.State.Inflight.Set(out) {
			atomic.AddInt64(&h.info.Inflight, 1)
		}
	}
	if !cl.IsTakenOver() {
		return
	}
	// Taken over before or after the message was back: it leaves this
	// connection for the one that has the session now.
	if in, ok := cl.State.Inflight.Get(out.PacketID); ok && outbound(in) && cl.State.Inflight.Delete(out.PacketID) {
		atomic.AddInt64(&h.info.Inflight, -1)
	}
	if cl.Properties.ProtocolVersion < 5 && cl.Properties.Clean {
		return // the session ended with the connection
	}
	h.mu.Lock()
	cur := h.current[cl.ID]
	if cur == nil || cur == cl {
		h.handoff[cl.ID] = out
		h.mu.Unlock()
		return
	}
	h.mu.Unlock()
	if !cur.Properties.Clean {
		h.send(cur, out)
	}
}

// OnQosDropped forgets the message kept aside for cl when mochi drops it
// before it handles the PUBLISH (the expiry pass, a takeover that copied
// it to the new connection or ended the session): it is not put back.
func (h *packetIDHook) OnQosDropped(cl *mochi.Client, pk packets.Packet) {
	if h.asides.Load() == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if out, ok := h.aside[cl]; ok && out.PacketID == pk.PacketID {
		delete(h.aside, cl)
		h.asides.Add(-1)
	}
}

// OnSessionEstablish puts back in flight, on the connection cl takes its
// session over from, the message kept aside there, so that mochi copies
// it with the session: out of flight, its id would be free on cl, and a
// message routed to cl meanwhile could take it. It stays aside: mochi
// drops it from the old connection once copied (OnQosDropped forgets
// it), else OnPacketProcessed hands it over.
func (h *packetIDHook) OnSessionEstablish(cl *mochi.Client, pk packets.Packet) {
	if h.asides.Load() == 0 || pk.Connect.Clean {
		return
	}
	h.mu.Lock()
	var old *mochi.Client
	var out packets.Packet
	for c, o := range h.aside {
		if c.ID == cl.ID && c != cl {
			old, out = c, o
		}
	}
	h.mu.Unlock()
	if old == nil {
		return
	}
	if _, taken := old.State.Inflight.Get(out.PacketID); !taken && old.State.Inflight.Set(out) {
		atomic.AddInt64(&h.info.Inflight, 1)
	}
}

// OnSessionEstablished notes cl as the connection of its client id's
// session and gives it the message a connection it took the session over
// from put back meanwhile, unless it started a clean session.
func (h *packetIDHook) OnSessionEstablished(cl *mochi.Client, _ packets.Packet) {
	h.mu.Lock()
	h.current[cl.ID] = cl
	out, ok := h.handoff[cl.ID]
	delete(h.handoff, cl.ID)
	h.mu.Unlock()
	if ok && !cl.Properties.Clean {
		h.send(cl, out)
	}
}

// send puts out in flight to cl and writes it (a duplicate), unless cl
// has a message in flight under its id: out itself, copied from the
// connection it took the session over from, or another message.
func (h *packetIDHook) send(cl *mochi.Client, out packets.Packet) {
	if _, taken := cl.State.Inflight.Get(out.PacketID); taken {
		return
	}
	if out.FixedHeader.Type == packets.Publish {
		out.FixedHeader.Dup = true
	}
	if cl.State.Inflight.Set(out) {
		atomic.AddInt64(&h.info.Inflight, 1)
	}
	_ = cl.WritePacket(out) // else sent again when the client reconnects
}

// OnDisconnect forgets a swap whose answer was not written, a message
// kept aside (it is in flight still unless mochi's handling ended first)
// and cl as its session's connection.
func (h *packetIDHook) OnDisconnect(cl *mochi.Client, _ error, _ bool) {
	h.mu.Lock()
	delete(h.pending, cl)
	if h.current[cl.ID] == cl {
		delete(h.current, cl.ID)
	}
	h.mu.Unlock()
	h.takeAside(cl)
}

// takeAside removes and returns the message kept aside for cl, if any (a
// PUBLISH that failed validation leaves its entry until the client's next
// handled PUBLISH or its disconnect).
func (h *packetIDHook) takeAside(cl *mochi.Client) (packets.Packet, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	out, ok := h.aside[cl]
	if ok {
		delete(h.aside, cl)
		h.asides.Add(-1)
	}
	return out, ok
}
