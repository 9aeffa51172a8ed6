package operatorstest

import (
	"container/heap"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/edgedio/edged/keygroup"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/state"
	"github.com/edgedio/edged/watermark"
)

// DefaultStart is the processing time the fake clock of a Harness starts
// at, unless StartAt says otherwise: 2023-11-14T22:13:20Z, a whole second.
var DefaultStart = time.Unix(1_700_000_000, 0).UTC()

// Record is a record an operator emitted and the event timestamp it
// carried (Context.Time.Timestamp at the moment of the Collect call;
// operators.NoTimestamp when it had none).
type Record[O any] struct {
	Value     O
	Timestamp int64
}

// Option configures a Harness.
type Option func(*config)

type config struct {
	// maxP is the number of key groups; 0 means not keyed.
	maxP int
	// side makes the collector of each connected side output, given the
	// function that stores a record of it.
	side  map[string]func(store func(v any)) any
	start time.Time
}

// Keyed gives the operator a keyed state backend: Context.State is a
// state.MemoryBackend over all maxParallelism key groups (the operator
// stands for the only subtask), measuring TTLs on the harness's fake
// clock. Without it Context.State is nil, as for an operator that does not
// follow a key-by edge. It panics if maxParallelism is not positive.
func Keyed(maxParallelism int) Option {
	if maxParallelism <= 0 {
		panic(fmt.Sprintf("operatorstest: Keyed(%d): max parallelism must be positive", maxParallelism))
	}
	return func(c *config) { c.maxP = maxParallelism }
}

// SideOutput connects the side output named tag, whose records are of type
// X: Context.SideOutput(tag) returns an operators.Collector[X] that appends
// each record, as a Record[any], to Harness.Side[tag]. Side outputs not
// connected are nil, as in the runtime when nothing consumes them (the
// operator then drops and counts their records).
func SideOutput[X any](tag string) Option {
	return func(c *config) {
		c.side[tag] = func(store func(any)) any {
			return operators.CollectorFunc[X](func(v X) { store(v) })
		}
	}
}

// StartAt sets the processing time the fake clock starts at (default
// DefaultStart).
func StartAt(t time.Time) Option {
	return func(c *config) { c.start = t }
}

// Harness drives one operator instance: it owns the operator's Context,
// feeds it records, watermarks and processing time, and records what it
// emits. Make one with New. The exported fields may be read, and reset
// (Out = nil), by the test between calls.
type Harness[T, O any] struct {
	// Out holds the records of the main output, in emission order.
	Out []Record[O]
	// Watermarks holds the watermarks the operator forwarded (with
	// Context.EmitWatermark, or because it handles no watermarks), in
	// order.
	Watermarks []int64
	// Idle holds the stream-status changes the operator emitted with
	// Context.EmitIdle, in order: true for idle, false for active again.
	Idle []bool
	// Side holds, per connected side-output tag, the records emitted to
	// it, with their values boxed in an any.
	Side map[string][]Record[any]
	// Clock is the processing-time clock; move it with
	// AdvanceProcessingTime so that due callbacks run.
	Clock *clockwork.FakeClock
	// Ctx is the operator's context, built by New and passed to Open.
	Ctx *operators.Context
	// Op is the operator under test.
	Op operators.OneInput[T]

	timers timerHeap
	seq    uint64
}

