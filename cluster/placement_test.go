package cluster

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

func units(ops []string, par int) []Unit {
	var out []Unit
	for _, op := range ops {
		for i := 0; i < par; i++ {
			out = append(out, Unit(fmt.Sprintf("%s/%d", op, i)))
		}
	}
	return out
}

func members(n int) []Member {
	out := make([]Member, n)
	for i := range out {
		out[i] = Member{ID: fmt.Sprintf("node-%d", i+1), Capacity: 1}
	}
	return out
}

func mustPlace(t *testing.T, ms []Member, us []Unit) Placement {
	t.Helper()
	p, err := Place(ms, us)
	if err != nil {
		t.Fatal(err)
	}
	if len(p) != len(slices.Compact(slices.Sorted(slices.Values(us)))) {
		t.Fatalf("placed %d of %d units", len(p), len(us))
	}
	return p
}

// The same members and units give the same placement whatever their order.
func TestPlaceIsDeterministic(t *testing.T) {
	ms, us := members(5), units([]string{"window", "alerts"}, 16)
	want := mustPlace(t, ms, us)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 50; i++ {
		ms2, us2 := slices.Clone(ms), slices.Clone(us)
		rng.Shuffle(len(ms2), func(a, b int) { ms2[a], ms2[b] = ms2[b], ms2[a] })
		rng.Shuffle(len(us2), func(a, b int) { us2[a], us2[b] = us2[b], us2[a] })
		got := mustPlace(t, ms2, us2)
		if moved := Moved(want, got); len(moved) != 0 {
			t.Fatalf("shuffle %d moved %v", i, moved)
		}
	}
}

// No member gets more than its capacity's share of the units, rounded up,
// and so every member gets at least its share rounded down less the
// others' rounding.
func TestPlaceBalancesByCapacity(t *testing.T) {
	for _, tc := range []struct {
		caps  []int
		units int
	}{
		{[]int{1, 1, 1}, 8}, {[]int{1, 1, 1}, 128}, {[]int{2, 1, 1}, 64},
		{[]int{4, 2, 1, 1}, 100}, {[]int{1}, 7}, {[]int{1, 1, 1, 1, 1}, 3},
	} {
		ms := make([]Member, len(tc.caps))
		total := 0
		for i, c := range tc.caps {
			ms[i] = Member{ID: fmt.Sprintf("n%d", i), Capacity: c}
			total += c
		}
		p := mustPlace(t, ms, units([]string{"op"}, tc.units))
		by := p.ByNode()
		for _, m := range ms {
			share := float64(tc.units*m.Capacity) / float64(total)
			got := len(by[m.ID])
			if float64(got) > share+1 || float64(got) < share-float64(len(ms)) {
				t.Errorf("caps %v, %d units: %s (capacity %d) has %d, share %.1f", tc.caps, tc.units, m.ID, m.Capacity, got, share)
			}
		}
	}
}

// When a member leaves, only units it had move... up to the few that the
// survivors' new caps rebalance; when one joins, about its share moves.
// The measured fractions are logged; the bounds are 1.5 times the ideal.
func TestPlaceMovesLittleOnJoinAndLeave(t *testing.T) {
	us := units([]string{"window"}, 128)
	for _, n := range []int{2, 3, 4, 5} {
		before := mustPlace(t, members(n), us)
		after := mustPlace(t, members(n+1), us)
		moved := float64(len(Moved(before, after))) / float64(len(us))
		ideal := 1 / float64(n+1)
		t.Logf("join %d→%d: moved %.3f of units (ideal %.3f)", n, n+1, moved, ideal)
		if moved > 1.5*ideal {
			t.Errorf("join %d→%d moved %.3f, ideal %.3f", n, n+1, moved, ideal)
		}
		// The leaving member is the last one: the same sets in reverse.
		leave := float64(len(Moved(after, before))) / float64(len(us))
		if leave != moved {
			t.Errorf("leave moved %.3f, join %.3f", leave, moved)
		}
		// A member other than the newest leaves.
		ms := members(n + 1)
		gone := ms[0].ID
		left := mustPlace(t, ms[1:], us)
		var owned int
		for _, node := range after {
			if node == gone {
				owned++
			}
		}
		mv := Moved(after, left)
		t.Logf("leave of %s from %d: moved %d units, it owned %d", gone, n+1, len(mv), owned)
		if float64(len(mv)) > 1.5*float64(owned) {
			t.Errorf("leave of %s moved %d units, it owned %d", gone, len(mv), owned)
		}
		for _, u := range mv {
			if left[u] == gone {
				t.Fatalf("unit %s placed on the member that left", u)
			}
		}
	}
}

func TestPlaceWithoutMembers(t *testing.T) {
	if _, err := Place(nil, units([]string{"op"}, 2)); err == nil {
		t.Fatal("no error placing units on no members")
	}
	p, err := Place(nil, nil)
	if err != nil || len(p) != 0 {
		t.Fatalf("no units: %v %v", p, err)
	}
}

