package state

import (
	"bytes"
	"cmp"
	"flag"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/edgedio/edged/keygroup"
)

var timerSeed = flag.Uint64("timer.seed", 1, "seed of TestTimerQueueAgainstModel; 0 picks one from the time")

type tm = Timer[string, int]

func collect(q *TimerQueue[string, int], wm int64) []tm {
	var got []tm
	q.PopUntil(wm, func(t tm) { got = append(got, t) })
	return got
}

func TestTimerOrderDedupDelete(t *testing.T) {
	q := NewTimerQueue[string, int]()
	if _, ok := q.Peek(); ok {
		t.Fatal("empty queue peeks a timer")
	}
	reg := []tm{{5, "a", 1, 0}, {3, "b", 2, 0}, {5, "c", 1, 0}, {3, "a", 1, 0}, {5, "a", 1, 1}, {9, "d", 3, 0}}
	for _, x := range reg {
		if !q.Register(x.Timestamp, x.Key, x.Group, x.Namespace) {
			t.Fatalf("Register(%v) = false", x)
		}
	}
	if q.Register(5, "a", 1, 0) {
		t.Fatal("duplicate timer registered")
	}
	if q.Len() != 6 {
		t.Fatalf("Len = %d", q.Len())
	}
	if p, _ := q.Peek(); p != (tm{3, "b", 2, 0}) {
		t.Fatalf("Peek = %v", p)
	}
	if !q.Delete(5, "c", 1, 0) || q.Delete(5, "c", 1, 0) || q.Delete(7, "zz", 4, 0) {
		t.Fatal("Delete")
	}
	if got, want := q.Groups(), []int{1, 2, 3}; !slices.Equal(got, want) {
		t.Fatalf("Groups = %v", got)
	}
	if got, want := q.InGroup(1), []tm{{3, "a", 1, 0}, {5, "a", 1, 0}, {5, "a", 1, 1}}; !slices.Equal(got, want) {
		t.Fatalf("InGroup(1) = %v", got)
	}
	if got := q.InGroup(7); len(got) != 0 {
		t.Fatalf("InGroup(7) = %v", got)
	}
	// Equal timestamps fire in registration order.
	got := collect(q, 5)
	want := []tm{{3, "b", 2, 0}, {3, "a", 1, 0}, {5, "a", 1, 0}, {5, "a", 1, 1}}
	if !slices.Equal(got, want) {
		t.Fatalf("fired %v, want %v", got, want)
	}
	if got := collect(q, 8); got != nil {
		t.Fatalf("fired %v before their time", got)
	}
	if q.Len() != 1 || !slices.Equal(q.Groups(), []int{3}) {
		t.Fatalf("Len %d, Groups %v", q.Len(), q.Groups())
	}
	// A fired timer can be registered again.
	if !q.Register(3, "b", 2, 0) {
		t.Fatal("re-registering a fired timer")
	}
}

func TestTimersRegisteredDuringPopUntil(t *testing.T) {
	q := NewTimerQueue[string, int]()
	q.Register(10, "a", 0, 0)
	q.Register(20, "b", 0, 0)
	q.Register(30, "c", 0, 0)
	var got []tm
	q.PopUntil(25, func(x tm) {
		got = append(got, x)
		switch x.Key {
		case "a":
			q.Register(15, "a2", 0, 0) // before b: fires next
			q.Register(20, "a3", 0, 0) // same time as b, registered later
			q.Register(26, "a4", 0, 0) // after the watermark
			q.Register(5, "a5", 0, 0)  // in the past: fires at once
			q.Delete(30, "c", 0, 0)
		case "b":
			q.Register(25, "b2", 0, 0)
		}
	})
	want := []tm{{10, "a", 0, 0}, {5, "a5", 0, 0}, {15, "a2", 0, 0}, {20, "b", 0, 0}, {20, "a3", 0, 0}, {25, "b2", 0, 0}}
	if !slices.Equal(got, want) {
		t.Fatalf("fired %v\nwant  %v", got, want)
	}
	if p, _ := q.Peek(); q.Len() != 1 || p.Key != "a4" {
		t.Fatalf("left %d timers, next %v", q.Len(), p)
	}
}

