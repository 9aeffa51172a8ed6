package operators

import "sync/atomic"

// OutputTag names a side output carrying records of type X, like Flink's
// OutputTag: a process function or window sends records to it besides its
// main output (late records, alerts), and stream.SideOutput reads it.
type OutputTag[X any] struct {
	id string
}

// NewOutputTag returns the tag named id; ids are unique per operator.
func NewOutputTag[X any](id string) OutputTag[X] { return OutputTag[X]{id: id} }

// ID returns the tag's name.
func (t OutputTag[X]) ID() string { return t.id }

// Collector returns the collector of the side output in ctx, or one that
// counts and drops the records when nothing consumes the side output.
func (t OutputTag[X]) Collector(ctx *Context) Collector[X] {
	if ctx.SideOutput != nil {
		if c, ok := ctx.SideOutput(t.id).(Collector[X]); ok && c != nil {
			return c
		}
	}
	return &Discard[X]{}
}

// Discard is a collector that counts and drops what it gets.
type Discard[X any] struct {
	n atomic.Int64
}

// Collect drops v.
func (d *Discard[X]) Collect(X) { d.n.Add(1) }

// Dropped returns the number of records dropped.
func (d *Discard[X]) Dropped() int64 { return d.n.Load() }
