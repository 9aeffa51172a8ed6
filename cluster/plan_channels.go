package cluster

import (
	"fmt"

	"github.com/edgedio/edged/actors"
)

// PlanChannels returns the IDs of every channel of j's plan in epoch: one
// per pair of subtasks an edge between two tasks joins (edges inside a
// chain are not channels). A forward edge joins subtask i to subtask i;
// rebalance, key-by and broadcast edges join every subtask to every
// subtask. The IDs come in edge order, then by from and to subtask, so two
// nodes deriving them from the same plan get the same list.
func PlanChannels(j *actors.Job, epoch uint64) ([]ChannelID, error) {
	plan, err := actors.BuildPlan(j)
	if err != nil {
		return nil, fmt.Errorf("channels of job %q: %w", j.Name, err)
	}
	between := make(map[*actors.Edge]bool)
	for _, c := range plan.Chains {
		for _, e := range c.In {
			between[e] = true
		}
	}
	var ids []ChannelID
	for i, e := range j.Edges {
		if !between[e] {
			continue
		}
		for from := range e.From.Parallelism {
			for _, to := range Targets(e.Partition, from, e.To.Parallelism) {
				ids = append(ids, ChannelID{Job: j.Name, Epoch: epoch, Edge: i, From: from, To: to})
			}
		}
	}
	return ids, nil
}

// Targets returns the subtasks of a target with parallelism n that subtask
// from of the source sends to over an edge partitioned by p: for forward,
// from alone; for every other partitioner, all of them.
func Targets(p actors.Partition, from, n int) []int {
	if p == actors.Forward {
		return []int{from}
	}
	to := make([]int, n)
	for i := range to {
		to[i] = i
	}
	return to
}
