package mqtt

import (
	"bufio"
	"fmt"
	"net"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/edgedio/edged/internal/testutil"
)

// persistentSub connects id with a persistent session, collecting every
// message (acknowledged automatically unless manual) by its payload.
type persistentSub struct {
	mu   sync.Mutex
	seen map[string]int
	msgs []paho.Message
}

func (s *persistentSub) handler(_ paho.Client, m paho.Message) {
	s.mu.Lock()
	s.seen[string(m.Payload())]++
	s.msgs = append(s.msgs, m)
	s.mu.Unlock()
}

func (s *persistentSub) distinct() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.seen)
}

func connectPersistent(t *testing.T, addr, id string, s *persistentSub, manual bool) paho.Client {
	return connect(t, addr, id, func(o *paho.ClientOptions) {
		o.SetCleanSession(false).SetDefaultPublishHandler(s.handler).SetAutoAckDisabled(manual).SetOrderMatters(false)
	})
}

// publishN publishes n QoS 1 messages "<prefix>-<i>" to topic and waits
// for every PUBACK.
func publishN(t *testing.T, addr, id, topic, prefix string, n int) {
	t.Helper()
	pub := connect(t, addr, id)
	var toks []paho.Token
	for i := range n {
		toks = append(toks, pub.Publish(topic, 1, false, fmt.Appendf(nil, "%s-%d", prefix, i)))
		if len(toks) == 500 || i == n-1 {
			for _, tok := range toks {
				if !tok.WaitTimeout(waitBound) || tok.Error() != nil {
					t.Fatalf("publish: %v", tok.Error())
				}
			}
			toks = toks[:0]
		}
	}
	pub.Disconnect(0)
}

// A persistent-session subscriber is offline, or online with messages
// unacknowledged, when the broker is killed (no drain; journal records
// not yet synced are lost). After a restart on the same directory it
// reconnects and gets every QoS 1 message whose publisher got a PUBACK.
func TestBrokerPersistentSessionAcrossCrash(t *testing.T) {
	testutil.Burn(t, 1)
	const n = 600
	for _, online := range []bool{false, true} {
		t.Run(fmt.Sprintf("online=%v", online), func(t *testing.T) {
			dataDir := t.TempDir()
			cfg := BrokerConfig{DataDir: dataDir}
			b := startBrokerCfg(t, nil, cfg, nil)
			first := &persistentSub{seen: map[string]int{}}
			sub := connectPersistent(t, b.Addr(), "consumer", first, true)
			if tok := sub.Subscribe("results/#", 1, nil); !tok.WaitTimeout(waitBound) || tok.Error() != nil {
				t.Fatal(tok.Error())
			}
			if !online {
				sub.Disconnect(0)
			}
			start := time.Now()
			publishN(t, b.Addr(), "sink", "results/x", "r", n)
			t.Logf("%d QoS 1 messages stored for a persistent session from one connection in %v", n, time.Since(start))
			if online {
				// The consumer acknowledges the first half only.
				testutil.Eventually(t, waitBound, "every message delivered once", func() bool { return first.distinct() >= n })
				first.mu.Lock()
				for _, m := range first.msgs[:n/2] {
					m.Ack()
				}
				first.mu.Unlock()
			}
			if st := b.SessionStats(); st.Messages == 0 {
				t.Fatalf("stats %+v: no message stored for the offline session", st)
			}
			b.crash()
			sub.Disconnect(0)

			b = startBrokerCfg(t, nil, cfg, nil)
			again := &persistentSub{seen: map[string]int{}}
			connectPersistent(t, b.Addr(), "consumer", again, false)
			acked := map[string]bool{}
			if online {
				first.mu.Lock()
				for _, m := range first.msgs[:n/2] {
					acked[string(m.Payload())] = true
				}
				first.mu.Unlock()
			}
			missing := func() []string {
				again.mu.Lock()
				defer again.mu.Unlock()
				var out []string
				for i := range n {
					if p := fmt.Sprintf("r-%d", i); again.seen[p] == 0 && !acked[p] {
						out = append(out, p)
					}
				}
				return out
			}
			if !testutil.Within(waitBound, func() bool { return len(missing()) == 0 }) {
				m := missing()
				t.Fatalf("%d unacknowledged messages lost, first %s", len(m), m[0])
			}
		})
	}
}

