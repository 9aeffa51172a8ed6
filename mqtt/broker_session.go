package mqtt

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/storage"
	"github.com/mochi-mqtt/server/v2/packets"
)

// sessionHook persists the broker's persistent sessions in the session
// store: clients with clean_session=false (MQTT 5: a session expiry
// interval above 0), their subscriptions, and the QoS 1/2 messages queued
// or in flight for them, and gives them back to mochi at start.
//
// mochi sends the publisher its PUBACK before it routes the message to
// the subscribers, so the hook stores the message in OnPublish, before the
// PUBACK, for the persistent sessions subscribed to its topic (found with
// mochi's own topic index); a QoS 1 message's PUBACK then waits in the
// connection's ackGate until the record is durable (a group commit
// shared by every message in flight), a QoS 2 message's PUBREC is sent
// only once its record is. Which packet id each session got is
// recorded when mochi issues it (OnQosPublish) and the end of each flow
// (PUBACK, PUBCOMP, a dropped or expired message) when it happens; those
// records are group-committed with the next durable one, so a crash may
// redeliver a message whose acknowledgement was not yet on disk
// (at-least-once to the consumer, which drops duplicates by msg_id) but
// never loses one whose publisher got its PUBACK.
//
// A reconnecting client takes its persistent session over from the
// connection mochi holds for it (the old connection, or the offline
// session restored at start) in steps: mochi copies the old connection's
// inflight messages to the new one, drops them from the old one, and only
// then routes the client id's messages to the new connection. A message
// routed to the old connection in between would be lost (and the journal,
// still holding it, would later drop it on the PUBACK of another message
// given its packet id). So no stored message is routed to a session while
// it is taken over: the takeover (OnSessionEstablish) waits for the
// routings to it in progress, and publishes to it wait in OnPublish, after
// their message is durable and before their PUBACK, until mochi routes to
// the new connection (told by the CONNACK's OnPacketEncode).
//
// Hooks run on the clients' connection goroutines; the publish path (from
// OnPublish to OnPublished) runs on the publisher's.
type sessionHook struct {
	mochi.HookBase
	b     *Broker
	store *sessionStore

	mu      sync.Mutex                // guards routing, takeovers, changed
	routing map[string]routingMessage // by publisher client id: the message being routed
	// takeovers holds, by client id, the connection a new one is taking
	// the session over from, until mochi routes to another.
	takeovers map[string]*mochi.Client
	// changed is closed and replaced when a routing ends or a takeover
	// may have ended, while takeovers is not empty.
	changed chan struct{}
	// maxWait bounds each wait of the takeover gate (takeoverMaxWait).
	maxWait time.Duration
	// fullLogged is set while publishes wait for a full session
	// (waitRoom): the first one logs, the others are counted.
	fullLogged atomic.Bool
}

// takeoverPoll bounds a wait for a takeover's end between checks: mochi
// calls no hook once it routes to the new connection, and the CONNACK
// that tells it is not encoded if that connection closed meanwhile.
const takeoverPoll = 10 * time.Millisecond

// takeoverMaxWait bounds each wait of the takeover gate: a publisher or a
// connection stuck on a dead link (a write without a deadline) holds a
// takeover, and the publishers to that session, no longer than this.
const takeoverMaxWait = time.Second

// newSessionHook returns the session hook of b storing in store.
func newSessionHook(b *Broker, store *sessionStore) *sessionHook {
	return &sessionHook{b: b, store: store, routing: map[string]routingMessage{},
		takeovers: map[string]*mochi.Client{}, changed: make(chan struct{}), maxWait: takeoverMaxWait}
}

// routingMessage is the stored message a publisher's goroutine is routing.
type routingMessage struct {
	id    uint64
	topic string
	to    []sessionTo
}

func (h *sessionHook) ID() string { return "edged-sessions" }

func (h *sessionHook) Provides(b byte) bool {
	switch b {
	case mochi.OnSessionEstablish, mochi.OnDisconnect, mochi.OnClientExpired,
		mochi.OnSubscribed, mochi.OnUnsubscribed, mochi.OnPacketEncode,
		mochi.OnPublish, mochi.OnPublished, mochi.OnPacketProcessed,
		mochi.OnQosPublish, mochi.OnQosComplete, mochi.OnQosDropped, mochi.OnPacketRead,
		mochi.StoredClients, mochi.StoredSubscriptions, mochi.StoredInflightMessages:
		return true
	}
	return false
}

