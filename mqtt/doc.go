// Package mqtt owns edged's MQTT input and output: the embedded broker
// (Broker), the source reading the durable ingest log (Source), and the
// MQTT sinks (Sink, PublishFunc for operators.NewWriteAheadSink).
//
// Ingestion: with the embedded broker, the broker's OnPublish hook
// appends each matching message to the ingest log (package ingestlog)
// before the device gets its PUBACK, so a device's QoS 1 message is
// acknowledged only once it is on disk and a full log pushes back on the
// device. The Source replays the log from its checkpointed offset and,
// when a checkpoint completes, truncates it below what the oldest retained
// checkpoint needs: at-least-once into the job, exactly-once state with
// checkpoints, and a fallback to an older retained checkpoint finds its
// records.
//
// Messages too large to keep: the broker reads no packet larger than
// BrokerConfig.MaxMessageBytes, and a Subscriber appends no message
// larger than SubscriberConfig.MaxMessageBytes; a message that passes
// those bounds but cannot fit in one record of an ingest log, and every
// message over the Subscriber's bound, is replaced in the log by a
// dead-letter record (ingestlog.Message.TooLarge) and acknowledged once
// that is durable, so that it is neither lost without a trace nor
// redelivered forever. The Source emits it as a Message whose Err wraps
// ErrMessageTooLarge, which the pipeline sends to its dead-letter output.
//
// Output: Sink publishes as records arrive and waits for the broker's
// acknowledgements at each checkpoint barrier (at-least-once).
// PublishFunc feeds operators.NewWriteAheadSink, which publishes only the
// records of completed checkpoints, each carrying a deterministic msg_id
// (WithMsgID), so a consumer dropping duplicate ids sees each record once.
// Topics filled from records (TopicTemplate) are checked against the MQTT
// 3.1.1 topic-name rules (ValidateTopicName); a record whose topic or
// payload cannot be made is handed to the sink's reject function instead
// of failing the job, when one is given. With a Batch (Sink.Batch, the
// batch argument of PublishLineFunc and PublishLineChunksFunc) the
// records to one topic go out as JSON arrays, each element keeping its
// own msg_id.
//
// Concurrency: the Broker's hook runs on mochi's connection goroutines
// (one per client, so a client's messages are appended in order). Source,
// Sink and Publisher are owned by one subtask goroutine and are not safe
// for concurrent use. Constructors start nothing; Broker.Start starts the
// listener and Close stops it and waits for its connection goroutines. A
// Publisher to a tcp:// or ssl:// broker starts a reader and a writer
// goroutine for its connection at the first Publish; Close waits for
// them.
package mqtt
