package actors

import (
	"strings"
	"sync/atomic"
	"testing"

	"github.com/edgedio/edged/operators"
)

// panicClose is a sink whose Close panics.
type panicClose struct{ operators.Base }

func (panicClose) Collect(int64) {}
func (panicClose) Close() error  { panic("Close broke") }

// closeCounter is a source that counts its Close calls.
type closeCounter struct {
	countingSource
	closed *atomic.Int64
}

func (c *closeCounter) Close() error {
	c.closed.Add(1)
	return nil
}

// A panic in an operator's Close (user code: a sink's Close, the Abort a
// two-phase-commit sink calls there) fails the run with a TaskError
// naming the operator, with the panic's stack, and the other operators
// are closed too; the caller's goroutine goes on. Before, the panic
// unwound Run, and with it the caller of Execute: the program crashed.
func TestClosePanicFailsTheRun(t *testing.T) {
	for _, part := range []Partition{Rebalance, Forward} {
		t.Run(part.String(), func(t *testing.T) {
			closed := new(atomic.Int64)
			s := &Vertex{ID: 0, Name: "src", UID: "src", Parallelism: 1, Out: intType(),
				NewSource: func(*operators.Context) (operators.Operator, error) {
					return &closeCounter{countingSource: countingSource{n: 10, emitted: new(atomic.Int64)}, closed: closed}, nil
				}}
			k := &Vertex{ID: 1, Name: "sink", UID: "sink", Parallelism: 1, In: intType(),
				NewOperator: func(*operators.Context, any) (operators.Operator, any, error) {
					return panicClose{}, panicClose{}, nil
				}}
			job := &Job{Name: "close", Vertices: []*Vertex{s, k}, Edges: []*Edge{{From: s, To: k, Partition: part}}}
			err, te := runTaskError(t, job)
			if te.Operator != "sink" || !te.Panic || !strings.Contains(te.Err.Error(), "Close broke") || len(te.Stack) == 0 {
				t.Fatalf("TaskError %+v, want a panic of operator sink with its stack", te)
			}
			if !strings.Contains(err.Error(), `close operator "sink" subtask 0`) {
				t.Fatalf("Run returned %q, want it to say the close failed", err)
			}
			if closed.Load() != 1 {
				t.Fatalf("the source was closed %d times, want once", closed.Load())
			}
		})
	}
}
