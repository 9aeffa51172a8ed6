package cluster

// Transport carries frames between nodes. Delivery is at most once: a frame
// may be lost (and, on the in-memory network, duplicated, delayed or
// reordered); the channel machines detect it. Implementations: MemoryNetwork
// nodes for tests, RemoteTransport on protoactor remote.
//
// Safe for concurrent use.
type Transport interface {
	// Addr returns the node's address, as peers name it in Send.
	Addr() string
	// Send queues frame for node to and returns without waiting for the
	// network. It takes ownership of frame: the caller must not change it
	// afterwards. It fails only for local reasons (the transport is
	// closed, the node is unknown, the frame too large); a frame lost
	// later is not reported.
	Send(to string, frame []byte) error
}

// Handler receives what a transport delivers. The transport calls
// HandleFrame for the frames of one peer one at a time, in the order they
// arrived, from a goroutine of its own; HandleDisconnect may be called
// from another. Neither may block for long: they hold up the peer's
// frames.
type Handler interface {
	// HandleFrame takes one frame's bytes, which the handler then owns.
	HandleFrame(frame []byte)
	// HandleDisconnect says the connection to node was lost: frames sent
	// to it may have been lost, and channels with it must fail.
	HandleDisconnect(node string, err error)
}