// The session store's bound counts what its messages cost in memory,
// not their topics and payloads alone: an offline session queuing small
// messages makes the publisher wait once the broker's heap holds about
// the bound. Before, a 10-byte reading counted 25 bytes against it while
// it cost about 1.3 KiB (the store's record, mochi's inflight packet):
// one offline session took 64,511 messages and some 90 MB of heap on a 4
// MiB bound (mochi's bound per session, not ours, held it back), and the
// daemon's 16 MiB counted the messages of about ten such sessions.
func TestBrokerSessionBoundCountsWhatMessagesCost(t *testing.T) {
	const bound = 4 << 20
	b := startBrokerCfg(t, nil, BrokerConfig{DataDir: t.TempDir(), SessionMaxBytes: bound}, nil)
	subscribeOffline(t, b, "later", "results/#")
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()
	pub := connect(t, b.Addr(), "sink")
	var last paho.Token
	for i := 0; b.SessionStats().Blocked == 0; i++ {
		if i == 100_000 {
			t.Fatalf("stats %+v: 100,000 messages and the publisher never waited", b.SessionStats())
		}
		last = pub.Publish("results/x", 1, false, fmt.Sprintf("r-%07d", i))
		if i%64 == 63 {
			// At most 64 publishes ahead of the store: the last is
			// acknowledged, or held back by a full store.
			testutil.Eventually(t, waitBound, "a publish acknowledged or held back", func() bool {
				return last.WaitTimeout(time.Millisecond) || b.SessionStats().Blocked > 0
			})
		}
	}
	st := b.SessionStats()
	grown := heap() - before
	t.Logf("stats %+v, heap grown by %d bytes", st, grown)
	if st.Bytes > bound {
		t.Fatalf("stats %+v: store past its bound", st)
	}
	if grown > 2*bound {
		t.Fatalf("heap grew by %d bytes with %d messages queued on a %d-byte bound", grown, st.Messages, bound)
	}
}

// A full session store holds back the publisher's PUBACK until the
// offline consumer comes back and acknowledges; nothing is dropped.
func TestBrokerSessionStoreFullBackpressure(t *testing.T) {
	const n = 20
	cfg := BrokerConfig{DataDir: t.TempDir(), SessionMaxBytes: 10000}
	b := startBrokerCfg(t, nil, cfg, nil)
	first := &persistentSub{seen: map[string]int{}}
	sub := connectPersistent(t, b.Addr(), "slow", first, false)
	if tok := sub.Subscribe("results/#", 1, nil); !tok.WaitTimeout(waitBound) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}
	sub.Disconnect(0)

	pub := connect(t, b.Addr(), "sink")
	pad := strings.Repeat("x", 190)
	var toks []paho.Token
	for i := range n {
		toks = append(toks, pub.Publish("results/x", 1, false, fmt.Sprintf("%02d%s", i, pad)))
	}
	testutil.Eventually(t, waitBound, "a publish blocked on the full store", func() bool { return b.SessionStats().Blocked > 0 })
	if st := b.SessionStats(); st.Bytes > cfg.SessionMaxBytes {
		t.Fatalf("stats %+v: store past its bound", st)
	}
	select {
	case <-toks[n-1].Done():
		t.Fatal("the last publish was acknowledged while the store is full")
	default:
	}

	again := &persistentSub{seen: map[string]int{}}
	connectPersistent(t, b.Addr(), "slow", again, false)
	for _, tok := range toks {
		if !tok.WaitTimeout(waitBound) || tok.Error() != nil {
			t.Fatalf("publish: %v", tok.Error())
		}
	}
	testutil.Eventually(t, waitBound, "every message delivered", func() bool { return again.distinct() == n })
}

