package actors

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/edgedio/edged/snapshot"
)

// Cluster places the tasks of one job on several nodes. A Config without
// one runs every task in the process, as a single node.
//
// Every node builds the job graph from the same config or code; the job
// master (the Runner) compares each node's plan fingerprint with its own
// when the node's task host registers, and refuses a node running another
// version of the job. A task host builds only the tasks placed on its
// node; channels between two tasks of one node are local, as in a single
// process, and channels between nodes go through the node's Network.
type Cluster struct {
	// Nodes are the nodes that host the job's tasks, each with its
	// network. Node ids must be unique and non-empty.
	Nodes []Node
	// Placement maps a task (a vertex UID and a subtask) to the id of the
	// node that runs it. A chain's subtask goes where the first of its
	// vertices found in the table says; a task not in the table runs on
	// the first node.
	Placement map[TaskKey]string
	// ControlTimeout bounds each step of a deployment's handshake: every
	// host registered, every host deployed its tasks. 0 means
	// DefaultControlTimeout (10 s). A step that times out fails the
	// deployment with ErrControlTimeout, restarted by the restart
	// strategy.
	ControlTimeout time.Duration
	// Invite asks a node that runs in another process to host its tasks
	// of a deployment (Worker.Deploy on that node); it returns once the
	// node's host opened its control channels. Required when a node has
	// no Network. A failed invitation fails the deployment with
	// ErrControlFailed, restarted by the restart strategy.
	Invite func(ctx context.Context, node string, d Deployment) error
	// Describe, when set, returns what an operator needs to find a node
	// that does not answer (its configured addresses): a handshake step
	// that times out names it beside the node's id.
	Describe func(node string) string
	// Update, when set, is called before each attempt (each deployment):
	// it returns the nodes and the placement the attempt runs with (the
	// live members, after a failure or a join) in place of Nodes and
	// Placement. The first node must be the master's. An error means the
	// cluster has no deployment to offer now (no majority, say): the
	// attempt is tried again every RetryInterval, without using up the
	// restart strategy, until Update succeeds or the job is cancelled.
	Update func() (nodes []Node, placement map[TaskKey]string, err error)
	// RetryInterval is the wait between two calls of Update that failed.
	// 0 means DefaultRetryInterval (1 s).
	RetryInterval time.Duration
	// EpochBase is added to each attempt's number to make its epoch, so
	// that the epochs of a job master that restarted are newer than those
	// its nodes saw before. 0 in a single process.
	EpochBase uint64
	// Files, when set, copies the state files the master's own node
	// writes to the peers that keep replicas of them (SnapshotFiles.Push
	// with the master's node as master), before the acknowledgement
	// counts.
	Files SnapshotFiles
	// Publish, when set, is called with the metadata of each snapshot
	// once it is committed in the job's store and before its completion
	// is announced: it stores it on the other nodes. An error fails the
	// snapshot as a failed metadata write does.
	Publish func(ctx context.Context, epoch uint64, md *snapshot.Metadata) error
	// Committed, when set, is called once the master marked a
	// stop-with-savepoint committed in its own store (every sink
	// published what it holds), before the stop returns: it marks the
	// other nodes' copies of the savepoint too, so that a node that
	// restores its own copy (a takeover, a hand-back) publishes none of
	// its held output again. An error is logged; the savepoint stays
	// valid, and a node whose copy is not marked publishes the held
	// output again under the same ids.
	Committed func(ctx context.Context, epoch uint64, job string, id snapshot.ID) error
	// NextCheckpoint, when set, is the lowest id the attempt's
	// checkpoints may take: a master that took over from another never
	// reuses an id the other triggered.
	NextCheckpoint snapshot.ID
	// HandoverHook, when set, is called at each step of a handover
	// (Runner.Move) that runs on a node, with that node, from the job
	// master's handover goroutine; an error fails the step as the node's
	// failure would. It is for fault injection in tests.
	HandoverHook func(step HandoverStep, node string) error
}

