package watermark

// Merger combines the watermarks of a task's input channels: the task's
// watermark is the minimum over the channels that are not idle; when every
// channel is idle, it is the largest of their watermarks (as Flink's
// StatusWatermarkValve flushes when its last active channel goes idle); it
// never goes backwards. A channel that ended (sent MaxWatermark) counts as
// MaxWatermark.
//
// Precisely, each channel is in one of three states:
//
//   - ended: it delivered MaxWatermark. It stays ended, whatever status it
//     sends later, and contributes MaxWatermark to the minimum, so it never
//     holds the task back.
//   - idle: it sent an idle status and has not ended. It is left out of the
//     minimum.
//   - active: otherwise (every channel starts active at MinWatermark).
//
// If at least one channel is active, the candidate watermark is the
// minimum over the active channels. If every channel ended, it is
// MaxWatermark. Otherwise (no channel active, at least one idle) the task
// is idle and the candidate is the largest watermark of the idle channels:
// ended channels alone never take the task to MaxWatermark while another
// channel is merely idle, because MaxWatermark means end of input
// downstream and would make every later record of the idle channel late.
// The task's watermark advances to the candidate when the candidate is
// larger.
//
// Taking the largest idle watermark when no channel is active makes the
// task's watermark depend only on what each channel sent, not on the
// order in which the channels went idle: had the channel with the largest
// watermark gone idle last, the minimum over the active channels would
// have reached its watermark anyway. Holding the watermark instead (as
// Flink's original valve did) left it at the watermark of whichever
// channel went idle last, so two tasks reading the same channels in other
// interleavings could hold different watermarks for good, and windows
// closed or not at random once every input fell quiet. The price is the
// same as that of one channel going idle: a record that comes later on a
// channel behind the task's watermark is late.
//
// A watermark that arrives on an idle channel is recorded but counts only
// once the channel is active again, or while no channel is active (in the
// largest idle watermark); so the order in which an upstream task sends
// "active" and its next watermark does not matter. A channel that becomes
// active again with a watermark below the task's is held at the task's
// watermark (it cannot pull it back) until its own watermark passes it;
// unlike Flink, which leaves such a channel out of the minimum until it
// catches up, this holds the task's watermark where it is meanwhile.
//
// The task's stream status: the task is idle exactly when no channel is
// active and at least one is idle (Idle). Watermark and SetIdle may both
// change it (a channel going idle; an idle channel's upstream ending; the
// last active channel ending while another is idle). After each call the
// owning task calls StatusChanged and forwards downstream what changed, in
// an order that keeps the watermark in effect downstream: a status that
// turned active first, then the advanced watermark, then a status that
// turned idle. A call that makes the task idle can advance its watermark
// too (the largest idle watermark), and a watermark forwarded after the
// idle status would be held while the task is idle. While it is idle a
// watermark on an idle channel can still advance it.
//
// A Merger reads no clock and starts no goroutine. Not safe for concurrent
// use: the owning task actor calls it from its own goroutine. Channel
// indexes out of range panic, as slice indexes do.
type Merger struct {
	chans []channelState
	// combined is the task's watermark.
	combined int64
	// reportedIdle is the status StatusChanged last reported (initially
	// active, as every channel starts active).
	reportedIdle bool
}

// channelState is what the Merger knows of one input channel.
type channelState struct {
	// wm is the largest watermark received (raised to the task's
	// watermark when the channel becomes active again).
	wm   int64
	idle bool
}

// NewMerger returns a Merger for a task with the given number of input
// channels, all active at MinWatermark. It panics if channels < 1.
func NewMerger(channels int) *Merger {
	if channels < 1 {
		panic("watermark: NewMerger needs at least one input channel")
	}
	m := &Merger{chans: make([]channelState, channels), combined: MinWatermark}
	for i := range m.chans {
		m.chans[i].wm = MinWatermark
	}
	return m
}

// Watermark records watermark wm from channel ch and returns the task's
// watermark and whether it advanced. A watermark at or below the channel's
// previous one is ignored. On an idle channel it advances the task's
// watermark only while no channel is active.
func (m *Merger) Watermark(ch int, wm int64) (combined int64, advanced bool) {
	c := &m.chans[ch]
	if wm <= c.wm {
		return m.combined, false
	}
	c.wm = wm
	return m.update()
}

// SetIdle records that channel ch became idle (idle true) or active again
// (idle false) and returns the task's watermark and whether it advanced. A
// channel becoming idle can advance the task's watermark (the last active
// one, to the largest watermark of the idle channels); one becoming active
// never makes it go backwards (see Merger). Repeating the current status
// changes nothing.
func (m *Merger) SetIdle(ch int, idle bool) (combined int64, advanced bool) {
	c := &m.chans[ch]
	if c.idle == idle {
		return m.combined, false
	}
	c.idle = idle
	if !idle && c.wm < m.combined {
		c.wm = m.combined
	}
	return m.update()
}

// update recomputes the task's watermark after a channel changed.
func (m *Merger) update() (int64, bool) {
	candidate, largestIdle := MaxWatermark, MinWatermark
	active, idle := false, false
	for _, c := range m.chans {
		switch {
		case c.wm == MaxWatermark:
			// Ended: contributes MaxWatermark.
		case c.idle:
			idle = true
			largestIdle = max(largestIdle, c.wm)
		default:
			active = true
			candidate = min(candidate, c.wm)
		}
	}
	if !active && idle {
		// The task is idle: the largest idle watermark, whichever
		// channel went idle last.
		candidate = largestIdle
	}
	if candidate > m.combined {
		m.combined = candidate
		return m.combined, true
	}
	return m.combined, false
}

// Current returns the task's watermark: MinWatermark until every active
// channel sent one.
func (m *Merger) Current() int64 { return m.combined }

// Idle reports whether the task is idle: no channel is active and at least
// one is idle (ended channels are neither). It is a plain query; callers
// may compare it before and after a call, or use StatusChanged.
func (m *Merger) Idle() bool {
	idle := false
	for _, c := range m.chans {
		switch {
		case c.wm == MaxWatermark:
		case c.idle:
			idle = true
		default:
			return false
		}
	}
	return idle
}

// StatusChanged reports the task's stream status (idle or not, as Idle)
// and whether it differs from what the previous call reported (initially:
// active). The owning task calls it after every Watermark and SetIdle and
// forwards the status downstream when changed is true (an active status
// before the advanced watermark, an idle one after it); this is the one
// place the task learns that it became idle or active as a whole.
func (m *Merger) StatusChanged() (idle, changed bool) {
	idle = m.Idle()
	if idle == m.reportedIdle {
		return idle, false
	}
	m.reportedIdle = idle
	return idle, true
}

// Channel returns what the Merger knows of channel ch: its watermark (as
// held for the minimum) and whether it is marked idle. For metrics and
// debugging.
func (m *Merger) Channel(ch int) (wm int64, idle bool) {
	c := m.chans[ch]
	return c.wm, c.idle
}