// modelTimer is a timer of the naive model with its registration number.
type modelTimer struct {
	t   tm
	seq int
}

// timerModel is the obviously right timer queue: a slice searched
// linearly.
type timerModel struct {
	ts  []modelTimer
	seq int
}

func (m *timerModel) register(x tm) bool {
	if slices.ContainsFunc(m.ts, func(e modelTimer) bool { return e.t == x }) {
		return false
	}
	m.ts = append(m.ts, modelTimer{x, m.seq})
	m.seq++
	return true
}

func (m *timerModel) delete(x tm) bool {
	n := len(m.ts)
	m.ts = slices.DeleteFunc(m.ts, func(e modelTimer) bool { return e.t == x })
	return len(m.ts) < n
}

func (m *timerModel) popUntil(wm int64, fn func(tm)) {
	for {
		if len(m.ts) == 0 {
			return
		}
		i := slices.IndexFunc(m.ts, func(e modelTimer) bool {
			return e.t == slices.MinFunc(m.ts, func(a, b modelTimer) int {
				return cmp.Or(cmp.Compare(a.t.Timestamp, b.t.Timestamp), cmp.Compare(a.seq, b.seq))
			}).t
		})
		if m.ts[i].t.Timestamp > wm {
			return
		}
		x := m.ts[i].t
		m.ts = slices.Delete(m.ts, i, i+1)
		fn(x)
	}
}

// TestTimerQueueAgainstModel drives the queue and the model with the same
// random operations and compares every result.
func TestTimerQueueAgainstModel(t *testing.T) {
	seed := *timerSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun with -timer.seed=%d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	q := NewTimerQueue[string, int]()
	var m timerModel
	keys := []string{"a", "b", "c", "d", "e"}
	random := func(wm int64) tm {
		k := rng.IntN(len(keys))
		return tm{Timestamp: wm + rng.Int64N(40) - 10, Key: keys[k], Group: k % 3, Namespace: rng.IntN(3)}
	}
	// react is what a timer function does when a timer fires: the same for
	// queue and model, so both see the same calls.
	react := func(x tm, reg func(tm) bool, del func(tm) bool) {
		if x.Namespace == 0 && x.Timestamp%3 == 0 {
			reg(tm{x.Timestamp - 1, x.Key, x.Group, 1}) // fires in the same call
			reg(tm{x.Timestamp + 7, x.Key, x.Group, 2})
			del(tm{x.Timestamp + 2, "a", 0, 0})
		}
	}
	var wm int64
	for step := range 20000 {
		switch op := rng.IntN(10); {
		case op < 5:
			x := random(wm)
			if a, b := q.Register(x.Timestamp, x.Key, x.Group, x.Namespace), m.register(x); a != b {
				t.Fatalf("seed %d step %d: Register(%v) = %v, model %v", seed, step, x, a, b)
			}
		case op < 7:
			x := random(wm)
			if a, b := q.Delete(x.Timestamp, x.Key, x.Group, x.Namespace), m.delete(x); a != b {
				t.Fatalf("seed %d step %d: Delete(%v) = %v, model %v", seed, step, x, a, b)
			}
		default:
			wm += rng.Int64N(8)
			var got, want []tm
			q.PopUntil(wm, func(x tm) {
				got = append(got, x)
				react(x, func(y tm) bool { return q.Register(y.Timestamp, y.Key, y.Group, y.Namespace) },
					func(y tm) bool { return q.Delete(y.Timestamp, y.Key, y.Group, y.Namespace) })
			})
			m.popUntil(wm, func(x tm) {
				want = append(want, x)
				react(x, m.register, m.delete)
			})
			if !slices.Equal(got, want) {
				t.Fatalf("seed %d step %d: PopUntil(%d) fired\n%v\nmodel\n%v", seed, step, wm, got, want)
			}
		}
		if q.Len() != len(m.ts) {
			t.Fatalf("seed %d step %d: Len %d, model %d", seed, step, q.Len(), len(m.ts))
		}
		got, ok := q.Peek()
		if ok != (len(m.ts) > 0) {
			t.Fatalf("seed %d step %d: Peek ok %v with %d timers in the model", seed, step, ok, len(m.ts))
		}
		if ok {
			first := slices.MinFunc(m.ts, func(a, b modelTimer) int {
				return cmp.Or(cmp.Compare(a.t.Timestamp, b.t.Timestamp), cmp.Compare(a.seq, b.seq))
			})
			if got != first.t {
				t.Fatalf("seed %d step %d: Peek %v, model %v", seed, step, got, first.t)
			}
		}
		if step%1000 == 0 {
			checkGroups(t, seed, step, q, &m)
		}
	}
}

