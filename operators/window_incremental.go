package operators

import (
	"math"
	"math/rand/v2"

	"github.com/edgedio/edged/state"
)

// incSlices is the slice store of sliding window aggregates. It keeps the
// slices of each key as aggSlices does (same state, same layout), plus an
// incrementally maintained aggregate of the slices of the last window
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
// The incremental aggregate lives in its own state, "<name>/incremental",
// read and written when a window fires, so that adding a record costs
// what it did. A record added to a slice inside [From, To) (a late
// record, or on processing time one in the last millisecond of a window
// that fired) drops the key's incremental aggregate, which the next window
// rebuilds; the operator remembers the largest To it wrote (maxTo), so
// only records before it look. Each operator instance marks what it
// writes with a random owner: after a restore, at any parallelism, the
// incremental aggregates of the snapshot belong to another owner and are
// rebuilt when their key's next window fires (the slices are the state of
// record), so maxTo need not be restored; and a snapshot of the earlier
// layout, without incremental aggregates, restores as it is.
//
// Windows fired again because of late records, when they start before the
// incremental aggregate, merge their slices as before.
type incSlices[K comparable, T, A, R any] struct {
	*aggSlices[K, T, A, R]
	inc   state.Value[incAgg[A]]
	owner uint64
	maxTo int64
	// incremental and rebuilt count the windows whose result came from
	// the incremental aggregate, and those that rebuilt it (tests).
	incremental, rebuilt int64
}

// incAgg is the incremental aggregate of a key's slices in [From, To)
// (see incSlices), written by the operator instance Owner.
type incAgg[A any] struct {
	Owner         uint64
	Built         bool
	From, Mid, To int64
	// Front is a stack: its last entry is the suffix aggregate of the
	// earliest front slice, Front[i].Start the start of that slice.
	Front []aggSlice[A]
	// Back merges the slices of [Mid, To) when HasBack.
	Back    A
	HasBack bool
}

func newIncSlices[K comparable, T, A, R any](agg AggregateFunction[T, A, R], out Collector[WindowResult[K, R]]) *incSlices[K, T, A, R] {
	return &incSlices[K, T, A, R]{aggSlices: newAggSlices[K, T, A, R](agg, out)}
}

func (s *incSlices[K, T, A, R]) open(b state.Backend, keys *state.KeyContext[K], name string) error {
	if err := s.aggSlices.open(b, keys, name); err != nil {
		return err
	}
	var err error
	s.inc, err = state.NewValue[K, incAgg[A]](b, keys, state.ValueDescriptor[incAgg[A]]{Name: name + "/incremental"})
	s.owner, s.maxTo = rand.Uint64()|1, math.MinInt64
	return err
}

func (s *incSlices[K, T, A, R]) add(p int64, v T) bool {
	created := s.aggSlices.add(p, v)
	if p < s.maxTo {
		if a, ok := s.inc.Get(); ok && a.Owner == s.owner && a.Built && p >= a.From && p < a.To {
			s.inc.Clear()
		}
	}
	return created
}

// copyOf returns a fresh accumulator equal to a: Merge may change its
// first argument, never its second.
func (s *incSlices[K, T, A, R]) copyOf(a A) A { return s.merger.Merge(s.agg.CreateAccumulator(), a) }

func (s *incSlices[K, T, A, R]) fire(key K, w Window) error {
	set, ok := s.st.Get()
	if !ok {
		return nil
	}
	a, _ := s.inc.Get()
	if a.Owner != s.owner {
		a = incAgg[A]{Front: a.Front[:0]}
	}
	if a.Built && w.Start < a.From {
		// A window fired again, before the incremental aggregate.
		return s.aggSlices.fire(key, w)
	}
	if !a.Built || w.Start >= a.Mid {
		s.flip(&a, set.Slices, w)
		s.rebuilt++
	} else {
		s.advance(&a, set.Slices, w)
		s.incremental++
	}
	a.Owner = s.owner
	s.maxTo = max(s.maxTo, a.To)
	s.inc.Update(a)
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
func (s *incSlices[K, T, A, R]) flip(a *incAgg[A], sl []aggSlice[A], w Window) {
	clear(a.Front)
	*a = incAgg[A]{Front: a.Front[:0]}
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
}

// advance moves the incremental aggregate to w, which starts in
// [From, Mid): the slices of [To, w.End) join the back, the front's
// suffixes of the slices before w.Start leave.
func (s *incSlices[K, T, A, R]) advance(a *incAgg[A], sl []aggSlice[A], w Window) {
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
}

// drop removes the oldest slices while done holds for them, and the
// incremental aggregate with the last one. No window to come holds a
// dropped slice, so the incremental aggregate stays: the next window
// starts after the dropped slices, and drops their suffixes or flips.
func (s *incSlices[K, T, A, R]) drop(done func(p int64) bool) int {
	n := s.aggSlices.drop(done)
	if n == 0 {
		s.inc.Clear()
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
