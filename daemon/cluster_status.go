package daemon

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/cluster"
	"github.com/edgedio/edged/keygroup"
	"github.com/edgedio/edged/snapshot"
)

var _ cluster.StatusProvider = (*clusterNode)(nil)

// Status returns the node's view of the cluster (cluster.StatusProvider).
func (c *clusterNode) Status() cluster.Status {
	v := c.live
	alive := v.alive()
	size := len(c.cfg.Nodes())
	master := c.leader()
	s := cluster.Status{Enabled: true, Node: c.cfg.Node, Leader: master}
	v.mu.Lock()
	drained := maps.Clone(v.drained)
	v.mu.Unlock()
	others := v.otherPipelines()
	if o := v.otherThanLeader(master); o != nil {
		// This node differs from the leader: it is the one placed
		// around, and the members that match the leader are not.
		others = o
	}
	for _, id := range c.cfg.Nodes() {
		m := cluster.MemberStatus{ID: id, State: cluster.StateDead, Leader: id == master, Capacity: c.cfg.CapacityOf(id),
			Weight: c.cfg.WeightOf(id), Drained: drained[id], OtherPipelines: others[id]}
		if slices.Contains(alive, id) {
			m.State = cluster.StateAlive
		} else if drained[id] {
			m.State = cluster.StateLeft
		}
		if id == c.cfg.Node {
			m.API = c.api
			if c.tr != nil {
				m.Address = c.tr.Addr()
			}
			// What the node runs tasks under: the peers memberlist
			// declared dead, their death not confirmed yet, count as gone.
			m.SeesMajority = cluster.HasQuorum(len(v.reachable()), size)
			if v.outNow.Load() {
				// Drained, it left the membership and runs nothing until
				// it is undrained or restarts, as the leader shows it; its
				// stopped gossip run still lists every member as it last
				// saw them, itself alive among them.
				m.State, m.Drained, m.SeesMajority = cluster.StateLeft, true, false
			}
		} else if p, ok := c.cfg.Peer(id); ok {
			m.Address, m.API = p.Address, p.API
		}
		s.Members = append(s.Members, m)
	}
	byNode := map[string][]cluster.PlacedSubtask{}
	c.keyedSubtasks(func(e *actors.Execution, r *actors.Runner, vx *actors.Vertex, sub int, kg keygroup.Range) {
		s.Epoch = max(s.Epoch, r.Epoch())
		s.MaxParallelism = r.MaxParallelism()
		node := r.NodeOf(vx.UID, sub)
		byNode[node] = append(byNode[node], cluster.PlacedSubtask{Job: e.Name(), Operator: vx.Name, UID: vx.UID, Subtask: sub,
			KeyGroups: cluster.KeyGroups{kg.Start, kg.End - 1}})
	})
	if w := c.worker; w != nil {
		for _, j := range w.Jobs() {
			s.Epoch = max(s.Epoch, j.Epoch)
		}
	}
	// The highest epoch the node deployed or saw: it does not go back
	// when a job stops.
	s.Epoch = max(s.Epoch, c.highestEpoch())
	for node, subs := range byNode {
		s.Placement = append(s.Placement, cluster.NodePlacement{Node: node, Subtasks: subs})
	}
	if c.rep != nil {
		s.Replicas, s.ReplicaErrorsTotal = c.rep.status(), c.rep.bad.Load()
	}
	v.mu.Lock()
	s.Failovers = slices.Clone(v.failovers)
	s.Rebalances = slices.Clone(v.rebalances)
	s.FailoversTotal, s.RebalancesTotal = v.nFailovers, v.nRebalances
	for _, p := range v.pending {
		s.FailoversInProgress = append(s.FailoversInProgress, cluster.Failover{At: p.at, DeadNode: p.dead,
			DetectionMS: p.detectionMS, PlacementMS: p.placementMS})
	}
	v.mu.Unlock()
	if c.hb != nil {
		s.Handbacks, s.HandbacksTotal = c.hb.status()
	}
	return s
}

