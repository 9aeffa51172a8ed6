package stream

import (
	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/watermark"
)

// AssignTimestampsAndWatermarks gives every record its event timestamp and
// generates watermarks by strategy (bounded out-of-orderness, monotonous,
// or a custom generator; with optional idleness). Put it right after the
// source: it chains with it.
func (s *Stream[T]) AssignTimestampsAndWatermarks(name string, strategy watermark.Strategy[T]) *Stream[T] {
	if err := strategy.Validate(); err != nil {
		s.env.addError(err)
	}
	out := Transform(s, name, func(out operators.Collector[T]) operators.OneInput[T] {
		return operators.NewTimestampsAndWatermarks(strategy, out)
	})
	// Like Flink, the assigner runs with its input's parallelism, so that it
	// chains with the source.
	out.env.node(out.v).inherit = true
	return out
}

// Process runs fn on every record of s (not keyed: no keyed state or
// timers).
func Process[T, O any](s *Stream[T], name string, fn func() operators.ProcessFunction[T, O]) *Stream[O] {
	return Transform(s, name, func(out operators.Collector[O]) operators.OneInput[T] {
		return operators.NewProcess(fn(), out)
	})
}

// KeyedProcess runs fn on every record of the keyed stream, with keyed state
// and timers; fn is called once per subtask for a fresh function. The
// operator needs a UID.
func KeyedProcess[T any, K comparable, O any](k *KeyedStream[T, K], name string, fn func() operators.KeyedProcessFunction[K, T, O]) *Stream[O] {
	out := Transform(k.s, name, func(out operators.Collector[O]) operators.OneInput[T] {
		return operators.NewKeyedProcess(k.key, fn(), out)
	})
	out.env.node(out.v).stateful = true
	return out
}

// SideOutput returns the stream of records the operator that produced s
// sent to tag.
func SideOutput[X, T any](s *Stream[T], tag operators.OutputTag[X]) *Stream[X] {
	x := &Stream[X]{env: s.env, typ: typeOf[X]()}
	if s.v == nil {
		s.env.addError(errSideOutputOfUnion)
		return x
	}
	if s.v.SideOutputs == nil {
		s.v.SideOutputs = make(map[string]actors.ElemType)
	}
	if t, ok := s.v.SideOutputs[tag.ID()]; ok {
		x.typ = t.(*actors.Type[X])
	} else {
		s.v.SideOutputs[tag.ID()] = x.typ
	}
	x.ups = []upstream{{v: s.v, auto: true, output: tag.ID()}}
	return x
}
