package daemon

import "errors"

// Sentinel errors of package daemon.
var (
	// errNoLongerLeads ends a retried restart of the jobs of a leader that
	// yielded or stepped down since.
	errNoLongerLeads = errors.New("daemon: this node no longer leads")
	// ErrNoPipelines is returned by Run for a config without pipelines.
	ErrNoPipelines = errors.New("daemon: config has no pipelines")
	// ErrUnknownJob is returned for a job name the node does not run.
	ErrUnknownJob = errors.New("daemon: unknown job")
	// ErrStarting is returned for a job the node is starting that was
	// not recorded within the lookup's bound: ask again.
	ErrStarting = errors.New("daemon: job is being started")
	// ErrNotRunning is returned when a savepoint, stop or cancel is asked
	// of a job that has ended.
	ErrNotRunning = errors.New("daemon: job is not running")
	// ErrNoCheckpointing is returned when a savepoint or stop-with-savepoint
	// is asked of a job without checkpoint.dir.
	ErrNoCheckpointing = errors.New("daemon: job has no checkpoint.dir configured")
	// ErrSavepointNotLeader refuses edged run --from-savepoint on a
	// cluster node that does not run the job masters when it starts: the
	// savepoint would not be used.
	ErrSavepointNotLeader = errors.New("daemon: --from-savepoint given to a node that does not run the job masters")
)

// Errors of the dashboard's endpoints and the token check.
var (
	// ErrUnauthorized answers a request without the node's token when the
	// API requires one.
	ErrUnauthorized = errors.New("daemon: missing or wrong token")
	// ErrNoPlan is returned for the graph of a job that has no running
	// attempt (ended, or between restarts).
	ErrNoPlan = errors.New("daemon: job has no running attempt")
)

// Errors of the cluster's replicated checkpoints and leadership.
var (
	// ErrStaleMaster refuses what a job master of a term older than one
	// the node saw sends (see staleTerm): another node took over as
	// master since.
	ErrStaleMaster = errors.New("daemon: message of a stale job master")
	// ErrHandback is wrapped by a hand-back of the leadership that failed
	// or was refused (the leader leads on and retries later).
	ErrHandback = errors.New("daemon: leadership hand-back failed")
)

// staleTerm reports whether epoch is of an older term than seen, the
// highest epoch the node saw. An epoch is its master's term (the master's
// start counter, nextEpochBase) in its upper 32 bits and one job's
// attempt in the lower: the terms fence the masters, while the jobs of
// one master count their attempts each on their own, so that a job that
// restarted less often than another is not a stale master's.
func staleTerm(epoch, seen uint64) bool { return epoch>>32 < seen>>32 }
