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