// checkGroups compares Groups and InGroup with the model.
func checkGroups(t *testing.T, seed uint64, step int, q *TimerQueue[string, int], m *timerModel) {
	t.Helper()
	sorted := slices.Clone(m.ts)
	slices.SortFunc(sorted, func(a, b modelTimer) int {
		return cmp.Or(cmp.Compare(a.t.Timestamp, b.t.Timestamp), cmp.Compare(a.seq, b.seq))
	})
	var groups []int
	for _, e := range sorted {
		if !slices.Contains(groups, e.t.Group) {
			groups = append(groups, e.t.Group)
		}
	}
	slices.Sort(groups)
	if got := q.Groups(); !slices.Equal(got, groups) {
		t.Fatalf("seed %d step %d: Groups %v, model %v", seed, step, got, groups)
	}
	for _, g := range groups {
		var want []tm
		for _, e := range sorted {
			if e.t.Group == g {
				want = append(want, e.t)
			}
		}
		if got := q.InGroup(g); !slices.Equal(got, want) {
			t.Fatalf("seed %d step %d: InGroup(%d) = %v, model %v", seed, step, g, got, want)
		}
	}
}

func TestTimerQueueAllocs(t *testing.T) {
	q := NewTimerQueue[int, int]()
	for i := range 100 {
		q.Register(int64(i), i, i%4, 0)
	}
	q.PopUntil(1000, func(Timer[int, int]) {})
	ts := int64(0)
	allocs := testing.AllocsPerRun(100, func() {
		for i := range 100 {
			q.Register(ts+int64(i), i, i%4, 0)
		}
		q.PopUntil(ts+100, func(Timer[int, int]) {})
		ts += 100
	})
	if allocs != 0 {
		t.Fatalf("register+fire allocates %v per 100 timers once warm", allocs)
	}
}

// TestTimerQueueOneEntryPerTimestamp: timers of one timestamp (window
// ends, one per key) share one bucket and one entry in the order of
// timestamps, so that registering and firing one does not cost a heap
// operation over every queued timer; deletes and bucket reuse keep the
// order (see TestTimerQueueAgainstModel).
func TestTimerQueueOneEntryPerTimestamp(t *testing.T) {
	q := NewTimerQueue[int, int]()
	for k := range 1000 {
		q.Register(1000, k, k%128, 0)
	}
	q.Register(2000, 0, 0, 0)
	if len(q.times) != 2 || len(q.buckets) != 2 {
		t.Fatalf("2 timestamps of 1001 timers: %d heap entries, %d buckets; want 2 and 2", len(q.times), len(q.buckets))
	}
	q.Delete(1000, 500, 500%128, 0)
	var keys []int
	q.PopUntil(1000, func(x Timer[int, int]) {
		keys = append(keys, x.Key)
		q.Register(2000, x.Key, x.Group, 0) // the next window end of the key
	})
	if len(keys) != 999 || keys[0] != 0 || keys[499] != 499 || keys[500] != 501 {
		t.Fatalf("fired %d timers (%v…): want 999 in registration order without key 500", len(keys), keys[:min(len(keys), 3)])
	}
	if len(q.times) != 1 || q.Len() != 999 {
		t.Fatalf("after firing: %d heap entries, %d timers; want 1 and 999", len(q.times), q.Len())
	}
}

