package stream

import (
	"fmt"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/operators"
)

// ConnectBroadcast joins a keyed stream with a stream broadcast to every
// subtask (the broadcast-state pattern: rules or thresholds applied to
// keyed records). fn is called once per subtask for a fresh function. The
// watermark of the operator is the minimum of both inputs, so a broadcast
// stream without timestamps should be bounded or marked idle. The operator
// needs a UID. b must come from k's Environment: Plan and Execute refuse a
// stream of another one, and a nil b.
func ConnectBroadcast[T any, K comparable, B, O any](k *KeyedStream[T, K], b *Stream[B], name string, fn func() operators.KeyedBroadcastProcessFunction[K, T, B, O]) *Stream[O] {
	k.must(called("ConnectBroadcast", name))
	env := k.s.env
	if fn == nil {
		env.nilFunc(name, "the function factory")
	}
	var seen instances
	v := &actors.Vertex{
		Name: name,
		In:   k.s.typ,
		In2:  typeOf[B](), // b's own below, where it has one
		Out:  typeOf[O](),
		NewOperator: func(ctx *operators.Context, out any) (operators.Operator, any, error) {
			f := made(fn())
			seen.fresh(name, ctx.Subtask, f)
			op := operators.NewKeyedBroadcastProcess(k.key, f, out.(operators.Collector[O]))
			return op, op.Inputs(), nil
		},
	}
	if b != nil {
		v.In2 = b.typ // a codec set with SetCodec
	}
	env.addVertex(v)
	k.s.connectInput(v, 0)
	if b == nil {
		env.addError(fmt.Errorf("stream: operator %q: the broadcast stream is nil", name))
	} else if b.env != env {
		// Its edge would go into b's job, which has no such operator (its
		// tasks failed with a panic), and this job would run without the
		// broadcast input.
		env.addError(fmt.Errorf("stream: operator %q: the broadcast stream is from another environment", name))
	} else {
		b.Broadcast().connectInput(v, 1)
	}
	out := newStream[O](env, v)
	env.keyedState(v, "keyed-broadcast-process")
	return out
}