// persistent reports whether cl's session outlives its connection.
func persistent(cl *mochi.Client) bool {
	if cl.Properties.ProtocolVersion == 5 {
		return cl.Properties.Props.SessionExpiryInterval > 0
	}
	return !cl.Properties.Clean
}

// OnSessionEstablish runs before the CONNACK: a persistent session is
// stored durably, a clean one discards what was stored under its id.
func (h *sessionHook) OnSessionEstablish(cl *mochi.Client, pk packets.Packet) {
	var err error
	if persistent(cl) {
		err = h.store.record(&sessionRec{T: "c", Client: cl.ID, Version: cl.Properties.ProtocolVersion,
			Expiry: cl.Properties.Props.SessionExpiryInterval, ExpFlag: cl.Properties.Props.SessionExpiryIntervalFlag,
			Listener: cl.Net.Listener, Username: cl.Properties.Username}, true)
	} else if h.store.hasClient(cl.ID) {
		err = h.store.record(&sessionRec{T: "cd", Client: cl.ID}, true)
	}
	if err != nil {
		h.b.logger.Error("mqtt broker: storing session failed; disconnecting client", "client", cl.ID, "err", err)
		cl.Stop(err)
	}
	if old, ok := h.b.server.Clients.Get(cl.ID); ok && old != cl {
		h.beginTakeover(cl.ID, old)
	}
}

// beginTakeover holds back the routing of stored messages to client id,
// whose session mochi is about to move from old to a new connection, and
// returns once the routings to it in progress ended.
func (h *sessionHook) beginTakeover(id string, old *mochi.Client) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.takeovers[id] = old
	deadline := time.Now().Add(h.maxWait)
	for {
		busy := false
		for pub, r := range h.routing {
			// The old connection routing to its own session is
			// disconnected by the takeover itself: not waited for.
			if pub != id && slices.ContainsFunc(r.to, func(to sessionTo) bool { return to.Client == id }) {
				busy = true
				break
			}
		}
		if !busy {
			return
		}
		if time.Now().After(deadline) {
			h.b.logger.Warn("mqtt broker: a publish to a session being taken over did not end in time; taking it over anyway",
				"client", id, "waited", h.maxWait)
			return
		}
		h.waitChange()
	}
}

// waitTakeovers returns once no recipient in to is being taken over. h.mu
// is held.
func (h *sessionHook) waitTakeovers(to []sessionTo) {
	deadline := time.Now().Add(h.maxWait)
	for {
		busy := ""
		for _, t := range to {
			if h.takingOver(t.Client) {
				busy = t.Client
				break
			}
		}
		if busy == "" {
			return
		}
		if time.Now().After(deadline) {
			// A takeover that does not end (its new connection stuck
			// before its CONNACK) must not hold every publisher to it.
			h.b.logger.Warn("mqtt broker: a session takeover did not end in time; routing to it anyway",
				"client", busy, "waited", h.maxWait)
			delete(h.takeovers, busy)
			continue
		}
		h.waitChange()
	}
}

// takingOver reports whether client id's session is being taken over,
// forgetting the takeover once mochi routes to the new connection. h.mu
// is held.
func (h *sessionHook) takingOver(id string) bool {
	old, ok := h.takeovers[id]
	if !ok {
		return false
	}
	if cur, _ := h.b.server.Clients.Get(id); cur == old {
		return true
	}
	delete(h.takeovers, id)
	return false
}

// waitChange waits, with h.mu released, until a routing or a takeover
// may have ended (at most takeoverPoll). h.mu is held.
func (h *sessionHook) waitChange() {
	ch := h.changed
	h.mu.Unlock()
	t := time.NewTimer(takeoverPoll)
	select {
	case <-ch:
	case <-t.C:
	}
	t.Stop()
	h.mu.Lock()
}