// New builds the operator with build, giving it the collector of the
// harness's main output, and prepares its Context: subtask 0 of 1, job
// "test", operator and UID "op", a discarding logger, a fake clock at
// DefaultStart, an empty operator state store, the harness's
// processing-time service, and the options' keyed state and side outputs.
// It does not call Open.
func New[T, O any](build func(out operators.Collector[O]) operators.OneInput[T], opts ...Option) *Harness[T, O] {
	cfg := config{side: make(map[string]func(func(any)) any), start: DefaultStart}
	for _, o := range opts {
		o(&cfg)
	}
	h := &Harness[T, O]{
		Side:  make(map[string][]Record[any]),
		Clock: clockwork.NewFakeClockAt(cfg.start),
	}
	maxP := cfg.maxP
	if maxP == 0 {
		maxP = keygroup.DefaultMaxParallelism
	}
	ctx := &operators.Context{
		Job:            "test",
		Operator:       "op",
		UID:            "op",
		Subtask:        0,
		Parallelism:    1,
		MaxParallelism: maxP,
		KeyGroups:      keygroup.Range{Start: 0, End: maxP},
		Logger:         slog.New(slog.DiscardHandler),
		Clock:          h.Clock,
		OperatorState:  state.NewOperatorStore(),
		Time:           &operators.TaskTime{Timestamp: operators.NoTimestamp},
		ProcessingTime: service[T, O]{h},
		EmitWatermark:  func(wm int64) { h.Watermarks = append(h.Watermarks, wm) },
		EmitIdle:       func(idle bool) { h.Idle = append(h.Idle, idle) },
	}
	if cfg.maxP > 0 {
		ctx.State = state.NewMemoryBackend(ctx.KeyGroups, h.Clock)
	}
	sides := make(map[string]any, len(cfg.side))
	for tag, mk := range cfg.side {
		sides[tag] = mk(func(v any) {
			h.Side[tag] = append(h.Side[tag], Record[any]{Value: v, Timestamp: ctx.Time.Timestamp})
		})
	}
	ctx.SideOutput = func(tag string) any { return sides[tag] }
	h.Ctx = ctx
	h.Op = build(operators.CollectorFunc[O](func(v O) {
		h.Out = append(h.Out, Record[O]{Value: v, Timestamp: ctx.Time.Timestamp})
	}))
	return h
}

// Open opens the operator with the harness's Context.
func (h *Harness[T, O]) Open() error {
	return catchErr(func() error { return h.Op.Open(h.Ctx) })
}

// Process sets Ctx.Time.Timestamp to ts and passes v to the operator, as
// the runtime does for each record of a batch. ts is the record's event
// timestamp in milliseconds, or operators.NoTimestamp. A panic of the
// operator, *operators.Failure included, goes through: use TryProcess to
// get a failure as an error.
func (h *Harness[T, O]) Process(v T, ts int64) {
	h.Ctx.Time.Timestamp = ts
	h.Op.Collect(v)
}

// TryProcess is Process returning the *operators.Failure the operator
// panicked with (operators.Fail), or nil. Other panics go through.
func (h *Harness[T, O]) TryProcess(v T, ts int64) error {
	return Catch(func() { h.Process(v, ts) })
}

// Watermark passes the watermark wm to the operator: ProcessWatermark if
// it implements operators.WatermarkHandler (it forwards what it decides
// with Ctx.EmitWatermark, which appends to Watermarks); otherwise wm is
// forwarded unchanged and appended to Watermarks, as the runtime does.
func (h *Harness[T, O]) Watermark(wm int64) error {
	wh, ok := h.Op.(operators.WatermarkHandler)
	if !ok {
		h.Watermarks = append(h.Watermarks, wm)
		return nil
	}
	return catchErr(func() error { return wh.ProcessWatermark(wm) })
}

// AdvanceProcessingTime moves processing time forward by d and runs the
// processing-time callbacks due by then, earliest first (registration
// order among equal due times). Before each callback the fake clock is
// moved to its due time (never backwards) and Ctx.Time.Timestamp is set to
// operators.NoTimestamp, as the runtime does; the callback gets the clock's
// time in milliseconds. Callbacks registered or cancelled by a callback
// count: one due by the end of the advance runs in the same call. The
// first error (or failure) stops the advance with the clock at that
// callback's time. d may be 0 to run the callbacks already due.
func (h *Harness[T, O]) AdvanceProcessingTime(d time.Duration) error {
	if d < 0 {
		return fmt.Errorf("operatorstest: AdvanceProcessingTime(%s): processing time does not go back", d)
	}
	target := h.Clock.Now().Add(d)
	limit := target.UnixMilli()
	for len(h.timers) > 0 && h.timers[0].at <= limit {
		c := heap.Pop(&h.timers).(*callback)
		if at := time.UnixMilli(c.at); at.After(h.Clock.Now()) {
			h.Clock.Advance(at.Sub(h.Clock.Now()))
		}
		h.Ctx.Time.Timestamp = operators.NoTimestamp
		now := h.Clock.Now().UnixMilli()
		if err := catchErr(func() error { return c.fn(now) }); err != nil {
			return fmt.Errorf("processing-time callback due at %d: %w", c.at, err)
		}
	}
	if target.After(h.Clock.Now()) {
		h.Clock.Advance(target.Sub(h.Clock.Now()))
	}
	return nil
}

