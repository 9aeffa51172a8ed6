package operators

import (
	"slices"

	"github.com/edgedio/edged/state"
)

// sliceStore keeps the slices of the current key for tumbling and sliding
// windows and computes window results from them.
type sliceStore[K comparable, T any] interface {
	open(b state.Backend, keys *state.KeyContext[K], name string) error
	// add adds v to the slice starting at p and reports whether the slice
	// is new.
	add(p int64, v T) bool
	// starts appends the slice starts of the current key, in order, to dst.
	starts(dst []int64) []int64
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

// aggSlices keeps the accumulators of all slices of a key in one state
// entry, in order: adding a record costs one state access whatever the
// number of slices, and a window's result combines its slices without
// further state access.
type aggSlices[K comparable, T, A, R any] struct {
	agg    AggregateFunction[T, A, R]
	merger Merger[A]
	out    Collector[WindowResult[K, R]]
	st     state.Value[[]aggSlice[A]]
}

func newAggSlices[K comparable, T, A, R any](agg AggregateFunction[T, A, R], out Collector[WindowResult[K, R]]) *aggSlices[K, T, A, R] {
	m, _ := agg.(Merger[A])
	return &aggSlices[K, T, A, R]{agg: agg, merger: m, out: out}
}

func (s *aggSlices[K, T, A, R]) open(b state.Backend, keys *state.KeyContext[K], name string) error {
	st, err := state.NewValue[K, []aggSlice[A]](b, keys, state.ValueDescriptor[[]aggSlice[A]]{Name: name})
	s.st = st
	return err
}

func findSlice[A any](sl []aggSlice[A], p int64) (int, bool) {
	// The newest slice is the usual one.
	if n := len(sl); n > 0 && sl[n-1].Start == p {
		return n - 1, true
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

func (s *aggSlices[K, T, A, R]) add(p int64, v T) bool {
	sl, _ := s.st.Get()
	i, found := findSlice(sl, p)
	if found {
		sl[i].Acc = s.agg.Add(v, sl[i].Acc)
	} else {
		sl = slices.Insert(sl, i, aggSlice[A]{Start: p, Acc: s.agg.Add(v, s.agg.CreateAccumulator())})
	}
	s.st.Update(sl)
	return !found
}

func (s *aggSlices[K, T, A, R]) starts(dst []int64) []int64 {
	sl, _ := s.st.Get()
	for _, x := range sl {
		dst = append(dst, x.Start)
	}
	return dst
}

func (s *aggSlices[K, T, A, R]) fire(key K, w Window) error {
	sl, _ := s.st.Get()
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

func (s *aggSlices[K, T, A, R]) drop(done func(p int64) bool) int {
	sl, _ := s.st.Get()
	n := 0
	for n < len(sl) && done(sl[n].Start) {
		n++
	}
	switch {
	case n == len(sl):
		s.st.Clear()
	case n > 0:
		keep := slices.Delete(sl, 0, n)
		s.st.Update(keep)
		return len(keep)
	}
	return len(sl) - n
}

// listSlices keeps every record, in a list per slice, with the slice starts
// of each key in order.
type listSlices[K comparable, T, O any] struct {
	fn      ProcessWindowFunction[K, T, O]
	out     Collector[O]
	index   state.Value[[]int64]
	lists   state.NamespacedList[int64, T]
	scratch []T
}

func (s *listSlices[K, T, O]) open(b state.Backend, keys *state.KeyContext[K], name string) error {
	var err error
	if s.index, err = state.NewValue[K, []int64](b, keys, state.ValueDescriptor[[]int64]{Name: name + "/slices"}); err != nil {
		return err
	}
	s.lists, err = state.NewNamespacedList[K, int64, T](b, keys, state.ListDescriptor[T]{Name: name})
	return err
}

func (s *listSlices[K, T, O]) add(p int64, v T) bool {
	idx, _ := s.index.Get()
	i, found := slices.BinarySearch(idx, p)
	if !found {
		s.index.Update(slices.Insert(idx, i, p))
	}
	s.lists.SetNamespace(p)
	s.lists.Add(v)
	return !found
}

func (s *listSlices[K, T, O]) starts(dst []int64) []int64 {
	idx, _ := s.index.Get()
	return append(dst, idx...)
}

func (s *listSlices[K, T, O]) fire(key K, w Window) error {
	idx, _ := s.index.Get()
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
	idx, _ := s.index.Get()
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
		keep := slices.Delete(idx, 0, n)
		s.index.Update(keep)
		return len(keep)
	}
	return len(idx) - n
}
