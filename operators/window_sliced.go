package operators

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// ErrNoTimestamp is returned when an event-time window gets a record
// without a timestamp.
var ErrNoTimestamp = errors.New("operators: event-time window got a record without a timestamp: assign timestamps and watermarks first")

// windowCore holds what both window operators share: the key, the
// assigner, allowed lateness and the late-data side output.
type windowCore[K comparable, T any] struct {
	keyedCore[K, struct{}]
	key       func(T) K
	assigner  WindowAssigner
	lateness  int64 // ms
	lateTag   string
	late      Collector[T]
	lateCount int64
	dropped   int64 // late records dropped for want of a late-data side output
	name      string
	// procFired is the latest processing-time timer fired: a record at or
	// before it is placed just after it.
	procFired int64
}

func (w *windowCore[K, T]) openCore(ctx *Context, onTimer func(int64, TimeDomain) error) error {
	if err := w.assigner.Validate(); err != nil {
		return err
	}
	if !w.assigner.eventTime && w.lateness != 0 {
		return errors.New("operators: allowed lateness applies to event-time windows only")
	}
	fired := func(ts int64, d TimeDomain) error {
		if d == ProcessingTime && ts > w.procFired {
			w.procFired = ts
		}
		return onTimer(ts, d)
	}
	if err := w.open(ctx, fired); err != nil {
		return err
	}
	if w.lateTag != "" && ctx.SideOutput != nil {
		w.late, _ = ctx.SideOutput(w.lateTag).(Collector[T])
	}
	return nil
}

// times returns the record's time in the window's domain and the time up
// to which the windows have fired (the watermark; in processing time, the
// millisecond before now: a timer at now has not fired yet, as one at
// procFired would have moved now past it).
func (w *windowCore[K, T]) times() (ts, current int64) {
	if w.assigner.eventTime {
		ts = w.ctx.Time.Timestamp
		if ts == NoTimestamp {
			Fail(ErrNoTimestamp)
		}
		return ts, w.wm
	}
	now := w.ctx.ProcessingTime.Now()
	if now <= w.procFired {
		// A timer of this millisecond already fired its windows: the
		// record belongs to the next millisecond's.
		now = w.procFired + 1
	}
	return now, now - 1
}

// queued reports whether the current key has a timer at ts in the
// window's domain.
func (w *windowCore[K, T]) queued(ts int64) bool {
	if w.assigner.eventTime {
		return w.eventTimers.Contains(ts, w.keys.Key(), w.keys.Group(), struct{}{})
	}
	return w.procTimers.Contains(ts, w.keys.Key(), w.keys.Group(), struct{}{})
}

// register sets a timer for the current key at ts in the window's domain.
func (w *windowCore[K, T]) register(ts int64) {
	if w.assigner.eventTime {
		w.RegisterEventTimeTimer(ts)
	} else {
		w.RegisterProcessingTimeTimer(ts)
	}
}

// unregister deletes the current key's timer at ts in the window's
// domain, if there is one.
func (w *windowCore[K, T]) unregister(ts int64) {
	if w.assigner.eventTime {
		w.DeleteEventTimeTimer(ts)
	} else {
		w.DeleteProcessingTimeTimer(ts)
	}
}

// dropLate sends a record too late for all its windows (or whose time no
// window can hold, see windowTime) to the side output
// (or counts it as dropped).
func (w *windowCore[K, T]) dropLate(v T) {
	w.lateCount++
	if w.late != nil {
		w.late.Collect(v)
	} else {
		w.dropped++
	}
}

// LateRecords returns how many records came after all their windows had
// been cleaned up, or at a time no window can hold (sent to the late-data
// side output, or dropped).
func (w *windowCore[K, T]) LateRecords() int64 { return w.lateCount }

// emitAt sets the timestamp of the results of window win.
func (w *windowCore[K, T]) emitAt(win Window) { w.ctx.Time.Timestamp = win.MaxTimestamp() }

// Finish fires the processing-time windows still open at the end of a
// bounded input, so that nothing is lost; event-time windows have fired
// with the final watermark.
func (w *windowCore[K, T]) Finish() error {
	if !w.assigner.eventTime {
		return w.fireProcessingTime(maxTimestamp)
	}
	return nil
}

// ProcessWatermark fires the windows the watermark passed.
func (w *windowCore[K, T]) ProcessWatermark(wm int64) error { return w.advance(wm) }

