package operators

// ProcessFunction processes the records of a stream that is not keyed, one
// at a time: it sees each record's timestamp, the watermark and processing
// time, and emits to the main output and side outputs. Timers need a keyed
// stream (KeyedProcessFunction). Its methods run on the subtask's
// goroutine; an error fails the task.
type ProcessFunction[T, O any] interface {
	// Open is called once per subtask before the first record.
	Open(ctx *Context) error
	// ProcessElement is called for every record.
	ProcessElement(v T, ctx *ProcessContext[O]) error
}

// ProcessContext is the context of one ProcessElement call.
type ProcessContext[O any] struct {
	op  *Context
	out Collector[O]
	wm  int64
}

// Timestamp returns the record's event timestamp, or NoTimestamp.
func (c *ProcessContext[O]) Timestamp() int64 { return c.op.Time.Timestamp }

// CurrentWatermark returns the operator's current watermark.
func (c *ProcessContext[O]) CurrentWatermark() int64 { return c.wm }

// CurrentProcessingTime returns processing time in milliseconds.
func (c *ProcessContext[O]) CurrentProcessingTime() int64 { return c.op.ProcessingTime.Now() }

// Emit sends v to the main output.
func (c *ProcessContext[O]) Emit(v O) { c.out.Collect(v) }

func (c *ProcessContext[O]) operatorContext() *Context { return c.op }

// Process is the operator running a ProcessFunction.
type Process[T, O any] struct {
	fn   ProcessFunction[T, O]
	pctx ProcessContext[O]
}

// NewProcess returns the operator running fn.
func NewProcess[T, O any](fn ProcessFunction[T, O], out Collector[O]) *Process[T, O] {
	return &Process[T, O]{fn: fn, pctx: ProcessContext[O]{out: out, wm: minWatermark}}
}

// Open opens the function.
func (o *Process[T, O]) Open(ctx *Context) error {
	o.pctx.op = ctx
	return o.fn.Open(ctx)
}

// Collect processes one record.
func (o *Process[T, O]) Collect(v T) {
	if err := o.fn.ProcessElement(v, &o.pctx); err != nil {
		Fail(err)
	}
}

// ProcessWatermark records the watermark and forwards it.
func (o *Process[T, O]) ProcessWatermark(wm int64) error {
	o.pctx.wm = wm
	o.pctx.op.EmitWatermark(wm)
	return nil
}

// Finish does nothing.
func (o *Process[T, O]) Finish() error { return nil }

// Close does nothing.
func (o *Process[T, O]) Close() error { return nil }
