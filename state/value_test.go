package state

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/jonboulle/clockwork"

	"github.com/edgedio/edged/keygroup"
)

func TestValueScopedByKey(t *testing.T) {
	forEachBackend(t, func(t *testing.T, newTestBackend func() (Backend, *clockwork.FakeClock)) {
		b, _ := newTestBackend()
		var kc KeyContext[string]
		v := must(NewValue(b, &kc, ValueDescriptor[int]{Name: "count"}))
		kc.Set("a", 10)
		if _, ok := v.Get(); ok {
			t.Fatal("fresh key has a value")
		}
		v.Update(1)
		kc.Set("b", 19)
		v.Update(2)
		kc.Set("a", 10)
		if x, ok := v.Get(); !ok || x != 1 {
			t.Fatalf("a = %d, %v", x, ok)
		}
		// The same key in another key group is another entry.
		kc.Set("a", 11)
		if _, ok := v.Get(); ok {
			t.Fatal("key group not part of the scope")
		}
		if n := Len(b, "count"); n != 2 {
			t.Fatalf("Len = %d, want 2", n)
		}
		kc.Set("b", 19)
		v.Clear()
		if _, ok := v.Get(); ok || Len(b, "count") != 1 {
			t.Fatal("Clear kept the value")
		}
		// A second handle on the same name sees the same entries.
		w := must(NewValue(b, &kc, ValueDescriptor[int]{Name: "count"}))
		kc.Set("a", 10)
		if x, _ := w.Get(); x != 1 {
			t.Fatalf("second handle sees %d", x)
		}
	})
}

func TestValueScopedByNamespace(t *testing.T) {
	forEachBackend(t, func(t *testing.T, newTestBackend func() (Backend, *clockwork.FakeClock)) {
		b, _ := newTestBackend()
		var kc KeyContext[string]
		v := must(NewNamespacedValue[string, window](b, &kc, ValueDescriptor[string]{Name: "last"}))
		w1, w2 := window{0, 10}, window{10, 20}
		kc.Set("a", 12)
		v.SetNamespace(w1)
		v.Update("a1")
		v.SetNamespace(w2)
		if _, ok := v.Get(); ok {
			t.Fatal("namespace not part of the scope")
		}
		v.Update("a2")
		kc.Set("b", 12)
		v.SetNamespace(w1)
		v.Update("b1")
		if n := Len(b, "last"); n != 3 {
			t.Fatalf("Len = %d, want 3 (key, namespace) entries", n)
		}
		// Clear after SetNamespace drops that namespace of the current key only.
		kc.Set("a", 12)
		v.Clear()
		if _, ok := v.Get(); ok {
			t.Fatal("Clear kept a's w1")
		}
		v.SetNamespace(w2)
		if x, _ := v.Get(); x != "a2" {
			t.Fatalf("a/w2 = %q", x)
		}
		kc.Set("b", 12)
		v.SetNamespace(w1)
		if x, _ := v.Get(); x != "b1" {
			t.Fatalf("b/w1 = %q", x)
		}
	})
}

// The cached entry must not outlive changes made through another handle
// or entries moving in memory.
func TestValueCacheInvalidation(t *testing.T) {
	forEachBackend(t, func(t *testing.T, newTestBackend func() (Backend, *clockwork.FakeClock)) {
		b, _ := newTestBackend()
		var kc KeyContext[int]
		v := must(NewValue(b, &kc, ValueDescriptor[int]{Name: "v"}))
		w := must(NewValue(b, &kc, ValueDescriptor[int]{Name: "v"}))
		kc.Set(1, 10)
		v.Update(1)
		if x, _ := v.Get(); x != 1 {
			t.Fatal(x)
		}
		w.Clear()
		if _, ok := v.Get(); ok {
			t.Fatal("v's cache outlived w.Clear")
		}
		v.Update(2)
		// Insert many keys through w, through another KeyContext, so the slot
		// slice of group 10 is reallocated while v's cache still holds key 1.
		var kc2 KeyContext[int]
		w2 := must(NewValue(b, &kc2, ValueDescriptor[int]{Name: "v"}))
		for k := 2; k < 1000; k++ {
			kc2.Set(k, 10)
			w2.Update(k * 10)
		}
		v.Update(3)
		kc2.Set(1, 10)
		if x, _ := w2.Get(); x != 3 {
			t.Fatalf("key 1 = %d after growth, want 3", x)
		}
		// Removing key 2 moves the last entry into its slot.
		kc2.Set(2, 10)
		w2.Clear()
		kc2.Set(999, 10)
		w2.Update(-1)
		if x, _ := v.Get(); x != 3 {
			t.Fatalf("key 1 = %d after a removal", x)
		}
		kc.Set(999, 10)
		if x, _ := v.Get(); x != -1 {
			t.Fatalf("key 999 = %d, want -1", x)
		}
	})
}