// Close cancels the processing-time callback and, when late records were
// dropped for want of a late-data side output, says how many with a
// warning: the count is not otherwise visible to the job.
func (w *windowCore[K, T]) Close() error {
	w.close()
	if w.dropped > 0 && w.ctx != nil && w.ctx.Logger != nil {
		w.ctx.Logger.Warn("window dropped late records: give it a late-data side output (SideOutputLateData) to keep them",
			"dropped", w.dropped)
	}
	return nil
}

const maxTimestamp int64 = 1<<63 - 1

// SlicedWindow is the operator of tumbling and sliding windows. Records are
// stored once, in the slice (pane) of length gcd(size, slide) they fall
// in; a window's result combines its slices when it fires (for sliding
// window aggregates, through an incrementally maintained aggregate: see
// incSlices). Each key has at
// most one pending timer per window end, registered when a slice is
// created and chained from one window end to the next while slices remain.
type SlicedWindow[K comparable, T any] struct {
	windowCore[K, T]
	// store keeps the slices of each key and its pending window-end timer:
	// a new slice whose first window ends no earlier needs no timer of its
	// own, as the chain reaches it.
	store  sliceStore[K, T]
	size   int64
	slide  int64
	pane   int64
	offset int64
	// timerTs and nextEnd are the arguments of the functions onTimer
	// passes to the store, made once (a closure per timer would be
	// allocated).
	timerTs, nextEnd int64
	// stateAhead is the watermark the restored state was written at when
	// it is ahead of the operator's (Context.RestoredStateWatermark);
	// math.MinInt64 otherwise.
	stateAhead          int64
	cleaned             func(p int64) bool
	nextWindow, firstOf func(p int64) (int64, bool)
}

// Open registers the window state.
func (o *SlicedWindow[K, T]) Open(ctx *Context) error {
	if err := o.openCore(ctx, o.onTimer); err != nil {
		return err
	}
	a := o.assigner
	o.size, o.slide, o.pane, o.offset = a.size, a.slide, a.pane(), a.offset
	o.stateAhead = math.MinInt64
	if wm := ctx.RestoredStateWatermark; wm != nil && a.eventTime {
		o.stateAhead = *wm
	}
	o.cleaned = func(p int64) bool { return o.lastEnd(p)-1+o.lateness <= o.timerTs }
	o.nextWindow = func(p int64) (int64, bool) {
		e := max(o.firstEnd(p), o.nextEnd)
		return e, e <= o.lastEnd(p)
	}
	o.firstOf = func(p int64) (int64, bool) { return p, true }
	return o.store.open(ctx.State, &o.keys, o.name+"/contents")
}

// chain registers the window-end timer at ts unless an earlier one of the
// current key is pending: next, the timer the key's slices record (0:
// none), when it is after current (one at or before current has fired or
// fires in this pass). A restore can give the operator a watermark
// behind the one its state was written at (restored at another
// parallelism, it takes the smallest of the old subtasks'; a snapshot
// without event time gives none): until current reaches that one
// (stateAhead), the timer the slices record may have fired before the
// snapshot though it is after current, so it counts only if it is still
// queued.
func (o *SlicedWindow[K, T]) chain(ts, current, next int64) {
	if next != 0 && next > current && next <= ts && (current >= o.stateAhead || o.queued(next)) {
		return
	}
	o.register(ts)
	o.store.setNext(ts)
}

// lastEnd returns the end of the latest window containing the slice at p.
func (o *SlicedWindow[K, T]) lastEnd(p int64) int64 {
	return floorTo(p, o.offset, o.slide) + o.size
}

// firstEnd returns the end of the earliest window containing the slice at
// p: the first window start s >= p+pane-size on the slide grid, plus size.
func (o *SlicedWindow[K, T]) firstEnd(p int64) int64 {
	lo := p + o.pane - o.size
	s := floorTo(lo, o.offset, o.slide)
	if s < lo {
		s += o.slide
	}
	return s + o.size
}

