package state

import (
	"slices"
	"testing"

	"github.com/jonboulle/clockwork"
)

func TestListScopedByKey(t *testing.T) {
	forEachBackend(t, func(t *testing.T, newTestBackend func() (Backend, *clockwork.FakeClock)) {
		b, _ := newTestBackend()
		var kc KeyContext[string]
		l := must(NewList(b, &kc, ListDescriptor[int]{Name: "l"}))
		kc.Set("a", 10)
		if got := l.Get(); got != nil {
			t.Fatalf("fresh key has %v", got)
		}
		l.Add(1)
		l.AddAll([]int{2, 3})
		l.AddAll(nil)
		kc.Set("b", 11)
		l.Add(9)
		kc.Set("a", 10)
		if got := l.Get(); !slices.Equal(got, []int{1, 2, 3}) {
			t.Fatalf("a = %v", got)
		}
		// Get returns a copy.
		got := l.Get()
		got[0] = 100
		if l.Get()[0] != 1 {
			t.Fatal("Get returned the stored slice")
		}
		// All iterates the list as it was when the iteration started.
		var seen []int
		for v := range l.All() {
			seen = append(seen, v)
			l.Add(v * 10)
			if len(seen) == 2 {
				l.Update([]int{7})
			}
		}
		if !slices.Equal(seen, []int{1, 2, 3}) {
			t.Fatalf("All yielded %v", seen)
		}
		if got := l.Get(); !slices.Equal(got, []int{7, 30}) {
			t.Fatalf("after writes during All: %v", got)
		}
		// Update copies its argument; an empty Update clears.
		in := []int{4, 5}
		l.Update(in)
		in[0] = 0
		if got := l.Get(); !slices.Equal(got, []int{4, 5}) {
			t.Fatalf("after Update: %v", got)
		}
		l.Update(nil)
		if got := l.Get(); got != nil || Len(b, "l") != 1 {
			t.Fatalf("empty Update left %v, Len %d", got, Len(b, "l"))
		}
		kc.Set("b", 11)
		if got := l.Get(); !slices.Equal(got, []int{9}) {
			t.Fatalf("b = %v", got)
		}
		l.Clear()
		if Len(b, "l") != 0 {
			t.Fatal("Clear kept b")
		}
		// Early stop of All.
		l.AddAll([]int{1, 2, 3})
		for v := range l.All() {
			if v == 2 {
				break
			}
		}
	})
}

func TestListNamespacesAndMerge(t *testing.T) {
	forEachBackend(t, func(t *testing.T, newTestBackend func() (Backend, *clockwork.FakeClock)) {
		b, _ := newTestBackend()
		var kc KeyContext[string]
		l := must(NewNamespacedList[string, int](b, &kc, ListDescriptor[string]{Name: "l"}))
		kc.Set("a", 10)
		for ns, vs := range map[int][]string{1: {"a1"}, 2: {"a2", "a2'"}, 3: {"a3"}, 4: {"a4"}} {
			l.SetNamespace(ns)
			l.AddAll(vs)
		}
		kc.Set("b", 10)
		l.SetNamespace(2)
		l.Add("b2")

		kc.Set("a", 10)
		l.SetNamespace(4)
		l.MergeNamespaces(1, 3, 2, 1, 99) // 1 is the target itself, 99 is absent
		if got := l.Get(); !slices.Equal(got, []string{"a4"}) {
			t.Fatalf("the handle left its namespace: %v", got)
		}
		l.SetNamespace(1)
		if got := l.Get(); !slices.Equal(got, []string{"a1", "a3", "a2", "a2'"}) {
			t.Fatalf("merged = %v", got)
		}
		for _, ns := range []int{2, 3} {
			l.SetNamespace(ns)
			if got := l.Get(); got != nil {
				t.Fatalf("source %d kept %v", ns, got)
			}
		}
		// Merging into an absent target moves the source.
		l.MergeNamespaces(5, 4)
		l.SetNamespace(5)
		if got := l.Get(); !slices.Equal(got, []string{"a4"}) {
			t.Fatalf("ns 5 = %v", got)
		}
		// Other keys are untouched.
		kc.Set("b", 10)
		l.SetNamespace(2)
		if got := l.Get(); !slices.Equal(got, []string{"b2"}) {
			t.Fatalf("b/2 = %v", got)
		}
		if n := Len(b, "l"); n != 3 {
			t.Fatalf("Len = %d, want 3 (a/1, a/5, b/2)", n)
		}
	})
}
