package mqtt

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/edgedio/edged/internal/testutil"
)

// subscribeOffline makes id a persistent session subscribed to filter
// and leaves it offline.
func subscribeOffline(t *testing.T, b *Broker, id, filter string) {
	t.Helper()
	sub := connectPersistent(t, b.Addr(), id, &persistentSub{seen: map[string]int{}}, false)
	if tok := sub.Subscribe(filter, 1, nil); !tok.WaitTimeout(waitBound) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	sub.Disconnect(0)
}

// A publisher with many QoS 1 messages in flight for an offline
// persistent session (a sink publishing results a consumer reads later)
// shares each session-journal fsync among them: its connection reads on
// while an fsync runs and the PUBACKs wait. Here the first fsync is held
// until every message is stored; then two fsyncs cover them all. Before,
// each message waited for its own fsync before the next was read (one
// fsync per message), and a node whose results had an offline consumer
// crawled.
func TestBrokerSessionFsyncsSharedByInFlightMessages(t *testing.T) {
	const n = 200
	fs := newFaultFS()
	b := startBrokerWith(t, nil, BrokerConfig{DataDir: t.TempDir()}, func(b *Broker) { b.journalFS = fs })
	subscribeOffline(t, b, "later", "results/#")
	_, release := holdFsyncs(t, fs)
	pub := connect(t, b.Addr(), "sink")
	toks := make([]paho.Token, n)
	for i := range toks {
		toks[i] = pub.Publish("results/x", 1, false, fmt.Sprintf("r-%d", i))
	}
	testutil.Eventually(t, waitBound, "every message stored while the first fsync is held", func() bool {
		return b.SessionStats().Messages == n
	})
	syncs := b.SessionStats().Syncs
	release()
	for _, tok := range toks {
		if !tok.WaitTimeout(waitBound) || tok.Error() != nil {
			t.Fatalf("publish: %v", tok.Error())
		}
	}
	if got := b.SessionStats().Syncs - syncs; got > 2 {
		t.Fatalf("%d journal fsyncs for %d messages stored before the first returned, want at most 2", got, n)
	}
	again := &persistentSub{seen: map[string]int{}}
	connectPersistent(t, b.Addr(), "later", again, false)
	testutil.Eventually(t, waitBound, "every message delivered", func() bool { return again.distinct() == n })
}

// holdFsyncs blocks fs's journal fsyncs until release (also called at
// the test's end, before the broker's Close, which waits for them).
func holdFsyncs(t *testing.T, fs *faultFS) (syncsBefore int, release func()) {
	hold := make(chan struct{})
	fs.mu.Lock()
	fs.hold = hold
	syncsBefore = fs.calls["sync"]
	fs.mu.Unlock()
	release = func() {
		fs.mu.Lock()
		defer fs.mu.Unlock()
		if fs.hold != nil {
			fs.hold = nil
			close(hold)
		}
	}
	t.Cleanup(release)
	return syncsBefore, release
}

// The PUBACK of a QoS 1 message stored for a persistent session waits
// until the session journal's fsync returns: held in the connection's
// gate while the fsync is blocked, written once it returns.
func TestBrokerPUBACKWaitsForTheSessionJournal(t *testing.T) {
	fs := newFaultFS()
	b := startBrokerWith(t, nil, BrokerConfig{DataDir: t.TempDir()}, func(b *Broker) { b.journalFS = fs })
	subscribeOffline(t, b, "later", "results/#")

	syncs, release := holdFsyncs(t, fs)
	pub, _ := dialRaw(t, b.Addr(), "sink", true)
	pub.publish(1, 1, "results/x", []byte("r1"), false)
	testutil.Eventually(t, 10*time.Second, "the journal fsync of the message began", func() bool {
		fs.mu.Lock()
		defer fs.mu.Unlock()
		return fs.calls["sync"] > syncs
	})
	testutil.Eventually(t, 10*time.Second, "the PUBACK held by the connection's gate", func() bool {
		b.tcp.mu.Lock()
		defer b.tcp.mu.Unlock()
		for g := range b.tcp.conns {
			g.mu.Lock()
			held := len(g.held) + g.batched // batched: taken by the flusher, waiting
			g.mu.Unlock()
			if held > 0 {
				return true
			}
		}
		return false
	})
	release()
	pub.expect(packets.Puback, 1)
	if st := b.SessionStats(); st.Messages != 1 {
		t.Fatalf("stats %+v: want the message stored", st)
	}
}

// The broker, not mochi's once-a-second pass over every queued message,
// expires the messages queued for sessions: they still expire (here
// after mochi's maximum message expiry, set to 1 s), and leave the
// session journal.
func TestBrokerExpiresQueuedMessages(t *testing.T) {
	b := startBrokerWith(t, nil, BrokerConfig{DataDir: t.TempDir()}, func(b *Broker) {
		b.server.Options.Capabilities.MaximumMessageExpiryInterval = 1
	})
	if !libraryExpiryStopped(b.server) {
		t.Fatal("mochi's own expiry pass still runs")
	}
	subscribeOffline(t, b, "later", "results/#")
	publishN(t, b.Addr(), "sink", "results/x", "r", 3)
	testutil.Eventually(t, waitBound, "the queued messages expired", func() bool {
		cl, ok := b.server.Clients.Get("later")
		return ok && cl.State.Inflight.Len() == 0 && b.SessionStats().Messages == 0
	})
}

