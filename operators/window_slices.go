package operators

import (
	"slices"

	"github.com/edgedio/edged/state"
)

// sliceStore keeps the slices of the current key for tumbling and sliding
// windows and computes window results from them.
type sliceStore[K comparable, T any] interface {
	open(b state.Backend, keys *state.KeyContext[K], name string) error
	// add adds v to the slice starting at p and returns the current key's
	// pending window-end timer as next does (0: none).
	add(p int64, v T) int64
	// first returns the first result fn gives (ok) for the current key's
	// slice starts, in order.
	first(fn func(p int64) (int64, bool)) (int64, bool)
	// next and setNext keep the current key's pending window-end timer
	// with its slices.
	next() (int64, bool)
	setNext(ts int64)
	// fire emits the result of window w if any slice lies in it.
	fire(key K, w Window) error
	// drop removes the oldest slices while done holds for them (done must
	// hold for a prefix of the slices in order) and reports how many
	// remain.
	drop(done func(p int64) bool) int
}

// aggSlice is the accumulator of one slice.
type aggSlice[A any] struct {
	Start int64
	Acc   A
}

// sliceSet is what aggSlices keeps per key: its slices in order and its
// pending window-end timer (0: none).
type sliceSet[A any] struct {
	Next   int64
	Slices []aggSlice[A]
}

// aggSlices keeps the accumulators of all slices of a key in one state
// entry, in order: adding a record costs one state access whatever the
// number of slices, and a window's result combines its slices without
// further state access.
type aggSlices[K comparable, T, A, R any] struct {
	agg    AggregateFunction[T, A, R]
	merger Merger[A]
	out    Collector[WindowResult[K, R]]
	st     state.Value[sliceSet[A]]
}

func newAggSlices[K comparable, T, A, R any](agg AggregateFunction[T, A, R], out Collector[WindowResult[K, R]]) *aggSlices[K, T, A, R] {
	m, _ := agg.(Merger[A])
	return &aggSlices[K, T, A, R]{agg: agg, merger: m, out: out}
}

func (s *aggSlices[K, T, A, R]) open(b state.Backend, keys *state.KeyContext[K], name string) error {
	st, err := state.NewValue[K, sliceSet[A]](b, keys, state.ValueDescriptor[sliceSet[A]]{Name: name})
	s.st = st
	return err
}

func findSlice[A any](sl []aggSlice[A], p int64) (int, bool) {
	// The newest slice is the usual one, or a new one after it.
	if n := len(sl); n > 0 && sl[n-1].Start <= p {
		if sl[n-1].Start == p {
			return n - 1, true
		}
		return n, false
	}
	return slices.BinarySearchFunc(sl, p, func(x aggSlice[A], p int64) int {
		switch {
		case x.Start < p:
			return -1
		case x.Start > p:
			return 1
		}
		return 0
	})
}

func (s *aggSlices[K, T, A, R]) add(p int64, v T) int64 {
	set, _ := s.st.Get()
	sl := set.Slices
	i, found := findSlice(sl, p)
	if found {
		sl[i].Acc = s.agg.Add(v, sl[i].Acc)
	} else {
		set.Slices = slices.Insert(sl, i, aggSlice[A]{Start: p, Acc: s.agg.Add(v, s.agg.CreateAccumulator())})
	}
	s.st.Update(set)
	return set.Next
}

func (s *aggSlices[K, T, A, R]) first(fn func(p int64) (int64, bool)) (int64, bool) {
	set, _ := s.st.Get()
	for _, x := range set.Slices {
		if r, ok := fn(x.Start); ok {
			return r, true
		}
	}
	return 0, false
}

func (s *aggSlices[K, T, A, R]) next() (int64, bool) {
	set, ok := s.st.Get()
	return set.Next, ok && set.Next != 0
}

func (s *aggSlices[K, T, A, R]) setNext(ts int64) {
	set, _ := s.st.Get()
	set.Next = ts
	s.st.Update(set)
}

func (s *aggSlices[K, T, A, R]) fire(key K, w Window) error {
	set, _ := s.st.Get()
	s.fireSlices(key, w, set.Slices)
	return nil
}

