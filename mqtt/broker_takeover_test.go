package mqtt

import (
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/edgedio/edged/internal/testutil"
)

// publishDuring is the part of a test hook that publishes a message
// from inside a hook call of mochi's and waits there until that message
// was routed (or until held says it is held back).
type publishDuring struct {
	mochi.HookBase
	client  string
	publish func() // publishes the message
	payload string // of the message
	routed  atomic.Bool
	once    sync.Once
	failure atomic.Value // string: what went wrong on mochi's goroutine
}

func (h *publishDuring) OnPublished(_ *mochi.Client, pk packets.Packet) {
	if string(pk.Payload) == h.payload {
		h.routed.Store(true)
	}
}

// publishOnce publishes the message the first time it is called and
// waits until it was routed or held reports true; failure says what went
// wrong when neither came.
func (h *publishDuring) publishOnce(held func() bool, failure string) {
	h.once.Do(func() {
		h.publish()
		if !testutil.Within(waitBound, func() bool { return h.routed.Load() || held() }) {
			h.failure.Store(failure)
		}
	})
}

// takeoverHook publishes a message in the middle of mochi's session
// takeover: when mochi drops the inflight messages of the connection
// being taken over (ClearInflights, after it copied them for the new
// connection and before the new connection is the one the broker routes
// to), it publishes and returns only once that message was routed or is
// held back by the session hook until the takeover is over.
type takeoverHook struct {
	publishDuring
	done      chan struct{} // closed when the first OnQosDropped returned
	closeDone sync.Once
}

func (h *takeoverHook) ID() string { return "test-takeover" }

func (h *takeoverHook) Provides(b byte) bool {
	return b == mochi.OnQosDropped || b == mochi.OnPublished
}

func (h *takeoverHook) OnQosDropped(cl *mochi.Client, _ packets.Packet) {
	if cl.ID != h.client || !cl.IsTakenOver() {
		return
	}
	h.publishOnce(func() bool { return testutil.Waiting("mqtt.(*sessionHook).waitTakeovers") },
		"the message published during the takeover was neither routed nor held back")
	h.closeDone.Do(func() { close(h.done) })
}

// queuedForOfflineConsumer subscribes a persistent session "consumer" to
// results/#, disconnects it, and publishes "queued" to results/x at QoS 1
// from a client "sink", which it returns: the message waits in the
// offline session.
func queuedForOfflineConsumer(t *testing.T, b *Broker) paho.Client {
	t.Helper()
	sub := connectPersistent(t, b.Addr(), "consumer", &persistentSub{seen: map[string]int{}}, false)
	if tok := sub.Subscribe("results/#", 1, nil); !tok.WaitTimeout(waitBound) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}
	sub.Disconnect(0)
	testutil.Eventually(t, waitBound, "the consumer's connection gone", func() bool {
		cl, ok := b.server.Clients.Get("consumer")
		return ok && cl.Closed()
	})
	pub := connect(t, b.Addr(), "sink")
	if tok := pub.Publish("results/x", 1, false, "queued"); !tok.WaitTimeout(waitBound) || tok.Error() != nil {
		t.Fatalf("publish: %v", tok.Error())
	}
	return pub
}

