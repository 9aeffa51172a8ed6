package daemon

import (
	"maps"
	"slices"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/cluster"
)

// placedRuns are the runs (cluster.Meta.Boot) of the live members when
// a job's tasks were placed: on the job master's node, as of its latest
// placement; on a worker, as its latest deployment of the job carried
// them (actors.Deployment.Boots).
type placedRuns struct {
	epoch uint64
	boots map[string]string
}

// recordPlaced records boots as the members' runs at job's placement in
// epoch (a worker's deployment), unless a newer deployment of the job
// recorded its own; master records those of the master's own placement,
// whatever was recorded before.
func (c *clusterNode) recordPlaced(job string, epoch uint64, boots map[string]string, master bool) {
	c.placedMu.Lock()
	defer c.placedMu.Unlock()
	if p, ok := c.placed[job]; ok && !master && p.epoch > epoch {
		return
	}
	if master {
		epoch = 0
	}
	if c.placed == nil {
		c.placed = map[string]placedRuns{}
	}
	c.placed[job] = placedRuns{epoch: epoch, boots: boots}
}

// placedBoots returns a copy of the runs recorded for job (nil if none).
func (c *clusterNode) placedBoots(job string) map[string]string {
	c.placedMu.Lock()
	defer c.placedMu.Unlock()
	return maps.Clone(c.placed[job].boots)
}

// pinnedAway marks, in placedRuns.boots, a node whose source split the
// job's placement pins on another node (cluster.placement): the split
// never goes home, so it never waits for the node.
const pinnedAway = "*"

// splitsPinnedAway returns the nodes of ids whose source split (subtask
// i of a source with one subtask per node) placement puts elsewhere.
func splitsPinnedAway(job *actors.Job, ids []string, placement map[actors.TaskKey]string) []string {
	var out []string
	for _, v := range job.Vertices {
		if v.NewSource == nil || v.Parallelism != len(ids) {
			continue
		}
		for i, id := range ids {
			if placement[actors.TaskKey{UID: v.UID, Subtask: i}] != id && !slices.Contains(out, id) {
				out = append(out, id)
			}
		}
	}
	return out
}

// withPinnedAway returns boots with every node of pinned marked
// pinnedAway.
func withPinnedAway(boots map[string]string, pinned []string) map[string]string {
	if boots == nil || len(pinned) == 0 {
		return boots
	}
	for _, id := range pinned {
		boots[id] = pinnedAway
	}
	return boots
}

// liveBoots returns the run of every live member, nil without gossip.
func (v *liveView) liveBoots() map[string]string {
	mem := v.membership()
	if mem == nil {
		return nil
	}
	out := map[string]string{}
	for _, m := range mem.Members() {
		out[m.ID] = m.Boot
	}
	return out
}

// splitHome reports whether node, the home of a source split of job
// that runs away from it on this node, is back and about to get the
// split (pipeline.Inputs.SplitHome): a live member, not leaving, running
// this node's pipelines, in a run the job's placement did not see — it
// was gone then (a failover, or a start that placed the job before the
// node joined), so the join's handover gives it its split back. A node
// the placement saw alive and left out (drained), or whose split
// cluster.placement pins on another node, is not back: its split stays
// idle, as it does without gossip or a recorded placement, and in a job
// without checkpoints.
func (c *clusterNode) splitHome(job, node string) bool {
	v := c.live
	if v == nil || !c.checkpointed(job) {
		return false
	}
	mem := v.membership()
	if mem == nil {
		return false
	}
	c.placedMu.Lock()
	p, ok := c.placed[job]
	c.placedMu.Unlock()
	if !ok {
		return false
	}
	for _, m := range mem.Members() {
		if m.ID == node {
			return backSincePlaced(m, p.boots, v.differs)
		}
	}
	return false
}

// checkpointed reports whether job takes checkpoints (its pipeline has
// a checkpoint.dir): only such a job's join hands a split back (the
// handover and the redeployment both start at a savepoint), so only its
// splits wait for their nodes.
func (c *clusterNode) checkpointed(job string) bool {
	if c.rep == nil {
		return false
	}
	_, ok := c.rep.jobs[job]
	return ok
}

// backSincePlaced reports whether live member m, the node of a source
// split placed away from it, is back since the placement that recorded
// boots: not leaving, running the same pipelines (differs false), its
// split not pinned away, and in another run than the placement saw.
func backSincePlaced(m cluster.Meta, boots map[string]string, differs func(cluster.Meta) bool) bool {
	if boots == nil || m.Leaving || differs(m) || boots[m.ID] == pinnedAway {
		return false
	}
	return m.Boot != boots[m.ID]
}
