package snapshot

import (
	"fmt"
	"time"
)

// ID identifies a checkpoint or savepoint of a job. Checkpoints and
// savepoints share one sequence, and IDs increase strictly over the job's
// life (across restarts, through Coordinator.Recover), so "every snapshot
// up to n" is well defined for sinks that commit on completion.
type ID uint64

// TaskID names one subtask of a task: the UID of the task's vertex (for a
// chain, the UID of its head operator) and the subtask index, 0 to
// parallelism-1.
type TaskID struct {
	Vertex  string
	Subtask int
}

// String formats t as "vertex[subtask]".
func (t TaskID) String() string { return fmt.Sprintf("%s[%d]", t.Vertex, t.Subtask) }

// TaskState is what a task acknowledges: for each operator of its chain
// that has state, keyed by the operator's UID, the handle of what that
// operator subtask wrote. A task without state acknowledges an empty
// TaskState.
type TaskState struct {
	Operators map[string]Handle
}

// Input is a message for Coordinator.Step: Ack, Decline, TriggerSavepoint,
// EndOfData, Persisted, TaskFailed or OutputHeld.
type Input interface{ isInput() }

// Ack is a task's acknowledgement of a checkpoint: its snapshot is written
// (State names the files) and its barrier forwarded.
type Ack struct {
	Checkpoint ID
	Task       TaskID
	State      TaskState
	// AlignmentTime is how long the task held back inputs waiting for the
	// barrier on all of them (0 for at-least-once and single-input tasks).
	AlignmentTime time.Duration
}

// Decline is a task's refusal of a checkpoint: it could not snapshot
// (Reason says why). The checkpoint fails and counts as a failure.
type Decline struct {
	Checkpoint ID
	Task       TaskID
	Reason     error
}

// TriggerSavepoint asks for a savepoint now. It is not held back by the
// interval, the min pause or the max concurrent checkpoints.
type TriggerSavepoint struct {
	// Path is where to write the savepoint: "" for the store's
	// savepoints/sp-<id>-<timestamp>/, a relative path for one under
	// savepoints/, or an absolute path.
	Path string
	// Stop makes it a stop-with-savepoint: sources stop after their
	// snapshot and the job ends once the savepoint completes. If the
	// savepoint fails the job keeps running.
	Stop bool
}

// EndOfData says that every task of the job has finished its input: the
// sources ended, the final watermark and every record have flowed through
// the graph and every operator has finished. The coordinator triggers the
// final checkpoint at once (not held back by the interval, the min pause
// or the max concurrent checkpoints), then no periodic checkpoint and no
// savepoint; a final checkpoint that fails is triggered again after
// max(Interval, MinPause) (100ms when both are 0). Once it completes, its
// NotifyComplete has Final set: the caller lets the sinks commit it and
// ends the job. While a stop-with-savepoint is pending the stop ends the
// job, and the final checkpoint is triggered only if the stop fails.
// Ignored after the job stopped or halted.
type EndOfData struct{}

// Persisted tells the coordinator how writing the metadata of a Complete
// went. Err nil means the metadata is durable at Path and the checkpoint
// is complete; otherwise the checkpoint fails (and counts as a failure).
type Persisted struct {
	Checkpoint ID
	Path       string
	Err        error
}

// TaskFailed reports that a task of the job failed. Every pending
// checkpoint and savepoint is aborted (not counted as failures) and the
// coordinator halts: it triggers nothing more. The restarted job gets a new
// Coordinator, Recover'ed from this one's Progress.
type TaskFailed struct {
	Task TaskID
	Err  error
}

// OutputHeld says that a task holds output only a checkpoint commits: an
// exactly-once sink's first record of this run. While no checkpoint or
// savepoint has been triggered in this run, the first periodic checkpoint
// is then due at once instead of Interval after the start (still after
// the min pause and within the max concurrent): output held back over a
// restart (the windows a recovery fires, the results lost with the
// crashed process) is committed as soon as it exists, not an interval
// later. Later ones change nothing, and the periodic schedule goes on
// from that checkpoint.
type OutputHeld struct {
	Task TaskID
}

func (Ack) isInput()              {}
func (Decline) isInput()          {}
func (TriggerSavepoint) isInput() {}
func (EndOfData) isInput()        {}
func (Persisted) isInput()        {}
func (TaskFailed) isInput()       {}
func (OutputHeld) isInput()       {}

// Action is a decision of the coordinator for its caller to carry out, in
// the order returned: Trigger, Complete, NotifyComplete, Abort, Discard or
// FailJob.
type Action interface{ isAction() }

// Trigger starts a checkpoint or savepoint: the caller calls Store.Begin
// with it, then sends it to every source task, which records its position
// and emits the barrier.
type Trigger struct {
	Checkpoint ID
	// Timestamp is the trigger time in milliseconds since the Unix epoch.
	Timestamp int64
	// Mode is the checkpoint mode; savepoints are always ExactlyOnce.
	Mode      Mode
	Savepoint bool
	// Stop is set for a stop-with-savepoint: sources stop after their
	// snapshot.
	Stop bool
	// Path is TriggerSavepoint.Path for a savepoint, "" otherwise.
	Path string
	// Final is set for the final checkpoint after EndOfData: every task
	// has finished, so every task snapshots its final state directly.
	Final bool
}

// Complete says every task has acknowledged: the caller writes Metadata
// with Store.Commit (last, and atomically) and reports the result with
// Persisted. Only then is the checkpoint complete.
type Complete struct {
	Checkpoint ID
	Savepoint  bool
	Stop       bool
	// Final is set for the final checkpoint; Metadata.Finished is set too.
	Final bool
	// Metadata holds the handles every operator subtask acknowledged; Job
	// and MaxParallelism are left for the Store to stamp.
	Metadata *Metadata
}

// NotifyComplete tells every task that the checkpoint is complete: sinks
// commit what they pre-committed up to and including it, sources may drop
// log entries before it. It follows a successful Persisted.
type NotifyComplete struct {
	Checkpoint ID
	// Stop: a stop-with-savepoint completed; after notifying, the caller
	// waits until every task has handled the notification (the sinks
	// committed) and ends the job.
	Stop bool
	// Final: the final checkpoint completed; as for Stop, the caller ends
	// the job once every task has handled the notification.
	Final bool
}

// Abort tells every task that a checkpoint or savepoint failed: tasks drop
// what they hold for it, and sinks abort its transactions. A sink must not
// abort what a NotifyComplete of a newer checkpoint already committed: an
// Abort for an ID at or below the newest it committed has nothing to undo
// (this is the case for ErrSubsumed).
type Abort struct {
	Checkpoint ID
	Savepoint  bool
	Reason     error
}

// Discard tells the caller to delete a checkpoint's directory with
// Store.Discard: a completed checkpoint retention no longer keeps, or the
// partial files of a failed checkpoint or savepoint. It is never issued
// for a completed savepoint.
type Discard struct {
	Checkpoint ID
}

// FailJob says that more checkpoints failed since the latest completed one
// than Config.TolerableFailures allows: the caller fails the job, and the
// restart strategy decides what happens next. The coordinator has halted.
type FailJob struct {
	Reason error
}

func (Trigger) isAction()        {}
func (Complete) isAction()       {}
func (NotifyComplete) isAction() {}
func (Abort) isAction()          {}
func (Discard) isAction()        {}
func (FailJob) isAction()        {}
