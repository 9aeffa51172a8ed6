package state

import (
	"errors"
	"maps"
	"math"
	"strings"
	"testing"
	"time"

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

// A key type that holds a pointer, a Map's user key, the stream key or a
// broadcast state's key, is refused at registration with ErrDescriptor
// naming the state, the type and where the pointer is, on every backend.
// The memory backend finds a key by ==, which compares pointers, and
// bbolt by the encoding, which follows them: before, two Puts of pointers
// to "a" made 2 elements on the memory backend and 1 on bbolt; a
// broadcast state restored new pointers that no lookup found again.
func TestPointerKeysAreRefused(t *testing.T) {
	type sensor struct {
		Room string
		ID   *string
	}
	forEachBackend(t, func(t *testing.T, newTestBackend func() (Backend, *clockwork.FakeClock)) {
		b, _ := newTestBackend()
		var kc KeyContext[string]
		cases := []struct {
			name string
			err  error
			want string
		}{
			{"map user key", second(NewMap(b, &kc, MapDescriptor[*string, int]{Name: "m"})),
				`state "m": user key type *string holds a pointer (the type itself)`},
			{"map user key field", second(NewMap(b, &kc, MapDescriptor[sensor, int]{Name: "m2"})),
				`state "m2": user key type state.sensor holds a pointer (field ID)`},
			{"stream key", second(NewValue(b, &KeyContext[*int]{}, ValueDescriptor[int]{Name: "v"})),
				`state "v": key type *int holds a pointer (the type itself)`},
			{"stream key array", second(NewList(b, &KeyContext[[2]sensor]{}, ListDescriptor[int]{Name: "l"})),
				`state "l": key type [2]state.sensor holds a pointer (field [0].ID)`},
			{"broadcast state key", second(BroadcastState[*string, int](NewOperatorStore(), "rules")),
				`state "rules": key type *string holds a pointer (the type itself)`},
			{"map user key time", second(NewMap(b, &kc, MapDescriptor[time.Time, int]{Name: "t"})),
				`state "t": user key type time.Time holds a pointer (the type itself, a time.Time, whose location is a pointer: key by its UnixNano())`},
		}
		for _, c := range cases {
			if !errors.Is(c.err, ErrDescriptor) || !strings.Contains(c.err.Error(), c.want) {
				t.Errorf("%s: %v, want ErrDescriptor saying %q", c.name, c.err, c.want)
			}
		}
		// Keys by value are one element on every backend.
		m, err := NewMap(b, &kc, MapDescriptor[string, int]{Name: "m"})
		if err != nil {
			t.Fatal(err)
		}
		kc.Set("k", 12)
		a1, a2 := "a", "a"
		m.Put(a1, 1)
		m.Put(a2, 2)
		if v, ok := m.Get("a"); !ok || v != 2 || m.Len() != 1 {
			t.Fatalf("Get(a) = %d, %t, Len %d; want 2, one element", v, ok, m.Len())
		}
	})
}
