package daemon

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/pipeline"
	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/state"
	"github.com/edgedio/edged/stream"
)

// Status is where a job stands.
type Status string

// The statuses of a job.
const (
	// StatusRunning means the job runs.
	StatusRunning Status = "running"
	// StatusRestarting means an attempt of the job ended (a task failed,
	// or a deployment could not be made) and it waits to run again:
	// JobInfo.LastFailure says why.
	StatusRestarting Status = "restarting"
	// StatusFinished means the job ended by itself (bounded sources) or
	// was stopped with a savepoint.
	StatusFinished Status = "finished"
	// StatusCancelled means the job was cancelled, through the API or on
	// shutdown (also one that waited to restart after a failure).
	StatusCancelled Status = "cancelled"
	// StatusFailed means a task failed and the restart strategy gave up.
	StatusFailed Status = "failed"
)

// job is the node's record of one pipeline's job.
type job struct {
	name          string
	checkpointing bool
	checkpointDir string // the pipeline's checkpoint.dir ("" without checkpoints)
	restoredFrom  string // the snapshot the job started from ("" for none)
	fromLatest    bool   // restoredFrom is checkpoint.dir's latest snapshot, not one the operator named
	run           *stream.Job
	pj            *pipeline.Job
	cancelFn      context.CancelFunc

	mu        sync.Mutex // guards the fields below
	status    Status
	err       error
	cancelled bool // cancel was asked
	stopping  bool // a stop-with-savepoint was asked
	shutdown  bool // the node's shutdown stops it with a savepoint
	savepoint string
	history   []snapshot.Stats // merged from every poll, by ID
	completed int64            // checkpoints seen completing
	failed    int64            // checkpoints seen failing
}

// jobState is a copy of a job's record.
type jobState struct {
	Status    Status
	Err       error
	Savepoint string
	History   []snapshot.Stats
	Completed int64
	Failed    int64
}

func (j *job) snapshot() jobState {
	j.mu.Lock()
	defer j.mu.Unlock()
	return jobState{Status: j.status, Err: j.err, Savepoint: j.savepoint,
		History: slices.Clone(j.history), Completed: j.completed, Failed: j.failed}
}

func (j *job) cancel() {
	j.mu.Lock()
	j.cancelled = true
	j.mu.Unlock()
	j.cancelFn()
}

// wasCancelled reports whether a cancel of the job was asked.
func (j *job) wasCancelled() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.cancelled
}

// markShutdown records that the node's shutdown stops the job with a
// savepoint: however the job ends from now on, it does not count as a
// failure (see finish).
func (j *job) markShutdown() {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.shutdown = true
}

func (j *job) markStopping() {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.stopping = true
}

func (j *job) setSavepoint(p string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.savepoint = p
}

// finish records how the job ended (Wait returned err) and returns its
// status.
func (j *job) finish(err error) Status {
	j.mu.Lock()
	defer j.mu.Unlock()
	switch {
	case err == nil:
		j.status = StatusFinished
	case j.shutdown:
		// The node's shutdown asked for a stop with a savepoint, and the
		// job failed before that savepoint completed (its sink's broker
		// away past the stop's wait, a full disk): the shutdown had
		// stopped its restarts, so the failure ends it. It is cancelled,
		// as the stop asked for, not failed: it goes on from its latest
		// checkpoint at the next start, and the node exits 0.
		j.status, j.err = StatusCancelled, err
	case j.cancelled && errors.Is(err, context.Canceled):
		j.status = StatusCancelled
	case errors.Is(err, actors.ErrStoppedRestarting):
		// Stopped by the node's shutdown while it waited to restart: its
		// latest checkpoint is where it goes on from.
		j.status, j.err = StatusCancelled, err
	default:
		j.status, j.err = StatusFailed, err
	}
	return j.status
}

// observe merges the job's current checkpoint history into the record.
// The runtime keeps only the current attempt's history, and none once the
// job has ended, so the record keeps what was seen.
func (j *job) observe() {
	cur := j.run.History()
	j.mu.Lock()
	defer j.mu.Unlock()
	var c, f int
	j.history, c, f = mergeHistory(j.history, cur, snapshot.HistorySize)
	j.completed += int64(c)
	j.failed += int64(f)
}

// mergeHistory merges cur into prev (both ordered by checkpoint ID, as
// the runtime reports them) keeping at most limit entries, the newest. It
// returns how many checkpoints became completed or failed: entries of cur
// that were not in prev with that status. It does not modify prev.
func mergeHistory(prev, cur []snapshot.Stats, limit int) (merged []snapshot.Stats, completed, failed int) {
	idx := make(map[snapshot.ID]int, len(prev))
	merged = slices.Clone(prev)
	for i, s := range merged {
		idx[s.Checkpoint] = i
	}
	for _, s := range cur {
		i, ok := idx[s.Checkpoint]
		if ok && merged[i].Status == s.Status {
			merged[i] = s
			continue
		}
		switch s.Status {
		case snapshot.Completed:
			completed++
		case snapshot.Failed:
			failed++
		}
		if ok {
			merged[i] = s
			continue
		}
		idx[s.Checkpoint] = len(merged)
		merged = append(merged, s)
	}
	slices.SortStableFunc(merged, func(a, b snapshot.Stats) int {
		switch {
		case a.Checkpoint < b.Checkpoint:
			return -1
		case a.Checkpoint > b.Checkpoint:
			return 1
		}
		return 0
	})
	if len(merged) > limit {
		merged = slices.Clone(merged[len(merged)-limit:])
	}
	return merged, completed, failed
}

// explainRestore adds to a restore refused for incompatible state how to
// start the pipeline without that snapshot: the node chose it (the latest
// of checkpoint.dir) or the operator did (--from-savepoint).
func (j *job) explainRestore(err error) error {
	if err == nil || j.restoredFrom == "" || !errors.Is(err, state.ErrIncompatibleState) {
		return err
	}
	if j.fromLatest {
		return fmt.Errorf("%w (the node resumed the job from %s, the latest snapshot under its checkpoint.dir %q: "+
			"to run the changed pipeline without that state, move that directory away or give the pipeline another checkpoint.dir; "+
			"to keep the state, start it with the settings the snapshot was taken with)", err, j.restoredFrom, j.checkpointDir)
	}
	return fmt.Errorf("%w (the job was started from %s by --from-savepoint: to run the changed pipeline without that state, start it without --from-savepoint, with a checkpoint.dir that holds no snapshot of it)",
		err, j.restoredFrom)
}