// With a session journal but no persistent session stored, the session
// hook's OnPublish does not look up the topic's subscribers (mochi does,
// again, to route the message): a node whose devices and consumers all
// use clean sessions pays nothing per QoS 1 message for the journal. Once
// a persistent session subscribes, the hook stores its messages again.
func TestSessionHookSkipsTopicScanWithoutPersistentSessions(t *testing.T) {
	b := startBrokerCfg(t, nil, BrokerConfig{DataDir: t.TempDir()}, nil)
	clean := subscribe(t, b.Addr(), "clean-consumer", "sensors/#") // a subscriber the scan would find
	h := newSessionHook(b, b.store)
	dev := &mochi.Client{ID: "device"}
	pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1},
		TopicName: "sensors/a", Payload: []byte("x"), PacketID: 1}
	if allocs := testing.AllocsPerRun(100, func() {
		if _, err := h.OnPublish(dev, pk); err != nil {
			t.Fatal(err)
		}
	}); allocs != 0 {
		t.Errorf("OnPublish allocates %.0f times per QoS 1 message with no persistent session stored, want 0 (no subscriber lookup)", allocs)
	}

	// The path that must not be skipped: a persistent session's message is
	// stored before the PUBACK.
	ps := &persistentSub{seen: map[string]int{}}
	sub := connectPersistent(t, b.Addr(), "persistent-consumer", ps, false)
	if tok := sub.Subscribe("sensors/#", 1, nil); !tok.WaitTimeout(waitBound) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}
	testutil.Eventually(t, waitBound, "the persistent session stored", func() bool {
		return b.SessionStats().Sessions == 1
	})
	if _, err := h.OnPublish(dev, pk); err != nil {
		t.Fatal(err)
	}
	h.mu.Lock()
	_, stored := h.routing[dev.ID]
	h.mu.Unlock()
	if !stored {
		t.Fatal("OnPublish did not store the message for the persistent session")
	}
	if got := b.SessionStats().Messages; got != 1 {
		t.Errorf("stored messages = %d, want 1", got)
	}
	h.OnPacketProcessed(dev, pk, nil) // never routed: forget it
	publishN(t, b.Addr(), "device-2", "sensors/b", "m", 1)
	testutil.Eventually(t, waitBound, "the persistent session's message delivered", func() bool {
		return ps.distinct() == 1
	})
	clean.waitFor(t, 1)
}

// A publish to a persistent session while the session journal cannot be
// written (a full card) gets no PUBACK (the publisher resends it; mochi
// may have routed it already, as it does before the ingest log's fsync:
// at least once); once space is freed the next publish rewrites the
// journal, gets its PUBACK and reaches the session, without a restart.
func TestBrokerSessionJournalRecoversAfterFailedWrite(t *testing.T) {
	fs := newFaultFS()
	b := startBrokerWith(t, nil, BrokerConfig{DataDir: t.TempDir()}, func(b *Broker) { b.journalFS = fs })
	sub, _ := dialRaw(t, b.Addr(), "consumer", false)
	sub.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Subscribe}, PacketID: 1,
		Filters: packets.Subscriptions{{Filter: "results/#", Qos: 1}}})
	sub.expect(packets.Suback, 1)

	fs.set("write", syscall.ENOSPC)
	fs.set("write.tmp", syscall.ENOSPC)
	pub, _ := dialRaw(t, b.Addr(), "pub", true)
	pub.publish(1, 1, "results/x", []byte("refused"), false)
	expectClosed(t, pub, "with the journal failing")
	pub, _ = dialRaw(t, b.Addr(), "pub", true)
	pub.publish(1, 1, "results/x", []byte("refused again"), false)
	expectClosed(t, pub, "while the rewrite fails")
	if n := fs.hit("write.tmp"); n != 1 {
		t.Fatalf("%d rewrites failed, want 1 (by the second publish)", n)
	}

	fs.set("write", nil)
	fs.set("write.tmp", nil)
	pub, _ = dialRaw(t, b.Addr(), "pub", true)
	pub.publish(1, 1, "results/x", []byte("accepted"), false)
	pub.expect(packets.Puback, 1)
	for {
		pk := sub.expect(packets.Publish, 0)
		if p := string(pk.Payload); p == "accepted" {
			break
		} else if p != "refused" && p != "refused again" {
			t.Fatalf("consumer got %q", p)
		}
	}
	if st := b.SessionStats(); st.Recoveries != 1 || st.Failures != 2 {
		t.Fatalf("stats %+v: want 2 failures, 1 recovery", st)
	}
}

// expectClosed fails unless the broker closes c's connection without
// sending anything.
func expectClosed(t *testing.T, c *rawClient, when string) {
	t.Helper()
	pk, err := c.read()
	if err == nil {
		t.Fatalf("got packet type %d %s, want the connection closed without a PUBACK", pk.FixedHeader.Type, when)
	}
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("connection still open %s: %v", when, err)
	}
}

