package watermark

import (
	"fmt"
	"time"
)

// Generator turns the timestamps of the records it sees into watermarks.
// There is one per source subtask or timestamp-assigner subtask, created by
// Strategy.NewGenerator. The owning task calls it from its own goroutine,
// never concurrently; its methods must not block.
type Generator interface {
	// OnEvent is called for every record with its event timestamp.
	OnEvent(ts int64)
	// OnPeriodicEmit is called every emit interval; it returns the
	// watermark to emit now, if it advanced past the last emitted one.
	// When ok is false, wm is the last emitted watermark (MinWatermark if
	// none) and nothing should be emitted.
	OnPeriodicEmit() (wm int64, ok bool)
}

// boundedOutOfOrderness is the Generator of NewBoundedOutOfOrderness.
type boundedOutOfOrderness struct {
	// delay is the maximum out-of-orderness in milliseconds.
	delay int64
	// maxTs is the largest timestamp seen; valid only once seen is set.
	maxTs int64
	seen  bool
	// emitted is the last watermark returned with ok.
	emitted int64
}

// NewBoundedOutOfOrderness returns a Generator for records that arrive at
// most maxOutOfOrderness later than a record with a larger timestamp. Its
// watermark is maxTs - maxOutOfOrderness - 1, where maxTs is the largest
// timestamp seen so far, as in Flink: a record maxOutOfOrderness behind the
// largest timestamp is still on time. It emits nothing before the first
// record. maxOutOfOrderness is truncated to whole milliseconds; it panics
// if maxOutOfOrderness is negative (Strategy.Validate reports that before).
func NewBoundedOutOfOrderness(maxOutOfOrderness time.Duration) Generator {
	if maxOutOfOrderness < 0 {
		panic(fmt.Sprintf("watermark: negative max out-of-orderness %s", maxOutOfOrderness))
	}
	return &boundedOutOfOrderness{delay: maxOutOfOrderness.Milliseconds(), emitted: MinWatermark}
}

// NewMonotonous returns a Generator for records whose timestamps never
// decrease: a bounded out-of-orderness generator with no delay, whose
// watermark is maxTs - 1.
func NewMonotonous() Generator {
	return NewBoundedOutOfOrderness(0)
}

// OnEvent records ts if it is the largest timestamp so far.
func (g *boundedOutOfOrderness) OnEvent(ts int64) {
	if !g.seen || ts > g.maxTs {
		g.maxTs = ts
		g.seen = true
	}
}

// OnPeriodicEmit returns maxTs - delay - 1 if that advanced past the last
// emitted watermark.
func (g *boundedOutOfOrderness) OnPeriodicEmit() (int64, bool) {
	if !g.seen {
		return g.emitted, false
	}
	wm := subSat(g.maxTs, g.delay+1)
	if wm <= g.emitted {
		return g.emitted, false
	}
	g.emitted = wm
	return wm, true
}