// changedLocked forgets the takeovers that ended and wakes the waits for
// a routing's or a takeover's end, if a takeover was under way. h.mu is
// held.
func (h *sessionHook) changedLocked() {
	if len(h.takeovers) == 0 {
		return
	}
	for id := range h.takeovers {
		h.takingOver(id)
	}
	close(h.changed)
	h.changed = make(chan struct{})
}

// OnPacketEncode tells the waits that a takeover may have ended: mochi
// sends the CONNACK once it routes to the new connection.
func (h *sessionHook) OnPacketEncode(cl *mochi.Client, pk packets.Packet) packets.Packet {
	if pk.FixedHeader.Type == packets.Connack {
		h.mu.Lock()
		if _, ok := h.takeovers[cl.ID]; ok {
			h.changedLocked()
		}
		h.mu.Unlock()
	}
	return pk
}

// OnDisconnect forgets a session that ends with its connection.
func (h *sessionHook) OnDisconnect(cl *mochi.Client, _ error, expire bool) {
	if expire && !cl.IsTakenOver() && h.store.hasClient(cl.ID) {
		h.store.record(&sessionRec{T: "cd", Client: cl.ID}, false)
	}
}

// OnClientExpired forgets an expired session.
func (h *sessionHook) OnClientExpired(cl *mochi.Client) {
	h.store.record(&sessionRec{T: "cd", Client: cl.ID}, false)
}

// OnSubscribed runs before the SUBACK: a persistent session's new
// subscriptions are stored durably.
func (h *sessionHook) OnSubscribed(cl *mochi.Client, pk packets.Packet, codes []byte) {
	if !persistent(cl) || !h.store.hasClient(cl.ID) {
		return
	}
	for i, f := range pk.Filters {
		if i >= len(codes) || codes[i] >= packets.ErrUnspecifiedError.Code {
			continue
		}
		sub := sessionSub{Filter: f.Filter, Qos: f.Qos, RetainHandling: f.RetainHandling,
			RetainAsPublished: f.RetainAsPublished, NoLocal: f.NoLocal, Identifier: f.Identifier}
		h.store.record(&sessionRec{T: "s", Client: cl.ID, Sub: &sub}, false)
	}
	if err := h.store.sync(); err != nil {
		h.b.logger.Error("mqtt broker: storing subscriptions failed; disconnecting client", "client", cl.ID, "err", err)
		cl.Stop(err)
	}
}

// OnUnsubscribed forgets a persistent session's subscriptions.
func (h *sessionHook) OnUnsubscribed(cl *mochi.Client, pk packets.Packet) {
	if !h.store.hasClient(cl.ID) {
		return
	}
	for _, f := range pk.Filters {
		h.store.record(&sessionRec{T: "u", Client: cl.ID, Filter: f.Filter}, false)
	}
}

// OnPublish runs on the publisher's goroutine before its PUBACK (PUBREC):
// a QoS 1/2 message for persistent sessions is stored durably first.
// With no persistent session stored it returns at once: the subscriber
// lookup (mochi repeats it to route the message) would find none.
func (h *sessionHook) OnPublish(cl *mochi.Client, pk packets.Packet) (packets.Packet, error) {
	if pk.FixedHeader.Qos == 0 || pk.Ignore || !h.store.hasClients() {
		return pk, nil
	}
	subs := h.b.server.Topics.Subscribers(pk.TopicName)
	var to []sessionTo
	for id, sub := range subs.Subscriptions {
		if sub.NoLocal && id == cl.ID {
			continue
		}
		q := min(pk.FixedHeader.Qos, sub.Qos)
		if q == 0 || !h.store.hasClient(id) {
			continue
		}
		to = append(to, sessionTo{Client: id, Qos: q})
	}
	if len(to) == 0 {
		return pk, nil
	}
	// A wait for room ends with the broker or with the connection.
	ctx := h.b.ctx
	gate, gated := cl.Net.Conn.(*ackGate)
	if gated {
		ctx = gate.ctx
	}
	if err := h.waitRoom(ctx, cl, to); err != nil {
		return pk, packets.ErrRejectPacket
	}
	data := sessionMsgData{Topic: pk.TopicName, Payload: pk.Payload,
		Qos: pk.FixedHeader.Qos, Retain: pk.FixedHeader.Retain, Origin: cl.ID, Created: pk.Created}
	var id uint64
	var err error
	if gated && pk.FixedHeader.Qos == 1 {
		// The PUBACK waits in the gate for the record, which a group
		// commit makes durable while this connection reads on (a
		// publisher with many messages in flight, such as a sink, shares
		// each fsync among them). A QoS 2 message is stored before its
		// PUBREC: the journal must not keep one whose PUBREC was lost.
		var seq uint64
		if id, seq, err = h.store.addMessageNoWait(ctx, data, to); err == nil {
			gate.storedSession(seq)
		}
	} else {
		id, err = h.store.addMessage(ctx, data, to)
	}
	if err != nil {
		// No PUBACK: drop the connection so the publisher resends.
		if ctx.Err() == nil {
			h.b.logger.Error("mqtt broker: storing message for persistent sessions failed; disconnecting client",
				"client", cl.ID, "topic", pk.TopicName, "err", err)
		}
		cl.Stop(err)
		return pk, packets.ErrRejectPacket
	}
	h.mu.Lock()
	if len(h.takeovers) > 0 {
		h.waitTakeovers(to)
	}
	h.routing[cl.ID] = routingMessage{id: id, topic: pk.TopicName, to: to}
	h.mu.Unlock()
	return pk, nil
}

