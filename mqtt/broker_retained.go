package mqtt

import (
	"log/slog"
	"sync"
	"sync/atomic"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// DefaultRetainedMaxBytes is BrokerConfig.RetainedMaxBytes by default.
const DefaultRetainedMaxBytes = 16 << 20

// retainedHook bounds the retained messages the broker keeps (in memory:
// mochi keeps every one until a device clears it) to max bytes of topic
// and payload. A retained PUBLISH that would pass the bound is routed as
// any message but not retained, and a retained message it would have
// replaced is cleared, so that no subscriber gets a value older than
// the last one published; Refused counts them.
type retainedHook struct {
	mochi.HookBase
	max    int64
	topics *mochi.TopicsIndex
	logger *slog.Logger

	mu    sync.Mutex       // guards sizes and total
	sizes map[string]int64 // retained topic -> its topic and payload bytes
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
	size := int64(len(pk.TopicName) + len(pk.Payload))
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
