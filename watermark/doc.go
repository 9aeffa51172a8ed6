// Package watermark owns event time: it turns record timestamps into
// watermarks, detects idle inputs, and combines the watermarks of a task's
// input channels.
//
// Event time is an int64 count of milliseconds since the Unix epoch. A
// watermark w says "no record with a timestamp at or below w should arrive
// any more": event-time windows and timers up to w may fire. MinWatermark
// means no watermark yet; MaxWatermark is the final watermark, which a
// bounded source emits when its input ends so that every window and timer
// downstream fires. Generators never produce MaxWatermark themselves.
//
// The package has three pure machines and no I/O:
//
//   - A Generator (one per source or timestamp-assigner subtask) sees the
//     timestamp of every record and is asked for a watermark every
//     Strategy.Interval of processing time (NewBoundedOutOfOrderness,
//     NewMonotonous, or a custom one through ForGenerator). A Strategy
//     bundles the timestamp function, the generator, the interval and the
//     idle timeout.
//   - An IdleDetector tells a source subtask when it has seen no record for
//     the idle timeout, so that it can mark its output idle and downstream
//     tasks stop waiting for its watermark.
//   - A Merger, at every task with input channels, keeps the watermark and
//     idle status of each channel and computes the task's watermark: the
//     minimum over the channels that are not idle (the largest of their
//     watermarks once every channel is idle), never going backwards. It
//     also says when the task as a whole becomes idle or active, which the
//     task forwards downstream as a stream status.
//
// A source (or timestamp-assigner) subtask drives them like this:
//
//	on record r at processing time now:
//		gen.OnEvent(s.Timestamp(r))
//		if idle.OnEvent(now) { emit status active }
//	every s.Interval, at processing time now:
//		if idle, changed := idle.Check(now); changed && idle { emit status idle }
//		if wm, ok := gen.OnPeriodicEmit(); ok { emit wm }
//	at end of input:
//		emit MaxWatermark
//
// and a task with inputs like this:
//
//	on watermark w from channel ch:  combined, advanced := m.Watermark(ch, w)
//	on status from channel ch:       combined, advanced := m.SetIdle(ch, idle)
//	then, in this order:
//		idle, changed := m.StatusChanged()
//		if changed && !idle { emit status active }
//		if advanced { emit combined }
//		if changed && idle { emit status idle }
//
// Checkpoints: a Merger's State and a StatefulGenerator's AppendState are
// saved with each checkpoint, and RestoreMerger and RestoreState bring
// them back, so that after a restore a record is late exactly when it was
// late in the run without the failure. A task restored with another
// parallelism starts from NewMergerAt at the smallest watermark of the
// old subtasks it takes over from.
//
// Concurrency: nothing here starts a goroutine or reads a clock. Processing
// time is passed in by the caller (milliseconds since the epoch, as
// time.Time.UnixMilli gives). No type is safe for concurrent use: each
// Generator, IdleDetector and Merger belongs to one task actor, which calls
// it from its own goroutine. A Strategy is an immutable value and may be
// shared.
package watermark
