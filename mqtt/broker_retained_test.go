package mqtt

import (
	"bytes"
	"fmt"
	"log/slog"
	"maps"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	mochi "github.com/mochi-mqtt/server/v2"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/mqtt/ingestlog"
)

// The retained messages the broker keeps are bounded by
// RetainedMaxBytes: a device that retains a message on every new topics
// gets them routed and ingested, but past the bound not retained, and a
// retained message it would replace is cleared rather than left stale.
// Clearing a retained message makes room again.
func TestBrokerBoundsRetainedMessages(t *testing.T) {
	l := openLog(t, t.TempDir(), ingestlog.DefaultOptions())
	logs := &testutil.Buffer{}
	cfg := DefaultBrokerConfig()
	cfg.RetainedMaxBytes = 10 * retainedCost("r/0", 97)
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	b := startBrokerCfg(t, l, cfg, nil)

	c, _ := dialRaw(t, b.Addr(), "dev", true)
	retain := func(pid uint16, topic string, payload []byte) {
		c.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1, Retain: true}, PacketID: pid, TopicName: topic, Payload: payload})
		c.expect(packets.Puback, pid)
	}
	payload := bytes.Repeat([]byte("x"), 100)
	for i := range 12 {
		topic := fmt.Sprintf("r/%d", i) // r/0..r/9 fill the bound; r/10 and r/11 pass it
		retain(uint16(i+1), topic, payload[:100-len(topic)])
	}
	// r/0 replaced by a larger message over the bound: cleared.
	retain(13, "r/0", bytes.Repeat([]byte("y"), 200))
	if n := b.RetainedRefused(); n != 3 {
		t.Fatalf("RetainedRefused %d, want 3 (r/10, r/11 and the new r/0)", n)
	}
	if recs := readAll(t, l); len(recs) != 13 {
		t.Fatalf("the log holds %d messages, want all 13", len(recs))
	}
	if !strings.Contains(logs.String(), "retained messages over their bound") {
		t.Fatal("the refusal was not logged")
	}
	// What the broker retains (its index), and what a subscriber that
	// comes later gets: every one of them (the retained messages reach it
	// in no set order with what is published meanwhile, so no message
	// can mark the end of them; the index says that there are no others).
	subs := 0
	retained := func() map[string]bool {
		got := map[string]bool{}
		for topic := range b.server.Topics.Retained.GetAll() {
			if strings.HasPrefix(topic, "r/") { // not the broker's $SYS topics
				got[topic] = true
			}
		}
		subs++
		var mu sync.Mutex
		delivered := map[string]bool{}
		sub := connect(t, b.Addr(), fmt.Sprintf("late%d", subs))
		defer sub.Disconnect(0)
		if tok := sub.Subscribe("r/#", 1, func(_ paho.Client, m paho.Message) {
			mu.Lock()
			delivered[m.Topic()] = true
			mu.Unlock()
		}); !tok.WaitTimeout(waitBound) || tok.Error() != nil {
			t.Fatalf("subscribe: %v", tok.Error())
		}
		testutil.Eventually(t, waitBound, "the retained messages delivered to a late subscriber", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return maps.Equal(delivered, got)
		})
		return got
	}
	got := retained()
	if len(got) != 9 || got["r/0"] || got["r/10"] || got["r/11"] {
		t.Fatalf("retained %v; want r/1..r/9", got)
	}
	// Clearing one makes room for another.
	retain(14, "r/1", nil)
	retain(15, "r/10", payload[:80])
	if got := retained(); len(got) != 9 || got["r/1"] || !got["r/10"] {
		t.Fatalf("retained %v; want r/2..r/10", got)
	}
}

