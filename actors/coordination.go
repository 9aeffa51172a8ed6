package actors

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/edgedio/edged/snapshot"
)

// ErrNoCheckpointStore is returned when a savepoint is asked of a job that
// has no checkpoint directory.
var ErrNoCheckpointStore = errors.New("actors: no checkpoint directory configured")

// savepointReq asks the runner for a savepoint.
type savepointReq struct {
	path  string
	stop  bool
	reply chan savepointResult
}

type savepointResult struct {
	path string
	// md is the savepoint's metadata, as committed.
	md  *snapshot.Metadata
	err error
}

// TriggerSavepoint takes a savepoint of the running job at path ("" for
// the store's default place) and returns where it was written. With stop,
// the job ends once the savepoint is complete. It fails if the job has no
// checkpoint directory or ends first. ctx bounds the wait: once the
// savepoint is triggered, an end of ctx does not abort it, and the error
// then wraps ErrSavepointUnderWay.
func (r *Runner) TriggerSavepoint(ctx context.Context, path string, stop bool) (string, error) {
	if r.cfg.Checkpoint.Dir == "" {
		return "", ErrNoCheckpointStore
	}
	req := savepointReq{path: path, stop: stop, reply: make(chan savepointResult, 1)}
	select {
	case <-r.started:
	case <-r.done:
		return "", fmt.Errorf("%w before the savepoint", ErrJobEnded)
	case <-ctx.Done():
		return "", ctx.Err()
	}
	select {
	case r.savepoints <- req:
	case <-r.done:
		return "", fmt.Errorf("%w before the savepoint", ErrJobEnded)
	case <-ctx.Done():
		return "", ctx.Err()
	}
	select {
	case res := <-req.reply:
		return res.path, res.err
	case <-ctx.Done():
		what := "the savepoint"
		if stop {
			what = "the stop with a savepoint"
		}
		return "", fmt.Errorf("%w: %w: no longer waiting for it, but %s goes on (the job's history lists its outcome and path)",
			ctx.Err(), ErrSavepointUnderWay, what)
	}
}

// History returns the checkpoint statistics of the job, nil without
// checkpointing. Safe to call while the job runs.
func (r *Runner) History() []snapshot.Stats {
	r.histMu.Lock()
	defer r.histMu.Unlock()
	return append([]snapshot.Stats(nil), r.history...)
}

// openCheckpointing opens the store and the coordinator when the job has
// a checkpoint directory.
func (r *Runner) openCheckpointing() error {
	cfg := r.cfg.Checkpoint
	if cfg.Dir == "" {
		return nil
	}
	store, err := snapshot.OpenStore(cfg.Dir, r.job.Name, r.maxP, r.cfg.Logger)
	if err != nil {
		return err
	}
	tasks, sources := r.taskIDs()
	coord, err := snapshot.NewCoordinator(cfg, tasks, sources)
	if err != nil {
		return err
	}
	prog, err := store.Progress()
	if err != nil {
		return err
	}
	if r.cfg.Cluster == nil {
		// The job holds the directory's lock: a savepoint without its
		// metadata is one a dead process was writing. (In a cluster a
		// peer's savepoint may be arriving by replication.)
		removed, err := store.DiscardIncompleteSavepoints()
		for _, dir := range removed {
			r.log.Info("removed a savepoint that never completed", "dir", dir)
		}
		if err != nil {
			r.log.Warn("removing savepoints that never completed", "err", err)
		}
	}
	if md := r.cfg.Restore; md != nil && snapshot.ID(md.Checkpoint) >= prog.NextID {
		prog.NextID = md.Checkpoint + 1
	}
	prog.NextID = max(prog.NextID, r.cfg.nextCheckpoint)
	if c := r.cfg.Cluster; c != nil && c.NextCheckpoint > prog.NextID {
		prog.NextID = c.NextCheckpoint
	}
	acts, err := coord.Recover(prog)
	if err != nil {
		return err
	}
	r.store, r.coord = store, coord
	for _, h := range r.hosts {
		h.store = store
	}
	// The first tick starts the interval.
	now := r.cfg.Clock.Now()
	return r.handle(now, append(acts, coord.Tick(now)...))
}

