// Package operators holds the built-in operators of edged: sources,
// map/filter/flatMap, keyed aggregation and sinks.
//
// Operators are plain code driven by the task runtime: they import neither
// actors nor cluster code. An operator instance belongs to exactly one
// subtask and is called from that subtask's goroutine only, one call at a
// time; it needs no locks for its own fields.
//
// Records move through a chain of operators by Collect calls: an operator
// pushes each output record into the Collector of the next operator. The
// per-record path allocates nothing, logs nothing and uses no reflection.
package operators