// A QoS 1 message for a persistent session, published while a
// reconnecting client takes the session over (as a consumer does when it
// reconnects to a restarted node while the node's write-ahead sink
// re-publishes its restored results), reaches the new connection. mochi
// routes by client id and moves the session to the new connection in
// steps (it copies the old connection's inflight messages, drops them
// from the old one, then makes the new connection the one routed to): a
// message routed to the old connection in between was lost, and the
// session journal, still holding it, later dropped it on the PUBACK of
// another message that got its packet id.
func TestBrokerSessionTakeoverKeepsMessagesRoutedMeanwhile(t *testing.T) {
	b := startBrokerCfg(t, nil, BrokerConfig{DataDir: t.TempDir()}, nil)
	// The takeover has an inflight message to copy and drop.
	pub := queuedForOfflineConsumer(t, b)
	publish := func(payload string) paho.Token { return pub.Publish("results/x", 1, false, payload) }

	var during paho.Token
	h := &takeoverHook{publishDuring: publishDuring{client: "consumer", payload: "during"}, done: make(chan struct{})}
	h.publish = func() { during = publish("during") }
	if err := b.server.AddHook(h, nil); err != nil {
		t.Fatal(err)
	}

	// OrderMatters: the handler sees the messages in the order they came.
	again := &persistentSub{seen: map[string]int{}}
	connect(t, b.Addr(), "consumer", func(o *paho.ClientOptions) {
		o.SetCleanSession(false).SetDefaultPublishHandler(again.handler).SetOrderMatters(true)
	})
	testutil.Receive(t, waitBound, "the takeover", h.done)
	if f := h.failure.Load(); f != nil {
		t.Fatal(f)
	}
	if !during.WaitTimeout(waitBound) || during.Error() != nil {
		t.Fatalf("publish during the takeover: %v", during.Error())
	}
	// The sink's messages are routed in the order they come on its
	// connection and go out to the consumer's in that order: once "after"
	// is in, "during" is in too if it was delivered at all. "queued" is
	// not in that order: mochi makes the new connection the one routed to
	// and sends its CONNACK before it resends the session's inflight
	// messages, so "after" can reach the consumer before it.
	if tok := publish("after"); !tok.WaitTimeout(waitBound) || tok.Error() != nil {
		t.Fatalf("publish: %v", tok.Error())
	}
	if !testutil.Within(waitBound, func() bool {
		again.mu.Lock()
		defer again.mu.Unlock()
		return again.seen["after"] > 0 && again.seen["queued"] > 0
	}) {
		again.mu.Lock()
		seen := fmt.Sprint(again.seen)
		again.mu.Unlock()
		t.Fatalf(`"after" and "queued" not both delivered to the consumer that took its session over (got %v)`, seen)
	}
	again.mu.Lock()
	n, seen := again.seen["during"], fmt.Sprint(again.seen)
	again.mu.Unlock()
	if n == 0 {
		t.Errorf(`"during" never reached the consumer that took its session over (got %v)`, seen)
	}
	// Every message acknowledged: the journal holds none.
	testutil.Eventually(t, waitBound, "the session journal emptied by the acknowledgements", func() bool {
		return b.SessionStats().Messages == 0
	})
}

// The session hook's takeover gate on its own: a takeover waits for a
// routing to the session in progress, and a routing to a session being
// taken over waits until mochi routes to another connection, also when
// no CONNACK tells it (the new connection closed before it).
func TestSessionHookTakeoverGate(t *testing.T) {
	b := startBrokerCfg(t, nil, BrokerConfig{DataDir: t.TempDir()}, nil)
	h := newSessionHook(b, b.store)
	old := b.server.NewClient(nil, "tcp", "consumer", false)
	b.server.Clients.Add(old)
	to := []sessionTo{{Client: "consumer", Qos: 1}}
	pub := &mochi.Client{ID: "sink"}

	h.mu.Lock()
	h.routing[pub.ID] = routingMessage{id: 1, topic: "results/x", to: to}
	h.mu.Unlock()
	began := testutil.CallUntilWaiting(t, "mqtt.(*sessionHook).beginTakeover", func() bool {
		h.beginTakeover("consumer", old)
		return true
	})
	h.OnPublished(pub, packets.Packet{})
	testutil.Receive(t, waitBound, "the takeover begun once the routing ended", began)

	routed := testutil.CallUntilWaiting(t, "mqtt.(*sessionHook).waitTakeovers", func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		h.waitTakeovers(to)
		return true
	})
	b.server.Clients.Add(b.server.NewClient(nil, "tcp", "consumer", false)) // no CONNACK
	testutil.Receive(t, waitBound, "the routing let through once mochi routes to the new connection", routed)
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.takeovers) != 0 {
		t.Errorf("takeovers %v: the ended one is still held", h.takeovers)
	}
}

