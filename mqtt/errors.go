package mqtt

import "errors"

var (
	// ErrInvalidConfig is wrapped by every Validate error of this package.
	ErrInvalidConfig = errors.New("mqtt: invalid config")
	// ErrBrokerClosed is returned by Start on a closed Broker.
	ErrBrokerClosed = errors.New("mqtt: broker closed")
	// ErrBrokerStarted is returned by a second Start.
	ErrBrokerStarted = errors.New("mqtt: broker already started")
	// ErrCorruptState is returned by RestoreState for bytes SnapshotState
	// did not write.
	ErrCorruptState = errors.New("mqtt: corrupt source state")
	// ErrOtherLog is wrapped, with operators.ErrSourcePositionGone, by
	// RestoreState for a snapshot read from another ingest log than the
	// Source's (another node's, or another data_dir's: its
	// ingestlog.Log.ID differs), whose offset names other records.
	ErrOtherLog = errors.New("mqtt source: the snapshot was read from another ingest log")
	// ErrTopic is returned for a topic template that cannot be parsed or
	// expands to an invalid topic name.
	ErrTopic = errors.New("mqtt: invalid topic")
	// ErrPublish is wrapped by publish failures of a Publisher.
	ErrPublish = errors.New("mqtt: publish failed")
	// ErrPublisherClosed is returned by a closed Publisher.
	ErrPublisherClosed = errors.New("mqtt: publisher closed")
	// ErrSessionStore is wrapped by failures to write the broker's
	// session journal (BrokerConfig.DataDir); while it fails, sessions are
	// not persisted and publishes that need it are refused. After a
	// failure the journal is rewritten at the next use, and the store is
	// healthy again once that succeeds.
	ErrSessionStore = errors.New("mqtt: broker session store failed")
	// ErrCorruptSession is returned by Broker.Start for a session journal
	// with a damaged record before its end.
	ErrCorruptSession = errors.New("mqtt: corrupt broker session journal")
	// ErrMessageTooLarge is wrapped by Message.Err for a message that was
	// too large to keep and was recorded as a dead letter instead.
	ErrMessageTooLarge = errors.New("mqtt: message too large")
)

// Errors of a Subscriber's direct reader (SubscriberConfig.Client
// "direct"); it logs them and reconnects.
var (
	// ErrConnectRefused is returned when the broker refuses the
	// connection (a CONNACK with a non-zero return code).
	ErrConnectRefused = errors.New("mqtt: broker refused the connection")
	// ErrSubscribeRefused is returned when the broker refuses every
	// topic filter of the subscription (SUBACK 0x80).
	ErrSubscribeRefused = errors.New("mqtt: broker refused the subscription")
	// ErrMalformedPacket is returned for a packet from the broker that
	// cannot be decoded or that a broker must not send to a subscriber.
	ErrMalformedPacket = errors.New("mqtt: malformed packet from the broker")
)