// sessionQueueLimit returns how many messages a persistent session may
// hold before publishes to it wait: mochi's bound on the messages queued
// for one client (maxInflight, its packet ids), past which it drops a
// message for that client, less a margin for the publishers routing to
// it at once (each connection routes one message at a time).
func sessionQueueLimit(maxInflight int) int {
	return maxInflight - min(1024, maxInflight/4)
}

// roomPoll bounds a wait for room in a session between checks (a message
// leaving mochi's queue without leaving the store wakes no one).
const roomPoll = time.Second

// waitRoom waits while a recipient in to holds sessionQueueLimit
// messages: back-pressure on the publisher, as for a full store, instead
// of mochi dropping the message for that session. It fails (no PUBACK)
// only when ctx ends: the publisher's connection closed (ctx is its
// ackGate's), or the broker stopped (the connection is ended too).
func (h *sessionHook) waitRoom(ctx context.Context, cl *mochi.Client, to []sessionTo) error {
	limit := sessionQueueLimit(int(h.b.server.Options.Capabilities.MaximumInflight))
	blocked := false
	for {
		full := ""
		for _, r := range to {
			if c, ok := h.b.server.Clients.Get(r.Client); ok && c.State.Inflight.Len() >= limit {
				full = r.Client
				break
			}
		}
		if full == "" {
			if blocked {
				h.fullLogged.Store(false)
			}
			return nil
		}
		if !blocked && h.fullLogged.CompareAndSwap(false, true) {
			h.b.logger.Warn("mqtt broker: a persistent session holds as many messages as it may; the publisher waits until it acknowledges",
				"session", full, "messages", limit, "publisher", cl.ID, "note", "further waits are counted in the session stats (blocked), not logged")
		}
		freed := h.store.freed(!blocked)
		blocked = true
		timer := time.NewTimer(roomPoll)
		select {
		case <-freed:
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			if h.b.ctx.Err() == nil {
				return ctx.Err() // the connection ended
			}
			cl.Stop(ErrBrokerClosed)
			return ErrBrokerClosed
		}
		timer.Stop()
	}
}

// OnQosPublish records which packet id a persistent session got for the
// message being routed. mochi calls it also when it resends a session's
// messages (DUP set; a routed copy never has it): those keep the id they
// have, whatever the publisher of the same origin is routing meanwhile.
func (h *sessionHook) OnQosPublish(cl *mochi.Client, pk packets.Packet, _ int64, _ int) {
	if pk.FixedHeader.Type != packets.Publish || pk.FixedHeader.Dup {
		return
	}
	h.mu.Lock()
	r, ok := h.routing[pk.Origin]
	h.mu.Unlock()
	if ok {
		h.store.assign(cl.ID, pk.PacketID, r.id, pk.TopicName, pk.Payload)
	}
}

// OnPublished ends the routing of the publisher's message.
func (h *sessionHook) OnPublished(cl *mochi.Client, _ packets.Packet) {
	h.mu.Lock()
	delete(h.routing, cl.ID)
	h.changedLocked()
	h.mu.Unlock()
}