// The bound counts what a retained message costs in memory, not its
// topic and payload alone: a device retaining a short status on a new
// topic each time makes the broker stop retaining once its heap holds
// about the bound. Before, a one-byte status on "dev/000042" counted 11
// bytes while it cost about 1.5 KiB (mochi's packet and topic-tree
// node): 512 KiB of bound held some 47,000 of them, about 70 MB of heap.
func TestBrokerRetainedBoundCountsWhatMessagesCost(t *testing.T) {
	const bound = 512 << 10
	cfg := DefaultBrokerConfig()
	cfg.RetainedMaxBytes = bound
	b := startBrokerCfg(t, nil, cfg, nil)
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	dev := connect(t, b.Addr(), "dev")
	before := heap()
	n := 0
	for ; b.RetainedRefused() == 0; n++ {
		if n == 100_000 {
			t.Fatal("100,000 retained messages and none refused")
		}
		if tok := dev.Publish(fmt.Sprintf("dev/%06d", n), 1, true, "1"); !tok.WaitTimeout(waitBound) || tok.Error() != nil {
			t.Fatalf("publish: %v", tok.Error())
		}
	}
	grown := heap() - before
	t.Logf("%d retained, heap grown by %d bytes", n-1, grown)
	if grown > 2*bound {
		t.Fatalf("heap grew by %d bytes with %d retained messages on a %d-byte bound", grown, n-1, bound)
	}
}

// A retained message the broker drops because it expired (an MQTT 5
// message expiry, or the broker's maximum of a day for every message)
// no longer counts against the bound: before, a broker up for more than
// a day refused to retain anything once the expired messages had added
// up to the bound, although it held none.
func TestRetainedExpiryMakesRoom(t *testing.T) {
	one := retainedCost("r/a", 97)
	h := newRetainedHook(3*one, mochi.NewTopicsIndex(), slog.New(slog.DiscardHandler))
	if !h.Provides(mochi.OnRetainedExpired) {
		t.Fatal("the hook does not take OnRetainedExpired: mochi would not tell it")
	}
	cl := &mochi.Client{ID: "dev"}
	retain := func(topic string, n int) bool {
		pk, err := h.OnPublish(cl, packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Retain: true},
			TopicName: topic, Payload: bytes.Repeat([]byte("x"), n)})
		if err != nil {
			t.Fatal(err)
		}
		return pk.FixedHeader.Retain
	}
	if !retain("r/a", 97) || !retain("r/b", 97) || !retain("r/c", 97) { // the bound
		t.Fatal("messages within the bound not retained")
	}
	if retain("r/d", 97) {
		t.Fatal("a message over the bound retained")
	}
	h.OnRetainedExpired("r/a")
	h.OnRetainedExpired("r/b")
	h.OnRetainedExpired("r/none") // not retained through the hook: nothing to take off
	if !retain("r/d", 97) || !retain("r/e", 97) {
		t.Fatal("no room after two retained messages expired")
	}
	if retain("r/f", 1) {
		t.Fatal("a message over the bound retained after the expiry")
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.total != 3*one || len(h.sizes) != 3 {
		t.Fatalf("total %d over %d topics, want %d over 3", h.total, len(h.sizes), 3*one)
	}
}

// Through the broker: an MQTT 5 device's retained message with a message
// expiry of one second stops counting once the broker drops it.
func TestBrokerRetainedExpiryReleasesItsBytes(t *testing.T) {
	l := openLog(t, t.TempDir(), ingestlog.DefaultOptions())
	b := startBrokerCfg(t, l, DefaultBrokerConfig(), nil)
	c, _ := dialRaw5(t, b.Addr(), "dev5")
	c.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1, Retain: true}, PacketID: 1,
		TopicName: "r/short", Payload: []byte("lives a second"),
		Properties: packets.Properties{MessageExpiryInterval: 1}})
	c.expect(packets.Puback, 1)
	held := func() int64 {
		b.retained.mu.Lock()
		defer b.retained.mu.Unlock()
		return b.retained.sizes["r/short"]
	}
	if held() == 0 {
		t.Fatal("the retained message is not counted")
	}
	testutil.Eventually(t, 10*time.Second, "the expired retained message to stop counting", func() bool { return held() == 0 })
	if _, ok := b.server.Topics.Retained.GetAll()["r/short"]; ok {
		t.Fatal("the broker still retains the message its hook no longer counts")
	}
}
