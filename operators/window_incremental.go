package operators

import (
	"math"
	"reflect"

	"github.com/edgedio/edged/state"
)

// incSlices is the slice store of sliding window aggregates. It keeps the
// slices of each key as aggSlices does (same state, same encoding), plus
// an incrementally maintained aggregate of the slices of the last window
// fired, so that the next window's result costs a few merges (about
// slide/pane of them, amortised) rather than one per slice of the window
// (size/pane).
//
// The incremental aggregate is two stacks over the slices whose starts lie
// in [From, To): the front, [From, Mid), holds for each of its slices the
// merge of that slice and all later ones up to Mid (a suffix aggregate);
// the back, [Mid, To), holds the merge of its slices. A window [s, e) with
// s >= From adds the slices of [To, e) to the back and drops the front's
// suffixes of slices before s; its result merges the first remaining
// suffix with the back. When the front runs out (s >= Mid), the window's
// slices are merged anew into suffixes (a flip), once per size/slide
// windows. Only associativity is needed: slices are combined in time
// order, as the merge of all slices does.
//
// The incremental aggregate is derived from the slices, so it is not part
// of the state of record: the operator keeps it in memory, per key, and
// writes it nowhere (adding a record and snapshots cost what they did for
// the slices alone). It is rebuilt from the slices when it is missing or
// stale: after a restore (snapshots hold the slices only), after a record
// joined one of its slices (a late record, or on processing time one in
// the last millisecond of a window that fired; the operator remembers the
// largest To it built, maxTo, so only records before it look), and when
// every slice of the key was dropped (its aggregate goes with them).
//
// Snapshots of the earlier layout kept the incremental aggregates in the
// state "<name>/incremental" (incAgg): the store still registers it, so
// that such snapshots restore, and clears a key's entry when it builds
// that key's aggregate or drops its slices, so that the state empties.
//
// Windows fired again because of late records, when they start before the
// incremental aggregate, merge their slices as before.
type incSlices[K comparable, T, A, R any] struct {
	*aggSlices[K, T, A, R]
	keys *state.KeyContext[K]
	// incs holds the incremental aggregate of each key with slices.
	incs  map[K]*incStacks[A]
	maxTo int64
	// flat says that accumulators hold no references, so that an
	// assignment copies one (see copyOf).
	flat bool
	// legacy holds the incremental aggregates of a restored snapshot of
	// the earlier layout; hasLegacy says whether it had any entries when
	// the store opened.
	legacy    state.Value[incAgg[A]]
	hasLegacy bool
	// incremental and rebuilt count the windows whose result came from
	// the incremental aggregate, and those that rebuilt it (tests).
	incremental, rebuilt int64
}

// incStacks is the incremental aggregate of a key's slices in
// [From, To) (see incSlices); it holds nothing until Built.
type incStacks[A any] struct {
	Built         bool
	From, Mid, To int64
	// Front is a stack: its last entry is the suffix aggregate of the
	// earliest front slice, Front[i].Start the start of that slice.
	Front []aggSlice[A]
	// Back merges the slices of [Mid, To) when HasBack.
	Back    A
	HasBack bool
}

// incAgg is the incremental aggregate as snapshots of the earlier layout
// hold it, in the state "<name>/incremental". Its type and fields are
// those of that layout, so that the state restores; it is only cleared.
type incAgg[A any] struct {
	Owner         uint64
	Built         bool
	From, Mid, To int64
	Front         []aggSlice[A]
	Back          A
	HasBack       bool
}

func newIncSlices[K comparable, T, A, R any](agg AggregateFunction[T, A, R], out Collector[WindowResult[K, R]]) *incSlices[K, T, A, R] {
	return &incSlices[K, T, A, R]{aggSlices: newAggSlices[K, T, A, R](agg, out), flat: refFree(reflect.TypeFor[A]())}
}

// refFree reports whether values of t hold no pointers, slices, maps,
// channels, functions or interfaces (strings are immutable): a copy of
// such a value shares nothing that Merge could change.
func refFree(t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Array:
		return t.Len() == 0 || refFree(t.Elem())
	case reflect.Struct:
		for i := range t.NumField() {
			if !refFree(t.Field(i).Type) {
				return false
			}
		}
		return true
	case reflect.Pointer, reflect.Slice, reflect.Map, reflect.Chan, reflect.Func, reflect.Interface, reflect.UnsafePointer:
		return false
	}
	return true
}

func (s *incSlices[K, T, A, R]) open(b state.Backend, keys *state.KeyContext[K], name string) error {
	if err := s.aggSlices.open(b, keys, name); err != nil {
		return err
	}
	s.keys, s.incs, s.maxTo = keys, make(map[K]*incStacks[A]), math.MinInt64
	var err error
	legacyName := name + "/incremental"
	s.legacy, err = state.NewValue[K, incAgg[A]](b, keys, state.ValueDescriptor[incAgg[A]]{Name: legacyName})
	s.hasLegacy = err == nil && state.Len(b, legacyName) > 0
	return err
}

