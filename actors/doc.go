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
// Job master and task hosts: a Runner is the job master of one deployment
// of a job. It owns the checkpoint coordinator, the checkpoint metadata
// and the deployment's epoch (an Execution gives every attempt a new one);
// the tasks are built by a task host per node, which wires the channels
// between its own tasks as above and the channels to tasks on other nodes
// through its Network (Config.Cluster; package cluster implements it), and
// reports to the master only by messages carrying the epoch: checkpoint
// acknowledgements and declines, tasks finished or failed, notifications
// handled. Messages of another epoch are dropped and counted. Without a
// Cluster one host builds every task, as a single process. A host
// registers with the fingerprint of its plan (its graph and settings
// digest, Job.Settings); one that differs from the master's is refused
// (ErrPlanMismatch). A cross-node channel carries the batches encoded with the element type's codec and the control messages
// in one sequence; its failure fails the job, which restarts from the
// latest checkpoint by its restart strategy.
//
// Runner.Move hands keyed subtasks over to other nodes while the job runs
// (handover.go): at a savepoint's barrier the senders park their
// channels to the moved subtasks, the moved subtasks stop, and once the
// savepoint is complete each is retired on its old node, restored on its
// new one and its channels re-pointed (a new channel generation); the
// other tasks are not restarted. A failure after the barrier restarts the
// whole job from its latest checkpoint or savepoint.
//
// Concurrency: a task's fields are touched only from its actor's
// goroutine (protoactor runs one message at a time per actor). The runner
// starts tasks, waits for them and stops them; goroutines it starts are
// tracked and waited for before Run returns. Panics never reach
// protoactor's supervisor: a task recovers them and fails the job, so a
// task is never silently restarted. A host's task and channel lists
// change only in a handover, under the host's mutex.
package actors
