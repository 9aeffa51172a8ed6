package operators

import (
	"slices"

	"github.com/edgedio/edged/state"
)

// incSlices is the slice store of sliding window aggregates: it keeps the
// slices of each key as aggSlices does, plus an incrementally maintained
// aggregate of the slices of the last window fired, so that the next
// window's result costs a few merges (about slide/pane of them, amortised)
// rather than one per slice of the window (size/pane).
//
// The incremental aggregate is two stacks over the slices whose starts lie
// in [From, To): the front, [From, Mid), holds for each of its slices the
// merge of that slice and all later ones up to Mid (a suffix aggregate);
// the back, [Mid, To), holds the merge of its slices. A window [s, e) with
// s >= From and e >= To adds the slices of [To, e) to the back and drops
// the front's suffixes of slices before s; its result merges the first
// remaining suffix with the back. When the front runs out (s >= Mid), the
// window's slices are merged anew into suffixes (a flip), once per
// size/slide windows. Only associativity is needed: slices are merged in
// time order, as the merge of all slices does.
//
// A record added to a slice inside [From, To) (a late record, or on
// processing time one in the last millisecond of a window that fired)
// invalidates the incremental aggregate, which the next window rebuilds.
// Windows fired again because of late records, when they lie before the
// incremental aggregate, merge their slices as before.
//
// The state is one entry per key, "<name>/incremental". Savepoints of the
// earlier layout, which kept the slices in "<name>" (sliceSet), restore:
// a key's entry there is moved to the new state when the key is next
// touched.
type incSlices[K comparable, T, A, R any] struct {
	agg    AggregateFunction[T, A, R]
	merger Merger[A]
	out    Collector[WindowResult[K, R]]
	st     state.Value[incSet[A]]
	legacy state.Value[sliceSet[A]]
	// incremental and rebuilt count the windows whose result came from
	// the incremental aggregate, and those that rebuilt it (tests).
	incremental, rebuilt int64
}

// incSet is what incSlices keeps per key: its pending window-end timer
// (0: none), its slices in order and the incremental aggregate.
type incSet[A any] struct {
	Next   int64
	Slices []aggSlice[A]
	Inc    incAgg[A]
}

// incAgg is the incremental aggregate of the slices in [From, To) (see
// incSlices); Built is false when there is none.
type incAgg[A any] struct {
	Built         bool
	From, Mid, To int64
	// Front is a stack: its last entry is the suffix aggregate of the
	// earliest front slice, Front[i].Start the start of that slice.
	Front []aggSlice[A]
	// Back merges the slices of [Mid, To) when HasBack.
	Back    A
	HasBack bool
}

func newIncSlices[K comparable, T, A, R any](agg AggregateFunction[T, A, R], m Merger[A], out Collector[WindowResult[K, R]]) *incSlices[K, T, A, R] {
	return &incSlices[K, T, A, R]{agg: agg, merger: m, out: out}
}

func (s *incSlices[K, T, A, R]) open(b state.Backend, keys *state.KeyContext[K], name string) error {
	var err error
	if s.st, err = state.NewValue[K, incSet[A]](b, keys, state.ValueDescriptor[incSet[A]]{Name: name + "/incremental"}); err != nil {
		return err
	}
	s.legacy, err = state.NewValue[K, sliceSet[A]](b, keys, state.ValueDescriptor[sliceSet[A]]{Name: name})
	return err
}

// get returns the current key's entry, moving it from the earlier layout
// when it is there.
func (s *incSlices[K, T, A, R]) get() (incSet[A], bool) {
	set, ok := s.st.Get()
	if ok {
		return set, true
	}
	old, ok := s.legacy.Get()
	if !ok {
		return set, false
	}
	s.legacy.Clear()
	set = incSet[A]{Next: old.Next, Slices: old.Slices}
	s.st.Update(set)
	return set, true
}

func (s *incSlices[K, T, A, R]) add(p int64, v T) bool {
	set, _ := s.get()
	sl := set.Slices
	i, found := findSlice(sl, p)
	if found {
		sl[i].Acc = s.agg.Add(v, sl[i].Acc)
	} else {
		set.Slices = slices.Insert(sl, i, aggSlice[A]{Start: p, Acc: s.agg.Add(v, s.agg.CreateAccumulator())})
	}
	if inc := &set.Inc; inc.Built && p >= inc.From && p < inc.To {
		inc.reset()
	}
	s.st.Update(set)
	return !found
}

// reset drops the incremental aggregate.
func (a *incAgg[A]) reset() {
	clear(a.Front)
	*a = incAgg[A]{Front: a.Front[:0]}
}

func (s *incSlices[K, T, A, R]) first(fn func(p int64) (int64, bool)) (int64, bool) {
	set, _ := s.get()
	for _, x := range set.Slices {
		if r, ok := fn(x.Start); ok {
			return r, true
		}
	}
	return 0, false
}

