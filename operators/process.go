package operators

import (
	"errors"
	"math"

	"github.com/edgedio/edged/codec"
	"github.com/edgedio/edged/keygroup"
	"github.com/edgedio/edged/state"
)

// minWatermark is the watermark before any arrived.
const minWatermark int64 = math.MinInt64

// TimeDomain says which clock fired a timer.
type TimeDomain int

const (
	// EventTime timers fire when the watermark passes them.
	EventTime TimeDomain = iota
	// ProcessingTime timers fire when the processing-time clock passes
	// them.
	ProcessingTime
)

// KeyedProcessFunction processes the records of a keyed stream one at a
// time, with keyed state and timers: Flink's KeyedProcessFunction. Its
// methods run on the subtask's goroutine, one call at a time; an error
// fails the task.
type KeyedProcessFunction[K comparable, T, O any] interface {
	// Open is called once per subtask before the first record; create
	// keyed state here.
	Open(rt *KeyedRuntime[K]) error
	// ProcessElement is called for every record, with the record's key
	// current.
	ProcessElement(v T, ctx *KeyedContext[K, O]) error
	// OnTimer is called when a timer fires, with the timer's key current.
	OnTimer(ts int64, ctx *KeyedContext[K, O]) error
}

// KeyedProcessBase gives a KeyedProcessFunction no-op Open and OnTimer
// methods, to embed.
type KeyedProcessBase[K comparable, O any] struct{}

// Open does nothing.
func (KeyedProcessBase[K, O]) Open(*KeyedRuntime[K]) error { return nil }

// OnTimer does nothing.
func (KeyedProcessBase[K, O]) OnTimer(int64, *KeyedContext[K, O]) error { return nil }

// KeyedRuntime is what a keyed function gets at Open: the subtask's
// operator context, its keyed state backend and the current-key context
// that every state handle must be created with.
type KeyedRuntime[K comparable] struct {
	// Context is the operator's context.
	Context *Context
	keys    *state.KeyContext[K]
}

// Backend returns the keyed state backend.
func (rt *KeyedRuntime[K]) Backend() state.Backend { return rt.Context.State }

// Keys returns the current-key context for creating state handles.
func (rt *KeyedRuntime[K]) Keys() *state.KeyContext[K] { return rt.keys }

// TimerService registers and deletes timers of the current key. At most one
// timer exists per key and timestamp in each time domain; registering it
// again does nothing.
type TimerService interface {
	CurrentProcessingTime() int64
	CurrentWatermark() int64
	RegisterEventTimeTimer(ts int64)
	RegisterProcessingTimeTimer(ts int64)
	DeleteEventTimeTimer(ts int64)
	DeleteProcessingTimeTimer(ts int64)
}

// KeyedContext is the context of one call of a KeyedProcessFunction: the
// current key and record timestamp, time, timers, and outputs.
type KeyedContext[K comparable, O any] struct {
	c      *keyedCore[K, O]
	domain TimeDomain
}

// CurrentKey returns the key of the record or timer being processed.
func (c *KeyedContext[K, O]) CurrentKey() K { return c.c.keys.Key() }

// Timestamp returns the event timestamp of the record being processed (the
// timer's timestamp in OnTimer for an event-time timer), or NoTimestamp.
func (c *KeyedContext[K, O]) Timestamp() int64 { return c.c.ctx.Time.Timestamp }

// TimeDomain returns, in OnTimer, which clock fired the timer.
func (c *KeyedContext[K, O]) TimeDomain() TimeDomain { return c.domain }

// CurrentWatermark returns the operator's current event-time watermark.
func (c *KeyedContext[K, O]) CurrentWatermark() int64 { return c.c.wm }

// CurrentProcessingTime returns processing time in milliseconds.
func (c *KeyedContext[K, O]) CurrentProcessingTime() int64 { return c.c.ctx.ProcessingTime.Now() }

// Timers returns the timer service of the current key.
func (c *KeyedContext[K, O]) Timers() TimerService { return c.c }

