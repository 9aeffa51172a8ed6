package stream_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/edgedio/edged/codec"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/state"
	"github.com/edgedio/edged/stream"
)

// unexportedEvent is the record type a user writes first: its fields are
// unexported, so no codec reaches them.
type unexportedEvent struct {
	key string
	n   int
}

// A job with a checkpoint directory whose keyed state has a type without a
// codec fails when its operator opens, naming the state and the field,
// before reading a record, on the memory backend as on bolt. Before, on the
// memory backend, it ran until its first snapshot (for a bounded job with
// only savepoints: its final checkpoint, after all its input) and failed
// there, so that its exactly-once sinks committed nothing of what it had
// computed, and every restart computed it all again.
func TestStateWithoutCodecFailsAtOpenWithCheckpoints(t *testing.T) {
	for _, bolt := range []bool{false, true} {
		name := map[bool]string{false: "memory", true: "bolt"}[bolt]
		t.Run(name, func(t *testing.T) {
			cfg := snapshot.DefaultConfig()
			cfg.Dir = t.TempDir()
			opts := []stream.Option{stream.WithCheckpointing(cfg)}
			if bolt {
				opts = append(opts, stream.WithBoltStateBackend(t.TempDir()))
			}
			env := stream.NewEnvironment("uncodable-"+name, opts...)
			events := stream.FromSource(env, "gen", func() operators.Source[unexportedEvent] {
				return operators.NewGenerator(operators.GeneratorConfig{Count: 100}, func(i int64) unexportedEvent {
					return unexportedEvent{key: string(rune('a' + i%3)), n: int(i)}
				})
			}).UID("gen")
			sums := stream.KeyBy(events, func(e unexportedEvent) string { return e.key }).
				Reduce("sum", func(a, b unexportedEvent) (unexportedEvent, error) { return unexportedEvent{a.key, a.n + b.n}, nil }).UID("sum")
			sink := operators.NewCollectSink[unexportedEvent]()
			sums.To("collect", sink.Subtask).UID("collect")

			err := env.Execute(context.Background())
			if !errors.Is(err, codec.ErrUnsupported) || !strings.Contains(err.Error(), `state "reduce"`) ||
				!strings.Contains(err.Error(), "field key") || !strings.Contains(err.Error(), "open") {
				t.Fatalf("Execute = %v; want a failure at open wrapping codec.ErrUnsupported, naming state \"reduce\" and field key", err)
			}
			if n := sink.Len(); n != 0 {
				t.Errorf("the job emitted %d results before failing; want none", n)
			}
		})
	}

	// Without a checkpoint directory nothing is snapshotted: the job runs.
	env := stream.NewEnvironment("uncodable-plain")
	events := stream.FromSource(env, "gen", func() operators.Source[unexportedEvent] {
		return operators.NewGenerator(operators.GeneratorConfig{Count: 100}, func(i int64) unexportedEvent {
			return unexportedEvent{key: string(rune('a' + i%3)), n: int(i)}
		})
	})
	sink := operators.NewCollectSink[unexportedEvent]()
	stream.KeyBy(events, func(e unexportedEvent) string { return e.key }).
		Reduce("sum", func(a, b unexportedEvent) (unexportedEvent, error) { return unexportedEvent{a.key, a.n + b.n}, nil }).UID("sum").
		To("collect", sink.Subtask)
	if err := env.Execute(context.Background()); err != nil || sink.Len() != 100 {
		t.Fatalf("without checkpoints: Execute = %v with %d results; want nil, 100", err, sink.Len())
	}
}

// bufferOp keeps the records it saw in operator list state of their own
// type (as a user's buffering operator would) and passes them on.
type bufferOp struct {
	operators.Base
	out  operators.Collector[unexportedEvent]
	seen state.OperatorList[unexportedEvent]
}

func (o *bufferOp) Open(ctx *operators.Context) (err error) {
	o.seen, err = state.ListState[unexportedEvent](ctx.OperatorState, "seen")
	return err
}

func (o *bufferOp) Collect(e unexportedEvent) {
	o.seen.Add(e)
	o.out.Collect(e)
}

// The same for operator state: with a checkpoint directory, a list state
// whose element type has no codec fails when the operator opens, naming
// the state, before a record is read; without one the job runs.
func TestOperatorStateWithoutCodecFailsAtOpenWithCheckpoints(t *testing.T) {
	run := func(opts ...stream.Option) (int, error) {
		env := stream.NewEnvironment("uncodable-op", opts...)
		events := stream.FromSource(env, "gen", func() operators.Source[unexportedEvent] {
			return operators.NewGenerator(operators.GeneratorConfig{Count: 100}, func(i int64) unexportedEvent {
				return unexportedEvent{key: "k", n: int(i)}
			})
		}).UID("gen")
		sink := operators.NewCollectSink[unexportedEvent]()
		stream.Transform(events, "buffer", func(out operators.Collector[unexportedEvent]) operators.OneInput[unexportedEvent] {
			return &bufferOp{out: out}
		}).UID("buffer").To("collect", sink.Subtask).UID("collect")
		err := env.Execute(context.Background())
		return sink.Len(), err
	}
	cfg := snapshot.DefaultConfig()
	cfg.Dir = t.TempDir()
	n, err := run(stream.WithCheckpointing(cfg))
	if !errors.Is(err, codec.ErrUnsupported) || !strings.Contains(err.Error(), `operator state "seen"`) || !strings.Contains(err.Error(), "open") {
		t.Fatalf("Execute = %v; want a failure at open wrapping codec.ErrUnsupported, naming operator state \"seen\"", err)
	}
	if n != 0 {
		t.Errorf("the job emitted %d results before failing; want none", n)
	}
	if n, err := run(); err != nil || n != 100 {
		t.Fatalf("without checkpoints: Execute = %v with %d results; want nil, 100", err, n)
	}
}
