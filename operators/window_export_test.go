package operators

import "time"

// NewMergeAllWindowAggregate is the reference of the incremental sliding
// windows: a tumbling or sliding window aggregate whose every result merges
// all the slices of its window, keeping them in the state layout of
// "<name>/contents".
func NewMergeAllWindowAggregate[K comparable, T, A, R any](name string, key func(T) K, a WindowAssigner, lateness time.Duration, lateTag string, agg AggregateFunction[T, A, R], out Collector[WindowResult[K, R]]) OneInput[T] {
	return newSliced[K, T](name, key, a, lateness, lateTag, newAggSlices[K, T, A, R](agg, out))
}

// IncrementalFirings returns how many results of the window operator op
// came from its incremental aggregate, and how many rebuilt it (0, 0 for
// operators without one).
func IncrementalFirings(op any) (incremental, rebuilt int64) {
	if o, ok := op.(interface{ incStore() (int64, int64) }); ok {
		return o.incStore()
	}
	return 0, 0
}

// pendingTimers returns how many event-time and processing-time timers
// the operator has queued.
func (c *keyedCore[K, O]) pendingTimers() (event, processing int) {
	return c.eventTimers.Len(), c.procTimers.Len()
}

// PendingTimers returns how many event-time and processing-time timers
// the keyed operator op has queued (0, 0 for other operators).
func PendingTimers(op any) (event, processing int) {
	if o, ok := op.(interface{ pendingTimers() (int, int) }); ok {
		return o.pendingTimers()
	}
	return 0, 0
}
