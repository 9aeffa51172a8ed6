package actors

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/state"
)

// ErrRestartsExhausted wraps the last failure when the restart strategy
// gives up. A job without a restart strategy (snapshot.NoRestart) says so
// instead ("actors: not restarted: the job has no restart strategy"); its
// error is ErrRestartsExhausted too (errors.Is).
var ErrRestartsExhausted = errors.New("actors: restart strategy exhausted")

// notRestarted is ErrRestartsExhausted for a job without a restart
// strategy.
type notRestarted struct{}

func (notRestarted) Error() string {
	return "actors: not restarted: the job has no restart strategy"
}

func (notRestarted) Is(target error) bool { return target == ErrRestartsExhausted }

// ErrStoppedRestarting ends an Execution told StopRestarting after a
// failure, instead of another attempt: the job stopped between attempts,
// without a savepoint; its latest complete checkpoint is where a new run
// goes on from.
var ErrStoppedRestarting = errors.New("actors: stopped while restarting after a failure")

// Execution runs a job with restarts: after a task failure (or too many
// failed checkpoints, or a failed control channel or handshake step in a
// cluster: ErrControlFailed, ErrControlTimeout) the restart strategy
// decides whether and when to run it again, and each new attempt
// restores the latest complete checkpoint (or a newer savepoint, unless
// the checkpoint config prefers checkpoints), rewinding the sources and
// letting the sinks re-commit what the checkpoint covered. Make one with
// NewExecution; Run it once.
type Execution struct {
	job      *Job
	cfg      Config
	strategy snapshot.RestartStrategy

	mu       sync.Mutex // guards runner, attempts, notPlaced, restores, finished and moved
	runner   *Runner
	attempts int
	// notPlaced counts the tries that found no deployment (ErrNotPlaced):
	// not attempts, nothing started.
	notPlaced int
	restores  []snapshot.ID
	finished  *snapshot.Metadata
	// moved is where handovers moved subtasks (by chain head), for the
	// next attempts.
	moved   map[TaskKey]string
	changed chan struct{} // closed and replaced when runner changes
	// ended is closed when Run returns.
	ended     chan struct{}
	endedOnce sync.Once
	// resumeOnce runs Resume's look-up once; resumeErr is its error.
	resumeOnce sync.Once
	resumeErr  error
	// noRestart is closed by StopRestarting.
	noRestart     chan struct{}
	noRestartOnce sync.Once

	// failure is the error of the latest failed attempt and failedAt
	// when it was seen; restarting is set from a failure until the next
	// attempt runs (all guarded by mu).
	failure    error
	failedAt   time.Time
	restarting bool
	// lastHistory is the checkpoint history of the attempts that ended
	// (the newest snapshot.HistorySize), and completed the newest
	// checkpoint (not savepoint) that completed or was restored in this
	// execution (both guarded by mu).
	lastHistory []snapshot.Stats
	completed   snapshot.ID
}

// NewExecution returns an execution of job; a nil strategy never restarts.
func NewExecution(job *Job, cfg Config, strategy snapshot.RestartStrategy) *Execution {
	if strategy == nil {
		strategy = snapshot.NoRestart{}
	}
	return &Execution{job: job, cfg: cfg, strategy: strategy, changed: make(chan struct{}), ended: make(chan struct{}),
		noRestart: make(chan struct{})}
}

// StopRestarting tells the execution that the job is being stopped: an
// attempt that fails from now on is not followed by another, and a
// restart delay under way ends at once; Run then returns
// ErrStoppedRestarting. A running attempt is not touched (stop it with a
// savepoint). A node shutting down calls it, so that a job waiting out
// its restart delay does not hold the shutdown until it runs again.
func (e *Execution) StopRestarting() { e.noRestartOnce.Do(func() { close(e.noRestart) }) }

// Ended is closed when Run returned: the job finished, failed for good,
// was stopped with a savepoint or cancelled; no attempt follows.
func (e *Execution) Ended() <-chan struct{} { return e.ended }

// Attempts returns how many times the job was started.
func (e *Execution) Attempts() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.attempts
}

// NotPlaced returns how many tries to deploy the job found no deployment
// (Cluster.Update failed: no majority, say). They are not attempts.
func (e *Execution) NotPlaced() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.notPlaced
}

