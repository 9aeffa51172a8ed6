// Package pipeline owns the declared pipelines of edged: the YAML schema of
// a node config's `pipelines:` section (Config, Load, Validate), the Row
// type whose Schema is resolved once when the config loads, the payload
// decoders (JSON and CSV straight into a Row, no map per message), and
// Build, which turns one PipelineConfig into a job on the typed runtime of
// package stream.
//
// Per record, a built pipeline decodes, filters and computes in one
// process function, assigns event time, keys by a string field, and feeds
// windows (WindowAggregate) and alerts (KeyedProcess with timers). No
// logging and no reflection run per record; expressions are compiled once
// at load (expr-lang/expr). Evaluating an expression boxes the field values
// it reads, which allocates; decoding does not.
//
// Malformed payloads, records whose expressions fail (an integer overflow
// or a float that is not finite included), records whose event time is
// outside [MinEventTime, MaxEventTime], window results whose sum or avg
// is not finite, and results whose MQTT sink topic is not a valid topic
// name are counted (Job.DeadLetters) and
// sent to a dead-letter side output; none of them fails the job or enters
// a checkpoint as a result to publish. The stdout sink prints them as
// lines starting with "dead-letter: " followed by a JSON object
// {"pipeline", "error", "payload"}, the file sink writes them to the
// "dead-letter", "dead-letter-alerts", "dead-letter-late",
// and "dead-letter-sinks" subdirectories, and the MQTT sink publishes them to
// "deadletter/<pipeline>".
//
// Concurrency: Config values are plain data. Schema and compiled programs
// are immutable after Load and shared by all subtasks; every decoder and
// evaluator belongs to one subtask, created in its Open.
package pipeline
