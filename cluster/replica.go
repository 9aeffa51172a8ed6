package cluster

import (
	"cmp"
	"slices"
)

// ReplicaTargets returns the peers that hold the replicas of node's
// snapshot files: r of the other members (fewer if the cluster is
// smaller), chosen by rendezvous hashing on node's id, so that every node
// computes the same targets and a join or leave changes few of them.
func ReplicaTargets(node string, members []string, r int) []string {
	type scored struct {
		id    string
		score float64
	}
	var ss []scored
	for _, m := range slices.Compact(slices.Sorted(slices.Values(members))) {
		if m != node {
			ss = append(ss, scored{m, score(Unit("replicas-of/"+node), Member{ID: m, Capacity: 1})})
		}
	}
	slices.SortFunc(ss, func(a, b scored) int {
		if c := cmp.Compare(b.score, a.score); c != 0 {
			return c
		}
		return cmp.Compare(a.id, b.id)
	})
	out := make([]string, 0, min(r, len(ss)))
	for _, s := range ss[:min(r, len(ss))] {
		out = append(out, s.id)
	}
	return out
}