// DefaultRetryInterval is Cluster.RetryInterval's default.
const DefaultRetryInterval = time.Second

// retryInterval returns c's RetryInterval or its default.
func (c *Cluster) retryInterval() time.Duration {
	if c != nil && c.RetryInterval > 0 {
		return c.RetryInterval
	}
	return DefaultRetryInterval
}

// Node is one node of a Cluster.
type Node struct {
	// ID names the node in the placement table.
	ID string
	// Network carries the node's cross-node channels. The first node
	// runs the job master and needs one; a node without one runs in
	// another process and is invited with Cluster.Invite.
	Network Network
	// Job is the job graph as the node built it; nil means the job the
	// Runner was given. Its fingerprint must match the Runner's.
	Job *Job
}

// TaskKey names one subtask of a vertex in a placement table.
type TaskKey struct {
	UID     string
	Subtask int
}

// String renders the key as uid[subtask].
func (k TaskKey) String() string { return fmt.Sprintf("%s[%d]", k.UID, k.Subtask) }

// ChannelKey names one channel of a job run, the same way on both of its
// ends: the job, the epoch of the deployment, the edge's index in
// Job.Edges, the sending and receiving subtasks, and the channel's
// generation: 0 for the channels a deployment opens, the handover's
// number for a channel a handover opened to or from a moved subtask
// (Runner.Move), so that its frames never reach the channel it replaced.
type ChannelKey struct {
	Job      string
	Epoch    uint64
	Edge     int
	From, To int
	Gen      int
}

// FrameKind says what a cross-node channel message carries.
type FrameKind uint8

const (
	// FrameBatch carries a record batch encoded with the element type's
	// codec (the body of a serialised batch).
	FrameBatch FrameKind = iota + 1
	// FrameWatermark carries a watermark in Value.
	FrameWatermark
	// FrameStatus carries the stream status in Value: 1 idle, 0 active.
	FrameStatus
	// FrameBarrier carries checkpoint Value's barrier.
	FrameBarrier
	// FrameEnd is the channel's end of stream.
	FrameEnd
)

// RemoteFrame is one message delivered on the receiving end of a
// cross-node channel, in the channel's sequence.
type RemoteFrame struct {
	// Seq is the message's sequence number: the receiver reports it
	// processed with RemoteReceiver.Processed.
	Seq   uint64
	Kind  FrameKind
	Value int64
	// Body is a batch's encoded records; the receiver owns it.
	Body []byte
}

// Network carries the cross-node channels of the node it belongs to. It is
// implemented outside this package (package cluster), over a transport.
type Network interface {
	// Fingerprint returns a stable fingerprint of j's plan: two nodes
	// exchange channels only when theirs are equal. It is the plan's
	// digest, then optionally a space and, in readable form, the network
	// settings every node must share: a mismatch of those alone is named
	// in the error (ErrPlanMismatch).
	Fingerprint(j *Job) (string, error)
	// OpenSender opens the sending end of channel id, whose receiver runs
	// on node peer. onFail is called once if the channel fails (a gap, a
	// lost connection, a missing acknowledgement), from any goroutine; it
	// must not block.
	OpenSender(id ChannelKey, peer string, onFail func(error)) (RemoteSender, error)
	// OpenReceiver opens the receiving end of channel id, whose sender
	// runs on node peer. deliver gets the channel's messages in sequence,
	// from the network's goroutine, and must not block. onFail is as for
	// OpenSender.
	OpenReceiver(id ChannelKey, peer string, deliver func(RemoteFrame), onFail func(error)) (RemoteReceiver, error)
}

// RemoteSender is the sending end of a cross-node channel. Its methods are
// called by the sending task only (Close after the task stopped).
type RemoteSender interface {
	// Send sends one message in the channel's sequence. It blocks while
	// the channel has no credit (batches unacknowledged by the receiver)
	// until credit returns, ctx ends, or the channel fails; it returns the
	// channel's failure once it failed. body is the caller's again once
	// Send returns: the network copies what it keeps.
	Send(ctx context.Context, kind FrameKind, value int64, body []byte) error
	// MaxBody is the largest batch body, in bytes, a frame carries.
	MaxBody() int
	// Close closes the channel's end.
	Close()
}

