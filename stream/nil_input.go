package stream

import (
	"fmt"
	"reflect"
)

// The builders return no error, and a nil (or zero) Environment, Stream,
// KeyedStream, WindowedStream or Sink given to one has no Environment to
// report to: the builder panics at once, at the line of the mistake, with
// an error naming the builder, the operator and what is nil, instead of a
// nil dereference in the stream package. Plan, Graph, Execute and
// ExecuteAsync of a nil Environment return that error instead.

// nilInput panics with the error that call was given a nil what.
func nilInput(call, what string) {
	panic(fmt.Errorf("stream: %s: %s is nil (or a zero value): take it from NewEnvironment and the stream API (FromSource, Map, KeyBy, Window, ...)", call, what))
}

// called names a builder and the operator it adds, for nilInput.
func called(builder, name string) string { return fmt.Sprintf("%s(%q)", builder, name) }

// ready reports whether e was made by NewEnvironment.
func (e *Environment) ready() bool { return e != nil && e.nodes != nil }

// mustEnv panics (nilInput) unless e was made by NewEnvironment.
func (e *Environment) mustEnv(call string) {
	if !e.ready() {
		nilInput(call, "the *Environment")
	}
}

// errNil is the error Plan, Graph, Execute and ExecuteAsync of e return
// when e was not made by NewEnvironment, nil when it was.
func (e *Environment) errNil(call string) error {
	if e.ready() {
		return nil
	}
	return fmt.Errorf("stream: %s: the *Environment is nil (or a zero value): make it with NewEnvironment", call)
}

// must panics (nilInput) when s is nil or was not made by the stream API.
func (s *Stream[T]) must(call string) {
	if s == nil || !s.env.ready() {
		nilInput(call, fmt.Sprintf("the input *Stream[%v]", reflect.TypeFor[T]()))
	}
}

// must panics (nilInput) when k is nil or was not made by KeyBy.
func (k *KeyedStream[T, K]) must(call string) {
	if k == nil || k.s == nil || !k.s.env.ready() {
		nilInput(call, fmt.Sprintf("the input *KeyedStream[%v, %v]", reflect.TypeFor[T](), reflect.TypeFor[K]()))
	}
}

// must panics (nilInput) when w is nil or was not made by Window.
func (w *WindowedStream[T, K]) must(call string) {
	if w == nil || w.k == nil {
		nilInput(call, fmt.Sprintf("the input *WindowedStream[%v, %v]", reflect.TypeFor[T](), reflect.TypeFor[K]()))
	}
	w.k.must(call)
}

// must panics (nilInput) when k is nil or was not made by To or ForEach.
func (k *Sink) must(call string) {
	if k == nil || k.v == nil || !k.env.ready() {
		nilInput(call, "the *Sink")
	}
}
