// Package actors executes job graphs on protoactor-go actors.
//
// A job is a graph of vertices (operators) joined by edges (forward,
// rebalance, key-by, broadcast). Vertices joined by a forward edge with the
// same parallelism are chained into one task: records pass from one
// operator to the next by a direct call, with no mailbox hop and no copy.
// Each subtask of a chain is one actor. Its mailbox carries record batches,
// end-of-stream and control messages, in order per channel.
//
// Flow control is by credits: every channel between two subtasks owns a
// fixed number of batch buffers. A sender takes a free buffer before it
// fills it and the receiver gives it back once processed, so at most that
// many batches are in flight per channel and memory stays bounded when a
// source outruns its consumers; a sender without credit blocks, and the
// block travels upstream to the sources.
//
// End of input: a task whose inputs have all ended finishes its operators
// and sends end-of-stream on. Without checkpoints the job ends when every
// task has finished, and sinks commit in Finish. With checkpoints the
// runner then takes a final checkpoint through the finished graph (every
// task snapshots its final state), tells every task of its completion so
// that the sinks commit it, and ends the job once every task has handled
// that; a stop-with-savepoint ends the same way. The final checkpoint's
// metadata marks the job finished: restoring it commits what it holds and
// runs nothing.
//
// Concurrency: a task's fields are touched only from its actor's
// goroutine (protoactor runs one message at a time per actor). The runner
// starts tasks, waits for them and stops them; goroutines it starts are
// tracked and waited for before Run returns. Panics never reach
// protoactor's supervisor: a task recovers them and fails the job, so a
// task is never silently restarted.
package actors