// Collect adds a record to its slice.
func (o *SlicedWindow[K, T]) Collect(v T) {
	o.setKey(o.key(v))
	ts, current := o.times()
	if !windowTime(ts) {
		o.dropLate(v)
		return
	}
	p := floorTo(ts, o.offset, o.pane)
	last := o.lastEnd(p)
	if o.assigner.eventTime && last-1+o.lateness <= current {
		o.dropLate(v)
		return
	}
	next := o.store.add(p, v)
	first := o.firstEnd(p)
	// The earliest window of the slice still to fire needs a pending
	// timer at or before its end. A new slice may be the first one of
	// that window; an existing one has it, unless the operator was
	// restored behind windows that had fired (see chain).
	end := first
	for end-1 <= current && end < last {
		end += o.slide
	}
	if end-1 > current {
		o.chain(end-1, current, next)
	}
	if o.assigner.eventTime && first-1 <= current {
		// Late but within the allowed lateness: the windows that already
		// fired, and whose lateness has not passed, fire again with this
		// record; the slice is cleaned up once the lateness has passed.
		for end := first; end <= last && end-1 <= current; end += o.slide {
			if end-1+o.lateness > current {
				o.fire(Window{Start: end - o.size, End: end})
			}
		}
		o.register(last - 1 + o.lateness)
	}
}

// fire emits window win.
func (o *SlicedWindow[K, T]) fire(win Window) {
	o.emitAt(win)
	if err := o.store.fire(o.keys.Key(), win); err != nil {
		Fail(err)
	}
}

// onTimer fires the window ending at ts+1 (when one does), cleans up the
// slices no window needs any more, and sets the next timer of the key.
func (o *SlicedWindow[K, T]) onTimer(ts int64, _ TimeDomain) error {
	end := ts + 1
	if floorTo(end-o.size, o.offset, o.slide) == end-o.size {
		o.fire(Window{Start: end - o.size, End: end})
	}
	o.timerTs = ts
	if o.store.drop(o.cleaned) == 0 {
		return nil
	}
	// The earliest window ending after ts that holds a slice: the next
	// window end, or a later one when there is a gap in the key's data.
	next := floorTo(end-o.size, o.offset, o.slide) + o.slide + o.size
	if next-1 <= ts {
		next += o.slide
	}
	o.nextEnd = next
	if e, ok := o.store.first(o.nextWindow); ok {
		next, _ := o.store.next()
		o.chain(e-1, ts, next)
		return nil
	}
	if o.lateness > 0 {
		if first, ok := o.store.first(o.firstOf); ok {
			o.register(o.lastEnd(first) - 1 + o.lateness)
		}
	}
	return nil
}

// NewWindowAggregate returns a window operator folding each window's
// records with agg and emitting a WindowResult per key and window. Sliding
// and session windows need agg to implement Merger.
func NewWindowAggregate[K comparable, T, A, R any](name string, key func(T) K, a WindowAssigner, lateness time.Duration, lateTag string, agg AggregateFunction[T, A, R], out Collector[WindowResult[K, R]]) (OneInput[T], error) {
	if a.kind == session {
		c := newAggContents[K, Window, T, A, R](agg, out)
		if err := c.needsMerge(a); err != nil {
			return nil, err
		}
		return newSession[K, T](name, key, a, lateness, lateTag, c), nil
	}
	if a.pane() == a.size {
		// Tumbling: a window is one slice.
		return newSliced[K, T](name, key, a, lateness, lateTag, newAggSlices[K, T, A, R](agg, out)), nil
	}
	c := newIncSlices[K, T, A, R](agg, out)
	if c.merger == nil {
		return nil, fmt.Errorf("operators: %s combine accumulators: the aggregate function %T needs a Merge(a, b) method", a, agg)
	}
	return newSliced[K, T](name, key, a, lateness, lateTag, c), nil
}

// NewWindowProcess returns a window operator keeping every record of a
// window and calling fn with them when it fires.
func NewWindowProcess[K comparable, T, O any](name string, key func(T) K, a WindowAssigner, lateness time.Duration, lateTag string, fn ProcessWindowFunction[K, T, O], out Collector[O]) (OneInput[T], error) {
	if a.kind == session {
		return newSession[K, T](name, key, a, lateness, lateTag, &listContents[K, Window, T, O]{fn: fn, out: out}), nil
	}
	return newSliced[K, T](name, key, a, lateness, lateTag, &listSlices[K, T, O]{fn: fn, out: out}), nil
}

func newSliced[K comparable, T any](name string, key func(T) K, a WindowAssigner, lateness time.Duration, lateTag string, store sliceStore[K, T]) *SlicedWindow[K, T] {
	o := &SlicedWindow[K, T]{store: store}
	o.name, o.key, o.assigner, o.lateness, o.lateTag = name, key, a, lateness.Milliseconds(), lateTag
	return o
}
