package stream_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/state"
	"github.com/edgedio/edged/stream"
)

// keyCounter counts the records of each key in keyed state.
type keyCounter struct {
	operators.KeyedProcessBase[int64, int64]
	count state.Value[int64]
}

func (c *keyCounter) Open(rt *operators.KeyedRuntime[int64]) error {
	var err error
	c.count, err = state.NewValue(rt.Backend(), rt.Keys(), state.ValueDescriptor[int64]{Name: "count"})
	return err
}

func (c *keyCounter) ProcessElement(_ int64, ctx *operators.KeyedContext[int64, int64]) error {
	n, _ := c.count.Get()
	c.count.Update(n + 1)
	ctx.Emit(n + 1)
	return nil
}

// broadcastCounter is keyCounter as a broadcast function.
type broadcastCounter struct{ keyCounter }

func (c *broadcastCounter) Open(rt *operators.BroadcastRuntime[int64]) error {
	var err error
	c.count, err = state.NewValue(rt.Backend(), rt.Keys(), state.ValueDescriptor[int64]{Name: "count"})
	return err
}

func (*broadcastCounter) ProcessBroadcastElement(int64, *operators.BroadcastContext[int64]) error {
	return nil
}

// The function factories of KeyedProcess and ConnectBroadcast are called
// once per subtask for a new function: a factory that returns one
// instance to two subtasks fails the job with a TaskError naming the
// operator and saying so. Before, the instance kept the state handles of
// the subtask that opened it last, and the other subtask's records read
// and wrote that subtask's state under its current key, from another
// goroutine: the job failed with state.ErrNoCurrentKey, which told the
// user to use state in ProcessElement (where it was used), or, once both
// subtasks had a key, counted into the wrong key. A factory that returns
// a new function each time runs.
func TestSharedKeyedFunctionIsRefused(t *testing.T) {
	const n = 2000
	key := func(i int64) int64 { return i % 10 }
	cases := []struct {
		name  string
		build func(env *stream.Environment, shared bool) *stream.Stream[int64]
	}{
		{"KeyedProcess", func(env *stream.Environment, shared bool) *stream.Stream[int64] {
			one := &keyCounter{}
			return stream.KeyedProcess(stream.KeyBy(stream.FromSource(env, "src", ints(n)), key), "count",
				func() operators.KeyedProcessFunction[int64, int64, int64] {
					if shared {
						return one
					}
					return &keyCounter{}
				}).UID("count")
		}},
		{"ConnectBroadcast", func(env *stream.Environment, shared bool) *stream.Stream[int64] {
			one := &broadcastCounter{}
			rules := stream.FromSource(env, "rules", ints(1))
			return stream.ConnectBroadcast(stream.KeyBy(stream.FromSource(env, "src", ints(n)), key), rules, "count",
				func() operators.KeyedBroadcastProcessFunction[int64, int64, int64, int64] {
					if shared {
						return one
					}
					return &broadcastCounter{}
				}).UID("count")
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			env := stream.NewEnvironment("shared", stream.WithParallelism(2))
			c.build(env, true).ForEach("out", func(int64) error { return nil })
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			err := env.Execute(ctx)
			var te *actors.TaskError
			want := `stream: operator "count": the function factory returned the same *stream_test.`
			if !errors.As(err, &te) || te.Operator != "count" || !strings.Contains(err.Error(), want) ||
				!strings.Contains(err.Error(), "to subtasks 0 and 1") && !strings.Contains(err.Error(), "to subtasks 1 and 0") {
				t.Fatalf("Execute: %v, want a TaskError of operator \"count\" saying %q", err, want)
			}

			env = stream.NewEnvironment("fresh", stream.WithParallelism(2))
			sink := operators.NewCollectSink[int64]()
			c.build(env, false).To("out", sink.Subtask)
			if err := env.Execute(ctx); err != nil {
				t.Fatal(err)
			}
			if got := sink.Len(); got != n {
				t.Fatalf("%d results, want %d", got, n)
			}
			maxCount := int64(0)
			for _, v := range sink.Values() {
				maxCount = max(maxCount, v)
			}
			if maxCount != n/10 {
				t.Fatalf("the largest count is %d, want %d per key", maxCount, n/10)
			}
		})
	}
}

// forwarder is a keyed function without fields: every &forwarder{} may be
// the same address (Go allocates zero-size values at one place).
type forwarder struct {
	operators.KeyedProcessBase[int64, int64]
}

func (forwarder) ProcessElement(v int64, ctx *operators.KeyedContext[int64, int64]) error {
	ctx.Emit(v)
	return nil
}

// A factory that returns a new pointer to a function without fields at
// each call runs at any parallelism: the pointers may be equal (a
// zero-size value has one address), but such a function holds nothing a
// subtask could share.
func TestFieldlessKeyedFunctionRuns(t *testing.T) {
	const n = 1000
	env := stream.NewEnvironment("fieldless", stream.WithParallelism(2))
	sink := operators.NewCollectSink[int64]()
	stream.KeyedProcess(stream.KeyBy(stream.FromSource(env, "src", ints(n)), func(i int64) int64 { return i % 10 }), "fwd",
		func() operators.KeyedProcessFunction[int64, int64, int64] { return &forwarder{} }).UID("fwd").To("out", sink.Subtask)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := env.Execute(ctx); err != nil {
		t.Fatalf("Execute: %v", err)
	}
	if got := sink.Len(); got != n {
		t.Fatalf("%d results, want %d", got, n)
	}
}
