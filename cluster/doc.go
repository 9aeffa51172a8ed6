// Package cluster runs one job's tasks across several devices: it owns the
// channels between subtasks placed on different nodes, the transports that
// carry them, and the checks that both ends run the same plan.
//
// What it owns:
//
//   - Channel identity. A channel is named by a ChannelID (job, epoch, edge,
//     from subtask, to subtask) that both ends derive from the plan
//     (PlanChannels); no pointer crosses a node boundary.
//   - The frame format (AppendFrame, DecodeFrame): a header with magic,
//     version, kind, channel and sequence number, and as body the runtime
//     codec's batch bytes (BatchEncoder, DecodeBatch). Decoders never
//     panic.
//   - The channel protocol, as two pure machines: Sender and Receiver. Every
//     message of a channel (record batches, watermarks, stream status,
//     barriers, end of stream) is numbered in one sequence; the receiver
//     delivers in sequence and acknowledges once the task has processed a
//     batch, and the acknowledgement is the sender's credit, so the bound
//     on batches in flight holds across nodes as it does locally. A gap, a
//     duplicate older than the window, a sender over its credits, a lost
//     connection or a missing acknowledgement fails the channel loudly
//     (ErrChannelFailed); nothing is lost or duplicated silently. Frames of
//     another epoch are dropped and counted.
//   - Endpoint: the thin shell that owns a node's channel machines, steps
//     them with what its transport delivers, sends what they transmit, and
//     turns a lost connection into the failure of every channel with that
//     peer.
//   - Network: a node's end of the cross-node channels as package actors
//     sees it (actors.Network): it opens channels by the ids the task host
//     derives from the plan, maps node ids to transport addresses, adds
//     up what was sent (Sent), and turns a channel's failure into the
//     task host's failure callback. Pump runs a MemoryNetwork in real time
//     under a whole job.
//   - Transports (Transport): an in-memory network with a seeded fault
//     schedule for tests (MemoryNetwork), and RemoteTransport on
//     protoactor-go's remote package, which no other file of edged
//     imports.
//   - The plan fingerprint (FingerprintOf: the job graph and its settings
//     digest) that nodes compare before they exchange frames.
//   - Membership (Membership): memberlist gossip with a failure-detection
//     profile for a LAN of devices, node metadata (Meta) within gossip's
//     512 bytes, leaves told apart from crashes, events queued for the
//     cluster's own loop without ever blocking memberlist.
//   - Placement (Place, Leader, HasQuorum): pure functions. Keyed subtasks
//     go to live nodes by weighted rendezvous hashing with bounded load, so
//     one join or leave moves about that node's share; the leader is the
//     lowest id among the members a majority sees, and a node without a
//     majority owns nothing.
//   - Decider: the pure state machine by which the leader decides each
//     placement and its epoch (one Paxos round per epoch, so an epoch
//     never names two placements and a new leader never reuses one), and
//     by which each node learns which units it may run: a unit moves only
//     after every node the leader sees gave it up, and a node runs units
//     only under a lease that a majority renews, so no unit is owned by
//     two nodes at any moment, whatever the failure detectors say.
//   - Replicas (ReplicaTargets): which peers keep the copies of a node's
//     snapshot files, by rendezvous hashing on the writer's id. The copies
//     themselves live in each node's snapshot store (snapshot.Store's
//     ImportReplica and AddMetadata), moved over the node API by the
//     daemon.
//   - Rebalancing (PlanRebalance, RebalanceGate, Migration): pure
//     machines for moving work by savepoint migration: the plan and its
//     moves (refused past a node's slots), when a rebalance may start
//     (joins settled, no checkpoint, failover or rebalance running,
//     storms damped), and the steps of one migration with their fallback
//     to the previous placement.
//
// Concurrency. The machines (Sender, Receiver) and BatchEncoder are not safe
// for concurrent use: each has one owner that serialises its calls. They
// start no goroutines and read no clock: time enters through Tick. A
// Sender is stepped with acknowledgements by whoever receives them (the
// transport's handler), not from the sending task's mailbox, so a task
// blocked on credit still sees its credits come back; Endpoint guards each
// machine with a mutex for that. Transports are safe for concurrent use;
// their Handler is called from the transport's own goroutines (see
// Handler). Membership's methods are safe for concurrent use; memberlist
// calls its delegates on memberlist's goroutines, where they only queue.
// Constructors start nothing: MemoryNetwork runs only when the
// test pumps it, RemoteTransport only after Start.
//
// Dependencies. cluster reads the exported job graph of package actors
// (actors.Job) to derive channels and fingerprints; actors must not import
// cluster, and reaches it through an interface of its own (actors.Network,
// implemented by Network).
package cluster
