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
	// Edge is the edge's index in the job's edges; a channel that a
	// handover re-pointed carries its generation in the high bits
	// (EdgeOf, GenerationOf), so that it never shares a link with the
	// channel it replaced.
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

// The generation of a channel re-pointed by a handover is carried in the
// bits of its edge number above genShift: a job has fewer than 1<<genShift
// edges, and the largest generation keeps the number below the control
// channels' edges (actors.ControlEdgeDown).
const (
	genShift = 20
	// MaxGeneration is the largest channel generation.
	MaxGeneration = 1<<(31-genShift) - 2
)

// edgeWithGen returns the edge number that carries edge and generation
// gen, or an error when either is out of range.
func edgeWithGen(edge, gen int) (int, error) {
	if gen == 0 {
		return edge, nil
	}
	if edge < 0 || edge >= 1<<genShift || gen < 0 || gen > MaxGeneration {
		return 0, fmt.Errorf("%w: edge %d generation %d out of range", ErrCorruptFrame, edge, gen)
	}
	return edge | gen<<genShift, nil
}

// EdgeOf returns the job edge of the channel, without its generation.
func (id ChannelID) EdgeOf() int {
	if id.Edge >= 1<<genShift && id.Edge < (MaxGeneration+1)<<genShift {
		return id.Edge & (1<<genShift - 1)
	}
	return id.Edge
}

// GenerationOf returns the channel's generation: 0 but for a channel a
// handover re-pointed.
func (id ChannelID) GenerationOf() int {
	if id.Edge >= 1<<genShift && id.Edge < (MaxGeneration+1)<<genShift {
		return id.Edge >> genShift
	}
	return 0
}
