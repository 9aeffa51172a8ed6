package actors

import (
	"maps"
	"slices"
	"time"
)

// Aligner aligns checkpoint barriers across the input channels of a task.
// It is a pure machine: the task feeds it what arrives and carries out the
// actions it returns. Not safe for concurrent use: the owning task calls it
// from its own goroutine.
//
// In exactly-once mode a channel whose barrier n has arrived is blocked:
// the task holds back what comes after it on that channel until barrier n
// has arrived on every channel that has not ended; then the task
// snapshots, forwards barrier n and releases the held input, in order. In
// at-least-once mode nothing is held back: the snapshot happens when the
// last channel's barrier arrives.
//
// One checkpoint aligns at a time. With overlapping checkpoints, barrier
// n+1 on a blocked channel sits behind barrier n in the held input and
// reaches the aligner after the release. A barrier newer than the one
// aligning, on a channel that has not delivered the older one, means the
// older one was abandoned upstream: it is aborted and the newer one starts.
type Aligner struct {
	exactlyOnce bool
	arrived     []bool // channel delivered the current barrier
	ended       []bool // channel delivered end of stream
	open        int    // channels not ended
	current     int64  // checkpoint aligning, 0 if none
	count       int    // channels that delivered current
	started     time.Time
	last        int64 // last checkpoint snapshotted or aborted while aligning
	// aborted holds the checkpoints above last aborted before they
	// aligned here: their barriers, should any still come, are ignored.
	// An abort does not move last, since the barriers of an older
	// checkpoint still in flight (a periodic one overtaken by the abort
	// of a savepoint) must still align.
	aborted map[int64]bool
}

// AlignAction is what the task must do after a step.
type AlignAction struct {
	// Snapshot, when non-zero, is the checkpoint to snapshot and forward
	// now; Alignment is how long the alignment took.
	Snapshot  int64
	Alignment time.Duration
	// Aborted, when non-zero, is a checkpoint whose alignment was given up.
	Aborted int64
	// Release is set when held-back input must be processed again, in
	// order, channel by channel as it arrived.
	Release bool
}

// NewAligner returns the aligner of a task with channels input channels.
func NewAligner(channels int, exactlyOnce bool) *Aligner {
	return &Aligner{
		exactlyOnce: exactlyOnce,
		arrived:     make([]bool, channels),
		ended:       make([]bool, channels),
		open:        channels,
	}
}

// Blocked reports whether input arriving on channel ch must be held back.
func (a *Aligner) Blocked(ch int) bool {
	return a.exactlyOnce && a.current != 0 && a.arrived[ch]
}

// Aligning returns the checkpoint being aligned, 0 if none.
func (a *Aligner) Aligning() int64 { return a.current }

// Barrier handles barrier id arriving on channel ch at now.
func (a *Aligner) Barrier(now time.Time, ch int, id int64) AlignAction {
	var act AlignAction
	switch {
	case id <= a.last || a.aborted[id]:
		// A barrier of a checkpoint already done or aborted here.
		return act
	case a.current != 0 && id > a.current:
		// The one aligning was abandoned upstream.
		act.Aborted = a.current
		act.Release = a.exactlyOnce
		a.setLast(a.current)
		a.reset()
	case a.current != 0 && id < a.current:
		return act
	}
	if a.current == 0 {
		a.current, a.started = id, now
	}
	if !a.arrived[ch] {
		a.arrived[ch] = true
		a.count++
	}
	return a.complete(now, act)
}

// EndOfStream handles the end of channel ch: it no longer holds up an
// alignment.
func (a *Aligner) EndOfStream(now time.Time, ch int) AlignAction {
	if a.ended[ch] {
		return AlignAction{}
	}
	a.ended[ch] = true
	a.open--
	if a.arrived[ch] {
		a.arrived[ch] = false
		a.count--
	}
	if a.current == 0 {
		return AlignAction{}
	}
	return a.complete(now, AlignAction{})
}

// Abort gives up the alignment of checkpoint id (declined or timed out by
// the coordinator).
//
// An abort of a checkpoint that is not aligning here only marks it: its
// barriers are ignored should they come, and those of older checkpoints
// still align. (Control messages overtake barriers: a savepoint refused
// or aborted while an earlier checkpoint's barriers travel must not make
// the task drop them, which would leave that checkpoint, or the
// stop-with-savepoint it is, to expire.)
func (a *Aligner) Abort(id int64) AlignAction {
	if a.current == 0 || id != a.current {
		if id > a.last {
			if a.aborted == nil {
				a.aborted = make(map[int64]bool)
			}
			a.aborted[id] = true
			if len(a.aborted) > maxAborted {
				// No checkpoint completes here while every one is
				// aborted before its barriers come (a sink that declines
				// each): forget the oldest, whose barriers passed long
				// ago, so that the set stays small.
				delete(a.aborted, slices.Min(slices.Collect(maps.Keys(a.aborted))))
			}
		}
		return AlignAction{}
	}
	a.setLast(id)
	a.reset()
	return AlignAction{Aborted: id, Release: a.exactlyOnce}
}

// maxAborted bounds the checkpoints an Aligner remembers as aborted
// before they aligned.
const maxAborted = 64

// setLast records id as the last checkpoint done here, and forgets the
// aborted ones it passed.
func (a *Aligner) setLast(id int64) {
	a.last = id
	for x := range a.aborted {
		if x <= id {
			delete(a.aborted, x)
		}
	}
}

func (a *Aligner) complete(now time.Time, act AlignAction) AlignAction {
	if a.count < a.open {
		return act
	}
	act.Snapshot, act.Alignment = a.current, now.Sub(a.started)
	act.Release = act.Release || a.exactlyOnce
	a.setLast(a.current)
	a.reset()
	return act
}

func (a *Aligner) reset() {
	a.current, a.count = 0, 0
	clear(a.arrived)
}