// OnPacketProcessed drops a stored message mochi never routed (its PUBACK
// could not be written): the publisher resends it.
func (h *sessionHook) OnPacketProcessed(cl *mochi.Client, pk packets.Packet, _ error) {
	if pk.FixedHeader.Type != packets.Publish {
		return
	}
	h.mu.Lock()
	r, ok := h.routing[cl.ID]
	delete(h.routing, cl.ID)
	if ok {
		h.changedLocked()
	}
	h.mu.Unlock()
	if ok {
		h.store.record(&sessionRec{T: "md", MsgID: r.id}, false)
	}
}

// OnPacketRead notes a PUBREC from a persistent session: the message
// waits for its PUBCOMP now, and is resent as a PUBREL after a restart.
func (h *sessionHook) OnPacketRead(cl *mochi.Client, pk packets.Packet) (packets.Packet, error) {
	if pk.FixedHeader.Type == packets.Pubrec && h.store.outbound(cl.ID, pk.PacketID) {
		h.store.record(&sessionRec{T: "r", Client: cl.ID, PacketID: pk.PacketID}, false)
	}
	return pk, nil
}

// OnQosComplete ends an outbound flow on the client's PUBACK or PUBCOMP.
// mochi also calls it for acknowledgements it built itself (inbound
// flows); those carry a creation time, the client's packets do not.
func (h *sessionHook) OnQosComplete(cl *mochi.Client, pk packets.Packet) {
	t := pk.FixedHeader.Type
	if (t != packets.Puback && t != packets.Pubcomp) || pk.Created != 0 {
		return
	}
	h.store.done(cl.ID, pk.PacketID)
}

// OnQosDropped ends an outbound flow mochi gave up (expired, or the
// session ended). A session taken over by a new connection keeps its
// messages: mochi moved them to the new client.
func (h *sessionHook) OnQosDropped(cl *mochi.Client, pk packets.Packet) {
	if cl.IsTakenOver() {
		return
	}
	h.store.done(cl.ID, pk.PacketID)
}

// StoredClients gives mochi the persistent sessions at start.
func (h *sessionHook) StoredClients() ([]storage.Client, error) {
	s := h.store
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]storage.Client, 0, len(s.clients))
	for _, c := range s.clients {
		out = append(out, storage.Client{ID: c.id, Listener: c.listener, Username: c.username,
			ProtocolVersion: c.version, Clean: false,
			Properties: storage.ClientProperties{SessionExpiryInterval: c.expiry, SessionExpiryIntervalFlag: c.expFlag}})
	}
	return out, nil
}

// StoredSubscriptions gives mochi the persistent sessions' subscriptions.
func (h *sessionHook) StoredSubscriptions() ([]storage.Subscription, error) {
	s := h.store
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []storage.Subscription
	for _, c := range s.clients {
		for _, sub := range c.subs {
			out = append(out, storage.Subscription{Client: c.id, Filter: sub.Filter, Qos: sub.Qos,
				RetainHandling: sub.RetainHandling, RetainAsPublished: sub.RetainAsPublished,
				NoLocal: sub.NoLocal, Identifier: sub.Identifier})
		}
	}
	return out, nil
}

// StoredInflightMessages gives mochi the messages queued or in flight for
// the persistent sessions, each under the packet id the session knows it
// by; they are resent (DUP) when the session reconnects.
func (h *sessionHook) StoredInflightMessages() ([]storage.Message, error) {
	s := h.store
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []storage.Message
	for _, m := range s.msgs {
		for client, d := range m.pending {
			if d.pid == 0 {
				continue
			}
			msg := storage.Message{Client: client, Origin: m.data.Origin, TopicName: m.data.Topic,
				Payload: m.data.Payload, Created: m.data.Created, PacketID: d.pid,
				FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: d.qos}}
			if s.clients[client].rel[d.pid] {
				msg.FixedHeader = packets.FixedHeader{Type: packets.Pubrel, Qos: 1}
				msg.TopicName, msg.Payload = "", nil
			}
			out = append(out, msg)
		}
	}
	return out, nil
}
