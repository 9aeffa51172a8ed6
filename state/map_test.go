package state

import (
	"errors"
	"maps"
	"math"
	"testing"

	"github.com/jonboulle/clockwork"
)

func TestMapScopedByKey(t *testing.T) {
	forEachBackend(t, func(t *testing.T, newTestBackend func() (Backend, *clockwork.FakeClock)) {
		b, _ := newTestBackend()
		var kc KeyContext[string]
		m := must(NewMap(b, &kc, MapDescriptor[string, int]{Name: "m"}))
		kc.Set("a", 10)
		if _, ok := m.Get("x"); ok || m.Len() != 0 || m.Contains("x") {
			t.Fatal("fresh key has elements")
		}
		m.Remove("x") // no map: nothing to do
		m.Put("x", 1)
		m.Put("y", 2)
		m.Put("x", 3)
		kc.Set("b", 10)
		m.Put("x", 10)
		kc.Set("a", 10)
		if v, ok := m.Get("x"); !ok || v != 3 {
			t.Fatalf("a.x = %d, %v", v, ok)
		}
		if !m.Contains("y") || m.Contains("z") || m.Len() != 2 {
			t.Fatal("Contains/Len wrong")
		}
		if got := maps.Collect(m.All()); !maps.Equal(got, map[string]int{"x": 3, "y": 2}) {
			t.Fatalf("All = %v", got)
		}
		// Removing during All is allowed.
		for k := range m.All() {
			m.Remove(k)
		}
		if m.Len() != 0 || Len(b, "m") != 1 {
			t.Fatalf("Len %d, entries %d: an emptied map must drop its entry", m.Len(), Len(b, "m"))
		}
		kc.Set("b", 10)
		if v, _ := m.Get("x"); v != 10 {
			t.Fatalf("b.x = %d", v)
		}
		m.Clear()
		if m.Len() != 0 || Len(b, "m") != 0 {
			t.Fatal("Clear kept b")
		}
	})
}

func TestMapScopedByNamespace(t *testing.T) {
	forEachBackend(t, func(t *testing.T, newTestBackend func() (Backend, *clockwork.FakeClock)) {
		b, _ := newTestBackend()
		var kc KeyContext[int]
		m := must(NewNamespacedMap[int, string](b, &kc, MapDescriptor[int, bool]{Name: "m"}))
		kc.Set(7, 15)
		m.SetNamespace("w1")
		m.Put(1, true)
		m.SetNamespace("w2")
		if m.Len() != 0 {
			t.Fatal("namespace not part of the scope")
		}
		m.Put(2, true)
		m.Clear()
		m.SetNamespace("w1")
		if !m.Contains(1) || m.Len() != 1 {
			t.Fatal("Clear of w2 touched w1")
		}
	})
}

// A Put with a user key not equal to itself (a float NaN) fails with
// ErrNaNUserKey on every backend, and leaves the map as it was. Before,
// the memory backend added an element that Get, Contains and Remove never
// found again at every such Put (Len 1, 2, 3), while bbolt, which finds a
// user key by its encoding, kept one: the backends differed.
func TestMapNaNUserKeyIsRefused(t *testing.T) {
	forEachBackend(t, func(t *testing.T, newTestBackend func() (Backend, *clockwork.FakeClock)) {
		b, _ := newTestBackend()
		var kc KeyContext[string]
		m := must(NewMap(b, &kc, MapDescriptor[float64, int]{Name: "m"}))
		kc.Set("a", 10)
		m.Put(1, 1)
		for i := range 3 {
			func() {
				defer func() {
					err, _ := recover().(error)
					if !errors.Is(err, ErrNaNUserKey) {
						t.Fatalf("Put %d of NaN: panic %v, want ErrNaNUserKey", i, err)
					}
				}()
				m.Put(math.NaN(), i)
			}()
		}
		if m.Len() != 1 || m.Contains(math.NaN()) {
			t.Fatalf("after the refused Puts: Len %d, want only the element of 1", m.Len())
		}
		if v, ok := m.Get(1); !ok || v != 1 {
			t.Fatalf("Get(1) = %d, %v", v, ok)
		}
	})
}

// -0 and +0 are one user key of a Map (-0 == +0), on both backends. Before,
// the bolt backend, which finds a user key by its encoding, kept two
// elements where the memory backend kept one.
func TestMapNegativeZeroUserKeyIsZero(t *testing.T) {
	negz := math.Copysign(0, -1)
	forEachBackend(t, func(t *testing.T, newTestBackend func() (Backend, *clockwork.FakeClock)) {
		b, _ := newTestBackend()
		var kc KeyContext[string]
		m := must(NewMap(b, &kc, MapDescriptor[[2]float64, int]{Name: "m"}))
		kc.Set("a", 10)
		m.Put([2]float64{0, 1}, 1)
		m.Put([2]float64{negz, 1}, 2)
		if m.Len() != 1 {
			t.Fatalf("Len = %d after Puts of -0 and +0, want 1", m.Len())
		}
		if v, ok := m.Get([2]float64{0, 1}); !ok || v != 2 {
			t.Fatalf("Get(+0) = %d, %v, want 2", v, ok)
		}
		if !m.Contains([2]float64{negz, 1}) {
			t.Fatal("Contains(-0) = false")
		}
		for uk := range m.All() {
			if math.Signbit(uk[0]) {
				t.Fatalf("All gives user key %v, want +0", uk)
			}
		}
		m.Remove([2]float64{negz, 1})
		if m.Len() != 0 {
			t.Fatalf("Len = %d after Remove(-0), want 0", m.Len())
		}
	})
}