// Neither wait of the takeover gate outlasts its bound: a routing to the
// session that never ends (a publisher stuck writing to a dead link) does
// not hold the takeover, and a takeover that never ends (a new connection
// stuck before its CONNACK) does not hold the publishers to the session;
// each logs why it went on.
func TestSessionHookTakeoverGateIsBounded(t *testing.T) {
	var logs testutil.Buffer
	b := startBrokerCfg(t, nil, BrokerConfig{DataDir: t.TempDir(), Logger: slog.New(slog.NewTextHandler(&logs, nil))}, nil)
	h := newSessionHook(b, b.store)
	h.maxWait = 50 * time.Millisecond
	old := b.server.NewClient(nil, "tcp", "consumer", false)
	b.server.Clients.Add(old)
	to := []sessionTo{{Client: "consumer", Qos: 1}}

	// A routing to the consumer that never ends.
	h.mu.Lock()
	h.routing["stuck"] = routingMessage{id: 1, topic: "results/x", to: to}
	h.mu.Unlock()
	began := make(chan struct{})
	go func() {
		h.beginTakeover("consumer", old)
		close(began)
	}()
	testutil.Receive(t, waitBound, "the takeover begun after the bound, the routing still under way", began)
	if !strings.Contains(logs.String(), "a publish to a session being taken over did not end in time") {
		t.Errorf("no warning for the routing that held the takeover; logs:\n%s", logs.String())
	}

	// The takeover never ends: mochi still routes to the old connection.
	h.mu.Lock()
	delete(h.routing, "stuck")
	h.mu.Unlock()
	routed := make(chan struct{})
	go func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		h.waitTakeovers(to)
		close(routed)
	}()
	testutil.Receive(t, waitBound, "the routing let through after the bound, the takeover still under way", routed)
	if !strings.Contains(logs.String(), "a session takeover did not end in time") {
		t.Errorf("no warning for the takeover that held the routing; logs:\n%s", logs.String())
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.takeovers) != 0 {
		t.Errorf("takeovers %v: the one that did not end in time is still held", h.takeovers)
	}
}

// pidReuseHook, registered before the session hook, holds the consumer's
// first PUBACK between mochi freeing its packet id and the session hook
// hearing of it: there it publishes a message and returns once that
// message was routed (mochi gave it the id just freed). afterHook,
// registered after the session hook, counts the consumer's PUBACKs the
// session hook has handled.
type pidReuseHook struct {
	publishDuring
}

func (h *pidReuseHook) ID() string { return "test-pid-reuse" }

func (h *pidReuseHook) Provides(b byte) bool {
	return b == mochi.OnQosComplete || b == mochi.OnPublished
}

func (h *pidReuseHook) OnQosComplete(cl *mochi.Client, pk packets.Packet) {
	if cl.ID != h.client || pk.FixedHeader.Type != packets.Puback || pk.Created != 0 {
		return
	}
	h.publishOnce(func() bool { return false }, "the message published while a PUBACK was handled was not routed")
}

type pubackCounter struct {
	mochi.HookBase
	client string
	n      atomic.Int32
}

func (h *pubackCounter) ID() string { return "test-puback-counter" }

func (h *pubackCounter) Provides(b byte) bool { return b == mochi.OnQosComplete }

func (h *pubackCounter) OnQosComplete(cl *mochi.Client, pk packets.Packet) {
	if cl.ID == h.client && pk.FixedHeader.Type == packets.Puback && pk.Created == 0 {
		h.n.Add(1)
	}
}

