package operators

import (
	"errors"
	"fmt"
)

// ErrNotKeyed is returned when keyed state is used outside a keyed context.
var ErrNotKeyed = errors.New("operators: keyed state used on a stream that is not keyed")

// ErrSourcePositionGone is wrapped by a source's restore when its input
// no longer holds the position the snapshot recorded: the records the
// snapshot read are gone (an ingest log that ends before the snapshot's
// offset: a damaged or truncated last segment, or another log). No
// restart can cure it, so the job fails at once whatever its restart
// strategy, rather than restart until new input fills the gap and the
// restore lands on records the snapshot never read.
var ErrSourcePositionGone = errors.New("operators: the source's input no longer holds the snapshot's position")

// ErrClosed is wrapped by the failure of work an operator's Close cut
// short (a write-ahead sink's background publish).
var ErrClosed = errors.New("operators: operator closed")

// Failure is the panic value with which an operator aborts the record it is
// processing because a user function returned an error. The task runtime
// recovers it (and any other panic) and fails the task.
type Failure struct {
	Err error
}

// Error returns the cause's text.
func (f *Failure) Error() string { return f.Err.Error() }

// Unwrap returns the cause.
func (f *Failure) Unwrap() error { return f.Err }

// Fail aborts the current record with err; the task fails with it.
func Fail(err error) {
	panic(&Failure{Err: err})
}

// Failf aborts the current record with a formatted error.
func Failf(format string, args ...any) {
	Fail(fmt.Errorf(format, args...))
}
