package operators

// Snapshotter is implemented by operators with state of their own that is
// neither keyed state nor operator state: a source's position, a sink's
// pending transactions. The runtime calls SnapshotState at the barrier of
// checkpoint id, on the subtask's goroutine, between records; the bytes
// are written with the checkpoint and given back to RestoreState when the
// job is restored from it.
type Snapshotter interface {
	SnapshotState(id int64) ([]byte, error)
}

// BarrierFlusher is implemented by operators that must write out what
// they buffer when a checkpoint's barrier passes, without keeping state:
// a sink without transactions, whose output of the records before the
// barrier must be durable once the checkpoint completes (a restore from
// it replays only the records after it). The runtime calls FlushAtBarrier
// at the barrier of checkpoint id, on the subtask's goroutine, before it
// snapshots the operator; an error declines the checkpoint. Unlike a
// Snapshotter, the operator is not part of the checkpoint.
type BarrierFlusher interface {
	FlushAtBarrier(id int64) error
}

// Restorer takes back what SnapshotState wrote. The runtime calls it after
// Open and before the first record. With a parallelism different from the
// snapshot's, states holds what every old subtask wrote, in subtask order,
// for the operator to redistribute; with the same parallelism, just this
// subtask's.
type Restorer interface {
	RestoreState(states [][]byte, oldParallelism int) error
}

// CheckpointListener is told when a checkpoint completed (its metadata is
// written: sinks commit what they pre-committed for it, sources may drop
// what it covers) or was aborted. Called on the subtask's goroutine.
type CheckpointListener interface {
	NotifyCheckpointComplete(id int64) error
	NotifyCheckpointAborted(id int64) error
}

// CommitWaiter is implemented by sinks that deliver what a completed
// checkpoint commits in the background (a write-ahead sink with
// WithBackgroundPublish). When the completed checkpoint ends the job (the
// final checkpoint, a stop-with-savepoint), the runtime calls
// WaitCommitted after NotifyCheckpointComplete, on the subtask's
// goroutine: it returns once everything committed so far is delivered, or
// with the failure that stopped it, which fails the task. Only a job whose
// sinks all returned nil counts as committed (a job resumed from such a
// savepoint delivers none of its output again).
type CommitWaiter interface {
	WaitCommitted(id int64) error
}