// Emit sends v to the main output, with the current timestamp.
func (c *KeyedContext[K, O]) Emit(v O) { c.c.out.Collect(v) }

func (c *KeyedContext[K, O]) operatorContext() *Context { return c.c.ctx }

// keyedCore is what keyed operators share whatever their input type: the
// current key, the watermark, the timers of the current key and the
// outputs. It implements TimerService.
type keyedCore[K comparable, O any] struct {
	ctx         *Context
	out         Collector[O]
	keys        state.KeyContext[K]
	hash        func(K) uint64
	maxP        int
	wm          int64
	eventTimers *state.TimerQueue[K, struct{}]
	procTimers  *state.TimerQueue[K, struct{}]
	procArmed   int64
	procCancel  func()
	// onTimer is called for every timer that fires, with its key current.
	onTimer func(ts int64, domain TimeDomain) error
}

func (c *keyedCore[K, O]) open(ctx *Context, onTimer func(int64, TimeDomain) error) error {
	if ctx.State == nil {
		return ErrNotKeyed
	}
	c.ctx, c.maxP, c.onTimer = ctx, ctx.MaxParallelism, onTimer
	c.hash = KeyHasher[K]()
	c.wm = minWatermark
	c.eventTimers = state.NewTimerQueue[K, struct{}]()
	c.procTimers = state.NewTimerQueue[K, struct{}]()
	// Registered timers are part of the keyed snapshot.
	kc, nc := codec.For[K](), codec.For[struct{}]()
	if err := state.RegisterTimerQueue(ctx.State, "timers/event", c.eventTimers, kc, nc); err != nil {
		return err
	}
	if err := state.RegisterTimerQueue(ctx.State, "timers/processing", c.procTimers, kc, nc); err != nil {
		return err
	}
	// Restored processing-time timers fire by the clock as registered
	// ones do: the first of them arms the callback (an overdue one fires
	// at once).
	c.armProcessingTime()
	return nil
}

// setKey makes k the current key.
func (c *keyedCore[K, O]) setKey(k K) {
	c.keys.Set(k, keygroup.Of(c.hash(k), c.maxP))
}

func (c *keyedCore[K, O]) CurrentProcessingTime() int64 { return c.ctx.ProcessingTime.Now() }
func (c *keyedCore[K, O]) CurrentWatermark() int64      { return c.wm }

func (c *keyedCore[K, O]) RegisterEventTimeTimer(ts int64) {
	c.eventTimers.Register(ts, c.keys.Key(), c.keys.Group(), struct{}{})
}

func (c *keyedCore[K, O]) DeleteEventTimeTimer(ts int64) {
	c.eventTimers.Delete(ts, c.keys.Key(), c.keys.Group(), struct{}{})
}

func (c *keyedCore[K, O]) RegisterProcessingTimeTimer(ts int64) {
	if c.procTimers.Register(ts, c.keys.Key(), c.keys.Group(), struct{}{}) {
		c.armProcessingTime()
	}
}

func (c *keyedCore[K, O]) DeleteProcessingTimeTimer(ts int64) {
	c.procTimers.Delete(ts, c.keys.Key(), c.keys.Group(), struct{}{})
}

// armProcessingTime asks the task for a callback at the earliest
// processing-time timer.
func (c *keyedCore[K, O]) armProcessingTime() {
	t, ok := c.procTimers.Peek()
	if !ok || (c.procCancel != nil && c.procArmed <= t.Timestamp) {
		return
	}
	if c.procCancel != nil {
		c.procCancel()
	}
	c.procArmed = t.Timestamp
	c.procCancel = c.ctx.ProcessingTime.At(t.Timestamp, c.fireProcessingTime)
}

func (c *keyedCore[K, O]) fireProcessingTime(now int64) error {
	c.procCancel = nil
	var err error
	c.procTimers.PopUntil(now, func(t state.Timer[K, struct{}]) {
		if err != nil || c.stopped(&err) {
			return
		}
		c.keys.Set(t.Key, t.Group)
		c.ctx.Time.Timestamp = NoTimestamp
		err = c.onTimer(t.Timestamp, ProcessingTime)
	})
	if err == errSubtaskStopped {
		return nil
	}
	if err != nil {
		return err
	}
	c.armProcessingTime()
	return nil
}