// A timer moved on again and again (a session window's end, pushed on by
// every record of a key that never pauses) leaves no entry behind in the
// heap of timestamps: the entries of deleted buckets are dropped once they
// outnumber the live ones, not only when the watermark reaches them.
func TestTimerQueueMovedTimerLeavesNoHeapEntries(t *testing.T) {
	q := NewTimerQueue[string, int]()
	q.Register(1_000_000_000, "b", 7, 0) // far ahead: never reached below
	for ts := int64(1000); ts < 201_000; ts++ {
		q.Register(ts, "a", 1, 0)
		if ts > 1000 {
			q.Delete(ts-1, "a", 1, 0)
		}
		if len(q.times) > 2*len(q.buckets)+64 {
			t.Fatalf("at %d: %d heap entries for %d timestamps", ts, len(q.times), len(q.buckets))
		}
	}
	if got, ok := q.Peek(); !ok || got.Timestamp != 200_999 || got.Key != "a" {
		t.Fatalf("Peek = %v, %v; want key a at 200999", got, ok)
	}
	if got := collect(q, 1_000_000_000); len(got) != 2 || got[0].Timestamp != 200_999 || got[1].Key != "b" {
		t.Fatalf("fired %v, want the two live timers", got)
	}
}

// BenchmarkTimers registers timers at random times for 1000 keys and fires
// them with an advancing watermark.
func BenchmarkTimers(b *testing.B) {
	const keys, batch = 1000, 1000
	rng := rand.New(rand.NewPCG(1, 2))
	offsets := make([]int64, batch)
	for i := range offsets {
		offsets[i] = rng.Int64N(10_000)
	}
	q := NewTimerQueue[int, struct{}]()
	fired := 0
	b.ReportAllocs()
	var wm int64
	for b.Loop() {
		for i, off := range offsets {
			q.Register(wm+off, i%keys, i%128, struct{}{})
		}
		wm += 10_000
		q.PopUntil(wm, func(Timer[int, struct{}]) { fired++ })
	}
	b.ReportMetric(float64(fired)/b.Elapsed().Seconds(), "timers/s")
}

// Restoring a timer queue sizes it once: far fewer allocations than
// timers (one item per timer and maps grown timer by timer before), and
// the restored timers fire in the order the original ones would.
func TestTimerQueueRestoreAllocs(t *testing.T) {
	const n = 10_000
	src := NewMemoryBackend(benchGroups, nil)
	q := NewTimerQueue[int, int]()
	if err := RegisterTimerQueue(src, "event", q, nil, nil); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		q.Register(int64(i%7), i, keygroup.Of(uint64(i)*0x9e3779b97f4a7c15, keygroup.DefaultMaxParallelism), i%3)
	}
	data, offs := writeSnapshot(t, src)
	var want []Timer[int, int]
	q.PopUntil(100, func(x Timer[int, int]) { want = append(want, x) })

	restore := func() *TimerQueue[int, int] {
		be := NewMemoryBackend(benchGroups, nil)
		if err := Restore(be, bytes.NewReader(data), offs, benchGroups); err != nil {
			t.Fatal(err)
		}
		rq := NewTimerQueue[int, int]()
		if err := RegisterTimerQueue(be, "event", rq, nil, nil); err != nil {
			t.Fatal(err)
		}
		return rq
	}
	var got []Timer[int, int]
	restore().PopUntil(100, func(x Timer[int, int]) { got = append(got, x) })
	if len(got) != n {
		t.Fatalf("restored queue fired %d timers, want %d", len(got), n)
	}
	// Timers of one timestamp fire in registration order; the restore
	// registers them key group by key group, so compare per timestamp and
	// group.
	type tg struct {
		ts int64
		g  int
	}
	order := func(ts []Timer[int, int]) map[tg][]Timer[int, int] {
		m := map[tg][]Timer[int, int]{}
		for i, x := range ts {
			if i > 0 && x.Timestamp < ts[i-1].Timestamp {
				t.Fatalf("timer %d at %d fired after one at %d", i, x.Timestamp, ts[i-1].Timestamp)
			}
			m[tg{x.Timestamp, x.Group}] = append(m[tg{x.Timestamp, x.Group}], x)
		}
		return m
	}
	w, g := order(want), order(got)
	for k, ws := range w {
		if !slices.Equal(ws, g[k]) {
			t.Fatalf("timers at %d of group %d: restored fire %v, original %v", k.ts, k.g, g[k], ws)
		}
	}
	allocs := testing.AllocsPerRun(3, func() { restore() })
	if allocs > n/4 {
		t.Fatalf("restoring %d timers makes %v allocations; want at most %d", n, allocs, n/4)
	}
}
