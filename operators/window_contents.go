package operators

import (
	"fmt"

	"github.com/edgedio/edged/state"
)

// Merger is implemented by aggregate functions whose accumulators can be
// combined: sliding windows (whose slices are combined per window) and
// session windows (which merge) need it. Merge must not modify b.
type Merger[A any] interface {
	Merge(a, b A) A
}

// ProcessWindowFunction gets all records of a window at once, when it
// fires: Flink's ProcessWindowFunction. elements is valid only during the
// call. An error fails the task.
type ProcessWindowFunction[K comparable, T, O any] interface {
	Process(key K, w Window, elements []T, out Collector[O]) error
}

// ProcessWindowFunc adapts a function to a ProcessWindowFunction.
type ProcessWindowFunc[K comparable, T, O any] func(key K, w Window, elements []T, out Collector[O]) error

// Process calls f.
func (f ProcessWindowFunc[K, T, O]) Process(key K, w Window, elements []T, out Collector[O]) error {
	return f(key, w, elements, out)
}

// contents stores the records of windows (or of the slices windows are made
// of) for the current key, under a namespace N, and computes results.
type contents[K comparable, N comparable, T any] interface {
	open(b state.Backend, keys *state.KeyContext[K], name string) error
	add(ns N, v T)
	clear(ns N)
	// merge moves the contents of sources into target (session windows).
	merge(target N, sources []N)
	// fire emits the result of window w made of parts, if any is non-empty.
	fire(key K, w Window, parts []N) error
}

// aggContents keeps one accumulator per namespace.
type aggContents[K comparable, N comparable, T, A, R any] struct {
	agg    AggregateFunction[T, A, R]
	merger Merger[A]
	out    Collector[WindowResult[K, R]]
	st     state.NamespacedValue[N, A]
}

func newAggContents[K comparable, N comparable, T, A, R any](agg AggregateFunction[T, A, R], out Collector[WindowResult[K, R]]) *aggContents[K, N, T, A, R] {
	m, _ := agg.(Merger[A])
	return &aggContents[K, N, T, A, R]{agg: agg, merger: m, out: out}
}

func (c *aggContents[K, N, T, A, R]) open(b state.Backend, keys *state.KeyContext[K], name string) error {
	st, err := state.NewNamespacedValue[K, N, A](b, keys, state.ValueDescriptor[A]{Name: name})
	c.st = st
	return err
}

func (c *aggContents[K, N, T, A, R]) add(ns N, v T) {
	c.st.SetNamespace(ns)
	acc, ok := c.st.Get()
	if !ok {
		acc = c.agg.CreateAccumulator()
	}
	c.st.Update(c.agg.Add(v, acc))
}

func (c *aggContents[K, N, T, A, R]) clear(ns N) {
	c.st.SetNamespace(ns)
	c.st.Clear()
}

func (c *aggContents[K, N, T, A, R]) merge(target N, sources []N) {
	c.st.SetNamespace(target)
	acc, ok := c.st.Get()
	if !ok {
		acc = c.agg.CreateAccumulator()
	}
	for _, s := range sources {
		c.st.SetNamespace(s)
		if a, ok := c.st.Get(); ok {
			acc = c.merger.Merge(acc, a)
			c.st.Clear()
		}
	}
	c.st.SetNamespace(target)
	c.st.Update(acc)
}

func (c *aggContents[K, N, T, A, R]) fire(key K, w Window, parts []N) error {
	if len(parts) == 1 {
		c.st.SetNamespace(parts[0])
		if acc, ok := c.st.Get(); ok {
			c.out.Collect(WindowResult[K, R]{Key: key, Window: w, Value: c.agg.Result(acc)})
		}
		return nil
	}
	var acc A
	have := false
	for _, p := range parts {
		c.st.SetNamespace(p)
		a, ok := c.st.Get()
		if !ok {
			continue
		}
		if !have {
			acc, have = c.agg.CreateAccumulator(), true
		}
		acc = c.merger.Merge(acc, a)
	}
	if have {
		c.out.Collect(WindowResult[K, R]{Key: key, Window: w, Value: c.agg.Result(acc)})
	}
	return nil
}

// needsMerge reports an error when windows that combine accumulators get
// an aggregate function without Merge.
func (c *aggContents[K, N, T, A, R]) needsMerge(a WindowAssigner) error {
	if c.merger == nil && (a.kind == session || a.pane() != a.size) {
		return fmt.Errorf("operators: %s combine accumulators: the aggregate function %T needs a Merge(a, b) method", a, c.agg)
	}
	return nil
}

// listContents keeps every record, for a ProcessWindowFunction.
type listContents[K comparable, N comparable, T, O any] struct {
	fn      ProcessWindowFunction[K, T, O]
	out     Collector[O]
	st      state.NamespacedList[N, T]
	scratch []T
}

func (c *listContents[K, N, T, O]) open(b state.Backend, keys *state.KeyContext[K], name string) error {
	st, err := state.NewNamespacedList[K, N, T](b, keys, state.ListDescriptor[T]{Name: name})
	c.st = st
	return err
}

func (c *listContents[K, N, T, O]) add(ns N, v T) {
	c.st.SetNamespace(ns)
	c.st.Add(v)
}

func (c *listContents[K, N, T, O]) clear(ns N) {
	c.st.SetNamespace(ns)
	c.st.Clear()
}

func (c *listContents[K, N, T, O]) merge(target N, sources []N) {
	c.st.MergeNamespaces(target, sources...)
}

func (c *listContents[K, N, T, O]) fire(key K, w Window, parts []N) error {
	c.scratch = c.scratch[:0]
	for _, p := range parts {
		c.st.SetNamespace(p)
		for v := range c.st.All() {
			c.scratch = append(c.scratch, v)
		}
	}
	if len(c.scratch) == 0 {
		return nil
	}
	err := c.fn.Process(key, w, c.scratch, c.out)
	clear(c.scratch)
	return err
}
