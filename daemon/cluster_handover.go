package daemon

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/cluster"
	"github.com/edgedio/edged/keygroup"
	"github.com/edgedio/edged/snapshot"
)

// Rebalancing by handover, on the node that runs the job masters. When
// a rebalance (a join, edged cluster rebalance) moves only keyed subtasks
// that are not sources, each job hands them over to their new nodes at a
// savepoint barrier (actors.Execution.Move) while its other subtasks keep
// running: a node that joined is invited into the running deployment
// first. Otherwise — a source or another unkeyed subtask moves, a drain
// (the drained node then leaves the deployment), or a job refuses the
// move with actors.ErrMoveUnsupported — every job is redeployed from a
// savepoint, as before. A handover that fails after its barrier
// (actors.ErrHandover) restarts its job from its latest checkpoint or
// savepoint; the restart places the job by the live nodes, as a
// redeployment does: never half moved.

// handoverJob is one job's part of a rebalance by handover.
type handoverJob struct {
	e     *actors.Execution
	r     *actors.Runner
	moves []actors.Move
}

// planHandover returns the moves that bring every job to placement, by
// job, or why a handover cannot make them.
func (c *clusterNode) planHandover(placement map[string]map[actors.TaskKey]string) ([]handoverJob, string) {
	var out []handoverJob
	n := 0
	for _, e := range c.executions() {
		r, _ := e.Runner()
		if r == nil {
			return nil, fmt.Sprintf("job %q has no running attempt", e.Name())
		}
		target, ok := placement[e.Name()]
		if !ok {
			return nil, fmt.Sprintf("job %q has no placement", e.Name())
		}
		hj := handoverJob{e: e, r: r}
		for _, ch := range r.Plan().Chains {
			head := ch.Head()
			for sub := range head.Parallelism {
				want, ok := target[actors.TaskKey{UID: head.UID, Subtask: sub}]
				if !ok || want == r.NodeOf(head.UID, sub) {
					continue
				}
				if head.IsSource() || !head.Keyed {
					return nil, fmt.Sprintf("subtask %s[%d] of job %q moves and is not a keyed non-source subtask", head.UID, sub, e.Name())
				}
				hj.moves = append(hj.moves, actors.Move{UID: head.UID, Subtask: sub, To: want})
			}
		}
		n += len(hj.moves)
		if len(hj.moves) > 0 {
			out = append(out, hj)
		}
	}
	if n == 0 {
		return nil, "no keyed subtask moves"
	}
	return out, ""
}

// rebalanceJobs moves every job to placement: by handover when it moves
// only keyed non-source subtasks and no node is drained, else by
// redeploying every job from a savepoint.
func (c *clusterNode) rebalanceJobs(ctx context.Context, trigger cluster.Trigger, reason string, placement map[string]map[actors.TaskKey]string, draining []string) (cluster.Rebalance, error) {
	if len(draining) > 0 {
		c.log.Info("cluster: rebalance redeploys: a drained node leaves the deployment", "trigger", trigger, "draining", draining)
		return c.redeploy(ctx, trigger, reason)
	}
	jobs, why := c.planHandover(placement)
	if jobs == nil {
		c.log.Info("cluster: rebalance redeploys: no handover possible", "trigger", trigger, "reason", why)
		return c.redeploy(ctx, trigger, reason)
	}
	rec, ok, err := c.handover(ctx, trigger, jobs)
	if !ok {
		c.log.Info("cluster: rebalance redeploys: a job refused the handover; nothing moved by it", "trigger", trigger, "err", err)
		return c.redeploy(ctx, trigger, reason)
	}
	return rec, err
}

