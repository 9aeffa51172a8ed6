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

// Rebalancing by handover, on the node that runs the job masters. A
// rebalance (a join, edged cluster rebalance, a drain) hands each job's
// moved subtasks — keyed ones, source splits and the other subtasks of
// their pipeline — over to their new nodes at savepoint barriers
// (actors.Execution.Move) while its other subtasks keep running: a node
// that joined is invited into the running deployment first. Subtasks
// joined by an edge move in successive handovers, upstream first
// (handoverWaves): a subtask moved by a handover sends on serialised
// channels only, so that its readers can park them in turn. Every job is
// redeployed from a savepoint instead when a job refuses a move with
// actors.ErrMoveUnsupported (nothing of it moved by that handover). A
// handover that fails after its barrier (actors.ErrHandover), or meets
// the job's attempt ended (actors.ErrJobEnded), restarts its job from its
// latest checkpoint or savepoint; the restart places the job by the live
// nodes, as a redeployment does: never half moved. A drain whose
// handover fell back so waits for that restart, which places nothing on
// the drained nodes, and then lets them leave.

// handoverJob is one job's part of a rebalance by handover.
type handoverJob struct {
	e     *actors.Execution
	r     *actors.Runner
	moves []actors.Move
	// waves are the moves, one handover each, in order.
	waves [][]actors.Move
	// fellBack is set when a handover of the job fell back: the job
	// restarts from its latest checkpoint or savepoint.
	fellBack bool
}

// planHandover returns the moves that bring every job to placement, by
// job (every job, those with none too), or why a handover cannot make
// them: the jobs are nil then, unless no job has a move.
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
		var moves []actors.Move
		for _, ch := range r.Plan().Chains {
			head := ch.Head()
			for sub := range head.Parallelism {
				want, ok := targetOf(target, ch, sub)
				if !ok || want == r.NodeOf(head.UID, sub) {
					continue
				}
				moves = append(moves, actors.Move{UID: head.UID, Subtask: sub, To: want})
			}
		}
		hj.moves, hj.waves = moves, handoverWaves(r.Plan(), moves)
		n += len(moves)
		out = append(out, hj)
	}
	if n == 0 {
		return out, noMoves
	}
	return out, ""
}

// noMoves is planHandover's reason when no job has a subtask to move.
const noMoves = "no subtask moves"

// handoverWaves orders moves (of chain heads of plan) into successive
// handovers: a move goes in the wave after the latest one moving a
// subtask of a chain that sends to its chain, so that no two subtasks
// joined by an edge move in one handover and a subtask moves after the
// moved subtasks that send to it (they send on serialised channels
// then, which it needs when the edge crossed no node).
func handoverWaves(plan *actors.Plan, moves []actors.Move) [][]actors.Move {
	tailOf := map[*actors.Vertex]*actors.Chain{}
	byUID := map[string]*actors.Chain{}
	for _, ch := range plan.Chains {
		tailOf[ch.Tail()] = ch
		byUID[ch.Head().UID] = ch
	}
	moving := map[*actors.Chain]bool{}
	for _, m := range moves {
		moving[byUID[m.UID]] = true
	}
	// The plan's chains are in topological order: a moving chain's wave
	// is one more than the latest wave of a moving chain that sends to
	// it.
	wave := map[*actors.Chain]int{}
	for _, ch := range plan.Chains {
		if !moving[ch] {
			continue
		}
		w := 0
		for _, e := range ch.In {
			if from := tailOf[e.From]; from != nil && moving[from] {
				w = max(w, wave[from]+1)
			}
		}
		wave[ch] = w
	}
	var out [][]actors.Move
	for _, m := range moves {
		w := wave[byUID[m.UID]]
		for len(out) <= w {
			out = append(out, nil)
		}
		out[w] = append(out[w], m)
	}
	return slices.DeleteFunc(out, func(w []actors.Move) bool { return len(w) == 0 })
}