// redeploy takes a savepoint of every job, restarts each from it on the
// current placement, waits until each runs again, and records it: the key
// groups that changed node, the bytes of their state in the savepoint
// (what their new owners fetch and restore), and per moved subtask the
// pause of its job, from the end of the old attempt to every task of the
// new one restored and started (the whole job restarts). A failed
// savepoint aborts it with nothing moved.
func (c *clusterNode) redeploy(ctx context.Context, trigger cluster.Trigger, reason string) (cluster.Rebalance, error) {
	before := c.placements()
	rec := cluster.Rebalance{At: time.Now(), Trigger: trigger, Outcome: cluster.RebalanceRunning, PauseMS: map[string]float64{}, Mode: cluster.RebalanceRedeploy}
	execs := c.executions()
	// A savepoint first: the redeployment restores it (it is newer than
	// the latest checkpoint), so little is replayed. Without one nothing
	// moves.
	savepoints := map[string]string{}
	// They are the cluster's own: once the redeployment is over (not
	// before: the jobs run on meanwhile), each is marked and the older
	// ones pruned.
	defer func() {
		for job, path := range savepoints {
			c.rep.ownSavepoint(ctx, job, path)
		}
	}()
	for _, e := range execs {
		start := time.Now()
		path, err := e.TriggerSavepoint(ctx, "", false)
		for try := 2; err != nil && try <= savepointTries && ctx.Err() == nil; try++ {
			// Nothing has moved yet: a declined savepoint (a task that
			// failed, the job restarting) is worth another try.
			// Not at once: a peer that has just crashed stays a member
			// until the membership declares it dead, and until then each
			// savepoint is declined for the copies of state files it
			// refuses. One failure detection apart, the next try finds
			// it gone and gives its copies to the next peer.
			wait := restartGrace(c.cfg.Profile) / 3
			c.log.Warn("cluster: savepoint before the redeployment failed; trying again", "trigger", trigger, "job", e.Name(), "try", try, "in", wait, "err", err)
			select {
			case <-ctx.Done():
				continue
			case <-time.After(wait):
			}
			path, err = e.TriggerSavepoint(ctx, "", false)
		}
		if err != nil {
			rec.Outcome, rec.Error = cluster.RebalanceAborted, fmt.Sprintf("savepoint of job %q: %v", e.Name(), err)
			c.recordRebalance(rec)
			c.log.Warn("cluster: redeployment aborted: the savepoint failed; nothing moved", "trigger", trigger, "job", e.Name(), "err", err)
			return rec, fmt.Errorf("%w: savepoint of job %q before the redeployment: %w", cluster.ErrRefused, e.Name(), err)
		}
		savepoints[e.Name()] = path
		c.log.Info("cluster: savepoint before the redeployment", "trigger", trigger, "job", e.Name(), "path", path, "took", time.Since(start))
	}
	old := map[*actors.Execution]*actors.Runner{}
	stopped := map[*actors.Execution]time.Time{}
	for _, e := range execs {
		old[e], _ = e.Runner()
		stopped[e] = time.Now()
		e.Redeploy(reason)
	}
	var err error
	pause := map[string]float64{}
	for _, e := range execs {
		if err = waitNewRunner(ctx, e, old[e]); err != nil {
			break
		}
		pause[e.Name()] = msSince(stopped[e])
		c.log.Info("cluster: job runs on the new placement", "trigger", trigger, "job", e.Name(), "pause_ms", pause[e.Name()])
	}
	after := c.placements()
	sizes := map[string]*snapshot.Metadata{}
	for k, n := range after {
		b, ok := before[k]
		if !ok || b.node == n.node {
			continue
		}
		rec.MovedKeyGroups += n.groups
		if p, ok := pause[n.job]; ok {
			rec.PauseMS[k] = p
		}
		md, ok := sizes[n.job]
		if !ok && savepoints[n.job] != "" {
			if md, err = snapshot.Load(savepoints[n.job]); err != nil {
				c.log.Warn("cluster: the savepoint's sizes are unknown", "job", n.job, "err", err)
				md, err = nil, nil
			}
			sizes[n.job] = md
		}
		rec.BytesShipped += stateBytes(md, n.chain, n.subtask)
	}
	rec.Outcome = cluster.RebalanceDone
	if err != nil {
		rec.Outcome, rec.Error = cluster.RebalanceFailed, err.Error()
	}
	c.recordRebalance(rec)
	c.log.Info("cluster: redeployed", "trigger", trigger, "moved_key_groups", rec.MovedKeyGroups, "bytes_shipped", rec.BytesShipped,
		"took", time.Since(rec.At), "err", err)
	return rec, err
}

// savepointTries is how many savepoints a redeployment tries before it
// gives up with nothing moved.
const savepointTries = 3

// stateBytes returns the bytes of subtask sub of the operators uids in
// md; 0 without md.
func stateBytes(md *snapshot.Metadata, uids []string, sub int) int64 {
	if md == nil {
		return 0
	}
	var n int64
	for _, uid := range uids {
		if op, ok := md.Operator(uid); ok && sub < len(op.Subtasks) {
			n += op.Subtasks[sub].Size
		}
	}
	return n
}

// placedKeys is where a keyed subtask runs, how many key groups it has,
// and the UIDs of its chain's operators (whose state moves with it).
type placedKeys struct {
	job     string
	node    string
	groups  int
	chain   []string
	subtask int
}

// placements returns the node of every keyed subtask of the running
// attempts, by "job/operator/subtask".
func (c *clusterNode) placements() map[string]placedKeys {
	out := map[string]placedKeys{}
	c.keyedSubtasks(func(e *actors.Execution, r *actors.Runner, vx *actors.Vertex, sub int, kg keygroup.Range) {
		var chain []string
		for _, ch := range r.Plan().Chains {
			if slices.Contains(ch.Vertices, vx) {
				for _, cv := range ch.Vertices {
					chain = append(chain, cv.UID)
				}
			}
		}
		out[fmt.Sprintf("%s/%s/%d", e.Name(), vx.Name, sub)] = placedKeys{job: e.Name(), node: r.NodeOf(vx.UID, sub),
			groups: kg.End - kg.Start, chain: chain, subtask: sub}
	})
	return out
}

// keyedSubtasks calls f for every subtask of a keyed operator of the
// running attempts, with its key groups.
func (c *clusterNode) keyedSubtasks(f func(e *actors.Execution, r *actors.Runner, vx *actors.Vertex, sub int, kg keygroup.Range)) {
	for _, e := range c.executions() {
		r, _ := e.Runner()
		if r == nil {
			continue
		}
		for _, ch := range r.Plan().Chains {
			for _, vx := range ch.Vertices {
				if !vx.Keyed {
					continue
				}
				for i := range vx.Parallelism {
					f(e, r, vx, i, keygroup.RangeFor(i, vx.Parallelism, r.MaxParallelism()))
				}
			}
		}
	}
}

// waitNewRunner waits until e runs an attempt other than old with every
// task started, or ctx ends.
func waitNewRunner(ctx context.Context, e *actors.Execution, old *actors.Runner) error {
	for {
		r, changed := e.Runner()
		if r != nil && r != old {
			select {
			case <-r.Started():
				return nil
			case <-changed:
				continue
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		select {
		case <-changed:
		case <-e.Ended():
			// No attempt follows (the job finished, failed for good, or
			// was stopped or cancelled).
			if r, _ := e.Runner(); r == nil {
				return fmt.Errorf("%w: no attempt follows", actors.ErrJobEnded)
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
