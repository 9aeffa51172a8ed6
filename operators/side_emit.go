package operators

// contextHolder is any per-call context that knows its operator's Context:
// KeyedContext, ProcessContext and the window contexts.
type contextHolder interface {
	operatorContext() *Context
}

// Emit sends x to the side output of tag from inside a process or window
// function call. Records to a side output nothing consumes are dropped.
// The lookup costs a map access; it is meant for the side path (late
// records, alerts), not for every record.
func (t OutputTag[X]) Emit(ctx contextHolder, x X) {
	oc := ctx.operatorContext()
	if oc.SideOutput == nil {
		return
	}
	if c, ok := oc.SideOutput(t.id).(Collector[X]); ok && c != nil {
		c.Collect(x)
	}
}
