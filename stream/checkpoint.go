package stream

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/internal/fsutil"
	"github.com/edgedio/edged/snapshot"
)

// WithCheckpointing turns on checkpoints with cfg (start from
// snapshot.DefaultConfig(); cfg.Dir is required, cfg.Interval 0 allows
// savepoints only). The seeds' Java settings map one to one:
//
//	cfg := snapshot.DefaultConfig()
//	cfg.Dir = "/var/lib/edged/checkpoints"
//	cfg.Interval = 30 * time.Second          // enableCheckpointing(30000)
//	cfg.Mode = snapshot.ExactlyOnce          // setCheckpointingMode(EXACTLY_ONCE)
//	cfg.Timeout = 60 * time.Second           // setCheckpointTimeout(60000)
//	cfg.MaxConcurrent = 2                    // setMaxConcurrentCheckpoints(2)
//	cfg.MinPause = 2 * time.Second           // setMinPauseBetweenCheckpoints(2000)
//	cfg.PreferCheckpointForRecovery = true   // setPreferCheckpointForRecovery(true)
//	cfg.TolerableFailures = 0                // setTolerableCheckpointFailureNumber(0)
func WithCheckpointing(cfg snapshot.Config) Option {
	return func(e *Environment) { e.cfg.Checkpoint = cfg }
}

// WithRestartStrategy sets what happens when a task fails:
// snapshot.NoRestart{} (the default), &snapshot.FixedDelay{Attempts: 3,
// Delay: 10 * time.Second} (fixedDelayRestart(3, 10000)) or
// &snapshot.FailureRate{MaxFailures: 3, Interval: 10 * time.Minute, Delay:
// time.Minute} (failureRateRestart(3, Time.minutes(10), Time.minutes(1)))
// or &snapshot.ExponentialDelay{InitialDelay: time.Second, MaxDelay:
// time.Minute, Multiplier: 2, ResetAfter: time.Hour} (never gives up; the
// daemon's default). A restart restores the latest complete checkpoint.
//
// A FixedDelay, FailureRate or ExponentialDelay with values its YAML form
// would refuse (a negative attempt count or delay, no failures tolerated,
// an interval not above the delay, no initial delay, a maximum below it, a
// multiplier below 1) is an error of the job's plan, as is a nil strategy
// pointer.
func WithRestartStrategy(s snapshot.RestartStrategy) Option {
	return func(e *Environment) {
		if err := checkRestartStrategy(s); err != nil {
			e.addError(err)
			return
		}
		e.restart = s
	}
}

// checkRestartStrategy validates the built-in strategies by the rules of
// their YAML form (snapshot.RestartConfig.Validate).
func checkRestartStrategy(s snapshot.RestartStrategy) error {
	var rc snapshot.RestartConfig
	switch s := s.(type) {
	case *snapshot.FixedDelay:
		if s == nil {
			return fmt.Errorf("%w: restart strategy: nil *snapshot.FixedDelay", snapshot.ErrInvalidConfig)
		}
		rc = snapshot.RestartConfig{Strategy: snapshot.RestartFixedDelay, Attempts: s.Attempts, Delay: s.Delay}
	case *snapshot.FailureRate:
		if s == nil {
			return fmt.Errorf("%w: restart strategy: nil *snapshot.FailureRate", snapshot.ErrInvalidConfig)
		}
		rc = snapshot.RestartConfig{Strategy: snapshot.RestartFailureRate, MaxFailures: s.MaxFailures, Interval: s.Interval, Delay: s.Delay}
	case *snapshot.ExponentialDelay:
		if s == nil {
			return fmt.Errorf("%w: restart strategy: nil *snapshot.ExponentialDelay", snapshot.ErrInvalidConfig)
		}
		rc = snapshot.RestartConfig{Strategy: snapshot.RestartExponentialDelay, InitialDelay: s.InitialDelay, MaxDelay: s.MaxDelay, Multiplier: s.Multiplier, ResetAfter: s.ResetAfter}
	default:
		return nil
	}
	return rc.Validate()
}