// clearLegacy removes the current key's incremental aggregate of the
// earlier layout, if a restore brought any.
func (s *incSlices[K, T, A, R]) clearLegacy() {
	if s.hasLegacy {
		s.legacy.Clear()
	}
}

func (s *incSlices[K, T, A, R]) add(p int64, v T) int64 {
	next := s.aggSlices.add(p, v)
	if p < s.maxTo {
		if a := s.incs[s.keys.Key()]; a != nil && a.Built && p >= a.From && p < a.To {
			// The record joins a slice of the incremental aggregate: the
			// next window rebuilds it.
			a.Built = false
		}
	}
	return next
}

// copyOf returns a fresh accumulator equal to a: Merge may change its
// first argument, never its second. An accumulator without references is
// copied by assignment; another one is merged into a new accumulator
// (windows combine their slices from a new accumulator too).
func (s *incSlices[K, T, A, R]) copyOf(a A) A {
	if s.flat {
		return a
	}
	return s.merger.Merge(s.agg.CreateAccumulator(), a)
}

func (s *incSlices[K, T, A, R]) fire(key K, w Window) error {
	set, ok := s.st.Get()
	if !ok {
		return nil
	}
	a := s.incs[key]
	if a != nil && a.Built && w.Start < a.From {
		// A window fired again, before the incremental aggregate.
		s.fireSlices(key, w, set.Slices)
		return nil
	}
	if a == nil {
		a = new(incStacks[A])
		s.incs[key] = a
		s.clearLegacy()
	}
	if !a.Built || w.Start >= a.Mid {
		s.flip(a, set.Slices, w)
		s.rebuilt++
	} else {
		s.advance(a, set.Slices, w)
		s.incremental++
	}
	var acc A
	have := false
	if n := len(a.Front); n > 0 {
		acc, have = a.Front[n-1].Acc, true
	}
	if a.HasBack {
		if have {
			acc = s.merger.Merge(s.copyOf(acc), a.Back)
		} else {
			// The back changes in place as slices join it: emit a copy.
			acc, have = s.copyOf(a.Back), true
		}
	}
	if have {
		s.out.Collect(WindowResult[K, R]{Key: key, Window: w, Value: s.agg.Result(acc)})
	}
	return nil
}

// flip makes the slices of w the front, as suffix aggregates, with an
// empty back.
func (s *incSlices[K, T, A, R]) flip(a *incStacks[A], sl []aggSlice[A], w Window) {
	clear(a.Front)
	*a = incStacks[A]{Front: a.Front[:0]}
	i, _ := findSlice(sl, w.Start)
	j := i
	for j < len(sl) && sl[j].Start < w.End {
		j++
	}
	for k := j - 1; k >= i; k-- {
		acc := s.copyOf(sl[k].Acc)
		if n := len(a.Front); n > 0 {
			acc = s.merger.Merge(acc, a.Front[n-1].Acc)
		}
		a.Front = append(a.Front, aggSlice[A]{Start: sl[k].Start, Acc: acc})
	}
	a.Built, a.From, a.Mid, a.To = true, w.Start, w.End, w.End
	s.maxTo = max(s.maxTo, a.To)
}

// advance moves the incremental aggregate to w, which starts in
// [From, Mid): the slices of [To, w.End) join the back, the front's
// suffixes of the slices before w.Start leave.
func (s *incSlices[K, T, A, R]) advance(a *incStacks[A], sl []aggSlice[A], w Window) {
	// The slices after To are the newest ones: look for the first from
	// the end.
	i := len(sl)
	for i > 0 && sl[i-1].Start >= a.To {
		i--
	}
	for ; i < len(sl) && sl[i].Start < w.End; i++ {
		if a.HasBack {
			a.Back = s.merger.Merge(a.Back, sl[i].Acc)
		} else {
			a.Back, a.HasBack = s.copyOf(sl[i].Acc), true
		}
	}
	n := len(a.Front)
	for n > 0 && a.Front[n-1].Start < w.Start {
		n--
	}
	clear(a.Front[n:])
	a.Front = a.Front[:n]
	a.From, a.To = w.Start, max(a.To, w.End)
	s.maxTo = max(s.maxTo, a.To)
}

// drop removes the oldest slices while done holds for them, and the
// incremental aggregate with the last one. No window to come holds a
// dropped slice, so the incremental aggregate stays: the next window
// starts after the dropped slices, and drops their suffixes or flips.
func (s *incSlices[K, T, A, R]) drop(done func(p int64) bool) int {
	n := s.aggSlices.drop(done)
	if n == 0 {
		delete(s.incs, s.keys.Key())
		s.clearLegacy()
	}
	return n
}

// incStore returns the counts of results taken from the incremental
// aggregate and of its rebuilds, for tests.
func (o *SlicedWindow[K, T]) incStore() (incremental, rebuilt int64) {
	if s, ok := o.store.(interface{ counts() (int64, int64) }); ok {
		return s.counts()
	}
	return 0, 0
}

func (s *incSlices[K, T, A, R]) counts() (int64, int64) { return s.incremental, s.rebuilt }
