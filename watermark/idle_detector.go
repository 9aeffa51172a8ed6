package watermark

import "time"

// IdleDetector tells a source (or timestamp-assigner) subtask when it has
// seen no record for a timeout, so that it marks its output idle and
// downstream tasks stop holding their watermark back for it. It becomes
// active again at the next record. It reads no clock: the caller passes
// processing time in milliseconds since the epoch. Not safe for concurrent
// use: the owning task calls it from its own goroutine.
//
// Inactivity is measured from the last OnEvent, or, before any, from the
// first call to OnEvent or Check: a subtask that never sees a record turns
// idle one timeout after it first checks.
type IdleDetector struct {
	// timeout is in milliseconds; 0 means never idle.
	timeout int64
	// since is the processing time of the last activity; valid once
	// started is set.
	since   int64
	started bool
	idle    bool
}

// NewIdleDetector returns a detector that turns idle after timeout without
// events, rounded up to whole milliseconds. A timeout of 0 or less means
// never idle.
func NewIdleDetector(timeout time.Duration) *IdleDetector {
	var ms int64
	if timeout > 0 {
		ms = int64((timeout + time.Millisecond - 1) / time.Millisecond)
	}
	return &IdleDetector{timeout: ms}
}

// OnEvent records that a record arrived at processing time nowMs. It
// reports whether this switched the detector from idle back to active, in
// which case the caller marks its output active again.
func (d *IdleDetector) OnEvent(nowMs int64) (changed bool) {
	d.since = nowMs
	d.started = true
	if d.idle {
		d.idle = false
		return true
	}
	return false
}

// Check reports whether the detector is idle at processing time nowMs,
// that is whether at least the timeout passed since the last activity, and
// whether this call switched it from active to idle. Once idle it stays
// idle until the next OnEvent. Time going backwards counts as no time
// passing.
func (d *IdleDetector) Check(nowMs int64) (idle, changed bool) {
	if d.timeout == 0 {
		return false, false
	}
	if !d.started {
		d.since = nowMs
		d.started = true
	}
	if d.idle {
		return true, false
	}
	// The difference in uint64 cannot overflow for nowMs > since.
	if nowMs > d.since && uint64(nowMs)-uint64(d.since) >= uint64(d.timeout) {
		d.idle = true
		return true, true
	}
	return false, false
}

// Idle reports whether the detector is idle, as of the last Check or
// OnEvent.
func (d *IdleDetector) Idle() bool { return d.idle }