// ProcessingTimers returns the due times (milliseconds) of the
// processing-time callbacks registered and neither run nor cancelled, in
// increasing order.
func (h *Harness[T, O]) ProcessingTimers() []int64 {
	ats := make([]int64, len(h.timers))
	for i, c := range h.timers {
		ats[i] = c.at
	}
	slices.Sort(ats)
	return ats
}

// Now returns the harness's processing time in milliseconds.
func (h *Harness[T, O]) Now() int64 { return h.Clock.Now().UnixMilli() }

// Finish calls the operator's Finish, as the runtime does after the last
// record of a bounded input.
func (h *Harness[T, O]) Finish() error {
	return catchErr(h.Op.Finish)
}

// EndInput does what the runtime does when a bounded input ends: the
// final watermark (watermark.MaxWatermark), then Finish.
func (h *Harness[T, O]) EndInput() error {
	if err := h.Watermark(watermark.MaxWatermark); err != nil {
		return err
	}
	return h.Finish()
}

// Close calls the operator's Close.
func (h *Harness[T, O]) Close() error {
	return catchErr(h.Op.Close)
}

// Values returns the values of Out, without their timestamps.
func (h *Harness[T, O]) Values() []O {
	vs := make([]O, len(h.Out))
	for i, r := range h.Out {
		vs[i] = r.Value
	}
	return vs
}

// Drain returns Out and empties it, to check what the next steps emit.
func (h *Harness[T, O]) Drain() []Record[O] {
	out := h.Out
	h.Out = nil
	return out
}

// StateLen returns state.Len of the keyed state named name: its number of
// key and namespace pairs (0 when not keyed or not registered).
func (h *Harness[T, O]) StateLen(name string) int {
	return state.Len(h.Ctx.State, name)
}

// Catch runs f and returns the *operators.Failure it panicked with (see
// operators.Fail), or nil if f returned. Any other panic goes through.
func Catch(f func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			fl, ok := r.(*operators.Failure)
			if !ok {
				panic(r)
			}
			err = fl
		}
	}()
	f()
	return nil
}

// catchErr runs f and returns its error, or the failure it panicked with.
func catchErr(f func() error) error {
	var err error
	if fl := Catch(func() { err = f() }); fl != nil {
		return fl
	}
	return err
}

// service is the operators.ProcessingTimeService of a harness.
type service[T, O any] struct {
	h *Harness[T, O]
}

// Now returns the fake clock's time in milliseconds.
func (s service[T, O]) Now() int64 { return s.h.Now() }

// At registers fn to run once processing time reaches at, when
// AdvanceProcessingTime gets there.
func (s service[T, O]) At(at int64, fn func(now int64) error) (cancel func()) {
	h := s.h
	h.seq++
	c := &callback{at: at, seq: h.seq, fn: fn}
	heap.Push(&h.timers, c)
	return func() {
		if c.index >= 0 {
			heap.Remove(&h.timers, c.index)
		}
	}
}

// callback is a registered processing-time callback; index is its place
// in the heap, -1 once it ran or was cancelled.
type callback struct {
	at    int64
	seq   uint64
	fn    func(now int64) error
	index int
}

// timerHeap orders callbacks by due time, then registration.
type timerHeap []*callback

func (q timerHeap) Len() int { return len(q) }
func (q timerHeap) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].seq < q[j].seq
}
func (q timerHeap) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].index, q[j].index = i, j
}
func (q *timerHeap) Push(x any) {
	c := x.(*callback)
	c.index = len(*q)
	*q = append(*q, c)
}
func (q *timerHeap) Pop() any {
	old := *q
	c := old[len(old)-1]
	old[len(old)-1] = nil
	*q = old[:len(old)-1]
	c.index = -1
	return c
}
