package daemon

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/cluster"
	"github.com/edgedio/edged/keygroup"
)

var _ cluster.StatusProvider = (*clusterNode)(nil)

// Status returns the node's view of the cluster (cluster.StatusProvider).
func (c *clusterNode) Status() cluster.Status {
	v := c.live
	alive := v.alive()
	size := len(c.cfg.Nodes())
	master := c.leader()
	s := cluster.Status{Enabled: true, Node: c.cfg.Node, Leader: master}
	for _, id := range c.cfg.Nodes() {
		m := cluster.MemberStatus{ID: id, State: cluster.StateDead, Leader: id == master, Capacity: 1}
		if slices.Contains(alive, id) {
			m.State = cluster.StateAlive
		}
		if id == c.cfg.Node {
			m.Address, m.API = c.tr.Addr(), ""
			m.SeesMajority = cluster.HasQuorum(len(alive), size)
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
	v.mu.Unlock()
	return s
}

// Drain moves every subtask off node (cluster.StatusProvider): the job
// masters take a savepoint of every job and redeploy it from there
// without the node. The
// node keeps running and hosts nothing until a rebalance after it is
// undrained by a restart of the master; it can then be stopped.
func (c *clusterNode) Drain(ctx context.Context, node string) error {
	if !slices.Contains(c.cfg.Nodes(), node) {
		return fmt.Errorf("%w: %q is not a node of the cluster %v", cluster.ErrUnknownNode, node, c.cfg.Nodes())
	}
	if !c.master {
		return fmt.Errorf("%w: node %q does not run the job masters; ask node %q", cluster.ErrRefused, c.cfg.Node, c.cfg.Master())
	}
	if node == c.cfg.Node {
		return fmt.Errorf("%w: node %q runs the job masters and cannot be drained", cluster.ErrRefused, node)
	}
	v := c.live
	v.mu.Lock()
	if v.drained == nil {
		v.drained = map[string]bool{}
	}
	v.drained[node] = true
	v.mu.Unlock()
	return c.redeploy(ctx, cluster.TriggerDrain, "drain of node "+node)
}

// Rebalance redeploys every job on the live, undrained nodes
// (cluster.StatusProvider).
func (c *clusterNode) Rebalance(ctx context.Context) error {
	if !c.master {
		return fmt.Errorf("%w: node %q does not run the job masters; ask node %q", cluster.ErrRefused, c.cfg.Node, c.cfg.Master())
	}
	return c.redeploy(ctx, cluster.TriggerManual, "rebalance asked")
}

// redeploy takes a savepoint of every job, restarts each from it on the
// current placement, waits until each runs again, and records it. A
// failed savepoint aborts it with nothing moved.
func (c *clusterNode) redeploy(ctx context.Context, trigger cluster.Trigger, reason string) error {
	v := c.live
	before := c.placements()
	rec := cluster.Rebalance{At: time.Now(), Trigger: trigger, Outcome: cluster.RebalanceRunning, PauseMS: map[string]float64{}}
	execs := c.executions()
	// A savepoint first: the redeployment restores it (it is newer than
	// the latest checkpoint), so little is replayed. Without one nothing
	// moves.
	for _, e := range execs {
		path, err := e.TriggerSavepoint(ctx, "", false)
		if err != nil {
			rec.Outcome, rec.Error = cluster.RebalanceAborted, fmt.Sprintf("savepoint of job %q: %v", e.Name(), err)
			v.mu.Lock()
			v.nRebalances++
			v.rebalances = lastN(append(v.rebalances, rec), 10)
			v.mu.Unlock()
			c.log.Warn("cluster: redeployment aborted: the savepoint failed; nothing moved", "trigger", trigger, "job", e.Name(), "err", err)
			return fmt.Errorf("%w: savepoint of job %q before the redeployment: %w", cluster.ErrRefused, e.Name(), err)
		}
		c.log.Info("cluster: savepoint before the redeployment", "trigger", trigger, "job", e.Name(), "path", path, "took", time.Since(rec.At))
	}
	old := map[*actors.Execution]*actors.Runner{}
	for _, e := range execs {
		old[e], _ = e.Runner()
		e.Redeploy(reason)
	}
	var err error
	for _, e := range execs {
		if err = waitNewRunner(ctx, e, old[e]); err != nil {
			break
		}
	}
	after := c.placements()
	for k, n := range after {
		if b, ok := before[k]; ok && b.node != n.node {
			rec.MovedKeyGroups += n.groups
			rec.PauseMS[k] = msSince(rec.At)
		}
	}
	rec.Outcome = cluster.RebalanceDone
	if err != nil {
		rec.Outcome, rec.Error = cluster.RebalanceFailed, err.Error()
	}
	v.mu.Lock()
	v.nRebalances++
	v.rebalances = lastN(append(v.rebalances, rec), 10)
	v.mu.Unlock()
	c.log.Info("cluster: redeployed", "trigger", trigger, "moved_key_groups", rec.MovedKeyGroups, "took", time.Since(rec.At), "err", err)
	return err
}

// placedKeys is where a keyed subtask runs and how many key groups it has.
type placedKeys struct {
	node   string
	groups int
}

// placements returns the node of every keyed subtask of the running
// attempts, by "job/operator/subtask".
func (c *clusterNode) placements() map[string]placedKeys {
	out := map[string]placedKeys{}
	c.keyedSubtasks(func(e *actors.Execution, r *actors.Runner, vx *actors.Vertex, sub int, kg keygroup.Range) {
		out[fmt.Sprintf("%s/%s/%d", e.Name(), vx.Name, sub)] = placedKeys{r.NodeOf(vx.UID, sub), kg.End - kg.Start}
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
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