// errSubtaskStopped ends a run of timers when the subtask stops.
var errSubtaskStopped = errors.New("operators: the subtask stopped")

// stopped reports whether the subtask stopped (its Context.Done is
// closed), and then sets *err to errSubtaskStopped. The timers that fire
// at a watermark or a processing time include those their functions
// register at or before it: a function that always registers one (a
// periodic timer at the final watermark, math.MaxInt64, registers its
// next one there until the time wraps round) fires without end, and only
// the stop of its subtask ends the run, as the cancel of a job does.
func (c *keyedCore[K, O]) stopped(err *error) bool {
	select {
	case <-c.ctx.Done:
		*err = errSubtaskStopped
		return true
	default:
		return false
	}
}

// advance fires the event-time timers up to wm and forwards wm.
func (c *keyedCore[K, O]) advance(wm int64) error {
	c.wm = wm
	var err error
	c.eventTimers.PopUntil(wm, func(t state.Timer[K, struct{}]) {
		if err != nil || c.stopped(&err) {
			return
		}
		c.keys.Set(t.Key, t.Group)
		c.ctx.Time.Timestamp = t.Timestamp
		err = c.onTimer(t.Timestamp, EventTime)
	})
	if err == errSubtaskStopped {
		return nil
	}
	if err != nil {
		return err
	}
	c.ctx.EmitWatermark(wm)
	return nil
}

// RestoreWatermark implements WatermarkRestorer: wm becomes the current
// watermark, and is forwarded, without firing a timer.
func (c *keyedCore[K, O]) RestoreWatermark(wm int64) error {
	c.wm = wm
	c.ctx.EmitWatermark(wm)
	return nil
}

func (c *keyedCore[K, O]) close() {
	if c.procCancel != nil {
		c.procCancel()
		c.procCancel = nil
	}
}

// KeyedProcess is the operator running a KeyedProcessFunction.
type KeyedProcess[K comparable, T, O any] struct {
	keyedCore[K, O]
	fn   KeyedProcessFunction[K, T, O]
	key  func(T) K
	pctx KeyedContext[K, O]
}

// NewKeyedProcess returns the operator running fn on records keyed by key.
func NewKeyedProcess[K comparable, T, O any](key func(T) K, fn KeyedProcessFunction[K, T, O], out Collector[O]) *KeyedProcess[K, T, O] {
	o := &KeyedProcess[K, T, O]{fn: fn, key: key}
	o.out = out
	o.pctx.c = &o.keyedCore
	return o
}

// Open opens the function.
func (o *KeyedProcess[K, T, O]) Open(ctx *Context) error {
	if err := o.open(ctx, o.timer); err != nil {
		return err
	}
	return o.fn.Open(&KeyedRuntime[K]{Context: ctx, keys: &o.keys})
}

func (o *KeyedProcess[K, T, O]) timer(ts int64, d TimeDomain) error {
	o.pctx.domain = d
	return o.fn.OnTimer(ts, &o.pctx)
}

// Collect processes one record with its key current.
func (o *KeyedProcess[K, T, O]) Collect(v T) {
	o.setKey(o.key(v))
	if err := o.fn.ProcessElement(v, &o.pctx); err != nil {
		Fail(err)
	}
}

// ProcessWatermark fires the event-time timers the watermark passed.
func (o *KeyedProcess[K, T, O]) ProcessWatermark(wm int64) error { return o.advance(wm) }

// Finish does nothing: timers left after the final watermark are
// processing-time ones, which do not fire after the input ended.
func (o *KeyedProcess[K, T, O]) Finish() error { return nil }

// Close cancels the processing-time callback.
func (o *KeyedProcess[K, T, O]) Close() error {
	o.close()
	return nil
}