func (s *incSlices[K, T, A, R]) next() (int64, bool) {
	set, ok := s.get()
	return set.Next, ok && set.Next != 0
}

func (s *incSlices[K, T, A, R]) setNext(ts int64) {
	set, _ := s.get()
	set.Next = ts
	s.st.Update(set)
}

// copyOf returns a fresh accumulator equal to a: Merge may change its
// first argument, never its second.
func (s *incSlices[K, T, A, R]) copyOf(a A) A { return s.merger.Merge(s.agg.CreateAccumulator(), a) }

func (s *incSlices[K, T, A, R]) fire(key K, w Window) error {
	set, ok := s.get()
	if !ok {
		return nil
	}
	inc := &set.Inc
	if inc.Built && (w.Start < inc.From || w.End < inc.To) {
		// A window fired again, before the incremental aggregate.
		return s.mergeAll(key, w, set.Slices)
	}
	if !inc.Built || w.Start >= inc.Mid {
		s.flip(&set, w)
		s.rebuilt++
	} else {
		s.advance(&set, w)
		s.incremental++
	}
	s.st.Update(set)
	var acc A
	have := false
	if n := len(inc.Front); n > 0 {
		acc, have = inc.Front[n-1].Acc, true
	}
	if inc.HasBack {
		if have {
			acc = s.merger.Merge(s.copyOf(acc), inc.Back)
		} else {
			// The back changes in place as slices join it: emit a copy.
			acc, have = s.copyOf(inc.Back), true
		}
	}
	if have {
		s.out.Collect(WindowResult[K, R]{Key: key, Window: w, Value: s.agg.Result(acc)})
	}
	return nil
}

// flip makes the slices of w the front, as suffix aggregates, with an
// empty back.
func (s *incSlices[K, T, A, R]) flip(set *incSet[A], w Window) {
	inc := &set.Inc
	inc.reset()
	sl := set.Slices
	i, _ := findSlice(sl, w.Start)
	j := i
	for j < len(sl) && sl[j].Start < w.End {
		j++
	}
	for k := j - 1; k >= i; k-- {
		acc := s.copyOf(sl[k].Acc)
		if n := len(inc.Front); n > 0 {
			acc = s.merger.Merge(acc, inc.Front[n-1].Acc)
		}
		inc.Front = append(inc.Front, aggSlice[A]{Start: sl[k].Start, Acc: acc})
	}
	inc.Built, inc.From, inc.Mid, inc.To = true, w.Start, w.End, w.End
}

// advance moves the incremental aggregate to w, which starts before Mid:
// the slices of [To, w.End) join the back, the front's suffixes of the
// slices before w.Start leave.
func (s *incSlices[K, T, A, R]) advance(set *incSet[A], w Window) {
	inc := &set.Inc
	sl := set.Slices
	for i, _ := findSlice(sl, inc.To); i < len(sl) && sl[i].Start < w.End; i++ {
		if inc.HasBack {
			inc.Back = s.merger.Merge(inc.Back, sl[i].Acc)
		} else {
			inc.Back, inc.HasBack = s.copyOf(sl[i].Acc), true
		}
	}
	n := len(inc.Front)
	for n > 0 && inc.Front[n-1].Start < w.Start {
		n--
	}
	clear(inc.Front[n:])
	inc.Front = inc.Front[:n]
	inc.From, inc.To = w.Start, w.End
}

// mergeAll emits the result of w merging all its slices.
func (s *incSlices[K, T, A, R]) mergeAll(key K, w Window, sl []aggSlice[A]) error {
	i, _ := findSlice(sl, w.Start)
	j := i
	for j < len(sl) && sl[j].Start < w.End {
		j++
	}
	switch j - i {
	case 0:
		return nil
	case 1:
		s.out.Collect(WindowResult[K, R]{Key: key, Window: w, Value: s.agg.Result(sl[i].Acc)})
	default:
		acc := s.agg.CreateAccumulator()
		for _, x := range sl[i:j] {
			acc = s.merger.Merge(acc, x.Acc)
		}
		s.out.Collect(WindowResult[K, R]{Key: key, Window: w, Value: s.agg.Result(acc)})
	}
	return nil
}

// drop removes the oldest slices while done holds for them. No window to
// come holds a dropped slice, so the incremental aggregate stays: the
// next window starts after the dropped slices, and drops their suffixes
// or flips.
func (s *incSlices[K, T, A, R]) drop(done func(p int64) bool) int {
	set, _ := s.get()
	sl := set.Slices
	n := 0
	for n < len(sl) && done(sl[n].Start) {
		n++
	}
	switch {
	case n == len(sl):
		s.st.Clear()
	case n > 0:
		set.Slices = slices.Delete(sl, 0, n)
		s.st.Update(set)
		return len(set.Slices)
	}
	return len(sl) - n
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
