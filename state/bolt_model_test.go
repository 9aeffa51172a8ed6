package state

import (
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
)

var modelSeed = flag.Uint64("model.seed", 1, "seed of TestBoltAgainstMemory; 0 picks one from the time")

// modelStates is a set of handles on one backend: every kind, namespaced,
// with and without TTL.
type modelStates struct {
	b    Backend
	kc   KeyContext[int]
	v    NamespacedValue[int, int]
	tv   NamespacedValue[int, int]
	l    NamespacedList[int, int]
	tl   NamespacedList[int, int]
	m    NamespacedMap[int, int, int]
	tm   NamespacedMap[int, int, int]
	r    NamespacedReducing[int, int]
	tr   NamespacedReducing[int, int]
	a    NamespacedAggregating[int, float64, float64]
	ta   NamespacedAggregating[int, float64, float64]
	name []string
}

func newModelStates(b Backend) *modelStates {
	s := &modelStates{b: b}
	ttl := TTLConfig{TTL: 10 * time.Second}
	rttl := TTLConfig{TTL: 10 * time.Second, UpdateOnRead: true}
	s.v = must(NewNamespacedValue[int, int](b, &s.kc, ValueDescriptor[int]{Name: "v"}))
	s.tv = must(NewNamespacedValue[int, int](b, &s.kc, ValueDescriptor[int]{Name: "tv", TTL: rttl}))
	s.l = must(NewNamespacedList[int, int](b, &s.kc, ListDescriptor[int]{Name: "l"}))
	s.tl = must(NewNamespacedList[int, int](b, &s.kc, ListDescriptor[int]{Name: "tl", TTL: ttl}))
	s.m = must(NewNamespacedMap[int, int](b, &s.kc, MapDescriptor[int, int]{Name: "m"}))
	s.tm = must(NewNamespacedMap[int, int](b, &s.kc, MapDescriptor[int, int]{Name: "tm", TTL: rttl}))
	s.r = must(NewNamespacedReducing[int, int](b, &s.kc, ReducingDescriptor[int]{Name: "r", Reduce: sum}))
	s.tr = must(NewNamespacedReducing[int, int](b, &s.kc, ReducingDescriptor[int]{Name: "tr", Reduce: sum, TTL: ttl}))
	s.a = must(NewNamespacedAggregating[int, int](b, &s.kc, avgDescriptor("a", true)))
	d := avgDescriptor("ta", true)
	d.TTL = rttl
	s.ta = must(NewNamespacedAggregating[int, int](b, &s.kc, d))
	s.name = []string{"v", "tv", "l", "tl", "m", "tm", "r", "tr", "a", "ta"}
	return s
}

// modelOp applies one operation to s, with random arguments from rng, and
// describes what it returned.
type modelOp func(s *modelStates, rng *args) string

// args are random numbers drawn once per step, so that both backends get
// the same arguments.
type args struct {
	v [16]int
	i int
}

// IntN returns the next number, below n.
func (a *args) IntN(n int) int {
	x := a.v[a.i%len(a.v)] % n
	a.i++
	return x
}

func sortedPairs(seq func(func(int, int) bool)) string {
	m := maps.Collect(seq)
	var out []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, fmt.Sprintf("%d:%d", k, m[k]))
	}
	return fmt.Sprint(out)
}

func nss(rng *args) []int {
	out := make([]int, rng.IntN(4))
	for i := range out {
		out[i] = rng.IntN(4)
	}
	return out
}

