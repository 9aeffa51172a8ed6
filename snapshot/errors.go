package snapshot

import "errors"

// Configuration.
var (
	// ErrInvalidConfig is wrapped by every problem Config.Validate and
	// RestartConfig.Validate report.
	ErrInvalidConfig = errors.New("snapshot: invalid config")
	// ErrInvalidTasks is returned by NewCoordinator for a task set it cannot
	// drive: no sources, a source that is not a task, a duplicate task, or
	// subtask indexes of a vertex that are not 0..n-1.
	ErrInvalidTasks = errors.New("snapshot: invalid task set")
	// ErrStarted is returned by Coordinator.Recover once the coordinator has
	// seen its first Tick or Step.
	ErrStarted = errors.New("snapshot: coordinator already started")
)

// Reasons a checkpoint or savepoint fails; Abort.Reason and Stats.Err wrap
// one of them.
var (
	// ErrDeclined means a task declined the checkpoint (it could not
	// snapshot).
	ErrDeclined = errors.New("snapshot: checkpoint declined")
	// ErrExpired means not every task acknowledged within Config.Timeout.
	ErrExpired = errors.New("snapshot: checkpoint expired")
	// ErrMetadataWrite means the caller could not write the metadata of a
	// checkpoint whose tasks had all acknowledged.
	ErrMetadataWrite = errors.New("snapshot: writing checkpoint metadata failed")
	// ErrInvalidAck reports acknowledgements that contradict the task set
	// (an operator reported by tasks of two vertices) or carry a handle
	// Metadata.Validate would refuse.
	ErrInvalidAck = errors.New("snapshot: invalid acknowledgement")
	// ErrSubsumed means a newer checkpoint completed first, so this older one
	// could never become the latest. Not counted as a failure.
	ErrSubsumed = errors.New("snapshot: checkpoint subsumed by a newer one")
	// ErrTaskFailed means a task of the job failed while the checkpoint was
	// pending. Not counted as a failure; the restart strategy takes over.
	ErrTaskFailed = errors.New("snapshot: task failed")
	// ErrHalted means the coordinator stopped taking checkpoints because the job
	// failed (a task failed, or too many checkpoints failed).
	ErrHalted = errors.New("snapshot: coordinator halted by a job failure")
	// ErrStopping means a stop-with-savepoint is pending, so no other savepoint
	// may start.
	ErrStopping = errors.New("snapshot: job is stopping with a savepoint")
	// ErrStopped means the job stopped with a savepoint; nothing more is
	// taken.
	ErrStopped = errors.New("snapshot: job stopped with a savepoint")
	// ErrFinished means the job's input ended: it takes its final
	// checkpoint and no savepoint.
	ErrFinished = errors.New("snapshot: job finished its input")
	// ErrTooManyFailures is wrapped by FailJob.Reason when more checkpoints
	// failed since the latest completed one than Config.TolerableFailures
	// allows.
	ErrTooManyFailures = errors.New("snapshot: too many failed checkpoints")
)

// Metadata decoding; each failure has its own error.
var (
	// ErrBadMagic means the bytes do not start with the metadata magic.
	ErrBadMagic = errors.New("snapshot: not checkpoint metadata (bad magic)")
	// ErrVersion means the metadata has a format version this build cannot
	// read.
	ErrVersion = errors.New("snapshot: unsupported metadata version")
	// ErrChecksum means a CRC32C does not match (of the metadata or of a
	// state file).
	ErrChecksum = errors.New("snapshot: checksum mismatch")
	// ErrCorrupt means the metadata is not valid: a bad encoding, or a
	// value Metadata.Validate refuses.
	ErrCorrupt = errors.New("snapshot: corrupt metadata")
)

// Storage.
var (
	// ErrNoCheckpoint means there is no complete checkpoint (or savepoint) to
	// recover from.
	ErrNoCheckpoint = errors.New("snapshot: no complete checkpoint")
	// ErrAllDamaged means there are complete checkpoints (or savepoints)
	// but every one is damaged: not a fresh start, which would commit
	// the job's output again.
	ErrAllDamaged = errors.New("snapshot: every complete checkpoint is damaged")
	// ErrCheckpointGone means a checkpoint completed while the job ran,
	// but the checkpoint directory no longer holds it nor any other
	// complete checkpoint or savepoint of the job (the directory was
	// removed): a restart from the beginning would commit the job's
	// output again.
	ErrCheckpointGone = errors.New("snapshot: the completed checkpoints are gone from the checkpoint directory")
	// ErrIncomplete means a snapshot directory has no _metadata file, so the
	// checkpoint never completed.
	ErrIncomplete = errors.New("snapshot: checkpoint incomplete (no _metadata)")
	// ErrMissing means a state file named by the metadata does not exist.
	ErrMissing = errors.New("snapshot: state file missing")
	// ErrSize means a state file does not have the size the metadata
	// records.
	ErrSize = errors.New("snapshot: state file has the wrong size")
	// ErrJobMismatch means a checkpoint in the store belongs to another job.
	ErrJobMismatch = errors.New("snapshot: checkpoint of another job")
	// ErrExists means the directory of a new checkpoint or savepoint already
	// exists (and, for a savepoint path, is not empty).
	ErrExists = errors.New("snapshot: snapshot directory already exists")
	// ErrUnknownCheckpoint is returned by Store.Create, StatePath and
	// Commit for an ID that Store.Begin did not start.
	ErrUnknownCheckpoint = errors.New("snapshot: unknown checkpoint")
	// ErrLayout means the store directory has a layout this build cannot use.
	ErrLayout = errors.New("snapshot: unsupported store layout")
	// ErrName reports an operator UID, subtask or file name that cannot
	// be stored.
	ErrName = errors.New("snapshot: invalid name")
)
