package cluster

import "errors"

var (
	// ErrChannelFailed is wrapped by every error that fails a cross-node
	// channel. A failed channel delivers nothing more: the job recovers from
	// its latest checkpoint.
	ErrChannelFailed = errors.New("cluster: channel failed")
	// ErrGap is returned (wrapped with ErrChannelFailed) when a frame
	// arrives with a sequence number past the next one expected: frames
	// were lost.
	ErrGap = errors.New("cluster: sequence gap")
	// ErrStaleDuplicate is returned (wrapped with ErrChannelFailed) when a
	// frame arrives with a sequence number delivered so long ago that it
	// lies outside the duplicate window.
	ErrStaleDuplicate = errors.New("cluster: duplicate outside the window")
	// ErrDisconnected is returned (wrapped with ErrChannelFailed) when the
	// connection to the peer node was lost.
	ErrDisconnected = errors.New("cluster: peer disconnected")
	// ErrAckTimeout is returned (wrapped with ErrChannelFailed) when frames
	// stayed unacknowledged for longer than the acknowledgement timeout.
	ErrAckTimeout = errors.New("cluster: acknowledgement timeout")
	// ErrCreditExceeded is returned (wrapped with ErrChannelFailed) when a
	// sender has more batches in flight than the channel's credits.
	ErrCreditExceeded = errors.New("cluster: credit exceeded")
	// ErrProtocol is returned (wrapped with ErrChannelFailed) for a frame
	// that breaks the channel protocol: an acknowledgement of a frame never
	// sent, a frame after end of stream, a data frame at a sender.
	ErrProtocol = errors.New("cluster: protocol violation")
	// ErrChannelClosed is returned when a message is sent on a channel that
	// has failed or already sent its end of stream.
	ErrChannelClosed = errors.New("cluster: channel closed")

	// ErrBadMagic is returned when a frame does not start with the frame
	// magic.
	ErrBadMagic = errors.New("cluster: bad frame magic")
	// ErrBadVersion is returned for a frame of an unknown format version.
	ErrBadVersion = errors.New("cluster: unsupported frame version")
	// ErrBadKind is returned for a frame of an unknown kind.
	ErrBadKind = errors.New("cluster: unknown frame kind")
	// ErrShortFrame is returned when a frame ends inside its header or its
	// body.
	ErrShortFrame = errors.New("cluster: short frame")
	// ErrCorruptFrame is returned when a frame's fields are out of range.
	ErrCorruptFrame = errors.New("cluster: corrupt frame")
	// ErrFrameTooLarge is returned when a frame would exceed the largest
	// frame the transport carries.
	ErrFrameTooLarge = errors.New("cluster: frame too large")
	// ErrRecordTooLarge is returned when one record alone exceeds the byte
	// cap of a batch.
	ErrRecordTooLarge = errors.New("cluster: record larger than a batch")

	// ErrPlanMismatch is returned when a peer runs a job whose plan
	// fingerprint differs from the local one.
	ErrPlanMismatch = errors.New("cluster: job plan mismatch")

	// ErrTransportClosed is returned by a closed transport.
	ErrTransportClosed = errors.New("cluster: transport closed")
	// ErrUnknownNode is returned when sending to a node the transport does
	// not know.
	ErrUnknownNode = errors.New("cluster: unknown node")
)

// ErrDuplicateID is returned by Membership.Start when a live member
// already gossips this node's id from another address: two nodes were
// given the same cluster.node.
var ErrDuplicateID = errors.New("cluster: another member has this node's id")

// ErrNoMembers is returned by Place when there are units to place and no
// member to place them on.
var ErrNoMembers = errors.New("cluster: no members to place units on")

// ErrMetaTooLarge is returned when a node's metadata does not fit gossip's
// 512 bytes.
var ErrMetaTooLarge = errors.New("cluster: node metadata too large")

// ErrBadMeta is returned for node metadata that does not parse.
var ErrBadMeta = errors.New("cluster: bad node metadata")

// ErrBadDecision is returned for a decision protocol message that does not
// parse.
var ErrBadDecision = errors.New("cluster: bad decision message")

// ErrBadDeciderConfig is returned for an invalid DeciderConfig.
var ErrBadDeciderConfig = errors.New("cluster: bad decider config")

// Replica errors.
var (
	// ErrReplication is returned when a snapshot file could not be copied
	// to one of its replica peers.
	ErrReplication = errors.New("cluster: replication failed")
	// ErrNoReplica is returned when no holder served an intact replica.
	ErrNoReplica = errors.New("cluster: no intact replica")
)

// Rebalance errors.
var (
	// ErrOverCapacity is returned when a rebalance would put more units
	// on a node than its capacity, or leave no node to run them.
	ErrOverCapacity = errors.New("cluster: over capacity")
	// ErrBadGateConfig is returned for an invalid GateConfig.
	ErrBadGateConfig = errors.New("cluster: bad rebalance gate config")
	// ErrRebalance wraps the failure of a rebalance's step.
	ErrRebalance = errors.New("cluster: rebalance failed")
)