// handover moves the subtasks of jobs by handover, one job at a time, and
// records the rebalance. ok is false when a job refused the handover
// with nothing of it moved (not ErrHandover): the caller then redeploys
// every job, so that no job stays on the old placement.
func (c *clusterNode) handover(ctx context.Context, trigger cluster.Trigger, jobs []handoverJob) (rec cluster.Rebalance, ok bool, err error) {
	rec = cluster.Rebalance{At: time.Now(), Trigger: trigger, Outcome: cluster.RebalanceRunning, PauseMS: map[string]float64{}, Mode: cluster.RebalanceHandover}
	var joined []string
	// markJoined records that the nodes moved to run the jobs now: not
	// a join to rebalance again. Every return goes through it, so that a
	// failure after earlier jobs moved leaves the records true.
	markJoined := func() {
		v := c.live
		v.mu.Lock()
		for _, id := range joined {
			if v.deployed != nil && !slices.Contains(v.deployed, id) {
				v.deployed = append(slices.Clone(v.deployed), id)
			}
		}
		v.mu.Unlock()
	}
	for _, hj := range jobs {
		start := time.Now()
		c.log.Info("cluster: rebalance by handover: moving", "trigger", trigger, "job", hj.e.Name(), "moves", fmt.Sprint(hj.moves))
		res, err := hj.e.Move(ctx, hj.moves)
		if err != nil {
			if !errors.Is(err, actors.ErrHandover) {
				// Refused with nothing of this job moved: the caller
				// redeploys every job (those moved already included),
				// so that none stays on the old placement.
				markJoined()
				return rec, false, err
			}
			markJoined()
			rec.Outcome, rec.Error = cluster.RebalanceFellBack, fmt.Sprintf("handover of job %q: %v", hj.e.Name(), err)
			c.recordRebalance(rec)
			c.log.Warn("cluster: rebalance by handover failed; the job restarts from its latest checkpoint or savepoint, never half moved",
				"trigger", trigger, "job", hj.e.Name(), "took", time.Since(start), "err", err)
			return rec, true, fmt.Errorf("handover of job %q: %w", hj.e.Name(), err)
		}
		c.recordHandover(&rec, hj, res)
		for _, m := range res.Moved {
			if !slices.Contains(joined, m.To) {
				joined = append(joined, m.To)
			}
		}
		c.log.Info("cluster: rebalance by handover: job moved", "trigger", trigger, "job", hj.e.Name(), "savepoint", uint64(res.Savepoint),
			"waited", res.Waited, "took", res.Took, "moved", len(res.Moved))
	}
	markJoined()
	rec.Outcome = cluster.RebalanceDone
	c.recordRebalance(rec)
	c.log.Info("cluster: rebalanced by handover", "trigger", trigger, "moved_key_groups", rec.MovedKeyGroups, "bytes_shipped", rec.BytesShipped,
		"pause_ms", rec.PauseMS, "unpaused", len(rec.Unpaused), "took", time.Since(rec.At))
	return rec, true, nil
}

// recordHandover adds one job's handover to rec: each moved keyed
// subtask's key groups, state bytes and pause, and, when the job did not
// restart meanwhile, its keyed subtasks that did not move.
func (c *clusterNode) recordHandover(rec *cluster.Rebalance, hj handoverJob, res actors.MoveResult) {
	md, err := snapshot.Load(res.Path)
	if err != nil {
		c.log.Warn("cluster: the handover savepoint's sizes are unknown", "job", hj.e.Name(), "err", err)
		md = nil
	}
	moved := map[actors.TaskKey]actors.MovedSubtask{}
	for _, m := range res.Moved {
		moved[m.Task] = m
	}
	same := false
	if r, _ := hj.e.Runner(); r == hj.r {
		same = true
	}
	for _, ch := range hj.r.Plan().Chains {
		var uids []string
		for _, vx := range ch.Vertices {
			uids = append(uids, vx.UID)
		}
		for sub := range ch.Head().Parallelism {
			m, ok := moved[actors.TaskKey{UID: ch.Head().UID, Subtask: sub}]
			if ok {
				rec.BytesShipped += stateBytes(md, uids, sub)
			}
			for _, vx := range ch.Vertices {
				if !vx.Keyed {
					continue
				}
				key := fmt.Sprintf("%s/%s/%d", hj.e.Name(), vx.Name, sub)
				switch {
				case ok:
					kg := keygroup.RangeFor(sub, vx.Parallelism, hj.r.MaxParallelism())
					rec.MovedKeyGroups += kg.End - kg.Start
					rec.PauseMS[key] = float64(m.Pause.Microseconds()) / 1000
					c.log.Info("cluster: rebalance by handover: subtask moved", "subtask", key, "from", m.From, "to", m.To,
						"pause_ms", rec.PauseMS[key], "inputs", m.Inputs)
				case same:
					rec.Unpaused = append(rec.Unpaused, key)
				}
			}
		}
	}
	slices.Sort(rec.Unpaused)
}