// The minority side of a partition has no quorum and no leader, so it owns
// nothing; the majority side's leader is its lowest id.
func TestQuorumAndLeader(t *testing.T) {
	for _, tc := range []struct {
		seen []string
		size int
		ok   bool
		lead string
	}{
		{[]string{"b", "a", "c"}, 3, true, "a"},
		{[]string{"c", "b"}, 3, true, "b"},
		{[]string{"a"}, 3, false, ""},
		{[]string{"a", "b"}, 4, false, ""},
		{[]string{"d", "b", "c"}, 4, true, "b"},
		{[]string{"a"}, 1, true, "a"},
		{nil, 0, false, ""},
	} {
		lead, ok := Leader(tc.seen, tc.size)
		if ok != tc.ok || lead != tc.lead {
			t.Errorf("Leader(%v, %d) = %q %v, want %q %v", tc.seen, tc.size, lead, ok, tc.lead, tc.ok)
		}
	}
	// The two sides of any split of a cluster never both have quorum.
	for size := 1; size <= 7; size++ {
		for a := 0; a <= size; a++ {
			if HasQuorum(a, size) && HasQuorum(size-a, size) {
				t.Fatalf("size %d split %d/%d: both sides have quorum", size, a, size-a)
			}
		}
	}
}

func BenchmarkPlace(b *testing.B) {
	us := units([]string{"window", "alerts"}, 128)
	ms := members(5)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Place(ms, us); err != nil {
			b.Fatal(err)
		}
	}
}

// A member of capacity 2 (the daemon's cluster.weight) gets about twice
// the units of a member of capacity 1, and a join or leave of a weighted
// member moves about the share it gains or had: weights keep rendezvous
// hashing's minimal movement.
func TestPlaceWeightedShareAndMovement(t *testing.T) {
	us := units([]string{"window", "alerts"}, 64) // 128 units
	weighted := func(caps ...int) []Member {
		ms := make([]Member, len(caps))
		for i, c := range caps {
			ms[i] = Member{ID: fmt.Sprintf("node-%d", i+1), Capacity: c}
		}
		return ms
	}
	ms := weighted(2, 1, 1)
	by := mustPlace(t, ms, us).ByNode()
	heavy, l1, l2 := len(by["node-1"]), len(by["node-2"]), len(by["node-3"])
	t.Logf("capacities 2, 1, 1: %d, %d, %d units", heavy, l1, l2)
	// Ideal 64, 32, 32; the cap is the share rounded up.
	if heavy > 64 || l1 > 32 || l2 > 32 || heavy < 56 || float64(heavy) < 1.75*float64(max(l1, l2)) {
		t.Fatalf("capacities 2, 1, 1 placed %d, %d, %d units, want about 64, 32, 32", heavy, l1, l2)
	}
	// Without the weight the same members split evenly: the weight is
	// what made the difference.
	if by := mustPlace(t, weighted(1, 1, 1), us).ByNode(); len(by["node-1"]) > 43 {
		t.Fatalf("capacities 1, 1, 1: node-1 has %d of 128 units", len(by["node-1"]))
	}
	for _, tc := range []struct {
		name          string
		before, after []Member
	}{
		{"a member of weight 2 joins 3 of weight 1", weighted(1, 1, 1), weighted(1, 1, 1, 2)},
		{"a member of weight 1 joins 2, 1, 1", weighted(2, 1, 1), weighted(2, 1, 1, 1)},
		{"the member of weight 2 leaves", weighted(1, 1, 1, 2), weighted(1, 1, 1)},
		{"a member of weight 1 leaves 2, 1, 1, 1", weighted(2, 1, 1, 1), weighted(2, 1, 1)},
	} {
		before, after := mustPlace(t, tc.before, us), mustPlace(t, tc.after, us)
		total := func(ms []Member) int {
			n := 0
			for _, m := range ms {
				n += m.Capacity
			}
			return n
		}
		// The changed member's share of the larger set is the least that
		// must move.
		big := tc.after
		if len(big) < len(tc.before) {
			big = tc.before
		}
		ideal := float64(big[len(big)-1].Capacity) / float64(total(big))
		moved := float64(len(Moved(before, after))) / float64(len(us))
		t.Logf("%s: moved %.3f of the units (ideal %.3f)", tc.name, moved, ideal)
		if moved > 1.5*ideal {
			t.Errorf("%s: moved %.3f of the units, ideal %.3f", tc.name, moved, ideal)
		}
		// Nothing moves between members that stay, beyond the caps'
		// rebalancing: every unit that moved came from or went to the
		// changed member, but for a few.
		changed := big[len(big)-1].ID
		var between int
		for _, u := range Moved(before, after) {
			if before[u] != changed && after[u] != changed {
				between++
			}
		}
		if float64(between) > 0.05*float64(len(us)) {
			t.Errorf("%s: %d units moved between members that stayed", tc.name, between)
		}
	}
}
