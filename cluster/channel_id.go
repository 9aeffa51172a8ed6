package cluster

import (
	"cmp"
	"fmt"
)

// ChannelID names one channel of a job run: the records that subtask From
// of an edge's source sends to subtask To of its target, in one epoch.
// Both ends derive it from the plan (see PlanChannels), so that no pointer
// crosses a node boundary: the ID is all a frame carries to find its
// channel.
type ChannelID struct {
	// Job is the job's name.
	Job string
	// Epoch is the job run: it grows on every restart and placement, and
	// frames of another epoch are dropped.
	Epoch uint64
	// Edge is the edge's index in the job's edges.
	Edge int
	// From is the sending subtask of the edge's source vertex.
	From int
	// To is the receiving subtask of the edge's target vertex.
	To int
}

// String renders the ID as job/epoch/edge:from->to.
func (id ChannelID) String() string {
	return fmt.Sprintf("%s/e%d/%d:%d->%d", id.Job, id.Epoch, id.Edge, id.From, id.To)
}

// Compare orders IDs by job, epoch, edge, from and to: -1, 0 or +1.
func (id ChannelID) Compare(o ChannelID) int {
	return cmp.Or(
		cmp.Compare(id.Job, o.Job),
		cmp.Compare(id.Epoch, o.Epoch),
		cmp.Compare(id.Edge, o.Edge),
		cmp.Compare(id.From, o.From),
		cmp.Compare(id.To, o.To),
	)
}

// Link is a channel with the epoch left out: what stays the same across
// job runs. The receiver of a frame compares the frame's epoch with its
// own to drop messages from an older run.
type Link struct {
	// Job, Edge, From and To are as in ChannelID.
	Job            string
	Edge, From, To int
}

// Link returns the ID without its epoch.
func (id ChannelID) Link() Link { return Link{id.Job, id.Edge, id.From, id.To} }

// In returns the ID of the link's channel in epoch e.
func (l Link) In(e uint64) ChannelID { return ChannelID{l.Job, e, l.Edge, l.From, l.To} }
