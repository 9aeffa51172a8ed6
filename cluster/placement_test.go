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