// RemoteReceiver is the receiving end of a cross-node channel.
type RemoteReceiver interface {
	// Processed reports that every message up to seq was processed: the
	// batches among them are the sender's credits again.
	Processed(seq uint64)
	// Close closes the channel's end.
	Close()
}

// validate checks the cluster against the plan: unique node ids, a
// network on every node, placement rows naming known nodes and existing
// subtasks, and no negative timeout or retry interval.
func (c *Cluster) validate(j *Job) error {
	var errs []error
	if len(c.Nodes) == 0 {
		errs = append(errs, errors.New("cluster.nodes: at least one node"))
	}
	ids := make(map[string]bool)
	for i, n := range c.Nodes {
		switch {
		case n.ID == "":
			errs = append(errs, fmt.Errorf("cluster.nodes[%d].id must be set", i))
		case ids[n.ID]:
			errs = append(errs, fmt.Errorf("cluster.nodes[%d].id %q is not unique", i, n.ID))
		}
		ids[n.ID] = true
		if n.Network == nil && (i == 0 || c.Invite == nil) {
			errs = append(errs, fmt.Errorf("cluster.nodes[%d].network must be set", i))
		}
	}
	// 0 means the default; a negative duration is a mistake, not "the
	// default" nor "no wait", and is refused as the other settings are.
	if c.ControlTimeout < 0 {
		errs = append(errs, fmt.Errorf("cluster.control_timeout (%s) must not be negative (0 means %s)", c.ControlTimeout, DefaultControlTimeout))
	}
	if c.RetryInterval < 0 {
		errs = append(errs, fmt.Errorf("cluster.retry_interval (%s) must not be negative (0 means %s)", c.RetryInterval, DefaultRetryInterval))
	}
	par := make(map[string]int)
	for _, v := range j.Vertices {
		par[v.UID] = v.Parallelism
	}
	for k, node := range c.Placement {
		if !ids[node] {
			errs = append(errs, fmt.Errorf("cluster.placement: %s is placed on unknown node %q", k, node))
		}
		if p, ok := par[k.UID]; !ok {
			errs = append(errs, fmt.Errorf("cluster.placement: %s: the job has no operator with uid %q", k, k.UID))
		} else if k.Subtask < 0 || k.Subtask >= p {
			errs = append(errs, fmt.Errorf("cluster.placement: %s: operator %q has %d subtasks", k, k.UID, p))
		}
	}
	return errors.Join(errs...)
}

// update returns the cluster an attempt runs with: c, or c with the nodes
// and placement of Update.
func (c *Cluster) update() (*Cluster, error) {
	if c.Update == nil {
		return c, nil
	}
	nodes, placement, err := c.Update()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNotPlaced, err)
	}
	u := *c
	u.Nodes, u.Placement = nodes, placement
	return &u, nil
}

// nodeOf returns the node that runs subtask sub of chain c.
func (c *Cluster) nodeOf(ch *Chain, sub int) string {
	for _, v := range ch.Vertices {
		if n, ok := c.Placement[TaskKey{v.UID, sub}]; ok {
			return n
		}
	}
	return c.Nodes[0].ID
}

// NodeOf returns the node that runs subtask sub of vertex uid in the
// current attempt ("" in a single process or before the attempt built
// its plan), and the ids of the attempt's nodes.
func (r *Runner) NodeOf(uid string, sub int) string {
	c := r.cfg.Cluster
	if c == nil {
		return ""
	}
	for _, ch := range r.plan.Chains {
		for _, v := range ch.Vertices {
			if v.UID == uid {
				return r.currentNode(ch, sub)
			}
		}
	}
	return ""
}

// MaxParallelism returns the job's number of key groups.
func (r *Runner) MaxParallelism() int { return r.maxP }