// Restores returns what each restart restored, in order: the checkpoint's
// (or savepoint's) ID, or 0 for a restart from the beginning (no
// checkpoint had completed) or from the savepoint the job started from.
func (e *Execution) Restores() []snapshot.ID {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]snapshot.ID(nil), e.restores...)
}

// AlreadyFinished returns the final checkpoint of an earlier run when the
// job had finished before Run started (nil otherwise; valid once Resume
// or Run returned, or Run started; Resume sets it): Run then only let
// the sinks commit what that checkpoint holds, and ran nothing.
func (e *Execution) AlreadyFinished() *snapshot.Metadata {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.finished
}

// Runner returns the runner of the current attempt (nil before the first),
// and a channel closed when that changes.
func (e *Execution) Runner() (*Runner, <-chan struct{}) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.runner, e.changed
}

// LastFailure returns the error that ended the latest failed attempt
// (or try to deploy one) and when; nil if none failed. A redeployment
// (ErrRedeployed) is not a failure.
func (e *Execution) LastFailure() (error, time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.failure, e.failedAt
}

// Restarting reports whether the job waits to run again after an attempt
// ended without the job ending: from the failure (or redeployment) until
// the next attempt runs, restart delay and tries that find no deployment
// included.
func (e *Execution) Restarting() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.restarting
}

// failed records that an attempt ended with err at now and another one
// follows.
func (e *Execution) failed(err error, now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.restarting = true
	if !errors.Is(err, ErrRedeployed) {
		e.failure, e.failedAt = err, now
	}
}

// attemptEnded keeps the checkpoint history of r, whose attempt ended
// with err at now, and notes the newest checkpoint it completed. A
// checkpoint still in progress failed with the attempt: no later
// attempt completes it.
func (e *Execution) attemptEnded(r *Runner, err error, now time.Time) {
	h := r.History()
	for i := range h {
		if h[i].Status != snapshot.InProgress {
			continue
		}
		h[i].Status, h[i].Duration = snapshot.Failed, now.Sub(h[i].Triggered)
		if err == nil {
			err = ErrJobEnded
		}
		h[i].Err = fmt.Errorf("the attempt ended before it completed: %w", err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.lastHistory = mergeHistories(e.lastHistory, h)
	for _, s := range h {
		if s.Status == snapshot.Completed && s.Kind == snapshot.KindCheckpoint {
			e.completed = max(e.completed, s.Checkpoint)
		}
	}
}

// nextCheckpoint is the lowest id the next attempt's checkpoints may
// take: above every id in the history, so that an id a failed attempt
// used (whose directory its abort removed) names no other checkpoint.
func (e *Execution) nextCheckpoint() snapshot.ID {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.lastHistory) == 0 {
		return 0
	}
	return e.lastHistory[len(e.lastHistory)-1].Checkpoint + 1
}

// History returns the checkpoint history of the execution, oldest first,
// the newest snapshot.HistorySize entries: that of the attempts that
// ended, then the running attempt's. Each attempt's coordinator starts
// with an empty history, so a checkpoint that an attempt completed, or
// that failed it, stays visible with its reason after the restart, also
// to a reader that did not look in between.
func (e *Execution) History() []snapshot.Stats {
	e.mu.Lock()
	r, h := e.runner, e.lastHistory
	e.mu.Unlock()
	if r != nil {
		return mergeHistories(h, r.History())
	}
	return slices.Clone(h)
}

// mergeHistories returns the entries of prev and cur, each ordered by
// checkpoint id, in id order, an entry of cur replacing one of prev with
// its id; the newest snapshot.HistorySize are kept. It modifies neither.
func mergeHistories(prev, cur []snapshot.Stats) []snapshot.Stats {
	out := make([]snapshot.Stats, 0, len(prev)+len(cur))
	i, j := 0, 0
	for i < len(prev) || j < len(cur) {
		switch {
		case j == len(cur) || (i < len(prev) && prev[i].Checkpoint < cur[j].Checkpoint):
			out = append(out, prev[i])
			i++
		case i < len(prev) && prev[i].Checkpoint == cur[j].Checkpoint:
			i++ // cur's is the newer view of it
		default:
			out = append(out, cur[j])
			j++
		}
	}
	return out[max(0, len(out)-snapshot.HistorySize):]
}

func (e *Execution) setRunner(r *Runner) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.runner = r
	if r != nil {
		e.attempts++
		e.restarting = false
	}
	close(e.changed)
	e.changed = make(chan struct{})
}

