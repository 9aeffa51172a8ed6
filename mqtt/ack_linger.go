package mqtt

import "time"

// DefaultAckDelay is SubscriberConfig.AckDelay by default.
const DefaultAckDelay = 5 * time.Millisecond

// MaxAckDelay is the largest SubscriberConfig.AckDelay.
const MaxAckDelay = time.Second

// ackQuiet is how long nothing may arrive, while the acker lingers with
// messages outstanding, before it takes the broker to be waiting for
// acknowledgements (its in-flight window full) rather than slow.
const ackQuiet = time.Millisecond

// ackWindowTTL is how long a learned in-flight window is trusted: a broker
// that paused, rather than stalled on its window, is not taken for a
// small window for longer.
const ackWindowTTL = time.Second

// ackLinger decides whether the acker waits for more messages before it
// makes the ones it took durable and acknowledges them, so that many
// reads share one fsync and one write of acknowledgements (group commit,
// as a database delays a commit while others are about to commit).
//
// Waiting never holds back a broker that is waiting for acknowledgements:
// the acker stops waiting once half of the messages it lets be pending
// (SubscriberConfig.MaxPending, MaxPendingBytes) are outstanding, and
// once half of the broker's in-flight window is. It learns the window
// (which MQTT 3.1.1 does not tell the client: Mosquitto's
// max_inflight_messages, 20 by default) when nothing arrives for
// ackQuiet while it waits, twice in a row with the same number of
// messages unacknowledged: a broker held by its window stops at the same
// count every time, a broker that is merely slow (the common case when
// it is the bottleneck) pauses at any count. A window is trusted for
// ackWindowTTL, and forgotten at once when more messages than it are
// seen outstanding.
//
// A quiet connection ends the wait unless the broker has shown that it
// is not waiting for acknowledgements: it has had more than twice the messages now
// outstanding unacknowledged at once within ackWindowTTL (shown), so its
// window is that large at least and it pauses because it is slow (it
// shares the device's cores with its publishers and with edged). Then the
// acker waits on until the delay, so that a broker that delivers in
// bursts with pauses of more than ackQuiet still shares fsyncs across the
// bursts; waiting does not hold it back, as it can send shown - unacked
// more before it needs an acknowledgement.
//
// An ackLinger is a pure machine: the acker feeds it times and counts.
type ackLinger struct {
	delay time.Duration // 0: the acker does not wait
	still time.Duration // ackQuiet; tests change it
	// window is the number of unacknowledged messages at which the
	// broker was last seen to stop sending, learned at learned; 0 when
	// unknown.
	window  int64
	learned time.Time
	// stalled is the number outstanding at the last quiet end of a
	// wait, 0 when the last wait did not end quiet.
	stalled int64
	// shown is the most messages seen outstanding at once, last at
	// shownAt: the broker's window is at least that; 0 when unknown or
	// older than ackWindowTTL.
	shown   int64
	shownAt time.Time
}

// more reports whether the acker should wait for more messages at now,
// with unacked messages outstanding (received, not acknowledged) and
// half set when half of the subscriber's own bounds on them are used.
func (l *ackLinger) more(now time.Time, unacked int64, half bool) bool {
	l.see(now, unacked)
	if l.delay <= 0 || half {
		return false
	}
	if l.window > 0 && (now.Sub(l.learned) >= ackWindowTTL || unacked > l.window) {
		l.window = 0
	}
	return l.window == 0 || unacked < (l.window+1)/2
}

// see records that unacked messages are outstanding at now.
func (l *ackLinger) see(now time.Time, unacked int64) {
	if unacked >= l.shown || now.Sub(l.shownAt) >= ackWindowTTL {
		l.shown, l.shownAt = unacked, now
	}
}

// quiet records that nothing arrived for ackQuiet at now while the acker
// waited with unacked messages outstanding, and reports whether the wait
// ends: it goes on while the broker has shown a window of more than twice
// unacked (see ackLinger). A wait that ends quiet the second time in a
// row with the same count learns that count as the broker's window.
func (l *ackLinger) quiet(now time.Time, unacked int64) (end bool) {
	l.see(now, unacked)
	if unacked > 0 && unacked < (l.shown+1)/2 {
		return false
	}
	if unacked > 0 && unacked == l.stalled {
		l.window, l.learned = unacked, now
	}
	l.stalled = unacked
	return true
}

// ended records that a wait ended otherwise than quiet.
func (l *ackLinger) ended() { l.stalled = 0 }