func TestKeyedStateErrors(t *testing.T) {
	forEachBackend(t, func(t *testing.T, newTestBackend func() (Backend, *clockwork.FakeClock)) {
		b, _ := newTestBackend()
		var kc KeyContext[string]
		must(NewValue(b, &kc, ValueDescriptor[int]{Name: "x"}))
		cases := []struct {
			name string
			err  error
			want error
		}{
			{"value of another type", second(NewValue(b, &kc, ValueDescriptor[string]{Name: "x"})), ErrStateType},
			{"another kind, same type", second(NewReducing(b, &kc, ReducingDescriptor[int]{Name: "x", Reduce: sum})), ErrStateType},
			{"list", second(NewList(b, &kc, ListDescriptor[int]{Name: "x"})), ErrStateType},
			{"map", second(NewMap(b, &kc, MapDescriptor[string, int]{Name: "x"})), ErrStateType},
			{"another key type", second(NewValue(b, &KeyContext[int]{}, ValueDescriptor[int]{Name: "x"})), ErrStateType},
			{"with a namespace", second(NewNamespacedValue[string, window](b, &kc, ValueDescriptor[int]{Name: "x"})), ErrStateType},
			{"another TTL", second(NewValue(b, &kc, ValueDescriptor[int]{Name: "x", TTL: TTLConfig{TTL: 1}})), ErrStateType},
			{"nil backend", second(NewValue(nil, &kc, ValueDescriptor[int]{Name: "y"})), ErrNoBackend},
			{"typed nil backend", second(NewList(Backend((*MemoryBackend)(nil)), &kc, ListDescriptor[int]{Name: "y"})), ErrNoBackend},
			{"empty name", second(NewValue(b, &kc, ValueDescriptor[int]{})), ErrDescriptor},
			{"negative TTL", second(NewValue(b, &kc, ValueDescriptor[int]{Name: "y", TTL: TTLConfig{TTL: -1}})), ErrDescriptor},
			{"no KeyContext", second(NewValue[string](b, nil, ValueDescriptor[int]{Name: "y"})), ErrNoKeyContext},
			{"no Reduce", second(NewReducing(b, &kc, ReducingDescriptor[int]{Name: "y"})), ErrDescriptor},
			{"no Create", second(NewAggregating(b, &kc, AggregatingDescriptor[int, int, int]{Name: "y", Add: add, Result: id})), ErrDescriptor},
		}
		for _, c := range cases {
			if !errors.Is(c.err, c.want) {
				t.Errorf("%s: got %v, want %v", c.name, c.err, c.want)
			}
		}
		if Len(b, "y") != 0 || Len(nil, "x") != 0 {
			t.Error("a failed registration left state behind")
		}
	})
}

func second[T any](_ T, err error) error { return err }

func sum(a, b int) int    { return a + b }
func add(in, acc int) int { return in + acc }
func id(x int) int        { return x }
func zero() int           { return 0 }
func keyOf(i int) string  { return fmt.Sprintf("key-%d", i) }
func groupOf(i int) int   { return testGroups.Start + i%testGroups.Len() }
func allKeys(n int) []string {
	ks := make([]string, n)
	for i := range ks {
		ks[i] = keyOf(i)
	}
	return ks
}

type point struct {
	X, Y float64
	N    int64
}

// Get then Update of an existing key allocates nothing, for a scalar and a
// struct value, with and without TTL.
func TestValueGetUpdateAllocs(t *testing.T) {
	b, _ := newTestBackend()
	var kc KeyContext[string]
	iv := must(NewValue(b, &kc, ValueDescriptor[int]{Name: "int"}))
	pv := must(NewValue(b, &kc, ValueDescriptor[point]{Name: "point"}))
	tv := must(NewValue(b, &kc, ValueDescriptor[int64]{Name: "ttl", TTL: TTLConfig{TTL: 1 << 40, UpdateOnRead: true}}))
	keys := allKeys(100)
	for i, k := range keys {
		kc.Set(k, groupOf(i))
		iv.Update(i)
		pv.Update(point{N: int64(i)})
		tv.Update(int64(i))
	}
	i := 0
	allocs := testing.AllocsPerRun(1000, func() {
		kc.Set(keys[i], groupOf(i))
		x, _ := iv.Get()
		iv.Update(x + 1)
		p, _ := pv.Get()
		p.X++
		pv.Update(p)
		y, _ := tv.Get()
		tv.Update(y + 1)
		i = (i + 1) % len(keys)
	})
	if allocs != 0 {
		t.Fatalf("Get+Update allocates %v per record, want 0", allocs)
	}
}