// TriggerSavepoint takes a savepoint of the running attempt (waiting for
// one to run). An attempt that ends before it triggers the savepoint (a
// failed handover, say) leaves it to the next attempt.
func (e *Execution) TriggerSavepoint(ctx context.Context, path string, stop bool) (string, error) {
	for {
		r, changed := e.Runner()
		if r != nil {
			p, err := r.TriggerSavepoint(ctx, path, stop)
			if !errors.Is(err, ErrJobEnded) {
				return p, err
			}
		}
		select {
		case <-changed:
		case <-e.ended:
			return "", fmt.Errorf("%w before the savepoint", ErrJobEnded)
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
}

// Redeploy ends the running attempt with an error wrapping
// ErrRedeployed and ErrControlFailed, and reason, and deploys the job
// again from its latest checkpoint, with the nodes and placement
// Cluster.Update then returns. A redeployment does not count against the
// restart strategy: the cluster changed, the job did not fail. It does
// nothing when no attempt runs.
func (e *Execution) Redeploy(reason string) {
	if r, _ := e.Runner(); r != nil {
		r.fail(fmt.Errorf("%w: %w: job %q epoch %d: redeploying: %s", ErrRedeployed, ErrControlFailed, e.job.Name, r.epoch, reason))
	}
}

// ReceiveFile hands a state file pushed by a host in another process to
// the running attempt (Runner.ReceiveFile).
func (e *Execution) ReceiveFile(epoch uint64, id snapshot.ID, name string, size int64, checksum uint32, body io.Reader) error {
	r, _ := e.Runner()
	if r == nil {
		return fmt.Errorf("%w: job %q: no attempt runs", ErrStaleDeployment, e.job.Name)
	}
	return r.ReceiveFile(epoch, id, name, size, checksum, body)
}

// OpenRestoreFile opens a state file of the snapshot the running attempt
// restores, for a host in another process (Runner.OpenRestoreFile).
func (e *Execution) OpenRestoreFile(epoch uint64, name string) (*os.File, snapshot.Handle, error) {
	r, _ := e.Runner()
	if r == nil {
		return nil, snapshot.Handle{}, fmt.Errorf("%w: job %q: no attempt runs", ErrStaleDeployment, e.job.Name)
	}
	return r.OpenRestoreFile(epoch, name)
}

// Resume finds, once, what Run starts from: the snapshot of an earlier
// run in the job's checkpoint directory (the job goes on from it), or
// the savepoint it was started from. It sets AlreadyFinished when that
// snapshot is a final checkpoint. Run calls it first; calling it before
// Run makes AlreadyFinished valid at once. Its error is Run's.
func (e *Execution) Resume() error {
	e.resumeOnce.Do(func() { e.resumeErr = e.resume() })
	return e.resumeErr
}

func (e *Execution) resume() error {
	cfg := e.cfg
	log := cfg.Logger.With("job", e.job.Name)
	if cfg.Restore == nil && cfg.Checkpoint.Dir != "" {
		// The job's checkpoint directory outlives its process: a job
		// started again on it (after a crash, kill -9, a cancel) goes on
		// from where the earlier run's snapshots left it, as a restart
		// would, so its exactly-once sinks commit nothing twice.
		md, err := ResumePoint(cfg.Checkpoint.Dir, e.job.Name, e.job.maxParallelism(), cfg.Checkpoint.PreferCheckpointForRecovery, cfg.Cluster == nil, cfg.Logger)
		if err != nil {
			return err
		}
		if md != nil && !md.Finished {
			log.Info("resuming from the latest snapshot of an earlier run (to run the job anew, remove its checkpoints or use another checkpoint directory)",
				"checkpoint_id", md.Checkpoint, "path", md.Dir)
		}
		cfg.Restore = md
	}
	if md := cfg.Restore; md != nil && md.Finished {
		log.Info("job already finished; it does not run again (to run it anew, remove its checkpoints or use another checkpoint directory)",
			"checkpoint_id", md.Checkpoint, "path", md.Dir)
		e.mu.Lock()
		e.finished = md
		e.mu.Unlock()
	}
	e.cfg.Restore = cfg.Restore
	return nil
}

// Run runs the job until it finishes, fails for good, is stopped with a
// savepoint, or ctx is cancelled.
func (e *Execution) Run(ctx context.Context) error {
	defer e.endedOnce.Do(func() { close(e.ended) })
	defer func() {
		e.mu.Lock()
		e.restarting = false
		e.mu.Unlock()
	}()
	if err := e.Resume(); err != nil {
		return err
	}
	cfg := e.cfg
	log := cfg.Logger.With("job", e.job.Name)
	// waiting is why the last attempt found no deployment ("" if it
	// found one): the same reason is logged once.
	waiting := ""
	// restore is set once an attempt ended: the next attempt that is
	// placed restores the latest snapshot, chosen only then (tries that
	// find no deployment read nothing).
	restore := false
	for {
		epoch := uint64(e.Attempts() + 1)
		acfg := cfg
		var err error
		if cfg.Cluster != nil {
			epoch += cfg.Cluster.EpochBase
			acfg.Cluster, err = cfg.Cluster.update()
			if err == nil {
				acfg.Cluster = e.placed(acfg.Cluster)
			}
		}
		if err == nil && restore {
			if err := e.chooseRestore(&cfg, log); err != nil {
				return err
			}
			acfg.Restore, restore = cfg.Restore, false
		}
		acfg.nextCheckpoint = e.nextCheckpoint()
		var r *Runner
		if err == nil {
			r, err = newRunner(e.job, acfg, epoch)
		}
		if err != nil && !errors.Is(err, ErrControlFailed) && !errors.Is(err, ErrNotPlaced) {
			return err
		}
		if err != nil {
			// No deployment now (no quorum, say): tried again below.
			e.mu.Lock()
			if errors.Is(err, ErrNotPlaced) {
				e.notPlaced++
			} else {
				e.attempts++
			}
			e.mu.Unlock()
		} else {
			e.setRunner(r)
			err = r.Run(ctx)
			e.attemptEnded(r, err, cfg.Clock.Now())
			e.setRunner(nil)
		}
		var te *TaskError
		if err == nil || ctx.Err() != nil || !errors.As(err, &te) && !errors.Is(err, ErrCheckpointFailure) &&
			!errors.Is(err, ErrControlFailed) && !errors.Is(err, ErrControlTimeout) && !errors.Is(err, ErrNotPlaced) {
			return err
		}
		if restoreMismatch(err) {
			// Every restart would restore the same snapshot into the same
			// job and fail the same way: fail now, not after the restart
			// strategy's attempts and delays.
			return fmt.Errorf("%w (not restarted: the snapshot does not fit the job, and a restart would restore it again)", err)
		}
		select {
		case <-e.noRestart:
			return fmt.Errorf("%w: %w", ErrStoppedRestarting, err)
		default:
		}
		e.failed(err, cfg.Clock.Now())
		var delay time.Duration
		switch {
		case errors.Is(err, ErrNotPlaced):
			// The cluster changes, not the job: the restart strategy
			// keeps its budget for failures, however long a partition
			// lasts.
			delay = cfg.Cluster.retryInterval()
			if err.Error() != waiting {
				log.Warn("job not deployed; trying again until the cluster places it", "err", err, "every", delay)
			}
		case errors.Is(err, ErrRedeployed):
			log.Info("job redeploying", "reason", err, "attempt", e.Attempts()+1)
		default:
			restart, d := e.strategy.OnFailure(cfg.Clock.Now())
			if !restart {
				if _, none := e.strategy.(snapshot.NoRestart); none {
					return fmt.Errorf("%w: %w", notRestarted{}, err)
				}
				return fmt.Errorf("%w: %w", ErrRestartsExhausted, err)
			}
			delay = d
			log.Warn("job failed; restarting", "err", err, "delay", delay, "attempt", e.Attempts()+1)
		}
		waiting = ""
		if errors.Is(err, ErrNotPlaced) {
			waiting = err.Error()
		}
		if delay > 0 {
			select {
			case <-cfg.Clock.After(delay):
			case <-e.noRestart:
				return fmt.Errorf("%w: %w", ErrStoppedRestarting, err)
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if !errors.Is(err, ErrNotPlaced) {
			restore = true
		}
	}
}

// restoreMismatch reports whether err says that a restored snapshot does
// not fit the job (a source that cannot change its parallelism restored
// with another, keyed state restored into an incompatible descriptor, a
// source whose input no longer holds the snapshot's position): no
// restart can cure it.
func restoreMismatch(err error) bool {
	return errors.Is(err, operators.ErrRescaleSource) || errors.Is(err, state.ErrIncompatibleState) ||
		errors.Is(err, operators.ErrSourcePositionGone)
}

// chooseRestore sets cfg.Restore to what the next attempt restores: the
// latest completed checkpoint or savepoint in the checkpoint directory,
// or, with none, what it was (the savepoint the job started from, or
// nothing). It records the choice (Restores).
func (e *Execution) chooseRestore(cfg *Config, log *slog.Logger) error {
	if cfg.Checkpoint.Dir == "" {
		e.mu.Lock()
		e.restores = append(e.restores, 0)
		e.mu.Unlock()
		return nil
	}
	store, err := snapshot.OpenStore(cfg.Checkpoint.Dir, e.job.Name, e.job.maxParallelism(), cfg.Logger)
	if err != nil {
		return err
	}
	if cfg.Cluster == nil {
		store.MissingIsDamage() // one node: no replica holds the file
	}
	md, err := store.RecoveryPoint(cfg.Checkpoint.PreferCheckpointForRecovery)
	switch {
	case err == nil:
		log.Info("restoring", "checkpoint_id", md.Checkpoint, "path", md.Dir)
		cfg.Restore = md
		e.mu.Lock()
		e.restores = append(e.restores, md.Checkpoint)
		if md.Kind == snapshot.KindCheckpoint {
			e.completed = max(e.completed, md.Checkpoint)
		}
		e.mu.Unlock()
	case errors.Is(err, snapshot.ErrNoCheckpoint) && e.completedCheckpoint() > 0:
		// Checkpoints completed, and their completion committed output;
		// the directory lost them all (removed while the job ran). The
		// beginning, or the savepoint the job started from, would commit
		// that output again.
		return fmt.Errorf("%w: checkpoint %d completed in this run, but %s holds no complete checkpoint or savepoint of job %q any more; restarting from the beginning would commit the job's output again: put the directory back, or start the job from a savepoint",
			snapshot.ErrCheckpointGone, e.completedCheckpoint(), cfg.Checkpoint.Dir, e.job.Name)
	case errors.Is(err, snapshot.ErrNoCheckpoint):
		// Nothing completed yet: start again from the beginning (or from
		// the savepoint the job started from).
		log.Info("restarting without a checkpoint", "from_savepoint", cfg.Restore != nil)
		e.mu.Lock()
		e.restores = append(e.restores, 0)
		e.mu.Unlock()
	default:
		return err
	}
	return nil
}

// completedCheckpoint returns the newest checkpoint that completed or was
// restored in this execution; 0 if none.
func (e *Execution) completedCheckpoint() snapshot.ID {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.completed
}

// ResumePoint returns the snapshot a job started on the checkpoint
// directory dir goes on from: the newest complete checkpoint or savepoint
// of an earlier run (snapshot.Store.RecoveryPoint; a final checkpoint
// when the job finished there), nil when there is none. standalone is set
// for a job that runs on one node: a snapshot with a state file missing is
// then damaged (snapshot.Store.MissingIsDamage), since no replica holds
// the file.
func ResumePoint(dir, job string, maxParallelism int, preferCheckpoint, standalone bool, log *slog.Logger) (*snapshot.Metadata, error) {
	store, err := snapshot.OpenStore(dir, job, maxParallelism, log)
	if err != nil {
		return nil, err
	}
	if standalone {
		store.MissingIsDamage()
	}
	md, err := store.RecoveryPoint(preferCheckpoint)
	if errors.Is(err, snapshot.ErrNoCheckpoint) {
		return nil, nil
	}
	return md, err
}

// FinishedCheckpoint returns the final checkpoint of job in the checkpoint
// directory dir when the job finished there (its latest checkpoint is a
// final one), nil when it did not or has no checkpoint.
func FinishedCheckpoint(dir, job string, maxParallelism int, log *slog.Logger) (*snapshot.Metadata, error) {
	md, err := ResumePoint(dir, job, maxParallelism, false, false, log)
	if err != nil || md == nil || !md.Finished {
		return nil, err
	}
	return md, nil
}

// Name returns the job's name.
func (e *Execution) Name() string { return e.job.Name }
