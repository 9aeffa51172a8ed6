package mqtt

import (
	"bytes"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"testing"

	paho "github.com/eclipse/paho.mqtt.golang"

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
	cfg.RetainedMaxBytes = 1000
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
