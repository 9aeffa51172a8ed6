package operators

import (
	"slices"
	"sync"
)

// CollectSink keeps every record it receives in memory, for tests and
// examples. It is a store shared by all subtasks of the sink operator: give
// each subtask its own sink from Subtask, which writes into this store. The
// CollectSink itself is also a Sink whose methods are safe to call from
// several subtasks at once, for a runtime that shares one instance.
// Records of one subtask keep their order; those of different subtasks
// interleave.
type CollectSink[T any] struct {
	Base
	mu     sync.Mutex // guards values
	values []T
}

var _ Sink[string] = (*CollectSink[string])(nil)

// NewCollectSink returns an empty CollectSink.
func NewCollectSink[T any]() *CollectSink[T] {
	return &CollectSink[T]{}
}

// Subtask returns a sink for one subtask that adds what it collects to c.
func (c *CollectSink[T]) Subtask() Sink[T] {
	return &collectSubtask[T]{store: c}
}

// Collect adds v. Safe for concurrent use.
func (c *CollectSink[T]) Collect(v T) {
	c.mu.Lock()
	c.values = append(c.values, v)
	c.mu.Unlock()
}

// Values returns a copy of the records collected so far. Safe for
// concurrent use.
func (c *CollectSink[T]) Values() []T {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.values)
}

// Len returns the number of records collected so far. Safe for concurrent
// use.
func (c *CollectSink[T]) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.values)
}

// collectSubtask is the sink of one subtask of a CollectSink.
type collectSubtask[T any] struct {
	Base
	store *CollectSink[T]
}

// Collect adds v to the shared store.
func (s *collectSubtask[T]) Collect(v T) { s.store.Collect(v) }