// rebalanceJobs moves every job to placement: by handover when every job
// can make its moves while it runs, else by redeploying every job from a
// savepoint. A drained node (draining) then leaves each job's running
// deployment (releaseDrained), so that its leave or stop is no failure.
func (c *clusterNode) rebalanceJobs(ctx context.Context, trigger cluster.Trigger, reason string, placement map[string]map[actors.TaskKey]string, draining []string) (cluster.Rebalance, error) {
	jobs, why := c.planHandover(placement)
	if why == noMoves && len(draining) == 0 && jobs != nil {
		// Every job runs on placement already: nothing to move, nothing
		// to restart.
		return c.recordUnchanged(trigger), nil
	}
	if why != "" && (len(draining) == 0 || jobs == nil) {
		c.log.Info("cluster: rebalance redeploys: no handover possible", "trigger", trigger, "reason", why, "draining", draining)
		return c.redeploy(ctx, trigger, reason)
	}
	rec, ok, err := c.handover(ctx, trigger, jobs)
	if !ok {
		c.log.Info("cluster: rebalance redeploys: a job refused the handover; nothing moved by it", "trigger", trigger, "err", err)
		return c.redeploy(ctx, trigger, reason)
	}
	if len(draining) == 0 {
		return rec, err
	}
	if err != nil {
		// Fell back: the jobs whose handover failed restart from their
		// latest checkpoint or savepoint on the live nodes but the
		// drained ones. Once they run, the drained nodes hold nothing of
		// them and leave as after a drain by handover.
		if werr := c.awaitRestarts(ctx, jobs); werr != nil {
			return rec, fmt.Errorf("%w; the restart of the jobs without the drained nodes %v: %w", err, draining, werr)
		}
		c.log.Warn("cluster: drain fell back: the jobs whose handover failed restarted without the drained nodes", "draining", draining, "err", err)
	}
	if err := c.releaseDrained(ctx, jobs, draining); err != nil {
		c.log.Warn("cluster: rebalance redeploys: a drained node did not leave a running deployment", "trigger", trigger, "draining", draining, "err", err)
		return c.redeploy(ctx, trigger, reason)
	}
	return rec, nil
}

// releaseDrained lets the drained nodes leave every job's running
// deployment once handovers moved their subtasks away, and the record of
// the latest deployment (liveView.deployed) forget them: their leave or
// stop is then no failure to fail over from.
func (c *clusterNode) releaseDrained(ctx context.Context, jobs []handoverJob, draining []string) error {
	for _, hj := range jobs {
		r, _ := hj.e.Runner()
		if r != hj.r {
			// The job restarted meanwhile: its new attempt is placed on
			// the live nodes but the drained ones.
			continue
		}
		for _, node := range draining {
			if !slices.Contains(r.Nodes(), node) {
				continue
			}
			start := time.Now()
			if err := r.Release(ctx, node); err != nil {
				if errors.Is(err, actors.ErrJobEnded) {
					// The attempt ended after the check above: its next
					// one is placed on the live nodes, the drained ones
					// not among them.
					c.log.Info("cluster: job restarted during the release of a drained node", "job", hj.e.Name(), "drained", node)
					break
				}
				return fmt.Errorf("job %q: release node %q: %w", hj.e.Name(), node, err)
			}
			c.log.Info("cluster: drained node left the running deployment", "job", hj.e.Name(), "drained", node, "took", time.Since(start))
		}
	}
	v := c.live
	v.mu.Lock()
	if v.deployed != nil {
		v.deployed = slices.DeleteFunc(slices.Clone(v.deployed), func(id string) bool { return slices.Contains(draining, id) })
	}
	v.mu.Unlock()
	return nil
}

// awaitRestarts waits until every job of jobs whose attempt ended during
// the rebalance runs its next attempt.
func (c *clusterNode) awaitRestarts(ctx context.Context, jobs []handoverJob) error {
	for _, hj := range jobs {
		if r, _ := hj.e.Runner(); r == hj.r && !hj.fellBack {
			continue
		}
		start := time.Now()
		if err := waitNewRunner(ctx, hj.e, hj.r); errors.Is(err, actors.ErrJobEnded) {
			// It ended for good (finished its input, say): nothing of it
			// runs, on the drained node or elsewhere.
			c.log.Info("cluster: job ended after its handover failed", "job", hj.e.Name(), "took", time.Since(start))
			continue
		} else if err != nil {
			return fmt.Errorf("job %q: %w", hj.e.Name(), err)
		}
		r, _ := hj.e.Runner()
		c.log.Info("cluster: job restarted after its handover failed", "job", hj.e.Name(), "nodes", r.Nodes(), "took", time.Since(start))
	}
	return nil
}

// fellBack reports whether err, of a handover, means that the job
// restarts (or restarted) from its latest checkpoint or savepoint: the
// handover failed after its barrier, or the attempt ended before the
// handover could start. The restart places the job by the live nodes.
func fellBack(err error) bool {
	return errors.Is(err, actors.ErrHandover) || errors.Is(err, actors.ErrJobEnded)
}

