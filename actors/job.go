package actors

import (
	"errors"
	"fmt"

	"github.com/edgedio/edged/keygroup"
	"github.com/edgedio/edged/operators"
)

// Partition says how an edge spreads records over the target's subtasks.
type Partition int

const (
	// Forward sends subtask i's records to subtask i (equal parallelism).
	Forward Partition = iota
	// Rebalance sends records round robin to all target subtasks.
	Rebalance
	// KeyBy sends a record to the subtask owning its key group.
	KeyBy
	// Broadcast sends every record to every target subtask.
	Broadcast
)

// String returns the partition's name.
func (p Partition) String() string {
	switch p {
	case Forward:
		return "forward"
	case Rebalance:
		return "rebalance"
	case KeyBy:
		return "key-by"
	case Broadcast:
		return "broadcast"
	}
	return fmt.Sprintf("partition(%d)", int(p))
}

// Vertex is one operator of a job graph.
type Vertex struct {
	// ID is the vertex's index in Job.Vertices.
	ID int
	// Name is shown in logs and errors.
	Name string
	// UID identifies the operator across runs; state is matched by it.
	UID string
	// StateSettings, when set, is a digest of the settings the operator's
	// state is shaped by (a window's aggregates, say). Snapshots record
	// it, and a restore into an operator whose StateSettings differ from
	// the snapshot's fails (state.ErrIncompatibleState) instead of reading
	// the state under other settings.
	StateSettings string
	// Parallelism is the number of subtasks.
	Parallelism int
	// In is the type of the records consumed (nil for a source).
	In ElemType
	// In2 is the type of the records of the second input of a two-input
	// operator, nil for every other.
	In2 ElemType
	// Out is the type of the records produced (nil for a sink).
	Out ElemType
	// SideOutputs are the types of the side outputs, by tag.
	SideOutputs map[string]ElemType
	// Keyed is set when the vertex follows a key-by edge; its subtasks get
	// a keyed state backend for their key-group range.
	Keyed bool
	// NoChain keeps the vertex out of chains (for tests and debugging).
	NoChain bool
	// RecordBytes, when set, is a func(Out) int giving a record's size in
	// bytes, and BatchBytes a cap: a batch on the vertex's main-output
	// edges is sent once its records' sizes reach BatchBytes, before it
	// holds BatchSize records. A channel's credits then bound its bytes
	// too, to credits × (BatchBytes + one record), whatever the records'
	// sizes (Stream.BatchBytes).
	RecordBytes any
	BatchBytes  int
	// NewSource returns the operators.Source[Out] of one subtask. Set for
	// sources only.
	NewSource func(ctx *operators.Context) (operators.Operator, error)
	// NewOperator returns the operator of one subtask wired to out (an
	// operators.Collector[Out], nil for a sink) and its input (an
	// operators.Collector[In]; for a two-input operator a [2]any holding
	// the collectors of In and In2). Set for every vertex that is not a
	// source.
	NewOperator func(ctx *operators.Context, out any) (op operators.Operator, in any, err error)
}

// IsSource reports whether v is a source.
func (v *Vertex) IsSource() bool { return v.NewSource != nil }

// Edge joins two vertices.
type Edge struct {
	From, To  *Vertex
	Partition Partition
	// KeyGroup is, for a key-by edge, a func(T) int returning a record's key
	// group, where T is the type the edge carries.
	KeyGroup any
	// Output is the side-output tag the edge leaves From by; "" for the
	// main output.
	Output string
	// Input is the input of To the edge enters: 0, or 1 for the second
	// input of a two-input operator.
	Input int
}

// Type returns the type of the records the edge carries.
func (e *Edge) Type() ElemType {
	if e.Output != "" {
		return e.From.SideOutputs[e.Output]
	}
	return e.From.Out
}

// target returns the input type of To the edge enters.
func (e *Edge) target() ElemType {
	if e.Input == 1 {
		return e.To.In2
	}
	return e.To.In
}

// Job is a graph of vertices and edges.
type Job struct {
	Name string
	// MaxParallelism is the number of key groups (default 128).
	MaxParallelism int
	Vertices       []*Vertex
	Edges          []*Edge
	// Settings is a digest of what shapes the job's results but its
	// graph does not show (its operators' settings: window sizes,
	// aggregates, filters, sink topics, ...), or "" for none. It is part
	// of the plan fingerprint the nodes of a cluster compare, so a node
	// whose job differs only in such a setting is refused too
	// (ErrPlanMismatch).
	Settings string
}

// Validate reports every problem of the graph at once.
func (j *Job) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidJob}, args...)...))
	}
	if len(j.Vertices) == 0 {
		bad("job %q has no operators", j.Name)
	}
	maxP := j.maxParallelism()
	uids := make(map[string]string)
	for i, v := range j.Vertices {
		if v.ID != i {
			bad("vertex %q has id %d at index %d", v.Name, v.ID, i)
		}
		if err := keygroup.Validate(v.Parallelism, maxP); err != nil {
			bad("operator %q: %v", v.Name, err)
		}
		if v.UID == "" {
			bad("operator %q has no uid", v.Name)
		} else if other, dup := uids[v.UID]; dup {
			bad("operators %q and %q share uid %q", other, v.Name, v.UID)
		} else {
			uids[v.UID] = v.Name
		}
		if (v.NewSource == nil) == (v.NewOperator == nil) {
			bad("operator %q must be exactly one of source or operator", v.Name)
		}
	}
	ins := make(map[*Vertex]int)
	for _, e := range j.Edges {
		if e.From == nil || e.To == nil {
			bad("edge with a missing end")
			continue
		}
		ins[e.To]++
		if e.To.IsSource() {
			bad("edge %q -> %q: a source has no input", e.From.Name, e.To.Name)
		}
		if e.Input < 0 || e.Input > 1 || (e.Input == 1 && e.To.In2 == nil) {
			bad("edge %q -> %q: %q has no input %d", e.From.Name, e.To.Name, e.To.Name, e.Input)
		} else if typ := e.Type(); typ == nil {
			bad("edge %q -> %q: %q has no output %q", e.From.Name, e.To.Name, e.From.Name, e.Output)
		} else if in := e.target(); in != nil && typ.String() != in.String() {
			bad("edge %q -> %q: type %s does not match %s", e.From.Name, e.To.Name, typ, in)
		}
		if e.Partition == Forward && e.From.Parallelism != e.To.Parallelism {
			bad("edge %q -> %q: forward needs equal parallelism (%d vs %d)", e.From.Name, e.To.Name, e.From.Parallelism, e.To.Parallelism)
		}
		if e.Partition == KeyBy && e.KeyGroup == nil {
			bad("edge %q -> %q: key-by without a key", e.From.Name, e.To.Name)
		}
	}
	for _, v := range j.Vertices {
		if !v.IsSource() && ins[v] == 0 {
			bad("operator %q has no input", v.Name)
		}
	}
	return errors.Join(errs...)
}

func (j *Job) maxParallelism() int {
	if j.MaxParallelism == 0 {
		return keygroup.DefaultMaxParallelism
	}
	return j.MaxParallelism
}
