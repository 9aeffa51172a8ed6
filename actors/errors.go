package actors

import (
	"errors"
	"fmt"
	"strings"
)

var (
	// ErrJobEnded is returned by Release, and wrapped by the error of a
	// Move, when the attempt ended (failed, restarted or stopped) before
	// the release or the move started: nothing of it was released or
	// moved, and its next attempt, if any, places the job anew.
	ErrJobEnded = errors.New("actors: job ended")

	// ErrSavepointUnderWay is wrapped, with the context's error, by the
	// error of a TriggerSavepoint whose context ended after the savepoint
	// was triggered: the context bounds the wait, not the savepoint, which
	// goes on (a stop-with-savepoint then ends the job when it completes;
	// the job's history lists its outcome and path).
	ErrSavepointUnderWay = errors.New("actors: the savepoint was triggered and goes on")

	// ErrInvalidJob is wrapped by every job-graph validation error.
	ErrInvalidJob = errors.New("actors: invalid job")
	// ErrNoCodec is returned when an edge must serialise records of a type
	// that has no codec.
	ErrNoCodec = errors.New("actors: element type has no codec")
	// ErrCheckpointFailure is wrapped by the error of a job that failed
	// because more checkpoints failed than checkpoint.tolerable_failures
	// allows; the restart strategy restarts it from the latest completed
	// checkpoint like any task failure.
	ErrCheckpointFailure = errors.New("actors: too many failed checkpoints")
	// ErrPlanMismatch is returned when a node's task host registers with
	// a job graph whose plan fingerprint differs from the job master's,
	// or with other channel settings that must be shared (see
	// Network.Fingerprint).
	ErrPlanMismatch = errors.New("actors: job plan mismatch")
	// ErrControlFailed is wrapped by the error of a deployment whose
	// control channel between the job master and a task host failed (a
	// lost or out-of-order message, a lost connection, a missing
	// acknowledgement); the restart strategy restarts the job from its
	// latest completed checkpoint, as after a task failure.
	ErrControlFailed = errors.New("actors: control channel failed")
	// ErrControlTimeout is wrapped by the error of a deployment whose
	// hosts did not register or deploy within cluster.control_timeout; it
	// is restarted like ErrControlFailed.
	ErrControlTimeout = errors.New("actors: control timeout")
	// ErrNotPlaced is wrapped by the error of an attempt that found no
	// deployment to run (Cluster.Update failed: the node sees no
	// majority, say). It does not count against the restart strategy:
	// the attempt is tried again every Cluster.RetryInterval.
	ErrNotPlaced = errors.New("actors: no deployment placed")
	// ErrRedeployed is wrapped (with ErrControlFailed) by the error of
	// an attempt ended by Execution.Redeploy: the cluster changed (a node
	// died or joined, the majority was lost, a rebalance). It does not
	// count against the restart strategy.
	ErrRedeployed = errors.New("actors: redeployed")
	// ErrHandover is wrapped by the error of a handover (Runner.Move)
	// that failed after its barrier: the job fails with it (wrapping
	// ErrControlFailed too) and the restart strategy restores the whole
	// job from its latest checkpoint or savepoint, with the placement it
	// had before the handover.
	ErrHandover = errors.New("actors: handover failed")
	// ErrMoveUnsupported is returned by Runner.Move for a move the
	// running job cannot make while it runs (a node in another process,
	// an unkeyed or source subtask, an edge into it that is not
	// serialised, two moved subtasks joined by an edge); nothing changed,
	// and a redeployment can still make it.
	ErrMoveUnsupported = errors.New("actors: move not supported while the job runs")
	// ErrNilAvailable is the cause of the failure of a source task whose
	// source returned NothingAvailable from Poll and then a nil channel
	// from Available: a nil channel is never ready, so the source would
	// never be polled again and the job would wait for it for ever.
	ErrNilAvailable = errors.New("actors: the source returned NothingAvailable and a nil channel from Available, which is never ready")
	// errCancelled unwinds a task blocked on credit when the job stops.
	errCancelled = errors.New("actors: job cancelled")
)

// TaskError is the error of a failed task: which operator, which subtask,
// and the cause (an error returned by user code, or a recovered panic).
type TaskError struct {
	Job         string
	Operator    string
	UID         string
	Subtask     int
	Parallelism int
	// Panic is true when the cause was a panic; Stack then holds the stack,
	// except in a TaskError from a task host over a control channel (a job
	// with a Cluster): the message carries the panic's text only, and the
	// host logs the stack on its node.
	Panic bool
	Stack []byte
	Err   error
}

// Error names the operator, the subtask and the cause.
func (e *TaskError) Error() string {
	kind := "error"
	if e.Panic {
		kind = "panic"
	}
	return fmt.Sprintf("job %q: operator %q (uid %q) subtask %d/%d failed: %s: %v",
		e.Job, e.Operator, e.UID, e.Subtask, e.Parallelism, kind, e.Err)
}

// Unwrap returns the cause.
func (e *TaskError) Unwrap() error { return e.Err }

// planMismatch returns the error, wrapping ErrPlanMismatch, of node
// running fingerprint theirs of job where the job master runs want. A
// fingerprint is a plan digest, then optionally a space and the channel
// settings the nodes must share (Network.Fingerprint): when only those
// differ, the error names them.
func planMismatch(job, node, theirs, want string) error {
	tp, ts, _ := strings.Cut(theirs, " ")
	wp, ws, _ := strings.Cut(want, " ")
	if tp == wp {
		return fmt.Errorf("%w: job %q: node %q runs with %s, the job master with %s: they must be the same on every node",
			ErrPlanMismatch, job, node, orNone(ts), orNone(ws))
	}
	return fmt.Errorf("%w: job %q: node %q runs plan %.12s, the job master %.12s: every node must run the same job graph and settings",
		ErrPlanMismatch, job, node, theirs, want)
}

func orNone(s string) string {
	if s == "" {
		return "no channel settings"
	}
	return s
}
