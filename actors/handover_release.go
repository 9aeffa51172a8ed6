package actors

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// A node leaves a running deployment (Runner.Release) once handovers
// moved every subtask off it — a drained node, say: the job master tells
// its host that the deployment is over for it (its host stops, with no
// task to stop), closes its control channels and from then on sends it
// no command and counts on it for nothing: it has no task to acknowledge
// checkpoints, and the failure of its channels (the node stopping) is not
// the job's. The rest of the job runs on, in the same epoch.

// Release lets node leave the running deployment, once no subtask of the
// job runs on it (moved away by handovers: Move). It waits for a handover
// in progress to end. The job master's node does not leave. A node that
// still runs subtasks, or is not in the deployment, is refused with
// ErrMoveUnsupported and nothing changes.
func (r *Runner) Release(ctx context.Context, node string) error {
	if r.cfg.Checkpoint.Dir == "" {
		return ErrNoCheckpointStore
	}
	req := &moveReq{release: node, reply: make(chan moveResult, 1)}
	select {
	case <-r.started:
	case <-r.done:
		return ErrJobEnded
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case r.moves <- req:
	case <-r.done:
		return ErrJobEnded
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case res := <-req.reply:
		return res.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Release lets node leave the running attempt (Runner.Release).
func (e *Execution) Release(ctx context.Context, node string) error {
	r, _ := e.Runner()
	if r == nil {
		return errors.New("actors: no attempt runs")
	}
	return r.Release(ctx, node)
}

// checkRelease checks that node can leave the running deployment.
func (r *Runner) checkRelease(node string) error {
	c := r.cfg.Cluster
	if c == nil || r.ctl == nil {
		return fmt.Errorf("%w: the job runs in a single process", ErrMoveUnsupported)
	}
	if node == c.Nodes[0].ID {
		return fmt.Errorf("%w: node %q runs the job master and does not leave", ErrMoveUnsupported, node)
	}
	if !r.inDeployment(node) {
		return fmt.Errorf("%w: no node %q in the deployment", ErrMoveUnsupported, node)
	}
	for _, ch := range r.plan.Chains {
		for sub := range ch.Head().Parallelism {
			if r.currentNode(ch, sub) == node {
				return fmt.Errorf("%w: node %q still runs %s[%d]: move its subtasks away first", ErrMoveUnsupported, node, ch.Head().UID, sub)
			}
		}
	}
	return nil
}

// runRelease releases a node on its own goroutine, serialised with the
// handovers (its node indexes must not change under one).
func (r *Runner) runRelease(ctx context.Context, req *moveReq) {
	defer r.moveWG.Done()
	defer func() { r.moveEnded <- struct{}{} }()
	req.reply <- moveResult{err: r.release(ctx, req.release)}
}

// release takes node out of the deployment: marked released first (the
// failures of its channels are then ignored), told the deployment is over
// for it, and its channels closed.
func (r *Runner) release(ctx context.Context, node string) error {
	if err := r.checkRelease(node); err != nil {
		return err
	}
	began := time.Now()
	c := r.ctl
	var down []*ctlSender
	var up []RemoteReceiver
	c.nodesMu.Lock()
	for i, id := range c.ids {
		if id == node && !c.released[i] {
			if c.released == nil {
				c.released = make(map[int]bool)
			}
			c.released[i] = true
			down, up = append(down, c.down[i]), append(up, c.up[i])
		}
	}
	c.nodesMu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, r.controlTimeout())
	defer cancel()
	for _, s := range down {
		if err := s.send(cctx, &controlMsg{Kind: ctlCancel, Job: r.job.Name, Epoch: r.epoch}); err != nil {
			// It stops anyway when its control channels close.
			r.log.Warn("release: the node did not hear that the deployment is over for it", "node", node, "err", err)
		}
		s.close()
	}
	for _, in := range up {
		in.Close()
	}
	// A node in the master's process stops its host now, as a worker
	// does when told: nothing of it waits for the job's end.
	for _, h := range r.hosts {
		if h.node == node {
			h.stop()
		}
	}
	r.log.Info("node left the running deployment", "node", node, "epoch", r.epoch, "took", time.Since(began))
	return nil
}

// Nodes returns the nodes of the running deployment, the job master's
// first, without those released; nil in a single process or before the
// deployment started.
func (r *Runner) Nodes() []string {
	select {
	case <-r.started:
	default:
		return nil
	}
	if r.ctl == nil {
		return nil
	}
	_, ids, _ := r.ctl.live()
	return ids
}