// A client with a long queue is passed over less often: the cost of its
// expiry passes stays that of expiryBatch messages a second.
func TestExpiryPassPeriodFollowsTheQueue(t *testing.T) {
	for _, c := range []struct {
		queued int
		want   time.Duration
	}{{1, time.Second}, {expiryBatch - 1, time.Second}, {expiryBatch, 2 * time.Second},
		{10 * expiryBatch, 11 * time.Second}, {65535, maxExpiryPeriod}} {
		if got := expiryPeriod(c.queued); got != c.want {
			t.Errorf("expiryPeriod(%d) = %v, want %v", c.queued, got, c.want)
		}
	}

	b, err := NewBroker(BrokerConfig{Address: "127.0.0.1:0"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	b.server.Options.Capabilities.MaximumMessageExpiryInterval = 60
	cl := b.server.NewClient(nil, "tcp", "offline", false)
	b.server.Clients.Add(cl)
	t0 := time.Unix(1_800_000_000, 0)
	queue := func(n int) {
		for i := range n {
			cl.State.Inflight.Set(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1},
				PacketID: uint16(i + 1), Created: t0.Unix() - 120, ProtocolVersion: 4})
		}
	}
	next := map[*mochi.Client]time.Time{}
	queue(2 * expiryBatch)
	b.expirePass(t0, next)
	if n := cl.State.Inflight.Len(); n != 0 {
		t.Fatalf("%d messages past the maximum expiry left after a pass", n)
	}
	queue(10)
	b.expirePass(t0.Add(time.Second), next) // the long queue's period (3 s) is not up
	if n := cl.State.Inflight.Len(); n != 10 {
		t.Fatalf("%d queued after a pass before the period was up, want 10", n)
	}
	b.expirePass(t0.Add(3*time.Second), next)
	if n := cl.State.Inflight.Len(); n != 0 {
		t.Fatalf("%d queued after the period, want 0", n)
	}
	b.server.Clients.Delete("offline")
	b.expirePass(t0.Add(4*time.Second), next)
	if len(next) != 0 {
		t.Fatalf("a gone client is still scheduled: %v", next)
	}
}

// A persistent session that holds as many messages as mochi queues for
// one client (less a margin) makes its publishers wait, as a full store
// does, instead of mochi dropping the messages past its bound: here
// mochi's bound is 40, publishes wait at 30, and the consumer gets all
// 60 once it comes back.
func TestBrokerFullSessionQueueHoldsThePublisher(t *testing.T) {
	const n, bound = 60, 40
	b := startBrokerWith(t, nil, BrokerConfig{DataDir: t.TempDir()}, func(b *Broker) {
		b.server.Options.Capabilities.MaximumInflight = bound
	})
	subscribeOffline(t, b, "later", "results/#")
	pub := connect(t, b.Addr(), "sink")
	toks := make([]paho.Token, n)
	for i := range toks {
		toks[i] = pub.Publish("results/x", 1, false, fmt.Sprintf("r-%d", i))
	}
	limit := sessionQueueLimit(bound)
	testutil.Eventually(t, waitBound, "the publisher waiting on the full session", func() bool {
		cl, ok := b.server.Clients.Get("later")
		return b.SessionStats().Blocked > 0 && ok && cl.State.Inflight.Len() == limit
	})
	again := &persistentSub{seen: map[string]int{}}
	connectPersistent(t, b.Addr(), "later", again, false)
	testutil.Eventually(t, waitBound, "every message delivered", func() bool { return again.distinct() == n })
	for _, tok := range toks {
		if !tok.WaitTimeout(waitBound) || tok.Error() != nil {
			t.Fatalf("publish: %v", tok.Error())
		}
	}
	if d := b.server.Info.InflightDropped; d != 0 {
		t.Fatalf("mochi dropped %d messages", d)
	}
}

// An expiry pass over a long queue in which nothing has expired
// allocates next to nothing: mochi's pass (ClearExpiredInflights) copies
// and sorts every queued message (800 bytes each) before it looks at
// them, over 16 MB for the 10,000 results a full default session store
// holds, a transient that added to the heap's peak every few seconds
// while a results' consumer stayed away. A queue with an expired message
// is still passed over as before, and the message dropped.
func TestExpiryPassOverALongQueueAllocatesLittle(t *testing.T) {
	b, err := NewBroker(BrokerConfig{Address: "127.0.0.1:0"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	b.server.Options.Capabilities.MaximumMessageExpiryInterval = 3600
	cl := b.server.NewClient(nil, "tcp", "offline", false)
	b.server.Clients.Add(cl)
	t0 := time.Unix(1_800_000_000, 0)
	const queued = 10_000
	for i := range queued {
		cl.State.Inflight.Set(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1},
			PacketID: uint16(i + 1), Created: t0.Unix() - 60, ProtocolVersion: 4, TopicName: "results/x", Payload: []byte("r")})
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	b.expirePass(t0, map[*mochi.Client]time.Time{})
	runtime.ReadMemStats(&after)
	if n := cl.State.Inflight.Len(); n != queued {
		t.Fatalf("%d queued after a pass in which none had expired, want %d", n, queued)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 1<<20 {
		t.Fatalf("an expiry pass over %d queued messages, none expired, allocated %d bytes, want at most 1 MiB", queued, alloc)
	}

	// One message past its MQTT 5 expiry: the pass drops it.
	cl.State.Inflight.Set(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1},
		PacketID: queued + 1, Created: t0.Unix() - 60, Expiry: t0.Unix() - 1, ProtocolVersion: 5})
	b.expirePass(t0.Add(maxExpiryPeriod), map[*mochi.Client]time.Time{})
	if _, ok := cl.State.Inflight.Get(queued + 1); ok {
		t.Fatal("the expired message is still queued after a pass")
	}
	if n := cl.State.Inflight.Len(); n != queued {
		t.Fatalf("%d queued after the pass, want the %d not expired", n, queued)
	}
}