// An MQTT 5 consumer with a persistent session that accepts topic aliases
// gets every message after the first on a topic under the alias alone (an
// empty topic name): its PUBACK still takes the message out of the
// session journal. Before, the journal recorded no packet id for such a
// message and kept it, acknowledged, until it was full (its publishers
// then got no PUBACK) or the next restart resent it.
func TestBrokerSessionAliasedMessagesLeaveTheJournal(t *testing.T) {
	b := startBrokerCfg(t, nil, BrokerConfig{DataDir: t.TempDir()}, nil)
	acks := &pubackCounter{client: "consumer"}
	if err := b.server.AddHook(acks, nil); err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("tcp", b.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c := &rawClient{t: t, conn: conn, r: bufio.NewReader(conn), version: 5}
	c.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Connect},
		Connect:    packets.ConnectParams{ProtocolName: []byte("MQTT"), ClientIdentifier: "consumer", Keepalive: 60},
		Properties: packets.Properties{SessionExpiryInterval: 3600, SessionExpiryIntervalFlag: true, TopicAliasMaximum: 10}})
	c.expect(packets.Connack, 0)
	c.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Subscribe}, PacketID: 1,
		Filters: packets.Subscriptions{{Filter: "results/#", Qos: 1}}})
	c.expect(packets.Suback, 1)

	pub := connect(t, b.Addr(), "sink")
	var aliased int
	for i, payload := range []string{"a", "b", "c"} {
		if tok := pub.Publish("results/x", 1, false, payload); !tok.WaitTimeout(waitBound) || tok.Error() != nil {
			t.Fatalf("publish: %v", tok.Error())
		}
		pk := c.expect(packets.Publish, 0)
		if string(pk.Payload) != payload {
			t.Fatalf("got %q, want %q", pk.Payload, payload)
		}
		if pk.TopicName == "" {
			aliased++
		}
		c.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Puback}, PacketID: pk.PacketID})
		testutil.Eventually(t, waitBound, "the PUBACK handled", func() bool { return acks.n.Load() == int32(i+1) })
	}
	if aliased != 2 {
		t.Fatalf("%d of the messages came under their topic alias alone; the test needs 2", aliased)
	}
	if st := b.SessionStats(); st.Messages != 0 {
		t.Errorf("the session journal holds %d message(s) after the consumer acknowledged every one", st.Messages)
	}
}

// A publish waiting for room in a full session store ends when its
// connection ends (here taken over by a new connection with the same
// client id, as a sink's publisher reconnecting after a timeout or a
// restart of its job does): before, it went on waiting on the broker's
// context, with the connection's client and buffers (about 0.5 MiB), and
// a node whose results' consumer stayed away gained one such wait per
// reconnect of its sink (12 after 12 minutes). The consumer back, the
// messages of the connection that is still up are delivered.
func TestBrokerSessionStoreFullWaitEndsWithTheConnection(t *testing.T) {
	cfg := BrokerConfig{DataDir: t.TempDir(), SessionMaxBytes: 10000}
	b := startBrokerCfg(t, nil, cfg, nil)
	sub := connectPersistent(t, b.Addr(), "slow", &persistentSub{seen: map[string]int{}}, false)
	if tok := sub.Subscribe("results/#", 1, nil); !tok.WaitTimeout(waitBound) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}
	sub.Disconnect(0)
	waiting := func() int {
		var buf strings.Builder
		if err := pprof.Lookup("goroutine").WriteTo(&buf, 1); err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, g := range strings.Split(buf.String(), "\n\n") {
			if _, rest, ok := strings.Cut(g, "goroutine profile:"); ok {
				_, g, _ = strings.Cut(rest, "\n")
			}
			var c int
			if (strings.Contains(g, "(*sessionStore).addMessageLocked") || strings.Contains(g, "(*sessionHook).waitRoom")) &&
				func() bool { _, err := fmt.Sscanf(g, "%d @", &c); return err == nil }() {
				n += c
			}
		}
		return n
	}
	pad := strings.Repeat("x", 190)
	for round := range 3 {
		pub := connect(t, b.Addr(), "sink")
		for i := range 60 {
			pub.Publish("results/x", 1, false, fmt.Sprintf("%d-%02d%s", round, i, pad))
		}
		testutil.Eventually(t, waitBound, "a publish waiting for room in the full store", func() bool { return waiting() >= 1 })
	}
	// Three connections of "sink", each taken over by the next: only the
	// last one's publish may still wait.
	testutil.Eventually(t, waitBound, "the waits of the connections taken over ended", func() bool { return waiting() == 1 })
}