// handle carries out the coordinator's actions. It returns an error when
// the job must fail, and sets r.closing when the final checkpoint or a
// stop-with-savepoint completed.
func (r *Runner) handle(now time.Time, acts []snapshot.Action) error {
	var fail error
	for len(acts) > 0 {
		a := acts[0]
		acts = acts[1:]
		switch a := a.(type) {
		case snapshot.Trigger:
			if _, err := r.store.Begin(a); err != nil {
				first, _ := r.taskIDs()
				acts = append(acts, r.coord.Step(now, snapshot.Decline{Checkpoint: a.Checkpoint, Task: first[0], Reason: err})...)
				continue
			}
			r.log.Debug("checkpoint triggered", "checkpoint_id", a.Checkpoint, "savepoint", a.Savepoint, "final", a.Final)
			r.inflight[a.Checkpoint] = true
			// Every task is told: a running source emits the barrier, a
			// finished task snapshots its final state, and any other task
			// waits for the barriers (or snapshots when it finishes).
			r.command(triggerMsg{id: int64(a.Checkpoint), stop: a.Stop})
		case snapshot.Complete:
			r.job.recordSettings(a.Metadata)
			path, err := r.store.Commit(a.Metadata)
			if c := r.cfg.Cluster; err == nil && c != nil && c.Publish != nil {
				// On the command context: a deployment that fails (a
				// leader cut off from the majority is told to stop) gives
				// up a publication waiting on unreachable peers at once.
				ctx, cancel := context.WithTimeout(r.cmdCtx, r.controlTimeout())
				if err = c.Publish(ctx, r.epoch, a.Metadata); err != nil {
					err = fmt.Errorf("publish the metadata of snapshot %d to the cluster: %w", a.Checkpoint, err)
				}
				cancel()
			}
			acts = append(acts, r.coord.Step(now, snapshot.Persisted{Checkpoint: a.Checkpoint, Path: path, Err: err})...)
			if err == nil {
				r.log.Info("checkpoint complete", "checkpoint_id", a.Checkpoint, "savepoint", a.Savepoint, "path", path)
				r.paths[a.Checkpoint] = path
				if _, ok := r.waiting[a.Checkpoint]; ok {
					r.metas[a.Checkpoint] = a.Metadata
				}
			}
		case snapshot.NotifyComplete:
			// The final checkpoint and a stop-with-savepoint end the job
			// once every task has been notified: the sinks commit them.
			delete(r.inflight, a.Checkpoint)
			ends := a.Stop || a.Final
			if ends {
				r.closing = a.Checkpoint
			}
			if a.Final {
				r.final = a.Checkpoint
			}
			r.command(completeMsg{id: int64(a.Checkpoint), ack: ends})
			if req, ok := r.waiting[a.Checkpoint]; ok && !ends {
				// The caller reads the history next: it shows the
				// savepoint completed.
				r.refreshHistory()
				req.reply <- savepointResult{path: r.paths[a.Checkpoint], md: r.metas[a.Checkpoint]}
				delete(r.waiting, a.Checkpoint)
			}
			delete(r.metas, a.Checkpoint)
		case snapshot.Abort:
			r.log.Warn("checkpoint aborted", "checkpoint_id", a.Checkpoint, "err", a.Reason)
			delete(r.metas, a.Checkpoint)
			delete(r.inflight, a.Checkpoint)
			r.command(abortMsg{id: int64(a.Checkpoint)})
			if req, ok := r.waiting[a.Checkpoint]; ok {
				// The caller reads the history next: it shows the
				// savepoint failed, not in progress.
				r.refreshHistory()
				req.reply <- savepointResult{err: fmt.Errorf("savepoint %d: %w", a.Checkpoint, a.Reason)}
				delete(r.waiting, a.Checkpoint)
			}
		case snapshot.Discard:
			if err := r.store.Discard(a.Checkpoint); err != nil {
				r.log.Warn("discard checkpoint", "checkpoint_id", a.Checkpoint, "err", err)
			}
		case snapshot.FailJob:
			fail = fmt.Errorf("%w: %w", ErrCheckpointFailure, a.Reason)
		}
	}
	r.refreshHistory()
	return fail
}

// refreshHistory copies the coordinator's history for History.
func (r *Runner) refreshHistory() {
	r.histMu.Lock()
	r.history = r.coord.History()
	r.histMu.Unlock()
}

// coordinatorTimer returns the channel of a timer for the coordinator's
// next tick, or nil.
func (r *Runner) coordinatorTimer(clock clockwork.Clock, prev clockwork.Timer) (clockwork.Timer, <-chan time.Time) {
	if prev != nil {
		prev.Stop()
	}
	if r.coord == nil {
		return nil, nil
	}
	next, ok := r.coord.Next()
	if !ok {
		return nil, nil
	}
	t := clock.NewTimer(max(next.Sub(clock.Now()), 0))
	return t, t.Chan()
}

// taskIDs returns the checkpoint ids of every task of the plan, on
// whichever node it runs, and those of the sources among them.
func (r *Runner) taskIDs() (tasks, sources []snapshot.TaskID) {
	for _, c := range r.plan.Chains {
		for i := range c.Head().Parallelism {
			id := snapshot.TaskID{Vertex: c.Head().UID, Subtask: i}
			tasks = append(tasks, id)
			if c.Head().IsSource() {
				sources = append(sources, id)
			}
		}
	}
	return tasks, sources
}
