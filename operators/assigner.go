package operators

import (
	"errors"
	"fmt"

	"github.com/edgedio/edged/watermark"
)

// TimestampsAndWatermarks assigns each record its event timestamp and
// generates watermarks by a strategy: the generator sees every timestamp
// and is asked for a watermark every strategy interval of processing time.
// Upstream watermarks are swallowed, except the final one (end of input).
// With an idle timeout, the stream is marked idle after that long without
// records, and active again at the next record.
type TimestampsAndWatermarks[T any] struct {
	strategy watermark.Strategy[T]
	out      Collector[T]
	ctx      *Context
	gen      watermark.Generator
	idleness *watermark.IdleDetector
	// seen is set by Collect and cleared by the periodic check.
	seen   bool
	idle   bool
	cancel func()
}

// NewTimestampsAndWatermarks returns the operator for strategy s.
func NewTimestampsAndWatermarks[T any](s watermark.Strategy[T], out Collector[T]) *TimestampsAndWatermarks[T] {
	return &TimestampsAndWatermarks[T]{strategy: s, out: out}
}

// Open creates the generator and schedules the first periodic emit.
func (o *TimestampsAndWatermarks[T]) Open(ctx *Context) error {
	if err := o.strategy.Validate(); err != nil {
		return err
	}
	o.ctx = ctx
	o.gen = o.strategy.NewGenerator()
	if o.gen == nil {
		return errors.New("watermark: the strategy's generator factory returned nil: return a new watermark.Generator from each call")
	}
	if o.strategy.IdleTimeout > 0 {
		o.idleness = watermark.NewIdleDetector(o.strategy.IdleTimeout)
		o.idleness.OnEvent(ctx.ProcessingTime.Now())
	}
	o.schedule(ctx.ProcessingTime.Now())
	return nil
}

func (o *TimestampsAndWatermarks[T]) interval() int64 {
	if iv := o.strategy.Interval.Milliseconds(); iv > 0 {
		return iv
	}
	return watermark.DefaultInterval.Milliseconds()
}

func (o *TimestampsAndWatermarks[T]) schedule(now int64) {
	o.cancel = o.ctx.ProcessingTime.At(now+o.interval(), o.periodic)
}

// periodic emits the generator's watermark and checks for idleness.
func (o *TimestampsAndWatermarks[T]) periodic(now int64) error {
	if o.idleness != nil {
		if o.seen {
			o.idleness.OnEvent(now)
			o.seen = false
		} else if idle, changed := o.idleness.Check(now); changed && idle && !o.idle {
			o.idle = true
			o.ctx.EmitIdle(true)
		}
	}
	if wm, ok := o.gen.OnPeriodicEmit(); ok {
		o.ctx.EmitWatermark(wm)
	}
	o.schedule(now)
	return nil
}

// Collect stamps v with its event timestamp and emits it. A timestamp
// of math.MinInt64, the mark of a record without one (NoTimestamp), is
// taken as math.MinInt64+1: the record keeps a timestamp as early as
// int64 allows, which no window holds (it goes to the late-data side
// output), instead of reaching an event-time operator that takes it for a
// record no assigner stamped and fails the job.
func (o *TimestampsAndWatermarks[T]) Collect(v T) {
	ts := o.strategy.Timestamp(v)
	if ts == NoTimestamp {
		ts = NoTimestamp + 1
	}
	o.ctx.Time.Timestamp = ts
	o.gen.OnEvent(ts)
	o.seen = true
	if o.idle {
		o.idle = false
		o.ctx.EmitIdle(false)
	}
	o.out.Collect(v)
	if o.strategy.PerEvent {
		if wm, ok := o.gen.OnPeriodicEmit(); ok {
			o.ctx.EmitWatermark(wm)
		}
	}
}

// ProcessWatermark forwards only the final watermark; this operator makes
// its own.
func (o *TimestampsAndWatermarks[T]) ProcessWatermark(wm int64) error {
	if wm == watermark.MaxWatermark {
		if wm, ok := o.gen.OnPeriodicEmit(); ok {
			o.ctx.EmitWatermark(wm)
		}
		o.ctx.EmitWatermark(watermark.MaxWatermark)
	}
	return nil
}

// assignerStateVersion is the first byte of the assigner's snapshot.
const assignerStateVersion = 1

// SnapshotState saves the generator's state (when it is a
// watermark.StatefulGenerator), so that after a restore the watermarks
// are those of a run without the failure, and whether the output is
// marked idle (which RestoreState reads but does not take back).
func (o *TimestampsAndWatermarks[T]) SnapshotState(int64) ([]byte, error) {
	idle := byte(0)
	if o.idle {
		idle = 1
	}
	b := []byte{assignerStateVersion, idle}
	if g, ok := o.gen.(watermark.StatefulGenerator); ok {
		b = g.AppendState(b)
	}
	return b, nil
}

// RestoreState takes back what SnapshotState wrote, at the same
// parallelism. With another parallelism the generator starts afresh (its
// first watermarks are then held back downstream by the restored task
// watermarks, which never go back). The output starts active whatever the
// snapshot says: stream status is not restored (the task restores its
// output, and the tasks downstream their input channels, active), so an
// assigner still without records says it is idle again after its idle
// timeout; taking the idle mark back would keep it from ever saying so,
// and its restored watermark would hold the windows downstream until its
// next record.
func (o *TimestampsAndWatermarks[T]) RestoreState(states [][]byte, oldParallelism int) error {
	if len(states) != 1 || oldParallelism != o.ctx.Parallelism || len(states[0]) == 0 {
		return nil
	}
	b := states[0]
	if len(b) < 2 || b[0] != assignerStateVersion || b[1] > 1 {
		return fmt.Errorf("timestamp assigner: %w: %x", watermark.ErrCorruptState, b)
	}
	if g, ok := o.gen.(watermark.StatefulGenerator); ok && len(b) > 2 {
		if err := g.RestoreState(b[2:]); err != nil {
			return fmt.Errorf("timestamp assigner: %w", err)
		}
	}
	return nil
}

// Finish does nothing: the final watermark arrives through
// ProcessWatermark.
func (o *TimestampsAndWatermarks[T]) Finish() error { return nil }

// Close cancels the periodic emit.
func (o *TimestampsAndWatermarks[T]) Close() error {
	if o.cancel != nil {
		o.cancel()
	}
	return nil
}
