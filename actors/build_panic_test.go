package actors

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgedio/edged/operators"
)

// panicOpen is a sink whose Open panics.
type panicOpen struct{ operators.Base }

func (panicOpen) Open(*operators.Context) error { panic("Open broke") }
func (panicOpen) Collect(int64)                 {}

// okSink discards its records.
type okSink struct{ operators.Base }

func (okSink) Collect(int64) {}

// A panic in a factory or in Open while the tasks are built, or a factory
// that returns nil, fails the run with a TaskError naming the operator
// (also one chained behind another) and its subtask, as a panic while the
// task runs does; the caller's goroutine goes on.
func TestBuildPanicFailsTheRun(t *testing.T) {
	newSrc := func() (operators.Operator, error) {
		return &countingSource{n: 10, emitted: new(atomic.Int64)}, nil
	}
	cases := []struct {
		name     string
		src      func() (operators.Operator, error)
		sink     func() (operators.Operator, any, error)
		part     Partition
		operator string
		subtask  int
		panicked bool
		cause    string
	}{
		{"source factory panics", func() (operators.Operator, error) { panic("source factory broke") },
			func() (operators.Operator, any, error) { return okSink{}, okSink{}, nil }, Rebalance, "src", 0, true, "source factory broke"},
		{"source factory returns nil", func() (operators.Operator, error) { return nil, nil },
			func() (operators.Operator, any, error) { return okSink{}, okSink{}, nil }, Rebalance, "src", 0, false, "the source factory returned nil"},
		{"sink factory panics", newSrc,
			func() (operators.Operator, any, error) { panic(fmt.Errorf("sink factory broke")) }, Rebalance, "sink", 0, true, "sink factory broke"},
		{"sink factory returns nil", newSrc,
			func() (operators.Operator, any, error) { return nil, nil, nil }, Rebalance, "sink", 0, false, "the factory returned nil"},
		{"chained sink factory panics", newSrc,
			func() (operators.Operator, any, error) { panic("chained sink broke") }, Forward, "sink", 0, true, "chained sink broke"},
		{"chained sink's Open panics", newSrc,
			func() (operators.Operator, any, error) { return panicOpen{}, panicOpen{}, nil }, Forward, "sink", 0, true, "Open broke"},
		{"Fail in a factory", newSrc,
			func() (operators.Operator, any, error) { operators.Fail(errors.New("refused")); return nil, nil, nil }, Rebalance, "sink", 0, false, "refused"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := &Vertex{ID: 0, Name: "src", UID: "src", Parallelism: 1, Out: intType(),
				NewSource: func(*operators.Context) (operators.Operator, error) { return c.src() }}
			k := &Vertex{ID: 1, Name: "sink", UID: "sink", Parallelism: 1, In: intType(),
				NewOperator: func(*operators.Context, any) (operators.Operator, any, error) { return c.sink() }}
			job := &Job{Name: "build", Vertices: []*Vertex{s, k}, Edges: []*Edge{{From: s, To: k, Partition: c.part}}}
			_, te := runTaskError(t, job)
			if te.Operator != c.operator || te.Subtask != c.subtask || te.Panic != c.panicked || !strings.Contains(te.Err.Error(), c.cause) {
				t.Fatalf("TaskError %+v, want operator %q subtask %d panic %v cause %q", te, c.operator, c.subtask, c.panicked, c.cause)
			}
			if c.panicked && len(te.Stack) == 0 {
				t.Fatal("no stack for a panic")
			}
		})
	}
}

// runTaskError runs job for at most a minute and returns the error its
// run failed with and the *TaskError it must hold.
func runTaskError(t *testing.T, job *Job) (error, *TaskError) {
	t.Helper()
	r, err := NewRunner(job, DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = r.Run(ctx)
	var te *TaskError
	if !errors.As(err, &te) {
		t.Fatalf("Run returned %v (%T), want a *TaskError", err, err)
	}
	return err, te
}
