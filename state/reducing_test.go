package state

import (
	"testing"

	"github.com/jonboulle/clockwork"
)

func TestReducingScopedByKeyAndNamespace(t *testing.T) {
	forEachBackend(t, func(t *testing.T, newTestBackend func() (Backend, *clockwork.FakeClock)) {
		b, _ := newTestBackend()
		var kc KeyContext[string]
		r := must(NewReducing(b, &kc, ReducingDescriptor[int]{Name: "r", Reduce: func(a, b int) int { return max(a, b) }}))
		kc.Set("a", 10)
		if _, ok := r.Get(); ok {
			t.Fatal("fresh key has a value")
		}
		for _, v := range []int{3, 1, 7, 2} {
			r.Add(v)
		}
		kc.Set("b", 10)
		r.Add(-5)
		kc.Set("a", 10)
		if v, _ := r.Get(); v != 7 {
			t.Fatalf("a = %d, want 7", v)
		}
		kc.Set("b", 10)
		if v, _ := r.Get(); v != -5 {
			t.Fatalf("b = %d, want -5 (first value stored as is)", v)
		}
		r.Clear()
		if _, ok := r.Get(); ok {
			t.Fatal("Clear kept b")
		}

		// Reduce sees (accumulated, new) in order: concatenation shows it.
		nr := must(NewNamespacedReducing[string, int](b, &kc, ReducingDescriptor[string]{Name: "cat", Reduce: func(a, b string) string { return a + b }}))
		kc.Set("a", 10)
		nr.SetNamespace(1)
		nr.Add("x")
		nr.Add("y")
		nr.SetNamespace(2)
		nr.Add("z")
		nr.SetNamespace(3)
		nr.Add("w")
		nr.MergeNamespaces(1, 3, 2)
		nr.SetNamespace(1)
		if v, _ := nr.Get(); v != "xywz" {
			t.Fatalf("merged = %q, want xywz", v)
		}
		if Len(b, "cat") != 1 {
			t.Fatalf("sources kept: Len %d", Len(b, "cat"))
		}
	})
}