// handover moves the subtasks of jobs by handover, one job at a time, and
// records the rebalance. ok is false when a job refused the handover
// with nothing of it moved (not fellBack): the caller then redeploys
// every job, so that no job stays on the old placement. A job whose
// handover fell back (it restarts) is marked so in jobs, and the other
// jobs still move: err then names every job that fell back.
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
	var failed []error
	for k := range jobs {
		hj := &jobs[k]
		for i, wave := range hj.waves {
			err := c.handoverWave(ctx, trigger, &rec, *hj, i, wave, &joined)
			if err == nil {
				continue
			}
			if !fellBack(err) {
				markJoined()
				// Refused with nothing of this wave moved: the caller
				// redeploys every job (those moved already included), so
				// that none stays on the old placement.
				return rec, false, err
			}
			hj.fellBack = true
			failed = append(failed, fmt.Errorf("handover of job %q: %w", hj.e.Name(), err))
			break
		}
	}
	markJoined()
	if len(failed) > 0 {
		err := errors.Join(failed...)
		rec.Outcome, rec.Error = cluster.RebalanceFellBack, err.Error()
		c.recordRebalance(rec)
		return rec, true, err
	}
	rec.Outcome = cluster.RebalanceDone
	if !slices.ContainsFunc(jobs, func(hj handoverJob) bool { return len(hj.moves) > 0 }) {
		// Nothing to move (a drain of a node that runs nothing): no
		// handover ran.
		rec.Mode, rec.Note = "", nothingMoved
	}
	c.recordRebalance(rec)
	c.log.Info("cluster: rebalanced by handover", "trigger", trigger, "moved_key_groups", rec.MovedKeyGroups, "bytes_shipped", rec.BytesShipped,
		"pause_ms", rec.PauseMS, "unpaused", len(rec.Unpaused), "took", time.Since(rec.At))
	return rec, true, nil
}

// handoverWave runs one handover of job hj (wave i of its waves) and adds
// it to rec; the nodes its subtasks moved to are added to joined.
func (c *clusterNode) handoverWave(ctx context.Context, trigger cluster.Trigger, rec *cluster.Rebalance, hj handoverJob, i int, wave []actors.Move, joined *[]string) error {
	start := time.Now()
	c.log.Info("cluster: rebalance by handover: moving", "trigger", trigger, "job", hj.e.Name(), "wave", i+1, "waves", len(hj.waves), "moves", fmt.Sprint(wave))
	res, err := hj.e.Move(ctx, wave)
	if err != nil {
		if fellBack(err) {
			c.log.Warn("cluster: rebalance by handover failed; the job restarts from its latest checkpoint or savepoint, never half moved",
				"trigger", trigger, "job", hj.e.Name(), "wave", i+1, "took", time.Since(start), "err", err)
		}
		return err
	}
	c.recordHandover(rec, hj, res, i == len(hj.waves)-1)
	c.rep.ownSavepoint(ctx, hj.e.Name(), res.Path)
	for _, m := range res.Moved {
		if !slices.Contains(*joined, m.To) {
			*joined = append(*joined, m.To)
		}
	}
	c.log.Info("cluster: rebalance by handover: job moved", "trigger", trigger, "job", hj.e.Name(), "wave", i+1, "savepoint", uint64(res.Savepoint),
		"waited", res.Waited, "took", res.Took, "moved", len(res.Moved))
	return nil
}

// recordHandover adds one handover of a job to rec: each moved keyed
// subtask's key groups, state bytes and pause (a moved chain without
// keyed operators, a source split say, under its head's name), and,
// after the job's last handover (last) when the job did not restart
// meanwhile, its keyed subtasks that did not move in any.
func (c *clusterNode) recordHandover(rec *cluster.Rebalance, hj handoverJob, res actors.MoveResult, last bool) {
	md, err := snapshot.Load(res.Path)
	if err != nil {
		c.log.Warn("cluster: the handover savepoint's sizes are unknown", "job", hj.e.Name(), "err", err)
		md = nil
	}
	moved := map[actors.TaskKey]actors.MovedSubtask{}
	for _, m := range res.Moved {
		moved[m.Task] = m
	}
	all := map[actors.TaskKey]bool{}
	for _, m := range hj.moves {
		all[actors.TaskKey{UID: m.UID, Subtask: m.Subtask}] = true
	}
	same := false
	if r, _ := hj.e.Runner(); r == hj.r && last {
		same = true
	}
	for _, ch := range hj.r.Plan().Chains {
		var uids []string
		keyed := false
		for _, vx := range ch.Vertices {
			uids = append(uids, vx.UID)
			keyed = keyed || vx.Keyed
		}
		for sub := range ch.Head().Parallelism {
			tk := actors.TaskKey{UID: ch.Head().UID, Subtask: sub}
			m, ok := moved[tk]
			if ok {
				rec.BytesShipped += stateBytes(md, uids, sub)
			}
			if ok && !keyed {
				key := fmt.Sprintf("%s/%s/%d", hj.e.Name(), ch.Head().Name, sub)
				rec.PauseMS[key] = float64(m.Pause.Microseconds()) / 1000
				c.log.Info("cluster: rebalance by handover: subtask moved", "subtask", key, "from", m.From, "to", m.To,
					"pause_ms", rec.PauseMS[key], "inputs", m.Inputs)
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
				case same && !all[tk]:
					rec.Unpaused = append(rec.Unpaused, key)
				}
			}
		}
	}
	slices.Sort(rec.Unpaused)
}
