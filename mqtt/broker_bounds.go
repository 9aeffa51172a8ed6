package mqtt

import (
	"log/slog"
	"math/bits"
	"sync/atomic"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// Defaults of the embedded broker's bounds on clients.
const (
	// DefaultMaxConnections is BrokerConfig.MaxConnections by default.
	DefaultMaxConnections = 1000
	// DefaultMaxSubscriptions is BrokerConfig.MaxSubscriptions by
	// default.
	DefaultMaxSubscriptions = 1000
	// DefaultConnectTimeout is BrokerConfig.ConnectTimeout by default.
	DefaultConnectTimeout = 10 * time.Second
)

// refusedFilter stands in the SUBSCRIBE, as the broker library handles
// it, for a filter past a client's bound: no valid topic filter has a
// '#' before its last level, so the library answers it with a failure
// code (0x80 to MQTT 3.1.1, 0x8F to MQTT 5) and subscribes nothing.
const refusedFilter = "#/subscriptions-over-the-bound"

// subscriptionsHook bounds the topic filters one client holds: each
// costs the broker memory for as long as the session lives, and a
// device (or a hostile peer on the network) could otherwise subscribe to
// new filters until the node runs out of it.
type subscriptionsHook struct {
	mochi.HookBase
	max     int
	logger  *slog.Logger
	refused atomic.Uint64
}

func (h *subscriptionsHook) ID() string { return "edged-subscriptions" }

func (h *subscriptionsHook) Provides(b byte) bool { return b == mochi.OnSubscribe }

// OnSubscribe runs on the client's connection goroutine before the
// library handles the SUBSCRIBE: a filter the client does not hold yet
// that would take it past max is replaced by refusedFilter, so that the
// SUBACK refuses that one and grants the others.
func (h *subscriptionsHook) OnSubscribe(cl *mochi.Client, pk packets.Packet) packets.Packet {
	held := cl.State.Subscriptions.Len()
	if held+len(pk.Filters) <= h.max {
		return pk
	}
	filters := make(packets.Subscriptions, len(pk.Filters))
	copy(filters, pk.Filters)
	added := map[string]bool{}
	refused := 0
	for i, f := range filters {
		if _, ok := cl.State.Subscriptions.Get(f.Filter); ok || added[f.Filter] {
			continue
		}
		if held+len(added) < h.max {
			added[f.Filter] = true
			continue
		}
		filters[i].Filter = refusedFilter
		refused++
	}
	pk.Filters = filters
	if refused == 0 {
		return pk
	}
	// Logged when the count reaches the next power of two (the 1st, 2nd,
	// 4th, 8th … refusal): a client that keeps subscribing does not flood
	// the log.
	n := h.refused.Add(uint64(refused))
	if bits.Len64(n-uint64(refused)) != bits.Len64(n) {
		h.logger.Warn("mqtt broker: client holds its most topic filters; subscription refused",
			"client", cl.ID, "held", held+len(added), "max_subscriptions", h.max, "refused", refused, "refused_total", n)
	}
	return pk
}
