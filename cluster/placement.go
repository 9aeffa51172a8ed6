package cluster

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	"github.com/cespare/xxhash/v2"
)

// Member is a node as placement sees it: its id and its capacity (a
// relative weight: a node of capacity 2 takes about twice the units of a
// node of capacity 1; 0 means 1).
type Member struct {
	ID       string
	Capacity int
	// Slots is the most units the node may run (0: no limit); a
	// rebalance that would exceed it is refused (PlanRebalance).
	Slots int `json:",omitempty"`
}

// Unit is one thing to place: the subtask of a keyed operator (and with it
// its key-group range), named stably, e.g. "window/3".
type Unit string

// Placement maps every unit to the id of the node that runs it.
type Placement map[Unit]string

// Place assigns each unit to one member by weighted rendezvous hashing with
// bounded load: every member ranks every unit by a score that depends only
// on the pair and the member's capacity, and a unit goes to its best-ranked
// member that still has room, where a member's room is its capacity's share
// of the units, rounded up. The result is a pure function of the member set
// and the units (their order does not matter). When one member joins or
// leaves, only about the share of units that member gains or had moves, and
// no member ends with more than its share rounded up.
//
// Place returns an error when there are units but no members.
func Place(members []Member, units []Unit) (Placement, error) {
	if len(units) == 0 {
		return Placement{}, nil
	}
	if len(members) == 0 {
		return nil, fmt.Errorf("%w: %d units, no members", ErrNoMembers, len(units))
	}
	ms := slices.Clone(members)
	slices.SortFunc(ms, func(a, b Member) int { return cmp.Compare(a.ID, b.ID) })
	us := slices.Clone(units)
	slices.Sort(us)
	us = slices.Compact(us)

	total := 0
	for i := range ms {
		if ms[i].Capacity <= 0 {
			ms[i].Capacity = 1
		}
		total += ms[i].Capacity
	}
	room := make([]int, len(ms))
	for i, m := range ms {
		room[i] = (len(us)*m.Capacity + total - 1) / total
	}

	// Every (unit, member) pair with its score, best first; each unit then
	// takes its best member with room. Going through all pairs in score
	// order, rather than unit by unit, makes the outcome independent of the
	// units' names' order and keeps each unit on its best member wherever
	// the caps allow.
	type pair struct {
		score float64
		unit  int
		node  int
	}
	pairs := make([]pair, 0, len(us)*len(ms))
	for u, unit := range us {
		for n, m := range ms {
			pairs = append(pairs, pair{score(unit, m), u, n})
		}
	}
	slices.SortFunc(pairs, func(a, b pair) int {
		if c := cmp.Compare(b.score, a.score); c != 0 {
			return c
		}
		if c := cmp.Compare(a.unit, b.unit); c != 0 {
			return c
		}
		return cmp.Compare(a.node, b.node)
	})
	p := make(Placement, len(us))
	for _, pr := range pairs {
		if _, done := p[us[pr.unit]]; done || room[pr.node] == 0 {
			continue
		}
		p[us[pr.unit]] = ms[pr.node].ID
		room[pr.node]--
	}
	return p, nil
}

// score is the weighted rendezvous score of a unit on a member:
// -capacity / ln(h), with h the pair's hash mapped into (0, 1).
func score(u Unit, m Member) float64 {
	var buf [8]byte
	d := xxhash.New()
	_, _ = d.WriteString(string(u))
	binary.LittleEndian.PutUint64(buf[:], uint64(len(u)))
	_, _ = d.Write(buf[:])
	_, _ = d.WriteString(m.ID)
	h := (float64(d.Sum64()>>11) + 0.5) / (1 << 53) // in (0, 1)
	return -float64(m.Capacity) / math.Log(h)
}

// Moved returns the units whose node differs between two placements,
// sorted, counting units present in only one of them.
func Moved(before, after Placement) []Unit {
	var out []Unit
	for u, n := range after {
		if before[u] != n {
			out = append(out, u)
		}
	}
	for u := range before {
		if _, ok := after[u]; !ok {
			out = append(out, u)
		}
	}
	slices.Sort(out)
	return out
}

// ByNode groups a placement by node: each node's units, sorted.
func (p Placement) ByNode() map[string][]Unit {
	out := make(map[string][]Unit)
	for u, n := range p {
		out[n] = append(out[n], u)
	}
	for _, us := range out {
		slices.Sort(us)
	}
	return out
}

// HasQuorum reports whether a node that sees seen members (itself
// included) of a cluster configured for size nodes sees a majority. A node
// runs tasks only while it does, so the two sides of a partition never both
// own a unit.
func HasQuorum(seen, size int) bool {
	return size > 0 && seen > size/2
}

// Leader returns the member with the lowest id among those a node sees, if
// it sees a majority of a cluster of size nodes; ok is false otherwise. The
// leader alone decides placements and their epochs.
func Leader(seen []string, size int) (leader string, ok bool) {
	if !HasQuorum(len(seen), size) {
		return "", false
	}
	return slices.Min(seen), true
}
