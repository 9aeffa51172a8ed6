package operators

import "math"

// NoTimestamp is the timestamp of a record that has none (processing-time
// pipelines, sources without event time).
const NoTimestamp int64 = math.MinInt64

// TaskTime carries the event timestamp of the record being processed. One
// TaskTime is shared by the operators of a task: the runtime sets Timestamp
// from the batch before each record enters the chain, an operator that
// assigns or changes timestamps sets it before it emits, and the task's
// outputs send it along with each record. Event time is in milliseconds
// since the Unix epoch.
type TaskTime struct {
	Timestamp int64
}

// WatermarkHandler is implemented by operators that react to event time
// (timers, windows, timestamp assigners). When an operator implements it,
// the runtime calls ProcessWatermark instead of forwarding the watermark
// past it; the operator fires what the watermark triggers and then forwards
// a watermark with Context.EmitWatermark (usually the same one). Operators
// that do not implement it pass watermarks on unchanged.
type WatermarkHandler interface {
	ProcessWatermark(wm int64) error
}

// WatermarkRestorer is implemented by the WatermarkHandlers that keep
// event-time timers. A restored task gives its operators the watermark it
// had at the checkpoint, before any record, by RestoreWatermark rather
// than ProcessWatermark: the operator takes it as its current watermark
// and forwards it with Context.EmitWatermark, firing nothing. The timers
// at or before it still queued were registered after the watermark last
// advanced, so in the run without the failure they fire when the next
// watermark arrives, after the records before it; they fire then after
// the restore too. A WatermarkHandler that does not implement it is given
// the restored watermark by ProcessWatermark.
type WatermarkRestorer interface {
	RestoreWatermark(wm int64) error
}

// ProcessingTimeService gives an operator processing time and callbacks at
// processing-time instants. It is driven by the task's clock (a fake one in
// tests). Callbacks run on the subtask's goroutine, between records.
type ProcessingTimeService interface {
	// Now returns the current processing time in milliseconds.
	Now() int64
	// At calls fn(now) once processing time reaches at (milliseconds). It
	// returns a function that cancels the call.
	At(at int64, fn func(now int64) error) (cancel func())
}