// fireSlices emits the result of window w, merging its slices of sl, if
// any lies in it.
func (s *aggSlices[K, T, A, R]) fireSlices(key K, w Window, sl []aggSlice[A]) {
	i, _ := findSlice(sl, w.Start)
	j := i
	for j < len(sl) && sl[j].Start < w.End {
		j++
	}
	switch j - i {
	case 0:
	case 1:
		s.out.Collect(WindowResult[K, R]{Key: key, Window: w, Value: s.agg.Result(sl[i].Acc)})
	default:
		acc := s.agg.CreateAccumulator()
		for _, x := range sl[i:j] {
			acc = s.merger.Merge(acc, x.Acc)
		}
		s.out.Collect(WindowResult[K, R]{Key: key, Window: w, Value: s.agg.Result(acc)})
	}
}

func (s *aggSlices[K, T, A, R]) drop(done func(p int64) bool) int {
	set, _ := s.st.Get()
	sl := set.Slices
	n := 0
	for n < len(sl) && done(sl[n].Start) {
		n++
	}
	switch {
	case n == len(sl):
		s.st.Clear()
	case n > 0:
		// Dropping from the front of the backing array costs what it
		// drops, not a shift of the slices that stay; appends reuse the
		// array's tail and move the slices to a new one when it is full.
		clear(sl[:n])
		set.Slices = sl[n:]
		s.st.Update(set)
		return len(set.Slices)
	}
	return len(sl) - n
}

// listSlices keeps every record, in a list per slice, with the slice starts
// of each key in order.
type listSlices[K comparable, T, O any] struct {
	fn      ProcessWindowFunction[K, T, O]
	out     Collector[O]
	index   state.Value[sliceIndex]
	lists   state.NamespacedList[int64, T]
	scratch []T
}

func (s *listSlices[K, T, O]) open(b state.Backend, keys *state.KeyContext[K], name string) error {
	var err error
	if s.index, err = state.NewValue[K, sliceIndex](b, keys, state.ValueDescriptor[sliceIndex]{Name: name + "/slices"}); err != nil {
		return err
	}
	s.lists, err = state.NewNamespacedList[K, int64, T](b, keys, state.ListDescriptor[T]{Name: name})
	return err
}

// sliceIndex is what listSlices keeps per key besides the lists: the
// slice starts in order and the pending window-end timer (0: none).
type sliceIndex struct {
	Next   int64
	Starts []int64
}

func (s *listSlices[K, T, O]) add(p int64, v T) int64 {
	ix, _ := s.index.Get()
	i, found := slices.BinarySearch(ix.Starts, p)
	if !found {
		ix.Starts = slices.Insert(ix.Starts, i, p)
		s.index.Update(ix)
	}
	s.lists.SetNamespace(p)
	s.lists.Add(v)
	return ix.Next
}

func (s *listSlices[K, T, O]) first(fn func(p int64) (int64, bool)) (int64, bool) {
	ix, _ := s.index.Get()
	for _, p := range ix.Starts {
		if r, ok := fn(p); ok {
			return r, true
		}
	}
	return 0, false
}

func (s *listSlices[K, T, O]) next() (int64, bool) {
	ix, ok := s.index.Get()
	return ix.Next, ok && ix.Next != 0
}

func (s *listSlices[K, T, O]) setNext(ts int64) {
	ix, _ := s.index.Get()
	ix.Next = ts
	s.index.Update(ix)
}

func (s *listSlices[K, T, O]) fire(key K, w Window) error {
	ix, _ := s.index.Get()
	idx := ix.Starts
	s.scratch = s.scratch[:0]
	for _, p := range idx {
		if p >= w.Start && p < w.End {
			s.lists.SetNamespace(p)
			for v := range s.lists.All() {
				s.scratch = append(s.scratch, v)
			}
		}
	}
	if len(s.scratch) == 0 {
		return nil
	}
	err := s.fn.Process(key, w, s.scratch, s.out)
	clear(s.scratch)
	return err
}

func (s *listSlices[K, T, O]) drop(done func(p int64) bool) int {
	ix, _ := s.index.Get()
	idx := ix.Starts
	n := 0
	for n < len(idx) && done(idx[n]) {
		s.lists.SetNamespace(idx[n])
		s.lists.Clear()
		n++
	}
	switch {
	case n == len(idx):
		s.index.Clear()
	case n > 0:
		ix.Starts = idx[n:]
		s.index.Update(ix)
		return len(ix.Starts)
	}
	return len(idx) - n
}