// WithSavepoint starts the job from a savepoint (or retained checkpoint)
// directory: state is matched to operators by UID, and operators may have
// another parallelism than when it was taken. With allowNonRestored, state
// of operators the job no longer has is skipped instead of failing.
func WithSavepoint(path string, allowNonRestored bool) Option {
	return func(e *Environment) {
		md, err := snapshot.Load(path)
		if err != nil {
			if isStoreRoot(path) {
				err = fmt.Errorf("%w (this is a checkpoint directory, not one snapshot: give one of its savepoints/sp-… or checkpoints/chk-… directories; "+
					"a job on this checkpoint directory resumes from its newest snapshot without WithSavepoint)", err)
			}
			e.addError(fmt.Errorf("stream: WithSavepoint(%q): %w", path, err))
			return
		}
		e.cfg.Restore = md
		e.cfg.AllowNonRestoredState = allowNonRestored
	}
}

// isStoreRoot reports whether path is the root of a snapshot store (a
// checkpoint directory) rather than one snapshot in it.
func isStoreRoot(path string) bool {
	for _, name := range []string{"LAYOUT", "savepoints", "checkpoints"} {
		if _, err := os.Stat(filepath.Join(path, name)); err == nil {
			return true
		}
	}
	return false
}

// WithBoltStateBackend keeps keyed state in bbolt files under dir (state
// larger than RAM) instead of memory. Both backends behave alike and write
// the same snapshots, so a job can switch between them through a
// savepoint.
func WithBoltStateBackend(dir string) Option {
	return func(e *Environment) {
		e.cfg.StateBackend = actors.StateBackendConfig{Kind: actors.BoltBackend, Dir: dir}
	}
}

// Job is a running job: savepoints can be asked of it and it can be
// waited for.
type Job struct {
	exec *actors.Execution
	done chan struct{}
	err  error
}

// ExecuteAsync starts the job and returns at once. While a job e started
// runs, it returns ErrAlreadyRunning.
func (e *Environment) ExecuteAsync(ctx context.Context) (*Job, error) {
	if err := e.errNil("ExecuteAsync"); err != nil {
		return nil, err
	}
	if !e.running.CompareAndSwap(false, true) {
		return nil, ErrAlreadyRunning
	}
	return e.executeAsync(ctx)
}

// executeAsync is ExecuteAsync once e.running is set: it clears it when
// the job ends, or at once when it cannot start.
func (e *Environment) executeAsync(ctx context.Context) (*Job, error) {
	if err := e.resolve(); err != nil {
		e.running.Store(false)
		return nil, err
	}
	unlock, err := e.lockCheckpointDir()
	if err != nil {
		e.running.Store(false)
		return nil, err
	}
	j := &Job{exec: actors.NewExecution(&e.job, e.cfg, e.restart), done: make(chan struct{})}
	// Look up the earlier run's snapshot now, so that AlreadyFinished is
	// set when ExecuteAsync returns; an error of it is Wait's.
	_ = j.exec.Resume()
	go func() {
		defer close(j.done)
		j.err = j.exec.Run(ctx)
		unlock()
		e.running.Store(false)
	}()
	return j, nil
}

// checkpointLockFile is the file in the checkpoint directory that a
// running job holds an exclusive lock on.
const checkpointLockFile = "LOCK"

// lockCheckpointDir takes the lock on the checkpoint directory's LOCK
// file for the job's run, and returns what releases it. Two jobs on one
// directory, in two processes (a program started twice) or two
// Environments of one, would restore, write and discard each other's
// checkpoints and sink files: the second is refused with
// ErrCheckpointDirInUse. A job of a cluster takes no lock (its nodes
// share the job's snapshots by replication, not by directory).
func (e *Environment) lockCheckpointDir() (unlock func(), err error) {
	dir := e.cfg.Checkpoint.Dir
	if dir == "" || e.cfg.Cluster != nil {
		return func() {}, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("open snapshot store: %w", err)
	}
	path := filepath.Join(dir, checkpointLockFile)
	f, err := fsutil.TryLock(path)
	if errors.Is(err, fsutil.ErrLocked) {
		return nil, fmt.Errorf("%w: %s is locked by another running job (this program started twice, or another Environment of it)", ErrCheckpointDirInUse, path)
	}
	if err != nil {
		return nil, fmt.Errorf("lock the checkpoint directory: %w", err)
	}
	return func() { f.Close() }, nil
}

