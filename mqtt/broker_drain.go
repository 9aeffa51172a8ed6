package mqtt

import (
	"sync"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// drainHook lets Close drain the broker: it tracks the clients whose
// packet is being processed (from its read to the end of its processing,
// which includes the ingest append and the PUBACK/PUBREC write), and once
// draining refuses new connections and new PUBLISH packets. A refused
// PUBLISH ends its connection unacknowledged, so the device resends it
// later, and it was not appended: no duplicate. It is the first hook, so
// a refused packet reaches no other.
type drainHook struct {
	mochi.HookBase

	mu       sync.Mutex // guards the fields below
	draining bool
	busy     map[*mochi.Client]struct{}
	idle     chan struct{} // closed when draining and busy is empty
	atStart  int           // busy connections and pending ones when draining began
	pending  int           // connections with acknowledgements waiting for an fsync (ackGate)
	refused  int           // PUBLISH packets refused while draining
}

func newDrainHook() *drainHook {
	return &drainHook{busy: map[*mochi.Client]struct{}{}, idle: make(chan struct{})}
}

func (h *drainHook) ID() string { return "edged-drain" }

func (h *drainHook) Provides(b byte) bool {
	return b == mochi.OnConnect || b == mochi.OnPacketRead || b == mochi.OnPacketProcessed || b == mochi.OnDisconnect
}

// OnConnect refuses connections while draining.
func (h *drainHook) OnConnect(cl *mochi.Client, _ packets.Packet) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.draining {
		return ErrBrokerClosed
	}
	return nil
}

// OnPacketRead marks cl busy, or refuses a PUBLISH while draining. A
// refused PUBLISH ends the connection, but first the acknowledgements of
// the messages the connection already appended go out (they wait for an
// fsync in its ackGate): the device must not resend those. The connection
// then ends with a lingering close (see ackGate.Close), so the device
// reads them before the end of the stream.
func (h *drainHook) OnPacketRead(cl *mochi.Client, pk packets.Packet) (packets.Packet, error) {
	if pk.FixedHeader.Type == packets.Connect {
		// Not tracked: for a CONNECT, mochi calls neither
		// OnPacketProcessed nor, when the connection is refused (by
		// OnConnect while draining), OnDisconnect, and the drain would
		// wait for it until its timeout.
		return pk, nil
	}
	h.mu.Lock()
	if h.draining && pk.FixedHeader.Type == packets.Publish {
		h.refused++
		h.mu.Unlock()
		if g, ok := cl.Net.Conn.(*ackGate); ok {
			g.settled()
		}
		return pk, packets.ErrRejectPacket
	}
	h.busy[cl] = struct{}{}
	h.mu.Unlock()
	return pk, nil
}

// OnPacketProcessed marks cl idle.
func (h *drainHook) OnPacketProcessed(cl *mochi.Client, _ packets.Packet, _ error) { h.done(cl) }

// OnDisconnect marks cl idle (a packet that failed validation ends the
// connection without OnPacketProcessed).
func (h *drainHook) OnDisconnect(cl *mochi.Client, _ error, _ bool) { h.done(cl) }

func (h *drainHook) done(cl *mochi.Client) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.busy, cl)
	h.checkIdle()
}

// hold adds n (1 or -1) to the connections whose acknowledgements wait
// for an fsync: the drain waits for them too.
func (h *drainHook) hold(n int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.pending += n
	h.checkIdle()
}

// checkIdle closes idle once draining with nothing busy and no
// acknowledgement pending. h.mu is held.
func (h *drainHook) checkIdle() {
	if h.draining && len(h.busy) == 0 && h.pending == 0 {
		select {
		case <-h.idle:
		default:
			close(h.idle)
		}
	}
}

// drain starts draining and waits until no packet is being processed and
// no acknowledgement waits for an fsync, or timeout passes; it reports
// whether the broker drained.
func (h *drainHook) drain(timeout time.Duration) bool {
	h.mu.Lock()
	h.draining = true
	h.atStart = len(h.busy) + h.pending
	h.checkIdle()
	h.mu.Unlock()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-h.idle:
		return true
	case <-t.C:
		return false
	}
}

func (h *drainHook) busyCount() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.busy) + h.pending
}
