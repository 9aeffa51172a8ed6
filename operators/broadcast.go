package operators

import "github.com/edgedio/edged/state"

// KeyedBroadcastProcessFunction is the broadcast-state pattern: a keyed
// stream of records meets a low-rate stream (rules, thresholds) that is
// broadcast to every subtask. ProcessBroadcastElement may write broadcast
// state (the same in every subtask, as every subtask sees the same
// broadcast records); ProcessElement reads it, together with keyed state
// and timers. Its methods run on the subtask's goroutine; an error fails
// the task.
type KeyedBroadcastProcessFunction[K comparable, T, B, O any] interface {
	// Open creates the state: broadcast state with
	// state.BroadcastState(rt.Store(), ...) and its read-only view with
	// state.ReadOnlyBroadcastState, keyed state with rt.Backend() and
	// rt.Keys().
	Open(rt *BroadcastRuntime[K]) error
	// ProcessElement is called for every keyed record, with its key
	// current; it must only read broadcast state.
	ProcessElement(v T, ctx *KeyedContext[K, O]) error
	// ProcessBroadcastElement is called for every broadcast record, with
	// no key current: it may not use keyed state (state.ErrNoCurrentKey).
	ProcessBroadcastElement(b B, ctx *BroadcastContext[O]) error
	// OnTimer is called when a timer of the keyed side fires.
	OnTimer(ts int64, ctx *KeyedContext[K, O]) error
}

// BroadcastRuntime is what a KeyedBroadcastProcessFunction gets at Open.
type BroadcastRuntime[K comparable] struct {
	KeyedRuntime[K]
}

// Store returns the operator state of the subtask, where broadcast state
// lives.
func (rt *BroadcastRuntime[K]) Store() *state.OperatorStore { return rt.Context.OperatorState }

// BroadcastContext is the context of one ProcessBroadcastElement call.
type BroadcastContext[O any] struct {
	op  *Context
	out Collector[O]
	wm  *int64
}

// Timestamp returns the broadcast record's timestamp, or NoTimestamp.
func (c *BroadcastContext[O]) Timestamp() int64 { return c.op.Time.Timestamp }

// CurrentWatermark returns the operator's current watermark.
func (c *BroadcastContext[O]) CurrentWatermark() int64 { return *c.wm }

// CurrentProcessingTime returns processing time in milliseconds.
func (c *BroadcastContext[O]) CurrentProcessingTime() int64 { return c.op.ProcessingTime.Now() }

// Emit sends v to the main output.
func (c *BroadcastContext[O]) Emit(v O) { c.out.Collect(v) }

func (c *BroadcastContext[O]) operatorContext() *Context { return c.op }

// KeyedBroadcastProcess is the two-input operator running a
// KeyedBroadcastProcessFunction: input 0 is the keyed stream, input 1 the
// broadcast stream.
type KeyedBroadcastProcess[K comparable, T, B, O any] struct {
	keyedCore[K, O]
	fn   KeyedBroadcastProcessFunction[K, T, B, O]
	key  func(T) K
	kctx KeyedContext[K, O]
	bctx BroadcastContext[O]
}

// NewKeyedBroadcastProcess returns the operator running fn.
func NewKeyedBroadcastProcess[K comparable, T, B, O any](key func(T) K, fn KeyedBroadcastProcessFunction[K, T, B, O], out Collector[O]) *KeyedBroadcastProcess[K, T, B, O] {
	o := &KeyedBroadcastProcess[K, T, B, O]{fn: fn, key: key}
	o.out = out
	o.kctx.c = &o.keyedCore
	o.bctx.out, o.bctx.wm = out, &o.wm
	return o
}

// Inputs returns the collectors of the two inputs, as the runtime wants
// them from a two-input operator.
func (o *KeyedBroadcastProcess[K, T, B, O]) Inputs() [2]any {
	return [2]any{Collector[T](o), Collector[B](CollectorFunc[B](o.collectBroadcast))}
}

// Open opens the function.
func (o *KeyedBroadcastProcess[K, T, B, O]) Open(ctx *Context) error {
	if err := o.open(ctx, o.timer); err != nil {
		return err
	}
	o.bctx.op = ctx
	return o.fn.Open(&BroadcastRuntime[K]{KeyedRuntime[K]{Context: ctx, keys: &o.keys}})
}

func (o *KeyedBroadcastProcess[K, T, B, O]) timer(ts int64, d TimeDomain) error {
	o.kctx.domain = d
	return o.fn.OnTimer(ts, &o.kctx)
}

// Collect processes one keyed record.
func (o *KeyedBroadcastProcess[K, T, B, O]) Collect(v T) {
	o.setKey(o.key(v))
	if err := o.fn.ProcessElement(v, &o.kctx); err != nil {
		Fail(err)
	}
}

// collectBroadcast processes one broadcast record. No key is current: the
// function's keyed state fails the task (state.ErrNoCurrentKey) instead of
// reaching the state of the keyed record processed last.
func (o *KeyedBroadcastProcess[K, T, B, O]) collectBroadcast(b B) {
	o.keys.Unset()
	if err := o.fn.ProcessBroadcastElement(b, &o.bctx); err != nil {
		Fail(err)
	}
}

// ProcessWatermark fires the event-time timers the watermark passed.
func (o *KeyedBroadcastProcess[K, T, B, O]) ProcessWatermark(wm int64) error { return o.advance(wm) }

// Finish does nothing.
func (o *KeyedBroadcastProcess[K, T, B, O]) Finish() error { return nil }

// Close cancels the processing-time callback.
func (o *KeyedBroadcastProcess[K, T, B, O]) Close() error {
	o.close()
	return nil
}