// BenchmarkValueGetUpdate measures a keyed Value's Get then Update per
// record over 1000 keys, on the memory backend, on the bolt backend, and
// on a plain Go map as a baseline; the backends report their cost
// relative to the memory backend (x-memory) and to the map (x-map),
// measured in the same run. The bolt backend runs with its default batch
// (4096 buffered writes: 1000 hot keys never leave the write buffer, so
// this measures the buffer) and with a batch of 64 (a commit every 64
// records, and most reads from the file).
func BenchmarkValueGetUpdate(b *testing.B) {
	const n = 1000
	keys := allKeys(n)
	groups := make([]int, n)
	for i, k := range keys {
		groups[i] = keygroup.Of(keygroup.HashString(k), 128)
	}
	all := keygroup.Range{Start: 0, End: 128}
	nsPerOp := func(b *testing.B) float64 { return float64(b.Elapsed().Nanoseconds()) / float64(b.N) }
	var mapNs, memNs float64
	run := func(b *testing.B, be Backend) {
		var kc KeyContext[string]
		v := must(NewValue(be, &kc, ValueDescriptor[int]{Name: "count"}))
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			kc.Set(keys[i], groups[i])
			x, _ := v.Get()
			v.Update(x + 1)
			if i++; i == n {
				i = 0
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "records/s")
	}
	b.Run("impl=map/keys=1000", func(b *testing.B) {
		m := make(map[string]int)
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			x := m[keys[i]]
			m[keys[i]] = x + 1
			if i++; i == n {
				i = 0
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "records/s")
		mapNs = nsPerOp(b)
	})
	b.Run("impl=memory/keys=1000", func(b *testing.B) {
		run(b, NewMemoryBackend(all, nil))
		memNs = nsPerOp(b)
		if mapNs > 0 {
			b.ReportMetric(memNs/mapNs, "x-map")
		}
	})
	for _, batch := range []int{0, 64} {
		b.Run(fmt.Sprintf("impl=bolt/batch=%d/keys=1000", batch), func(b *testing.B) {
			run(b, newTestBolt(b, all, nil, batch))
			if memNs > 0 {
				b.ReportMetric(nsPerOp(b)/memNs, "x-memory")
			}
		})
	}
}

// BenchmarkValueGetUpdateLarge is BenchmarkValueGetUpdate over 100,000
// keys, in random order, with the bolt backend's default batch: most
// reads come from the file and a commit follows every 4096 records.
func BenchmarkValueGetUpdateLarge(b *testing.B) {
	const n = 100_000
	keys := allKeys(n)
	groups := make([]int, n)
	for i, k := range keys {
		groups[i] = keygroup.Of(keygroup.HashString(k), 128)
	}
	order := rand.New(rand.NewPCG(1, 2)).Perm(n)
	all := keygroup.Range{Start: 0, End: 128}
	var memNs float64
	for _, impl := range []string{"memory", "bolt"} {
		b.Run(fmt.Sprintf("impl=%s/keys=%d", impl, n), func(b *testing.B) {
			var be Backend = NewMemoryBackend(all, nil)
			if impl == "bolt" {
				be = newTestBolt(b, all, nil, 0)
			}
			var kc KeyContext[string]
			v := must(NewValue(be, &kc, ValueDescriptor[int]{Name: "count"}))
			for i, k := range keys {
				kc.Set(k, groups[i])
				v.Update(i)
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				j := order[i]
				kc.Set(keys[j], groups[j])
				x, _ := v.Get()
				v.Update(x + 1)
				if i++; i == n {
					i = 0
				}
			}
			ns := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "records/s")
			if impl == "memory" {
				memNs = ns
			} else if memNs > 0 {
				b.ReportMetric(ns/memNs, "x-memory")
			}
		})
	}
}