// A consumer that reconnects to its persistent session gets the messages
// queued for it under the packet ids they had, and the new connection
// issues ids from the first again: a message routed to it right after
// one of those is acknowledged can get the id just freed, before the
// session hook has heard of the acknowledgement (mochi frees the id, then
// calls the hooks). The journal kept that message's delivery without a
// packet id and ignored its PUBACK: it held the message, acknowledged,
// until the next restart, which resent it.
func TestBrokerSessionPacketIDReusedBeforeItsPubackIsJournaled(t *testing.T) {
	h := &pidReuseHook{publishDuring{client: "consumer", payload: "next"}}
	b := startBrokerWith(t, nil, BrokerConfig{DataDir: t.TempDir()}, func(b *Broker) {
		if err := b.server.AddHook(h, nil); err != nil {
			t.Fatal(err)
		}
	})
	acks := &pubackCounter{client: "consumer"}
	if err := b.server.AddHook(acks, nil); err != nil {
		t.Fatal(err)
	}
	// "queued" is queued for the offline session under packet id 1.
	pub := queuedForOfflineConsumer(t, b)
	var next paho.Token
	h.publish = func() { next = pub.Publish("results/x", 1, false, h.payload) }

	again := &persistentSub{seen: map[string]int{}}
	connect(t, b.Addr(), "consumer", func(o *paho.ClientOptions) {
		o.SetCleanSession(false).SetDefaultPublishHandler(again.handler)
	})
	testutil.Eventually(t, waitBound, "both messages acknowledged by the consumer", func() bool {
		return acks.n.Load() == 2
	})
	if f := h.failure.Load(); f != nil {
		t.Fatal(f)
	}
	if !next.WaitTimeout(waitBound) || next.Error() != nil {
		t.Fatalf("publish: %v", next.Error())
	}
	again.mu.Lock()
	var ids []uint16
	for _, m := range again.msgs {
		ids = append(ids, m.MessageID())
	}
	seen := fmt.Sprint(again.seen)
	again.mu.Unlock()
	if len(ids) != 2 || ids[0] != ids[1] {
		t.Fatalf("the consumer got %v under packet ids %v; the test needs both under one", seen, ids)
	}
	if st := b.SessionStats(); st.Messages != 0 {
		t.Errorf("the session journal holds %d message(s) after the consumer acknowledged every one (got %v)", st.Messages, seen)
	}
}

// A session's message that mochi resends (DUP) while the publisher it came
// from routes another message keeps its packet id, and the message being
// routed gets the one mochi gives it, whatever order the resend, the
// routing and the resent message's PUBACK come in.
func TestSessionHookResendKeepsPacketIDs(t *testing.T) {
	b := startBrokerCfg(t, nil, BrokerConfig{DataDir: t.TempDir()}, nil)
	h := newSessionHook(b, b.store)
	if err := b.store.record(&sessionRec{T: "c", Client: "consumer", Version: 4}, true); err != nil {
		t.Fatal(err)
	}
	to := []sessionTo{{Client: "consumer", Qos: 1}}
	msg := func(payload string) (uint64, packets.Packet) {
		id, err := b.store.addMessage(b.ctx, sessionMsgData{Topic: "results/x", Payload: []byte(payload), Qos: 1, Origin: "sink"}, to)
		if err != nil {
			t.Fatal(err)
		}
		return id, packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1},
			TopicName: "results/x", Payload: []byte(payload), Origin: "sink"}
	}
	cl := &mochi.Client{ID: "consumer"}
	sink := &mochi.Client{ID: "sink"}
	puback := func(pid uint16) packets.Packet {
		return packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Puback}, PacketID: pid}
	}

	// "queued" is in flight under packet id 1.
	queuedID, queued := msg("queued")
	h.mu.Lock()
	h.routing["sink"] = routingMessage{id: queuedID, topic: "results/x", to: to}
	h.mu.Unlock()
	queued.PacketID = 1
	h.OnQosPublish(cl, queued, 0, 0)
	h.OnPublished(sink, packets.Packet{})

	// The sink routes "next"; meanwhile mochi resends "queued" and the
	// consumer acknowledges it, all before "next" gets its id (2).
	nextID, next := msg("next")
	h.mu.Lock()
	h.routing["sink"] = routingMessage{id: nextID, topic: "results/x", to: to}
	h.mu.Unlock()
	resent := queued
	resent.FixedHeader.Dup = true
	h.OnQosPublish(cl, resent, 0, 0)
	h.OnQosComplete(cl, puback(1))
	next.PacketID = 2
	h.OnQosPublish(cl, next, 0, 0)
	h.OnPublished(sink, packets.Packet{})
	h.OnQosComplete(cl, puback(2))

	if st := b.store.Stats(); st.Messages != 0 {
		b.store.mu.Lock()
		out := fmt.Sprint(b.store.clients["consumer"].out)
		b.store.mu.Unlock()
		t.Errorf("the journal holds %d message(s) after both were acknowledged (packet ids %v)", st.Messages, out)
	}
}
