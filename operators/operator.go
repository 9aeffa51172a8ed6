package operators

import (
	"log/slog"

	"github.com/jonboulle/clockwork"

	"github.com/edgedio/edged/keygroup"
	"github.com/edgedio/edged/state"
)

// Collector receives the records an operator emits. It is called from the
// owning subtask's goroutine; it may block when downstream lacks credit
// (that is how backpressure reaches a source).
type Collector[T any] interface {
	Collect(v T)
}

// CollectorFunc adapts a function to a Collector.
type CollectorFunc[T any] func(v T)

// Collect calls f(v).
func (f CollectorFunc[T]) Collect(v T) { f(v) }

// Context describes the subtask an operator instance runs in and gives it
// what the runtime provides. It is built before Open and is valid until Close.
type Context struct {
	// Job is the job's name.
	Job string
	// Operator is the operator's display name.
	Operator string
	// UID is the operator's stable identifier; state is matched by it.
	UID string
	// Subtask is this instance's index in [0, Parallelism).
	Subtask int
	// Parallelism is the operator's number of subtasks.
	Parallelism int
	// MaxParallelism is the job's number of key groups.
	MaxParallelism int
	// KeyGroups is the range of key groups this subtask owns.
	KeyGroups keygroup.Range
	// Logger is tagged with job, operator and subtask. Not for the
	// per-record path.
	Logger *slog.Logger
	// Clock gives processing time; tests pass a fake clock.
	Clock clockwork.Clock
	// OperatorState holds the operator state of this subtask (list, union
	// list and broadcast state).
	OperatorState *state.OperatorStore
	// State is the keyed state backend of this subtask, or nil for an
	// operator that does not follow a key-by edge.
	State state.Backend
	// Time holds the timestamp of the record being processed, shared by
	// the operators of the task.
	Time *TaskTime
	// ProcessingTime gives processing time and processing-time callbacks.
	ProcessingTime ProcessingTimeService
	// EmitWatermark sends a watermark to the operators after this one and
	// on to the downstream tasks. Operators implementing WatermarkHandler
	// call it to forward; sources and timestamp assigners call it to
	// generate watermarks.
	EmitWatermark func(wm int64)
	// EmitIdle marks the stream out of this operator idle (true) or active
	// again (false); downstream tasks leave an idle input out of their
	// watermark.
	EmitIdle func(idle bool)
	// SideOutput returns the collector of the side output named tag (an
	// operators.Collector[X] for the tag's type X), or nil when nothing
	// consumes it.
	SideOutput func(tag string) any
	// FinalCheckpoint is set when the job checkpoints: after every task has
	// finished (Finish), the runtime takes a final checkpoint and tells
	// its completion. Exactly-once sinks then keep their last records for
	// that checkpoint to commit instead of committing them in Finish.
	FinalCheckpoint bool
	// OutputHeld, when set, tells the runtime that the operator holds
	// output only a checkpoint commits (an exactly-once sink's first
	// record of the run): the runtime then takes the run's first
	// checkpoint at once instead of an interval after the start, so that
	// output held back over a restart goes out as soon as it exists.
	// Sinks call it once per run, on the operator's goroutine.
	OutputHeld func()
	// Done is closed when the subtask stops (the job is cancelled, fails
	// or ends): an operator that blocks the subtask waiting for work of
	// its own (a write-ahead sink waiting for room, WithMaxHeld) stops
	// waiting. Nil (never closed) outside the runtime.
	Done <-chan struct{}
	// Restored is set when the subtask was restored from a snapshot: a
	// restart after a failure, a start from a savepoint, or a job started
	// again on its checkpoint directory. What the operator wrote outside
	// the job before (a sink's file) then holds output that no replay
	// emits again. False at a fresh start.
	Restored bool
	// RestoredCommitted is set when the snapshot the operator is restored
	// from was committed by every sink before the job stopped (a
	// stop-with-savepoint whose completion every task handled): the
	// output it holds was delivered, and a sink that would re-publish it
	// on restore leaves it out.
	RestoredCommitted bool
	// RestoredStateWatermark, when not nil, is the latest watermark the
	// restored keyed state was written at: the largest watermark of the
	// old subtasks whose key groups this subtask takes over
	// (math.MaxInt64 when the snapshot does not say). The operator's
	// restored watermark can be behind it (restored at another
	// parallelism, a subtask takes the smallest of theirs): state written
	// before the snapshot may then belong to windows whose timers fired
	// although they lie after the operator's watermark. Nil when nothing
	// was restored, or when the restored watermark is the one the state
	// was written at.
	RestoredStateWatermark *int64
}

// Operator is the lifecycle every operator instance has. The runtime calls
// Open once before the first record, Finish once after the last record of a
// bounded input (it may still emit), and Close once at the end whether the
// task succeeded or failed.
type Operator interface {
	Open(ctx *Context) error
	Finish() error
	Close() error
}

// Base is an Operator with no-op lifecycle methods, to embed.
type Base struct{}

// Open does nothing.
func (Base) Open(*Context) error { return nil }

// Finish does nothing.
func (Base) Finish() error { return nil }

// Close does nothing.
func (Base) Close() error { return nil }

// OneInput is an operator that consumes records of type T.
type OneInput[T any] interface {
	Operator
	Collector[T]
}

// Status is what a source reports after a Poll.
type Status int

const (
	// MoreAvailable means Poll may be called again at once.
	MoreAvailable Status = iota
	// NothingAvailable means the source has nothing now; the runtime waits
	// for the channel from Available before polling again.
	NothingAvailable
	// EndOfInput means the source is exhausted; Poll is not called again.
	EndOfInput
)

// Source produces records of type T for one subtask.
//
// The runtime calls Poll repeatedly from the subtask's goroutine; Poll emits
// at most max records to out and must not block for long (it returns
// NothingAvailable instead, and the runtime waits on Available). Between two
// Polls the runtime handles control messages, so a checkpoint sees the
// source between records.
type Source[T any] interface {
	Operator
	Poll(out Collector[T], max int) (Status, error)
	// Available returns a channel that is ready (closed or readable) when
	// Poll may have records again. Called after Poll returned
	// NothingAvailable, from the subtask's goroutine; the channel is
	// awaited on another goroutine. It must not be nil: a nil channel is
	// never ready, and it fails the task instead of stalling the job.
	Available() <-chan struct{}
}

// Replayer is implemented by a source that says whether it can be
// rewound. A source that does not implement it is taken to be
// replayable when it records a position (it implements Snapshotter or
// Restorer): a restore gives it back the position its checkpoint
// recorded (an index, a byte offset, an ingest-log offset) and it replays
// what followed. A source that cannot (SocketSource) makes a checkpointed
// job at-most-once for its records, and one that records no position
// would read from its beginning again after a restart, repeating what it
// had read before the checkpoint; the stream package refuses to run
// either in a checkpointed job unless the job opts in. A source that
// replays by other means (its position in operator state) says so with
// Replayable returning true.
//
// Replayable is called before the job runs, on an instance that is never
// opened; it must not block.
type Replayer interface {
	// Replayable reports whether a restore can rewind the source to the
	// position a checkpoint recorded.
	Replayable() bool
}

// Sink consumes records of type T at the end of a pipeline.
type Sink[T any] interface {
	OneInput[T]
}

// Flusher is implemented by an operator that buffers what it writes (a
// print sink, a line file): the runtime calls Flush on the task's
// goroutine whenever the task has no more input waiting, so that
// buffered output never waits for more records to come (under steady
// load the operator's own buffer limit writes it). Flush does not make
// the output durable.
type Flusher interface {
	Flush() error
}