// Execution returns the job's execution: the job master, to which nodes
// in other processes push and from which they fetch state files.
func (j *Job) Execution() *actors.Execution { return j.exec }

// Wait waits for the job to end and returns its error.
func (j *Job) Wait() error {
	<-j.done
	return j.err
}

// Done is closed when the job has ended.
func (j *Job) Done() <-chan struct{} { return j.done }

// TriggerSavepoint takes a savepoint of the running job ("" for the
// checkpoint directory's savepoints/) and returns its path. A job without
// a checkpoint directory (WithCheckpointing with Dir set) takes none, to
// a path of its own neither: the error is actors.ErrNoCheckpointStore.
// ctx bounds the wait, not the savepoint: when it ends after the savepoint
// was triggered, the savepoint goes on and the error wraps ctx's error and
// actors.ErrSavepointUnderWay (History lists its outcome and path).
func (j *Job) TriggerSavepoint(ctx context.Context, path string) (string, error) {
	p, err := j.exec.TriggerSavepoint(ctx, path, false)
	return p, explainNoStore(err)
}

// StopWithSavepoint takes a savepoint and ends the job once it is
// complete; Wait then returns nil. Refused, as TriggerSavepoint, for a
// job without a checkpoint directory; the job then goes on. ctx bounds
// the wait, not the stop: when it ends after the savepoint was triggered,
// the error wraps ctx's error and actors.ErrSavepointUnderWay, and the
// job still ends (Wait returns nil) once the savepoint completes.
func (j *Job) StopWithSavepoint(ctx context.Context, path string) (string, error) {
	p, err := j.exec.TriggerSavepoint(ctx, path, true)
	return p, explainNoStore(err)
}

// explainNoStore adds to actors.ErrNoCheckpointStore how a Go job gets a
// checkpoint directory.
func explainNoStore(err error) error {
	if errors.Is(err, actors.ErrNoCheckpointStore) {
		return fmt.Errorf("%w: savepoints are written through the job's checkpoint store; "+
			"start the job with stream.WithCheckpointing(cfg) and cfg.Dir set (cfg.Interval 0 takes savepoints only)", err)
	}
	return err
}

// StopRestarting tells the job that it is being stopped: a failure from
// now on ends it instead of restarting it, and a restart delay under way
// ends at once; Wait then returns an error that is
// actors.ErrStoppedRestarting. The running attempt goes on (stop it with
// StopWithSavepoint). Its latest complete checkpoint is where a new run
// goes on from.
func (j *Job) StopRestarting() { j.exec.StopRestarting() }

// Attempts returns how many times the job was started (1 + restarts).
func (j *Job) Attempts() int { return j.exec.Attempts() }

// Restores returns what each restart restored, in order: a checkpoint's
// (or savepoint's) ID, or 0 for a restart without one (from the beginning,
// or from the savepoint the job started from).
func (j *Job) Restores() []snapshot.ID { return j.exec.Restores() }

// AlreadyFinished returns the final checkpoint of an earlier run when the
// job had already finished in its checkpoint directory (or was started
// from a final checkpoint): it then ran nothing, its sinks only committed
// what that checkpoint holds. Nil otherwise. It is set when ExecuteAsync
// returns.
func (j *Job) AlreadyFinished() *snapshot.Metadata { return j.exec.AlreadyFinished() }

// Metrics returns the live counters of the current attempt's tasks
// (records in, batches, watermark, backpressure), nil when no attempt
// runs.
func (j *Job) Metrics() []actors.TaskMetrics {
	if r, _ := j.exec.Runner(); r != nil {
		return r.Metrics()
	}
	return nil
}

// Plan returns the execution plan (chains and the edges between them) of
// the current attempt, nil when no attempt runs.
func (j *Job) Plan() *actors.Plan {
	if r, _ := j.exec.Runner(); r != nil {
		return r.Plan()
	}
	return nil
}

// History returns the checkpoint statistics of the current attempt, or,
// between attempts and once the job ended, of the latest attempt that
// ended (actors.Execution.History).
func (j *Job) History() []snapshot.Stats {
	return j.exec.History()
}