var modelOps = []modelOp{
	func(s *modelStates, _ *args) string { return fmt.Sprint(s.v.Get()) },
	func(s *modelStates, rng *args) string { s.v.Update(rng.IntN(100)); return "" },
	func(s *modelStates, _ *args) string { s.v.Clear(); return "" },
	func(s *modelStates, _ *args) string { return fmt.Sprint(s.tv.Get()) },
	func(s *modelStates, rng *args) string { s.tv.Update(rng.IntN(100)); return "" },
	func(s *modelStates, _ *args) string { s.tv.Clear(); return "" },
	func(s *modelStates, _ *args) string { return fmt.Sprint(s.l.Get(), slices.Collect(s.l.All())) },
	func(s *modelStates, rng *args) string { s.l.Add(rng.IntN(100)); return "" },
	func(s *modelStates, rng *args) string { s.l.AddAll(nss(rng)); return "" },
	func(s *modelStates, rng *args) string { s.l.Update(nss(rng)); return "" },
	func(s *modelStates, rng *args) string { s.l.MergeNamespaces(rng.IntN(4), nss(rng)...); return "" },
	func(s *modelStates, _ *args) string { return fmt.Sprint(s.tl.Get()) },
	func(s *modelStates, rng *args) string { s.tl.Add(rng.IntN(100)); return "" },
	func(s *modelStates, rng *args) string { s.tl.MergeNamespaces(rng.IntN(4), nss(rng)...); return "" },
	func(s *modelStates, _ *args) string { s.tl.Clear(); return "" },
	func(s *modelStates, rng *args) string { return fmt.Sprint(s.m.Get(rng.IntN(5))) },
	func(s *modelStates, rng *args) string { s.m.Put(rng.IntN(5), rng.IntN(100)); return "" },
	func(s *modelStates, rng *args) string { s.m.Remove(rng.IntN(5)); return "" },
	func(s *modelStates, _ *args) string { return sortedPairs(s.m.All()) + fmt.Sprint(s.m.Len()) },
	func(s *modelStates, _ *args) string { s.m.Clear(); return "" },
	func(s *modelStates, _ *args) string {
		// Removing and putting during All.
		for k, v := range s.m.All() {
			if k%2 == 0 {
				s.m.Remove(k)
			} else {
				s.m.Put(k, v+k)
			}
		}
		return sortedPairs(s.m.All())
	},
	func(s *modelStates, rng *args) string { return fmt.Sprint(s.tm.Get(rng.IntN(5))) },
	func(s *modelStates, rng *args) string { return fmt.Sprint(s.tm.Contains(rng.IntN(5))) },
	func(s *modelStates, rng *args) string { s.tm.Put(rng.IntN(5), rng.IntN(100)); return "" },
	func(s *modelStates, rng *args) string { s.tm.Remove(rng.IntN(5)); return "" },
	func(s *modelStates, _ *args) string { return sortedPairs(s.tm.All()) },
	func(s *modelStates, _ *args) string { return fmt.Sprint(s.tm.Len()) },
	func(s *modelStates, _ *args) string { s.tm.Clear(); return "" },
	func(s *modelStates, _ *args) string { return fmt.Sprint(s.r.Get()) },
	func(s *modelStates, rng *args) string { s.r.Add(rng.IntN(100)); return "" },
	func(s *modelStates, rng *args) string { s.r.MergeNamespaces(rng.IntN(4), nss(rng)...); return "" },
	func(s *modelStates, _ *args) string { s.r.Clear(); return "" },
	func(s *modelStates, _ *args) string { return fmt.Sprint(s.tr.Get()) },
	func(s *modelStates, rng *args) string { s.tr.Add(rng.IntN(100)); return "" },
	func(s *modelStates, rng *args) string { s.tr.MergeNamespaces(rng.IntN(4), nss(rng)...); return "" },
	func(s *modelStates, _ *args) string { return fmt.Sprint(s.a.Get()) },
	func(s *modelStates, rng *args) string { s.a.Add(float64(rng.IntN(100))); return "" },
	func(s *modelStates, rng *args) string { s.a.MergeNamespaces(rng.IntN(4), nss(rng)...); return "" },
	func(s *modelStates, _ *args) string { s.a.Clear(); return "" },
	func(s *modelStates, _ *args) string { return fmt.Sprint(s.ta.Get()) },
	func(s *modelStates, rng *args) string { s.ta.Add(float64(rng.IntN(100))); return "" },
	func(s *modelStates, rng *args) string { s.ta.MergeNamespaces(rng.IntN(4), nss(rng)...); return "" },
}

// setScope points every handle of s at key k and namespace ns.
func (s *modelStates) setScope(k, ns int) {
	s.kc.Set(k, groupOf(k))
	for _, h := range []interface{ SetNamespace(int) }{s.v, s.tv, s.l, s.tl, s.m, s.tm, s.r, s.tr, s.a, s.ta} {
		h.SetNamespace(ns)
	}
}

// TestBoltAgainstMemory applies the same random operations to a memory
// backend (the model) and bolt backends with several batch sizes, and
// compares every result, the entry counts, and the records of snapshots.
// Entries expire (a fake clock advances) and are cleaned up. The seed is
// printed; rerun one with -model.seed.
func TestBoltAgainstMemory(t *testing.T) {
	seed := *modelSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d", seed)
	for _, batch := range []int{1, 2, 7, 64, 0} {
		t.Run(fmt.Sprint("batch=", batch), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, uint64(batch)))
			clk := clockwork.NewFakeClock()
			mem := newModelStates(NewMemoryBackend(testGroups, clk))
			bolt := newModelStates(newTestBolt(t, testGroups, clk, batch))
			const steps = 6000
			for step := range steps {
				k, ns := rng.IntN(24), rng.IntN(4)
				mem.setScope(k, ns)
				bolt.setScope(k, ns)
				i := rng.IntN(len(modelOps))
				var a args
				for j := range a.v {
					a.v[j] = rng.IntN(1 << 20)
				}
				a2 := a
				want := modelOps[i](mem, &a)
				got := modelOps[i](bolt, &a2)
				if got != want {
					t.Fatalf("step %d, op %d, key %d, ns %d: bolt %q, memory %q", step, i, k, ns, got, want)
				}
				switch {
				case rng.IntN(20) == 0:
					clk.Advance(time.Duration(rng.IntN(4000)) * time.Millisecond)
				case step%500 == 499:
					compareModel(t, step, mem, bolt, step < steps/2)
				case step >= steps/2 && rng.IntN(30) == 0:
					n := rng.IntN(10) + 1
					CleanupExpired(mem.b, n)
					CleanupExpired(bolt.b, n)
				}
			}
			// Cleanup removes every expired entry of both in the end.
			clk.Advance(time.Minute)
			for range 3 {
				CleanupExpired(mem.b, 1<<20)
				CleanupExpired(bolt.b, 1<<20)
			}
			compareModel(t, steps, mem, bolt, true)
		})
	}
}

// compareModel compares the records of snapshots of both backends and, if
// lens, the numbers of entries (which differ while cleanup has removed
// different expired entries from each).
func compareModel(t *testing.T, step int, mem, bolt *modelStates, lens bool) {
	t.Helper()
	if lens {
		for _, n := range mem.name {
			if a, b := Len(mem.b, n), Len(bolt.b, n); a != b {
				t.Fatalf("step %d: Len(%s) bolt %d, memory %d", step, n, b, a)
			}
		}
	}
	md, _ := writeSnapshot(t, mem.b)
	bd, _ := writeSnapshot(t, bolt.b)
	if !lens {
		// Expired entries may be in one and not the other.
		return
	}
	if d := diff(dump(t, md, testGroups), dump(t, bd, testGroups)); d != "" {
		t.Fatalf("step %d: snapshots differ: %s", step, d)
	}
}
