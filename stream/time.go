package stream

import (
	"fmt"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/watermark"
)

// AssignTimestampsAndWatermarks gives every record its event timestamp and
// generates watermarks by strategy (bounded out-of-orderness, monotonous,
// or a custom generator; with optional idleness). Put it right after the
// source: it chains with it. An invalid strategy (Strategy.Validate) is
// refused by Plan and Execute with an error naming the operator.
func (s *Stream[T]) AssignTimestampsAndWatermarks(name string, strategy watermark.Strategy[T]) *Stream[T] {
	s.must(called("AssignTimestampsAndWatermarks", name))
	if err := strategy.Validate(); err != nil {
		s.env.addError(fmt.Errorf("stream: operator %q: %w", name, err))
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
	s.must(called("Process", name))
	if fn == nil {
		s.env.nilFunc(name, "the function factory")
	}
	return Transform(s, name, func(out operators.Collector[O]) operators.OneInput[T] {
		return operators.NewProcess(made(fn()), out)
	})
}

// KeyedProcess runs fn on every record of the keyed stream, with keyed state
// and timers; fn is called once per subtask for a fresh function. The
// operator needs a UID. A nil fn is refused by Plan and Execute; an fn that
// returns nil or panics, or returns the same pointer to two subtasks,
// fails the job with an *actors.TaskError naming the operator.
func KeyedProcess[T any, K comparable, O any](k *KeyedStream[T, K], name string, fn func() operators.KeyedProcessFunction[K, T, O]) *Stream[O] {
	k.must(called("KeyedProcess", name))
	if fn == nil {
		k.s.env.nilFunc(name, "the function factory")
		fn = func() operators.KeyedProcessFunction[K, T, O] { return nil }
	}
	var seen instances
	out := transform(k.s, name, func(ctx *operators.Context, out operators.Collector[O]) operators.OneInput[T] {
		f := made(fn())
		seen.fresh(name, ctx.Subtask, f)
		return operators.NewKeyedProcess(k.key, f, out)
	})
	out.env.keyedState(out.v, "keyed-process")
	return out
}

// SideOutput returns the stream of records the operator that produced s
// sent to tag. Tags with the same id on one operator must have the same
// type: Plan and Execute refuse two types under one id, and a tag with an
// empty id (a zero OutputTag, or NewOutputTag("")).
func SideOutput[X, T any](s *Stream[T], tag operators.OutputTag[X]) *Stream[X] {
	s.must(fmt.Sprintf("SideOutput(%q)", tag.ID()))
	x := &Stream[X]{env: s.env, typ: typeOf[X]()}
	if s.v == nil {
		if u := s.sideOutput(); u != nil {
			s.env.addError(fmt.Errorf("stream: SideOutput(%q) of side output %q of operator %q: take side outputs from the operator that emits them",
				tag.ID(), u.output, u.v.Name))
			return x
		}
		s.env.addError(errSideOutputOfUnion)
		return x
	}
	if tag.ID() == "" {
		// The empty id is the main output's: the side stream would be
		// the main output, and what went to the tag would be dropped.
		s.env.addError(fmt.Errorf("stream: operator %q: SideOutput: %s", s.v.Name, errEmptyTag))
		return x
	}
	if s.v.SideOutputs == nil {
		s.v.SideOutputs = make(map[string]actors.ElemType)
	}
	if t, ok := s.v.SideOutputs[tag.ID()]; ok {
		typ, same := t.(*actors.Type[X])
		if !same {
			s.env.addError(fmt.Errorf("stream: operator %q: side output %q is used with two types, %s and %s: one tag id, one type",
				s.v.Name, tag.ID(), t, x.typ))
			return x
		}
		x.typ = typ
	} else {
		s.v.SideOutputs[tag.ID()] = x.typ
	}
	x.ups = []upstream{{v: s.v, auto: true, output: tag.ID()}}
	return x
}
