package state

import (
	"strings"
	"testing"

	"github.com/jonboulle/clockwork"
)

// avg is an accumulator of a mean.
type avg struct {
	Sum   float64
	Count int
}

func avgDescriptor(name string, merge bool) AggregatingDescriptor[float64, avg, float64] {
	d := AggregatingDescriptor[float64, avg, float64]{
		Name:   name,
		Create: func() avg { return avg{} },
		Add:    func(in float64, a avg) avg { return avg{a.Sum + in, a.Count + 1} },
		Result: func(a avg) float64 { return a.Sum / float64(a.Count) },
	}
	if merge {
		d.Merge = func(a, b avg) avg { return avg{a.Sum + b.Sum, a.Count + b.Count} }
	}
	return d
}

func TestAggregatingScopedByKeyAndNamespace(t *testing.T) {
	forEachBackend(t, func(t *testing.T, newTestBackend func() (Backend, *clockwork.FakeClock)) {
		b, _ := newTestBackend()
		var kc KeyContext[string]
		a := must(NewAggregating(b, &kc, avgDescriptor("avg", false)))
		kc.Set("a", 10)
		if _, ok := a.Get(); ok {
			t.Fatal("fresh key has a result")
		}
		a.Add(1)
		a.Add(2)
		kc.Set("b", 13)
		a.Add(10)
		kc.Set("a", 10)
		if v, _ := a.Get(); v != 1.5 {
			t.Fatalf("a = %v", v)
		}
		a.Clear()
		a.Add(4)
		if v, _ := a.Get(); v != 4 {
			t.Fatalf("a after Clear+Add = %v: Create not called afresh", v)
		}

		na := must(NewNamespacedAggregating[string, int](b, &kc, avgDescriptor("navg", true)))
		kc.Set("a", 10)
		for ns, ins := range map[int][]float64{1: {1, 2}, 2: {3}, 3: {10, 20}} {
			na.SetNamespace(ns)
			for _, in := range ins {
				na.Add(in)
			}
		}
		na.SetNamespace(2)
		na.MergeNamespaces(1, 2, 3)
		if _, ok := na.Get(); ok {
			t.Fatal("source 2 kept its accumulator")
		}
		na.SetNamespace(1)
		if v, _ := na.Get(); v != 36.0/5 {
			t.Fatalf("merged mean = %v, want 7.2", v)
		}
	})
}

func TestAggregatingMergeWithoutMergePanics(t *testing.T) {
	forEachBackend(t, func(t *testing.T, newTestBackend func() (Backend, *clockwork.FakeClock)) {
		b, _ := newTestBackend()
		var kc KeyContext[string]
		na := must(NewNamespacedAggregating[string, int](b, &kc, avgDescriptor("avg", false)))
		kc.Set("a", 10)
		defer func() {
			r := recover()
			if s, ok := r.(string); !ok || !strings.Contains(s, "no Merge") {
				t.Fatalf("recovered %v", r)
			}
		}()
		na.MergeNamespaces(1, 2)
	})
}

// User functions may use the same state: Add's result must land in the
// right entry even when the call moved entries in memory.
func TestAggregatingAddTouchingState(t *testing.T) {
	forEachBackend(t, func(t *testing.T, newTestBackend func() (Backend, *clockwork.FakeClock)) {
		b, _ := newTestBackend()
		var kc, other KeyContext[int]
		var same Aggregating[int, int]
		d := AggregatingDescriptor[int, int, int]{
			Name: "agg", Create: zero, Result: id,
			Add: func(in, acc int) int {
				if in > 0 {
					// Grow key group 10 through another handle on "agg".
					for k := range 100 {
						other.Set(1000+k+100*in, 10)
						same.Add(-1)
					}
				}
				return acc + in
			},
		}
		a := must(NewAggregating(b, &kc, d))
		same = must(NewAggregating(b, &other, d))
		kc.Set(1, 10)
		a.Add(1)
		a.Add(2)
		if v, _ := a.Get(); v != 3 {
			t.Fatalf("key 1 = %d, want 3", v)
		}
		if n := Len(b, "agg"); n != 201 {
			t.Fatalf("Len = %d, want 201", n)
		}
	})
}
