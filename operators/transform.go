package operators

import "errors"

// Map applies a function to every record. An error from the function fails
// the task.
type Map[T, U any] struct {
	Base
	fn  func(T) (U, error)
	out Collector[U]
}

// NewMap returns a Map operator emitting fn(v) to out for every v.
func NewMap[T, U any](fn func(T) (U, error), out Collector[U]) *Map[T, U] {
	return &Map[T, U]{fn: fn, out: out}
}

// Collect maps v and emits the result.
func (m *Map[T, U]) Collect(v T) {
	u, err := m.fn(v)
	if err != nil {
		Fail(err)
	}
	m.out.Collect(u)
}

// Filter keeps the records for which a predicate holds.
type Filter[T any] struct {
	Base
	fn  func(T) bool
	out Collector[T]
}

// NewFilter returns a Filter operator emitting the v for which fn(v) holds.
func NewFilter[T any](fn func(T) bool, out Collector[T]) *Filter[T] {
	return &Filter[T]{fn: fn, out: out}
}

// Collect emits v when the predicate holds.
func (f *Filter[T]) Collect(v T) {
	if f.fn(v) {
		f.out.Collect(v)
	}
}

// FlatMap emits zero or more records for every record. An error from the
// function fails the task.
type FlatMap[T, U any] struct {
	Base
	fn  func(T, Collector[U]) error
	out Collector[U]
}

// NewFlatMap returns a FlatMap operator; fn emits into the collector it is
// given.
func NewFlatMap[T, U any](fn func(T, Collector[U]) error, out Collector[U]) *FlatMap[T, U] {
	return &FlatMap[T, U]{fn: fn, out: out}
}

// Collect calls the function on v.
func (f *FlatMap[T, U]) Collect(v T) {
	if err := f.fn(v, f.out); err != nil {
		Fail(err)
	}
}

// SinkFunc adapts a function to a Sink: it is called for every record and
// an error fails the task.
type SinkFunc[T any] struct {
	Base
	fn func(T) error
}

// NewSinkFunc returns a sink calling fn for every record.
func NewSinkFunc[T any](fn func(T) error) *SinkFunc[T] { return &SinkFunc[T]{fn: fn} }

// Open refuses a nil function: the first record would fail the task with
// a nil pointer dereference that names no argument.
func (s *SinkFunc[T]) Open(*Context) error {
	if s.fn == nil {
		return errors.New("sink: the function is nil: give NewSinkFunc a func(T) error")
	}
	return nil
}

// Collect calls the function on v.
func (s *SinkFunc[T]) Collect(v T) {
	if err := s.fn(v); err != nil {
		Fail(err)
	}
}
