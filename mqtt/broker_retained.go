package mqtt

import (
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// DefaultRetainedMaxBytes is BrokerConfig.RetainedMaxBytes by default.
const DefaultRetainedMaxBytes = 16 << 20

// retainedMsgOverhead and retainedLevelOverhead are the memory a
// retained message costs besides its topic and payload, counted against
// the bound with them (retainedCost): mochi's packet, an 800-byte
// packets.Packet held by value in its retained map, with our entry in
// sizes; and for each level of the topic a node of mochi's topic tree
// (about 600 bytes with its maps), which the retained message creates
// when no other topic has it yet. Measured with retained messages of one
// byte on new topics: 1.5 KiB each with one new level, 2.0 KiB with two,
// 3.3 KiB with four, where topic and payload alone counted 9 to 15 bytes.
const (
	retainedMsgOverhead   = 1024
	retainedLevelOverhead = 640
)

// retainedCost is what a retained message on topic with a payload of
// payload bytes counts against the bound: its topic, its payload and the
// overheads above (each level counted, though a level other topics share
// costs nothing more).
func retainedCost(topic string, payload int) int64 {
	return int64(len(topic)+payload) + retainedMsgOverhead +
		int64(strings.Count(topic, "/")+1)*retainedLevelOverhead
}

// retainedHook bounds the retained messages the broker keeps (in memory:
// mochi keeps every one until a device clears it) to max bytes of what
// they cost (retainedCost). A retained PUBLISH that would pass the bound is routed as
// any message but not retained, and a retained message it would have
// replaced is cleared, so that no subscriber gets a value older than
// the last one published; Refused counts them.
type retainedHook struct {
	mochi.HookBase
	max    int64
	topics *mochi.TopicsIndex
	logger *slog.Logger

	mu    sync.Mutex       // guards sizes and total
	sizes map[string]int64 // retained topic -> its retainedCost
	total int64

	refused atomic.Uint64
}

func newRetainedHook(max int64, topics *mochi.TopicsIndex, logger *slog.Logger) *retainedHook {
	return &retainedHook{max: max, topics: topics, logger: logger, sizes: map[string]int64{}}
}

func (h *retainedHook) ID() string { return "edged-retained" }

func (h *retainedHook) Provides(b byte) bool {
	return b == mochi.OnPublish || b == mochi.OnRetainedExpired
}

// OnRetainedExpired runs on mochi's housekeeping goroutine once it has
// dropped the retained message of topic: one whose MQTT 5 message expiry
// passed, or any older than the broker's maximum message expiry
// interval (a day). Its bytes no longer count against the bound.
func (h *retainedHook) OnRetainedExpired(topic string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.total -= h.sizes[topic]
	delete(h.sizes, topic)
}

// OnPublish runs on the publisher's connection goroutine, after the
// ingest hook, before mochi retains the message.
func (h *retainedHook) OnPublish(cl *mochi.Client, pk packets.Packet) (packets.Packet, error) {
	if !pk.FixedHeader.Retain {
		return pk, nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	old := h.sizes[pk.TopicName]
	if len(pk.Payload) == 0 { // clears the topic's retained message
		delete(h.sizes, pk.TopicName)
		h.total -= old
		return pk, nil
	}
	size := retainedCost(pk.TopicName, len(pk.Payload))
	if h.total-old+size <= h.max {
		h.sizes[pk.TopicName] = size
		h.total += size - old
		return pk, nil
	}
	pk.FixedHeader.Retain = false
	if old > 0 {
		h.topics.RetainMessage(packets.Packet{TopicName: pk.TopicName})
		delete(h.sizes, pk.TopicName)
		h.total -= old
	}
	if n := h.refused.Add(1); n&(n-1) == 0 { // the 1st, 2nd, 4th, 8th, ...
		h.logger.Warn("mqtt broker: retained messages over their bound; message routed but not retained (the topic's retained message cleared)",
			"client", cl.ID, "topic", pk.TopicName, "message_bytes", size, "retained_bytes", h.total,
			"retained_max_bytes", h.max, "refused_total", n)
	}
	return pk, nil
}
