package watermark

import (
	"errors"
	"fmt"
	"time"
)

// DefaultInterval is the periodic emit interval of a Strategy whose
// Interval is 0.
const DefaultInterval = 200 * time.Millisecond

// Strategy says how a stream of T gets event time: where a record's
// timestamp comes from, how watermarks are generated, how often they are
// emitted, and when the stream counts as idle. Build one with
// ForBoundedOutOfOrderness, ForMonotonous or ForGenerator and refine it
// with WithIdleness and WithInterval; check it with Validate. A Strategy is
// a value: the With methods return a modified copy.
type Strategy[T any] struct {
	// Timestamp returns a record's event time in milliseconds since the
	// Unix epoch. It is called once per record on the task's goroutine and
	// must not block. Required.
	Timestamp func(T) int64
	// NewGenerator returns a fresh Generator; it is called once per
	// subtask. Required.
	NewGenerator func() Generator
	// IdleTimeout is how long a subtask may see no record before its
	// output is marked idle (rounded up to whole milliseconds). 0, the
	// default, means never idle.
	IdleTimeout time.Duration
	// Interval is the processing time between two calls of
	// Generator.OnPeriodicEmit, which is also when idleness is checked.
	// 0 means DefaultInterval (200ms); otherwise at least 1ms.
	Interval time.Duration
	// PerEvent also asks the generator for a watermark after every event,
	// not only every Interval: watermarks then follow the data whatever
	// the processing time (deterministic in tests, prompt for sparse
	// sensors) at the cost of one call per record.
	PerEvent bool

	// maxOutOfOrderness is what ForBoundedOutOfOrderness was given, kept
	// so that Validate can report it instead of NewGenerator panicking.
	maxOutOfOrderness time.Duration
}

// ForBoundedOutOfOrderness returns the strategy for records that arrive at
// most d late (see NewBoundedOutOfOrderness), with timestamps from ts.
func ForBoundedOutOfOrderness[T any](d time.Duration, ts func(T) int64) Strategy[T] {
	return Strategy[T]{
		Timestamp:         ts,
		NewGenerator:      func() Generator { return NewBoundedOutOfOrderness(d) },
		Interval:          DefaultInterval,
		maxOutOfOrderness: d,
	}
}

// ForMonotonous returns the strategy for records whose timestamps, taken
// from ts, never decrease (see NewMonotonous).
func ForMonotonous[T any](ts func(T) int64) Strategy[T] {
	return Strategy[T]{Timestamp: ts, NewGenerator: NewMonotonous, Interval: DefaultInterval}
}

// ForGenerator returns the strategy with a custom generator: newGen is
// called once per subtask; timestamps come from ts.
func ForGenerator[T any](ts func(T) int64, newGen func() Generator) Strategy[T] {
	return Strategy[T]{Timestamp: ts, NewGenerator: newGen, Interval: DefaultInterval}
}

// WithIdleness returns a copy of s whose output is marked idle after d
// without records (0: never).
func (s Strategy[T]) WithIdleness(d time.Duration) Strategy[T] {
	s.IdleTimeout = d
	return s
}

// WithInterval returns a copy of s that emits watermarks every d of
// processing time (0: DefaultInterval).
func (s Strategy[T]) WithInterval(d time.Duration) Strategy[T] {
	s.Interval = d
	return s
}

// WithPerEventEmit returns a copy of s that also emits a watermark after
// every event that advances it.
func (s Strategy[T]) WithPerEventEmit() Strategy[T] {
	s.PerEvent = true
	return s
}

// Validate reports every problem of s at once, each wrapping
// ErrInvalidStrategy.
func (s Strategy[T]) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidStrategy}, args...)...))
	}
	if s.Timestamp == nil {
		bad("timestamp must be set")
	}
	if s.NewGenerator == nil {
		bad("generator must be set")
	}
	if s.maxOutOfOrderness < 0 {
		bad("max_out_of_orderness (%s) must not be negative", s.maxOutOfOrderness)
	}
	if s.IdleTimeout < 0 {
		bad("idle_timeout (%s) must not be negative (0 disables idleness)", s.IdleTimeout)
	}
	if s.Interval < 0 || (s.Interval > 0 && s.Interval < time.Millisecond) {
		bad("interval (%s) must be 0 (default %s) or at least 1ms", s.Interval, DefaultInterval)
	}
	return errors.Join(errs...)
}
