package cluster

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"time"

	"github.com/edgedio/edged/keygroup"
)

// Status is what a node knows of its cluster, as the REST API (GET
// /cluster), the CLI (edged cluster status), the dashboard and the
// Prometheus metrics show it. It is a plain value: a StatusProvider builds
// a fresh one for every call, and its readers never change it.
type Status struct {
	// Enabled is false on a node that runs no cluster; every other field
	// is then empty.
	Enabled bool `json:"enabled"`
	// Node is this node's id.
	Node string `json:"node,omitempty"`
	// Leader is the id of the leader this node follows; empty while it
	// knows none (no majority, or an election in progress).
	Leader string `json:"leader,omitempty"`
	// Epoch is the highest epoch this node deployed or saw: that of the
	// placement it runs, or ran last (it does not go back when a job
	// stops); 0 before the first.
	Epoch uint64 `json:"epoch"`
	// MaxParallelism is the number of key groups of the keyed operators
	// (keygroup.DefaultMaxParallelism unless the job sets another); 0
	// when unknown, and readers then take the largest placed key group
	// plus one.
	MaxParallelism int `json:"max_parallelism,omitempty"`
	// Members are the nodes this node knows, this one included, sorted by
	// id.
	Members []MemberStatus `json:"members"`
	// Placement is the subtasks of keyed operators per node under Epoch,
	// sorted by node.
	Placement []NodePlacement `json:"placement"`
	// Replicas are where the files of the retained checkpoints are kept,
	// newest checkpoint first.
	Replicas []CheckpointReplicas `json:"replicas"`
	// ReplicaErrorsTotal counts the copies of state files this node found
	// missing, damaged or unreachable when it read one (another holder
	// was used, if any).
	ReplicaErrorsTotal int64 `json:"replica_errors_total"`
	// Failovers are the latest failovers, newest first (a bounded
	// history; FailoversTotal counts them all).
	Failovers []Failover `json:"failovers"`
	// FailoversTotal counts the failovers since this node started.
	FailoversTotal int64 `json:"failovers_total"`
	// FailoversInProgress are the failovers the job masters' node began
	// and has not recorded yet, oldest first: their nodes were seen dead,
	// and the jobs do not run again on a new placement yet (they wait for
	// a majority, say). Each has At, DeadNode and DetectionMS; it moves to
	// Failovers once every job runs again.
	FailoversInProgress []Failover `json:"failovers_in_progress,omitempty"`
	// Rebalances are the latest rebalances, newest first (a bounded
	// history; RebalancesTotal counts them all).
	Rebalances []Rebalance `json:"rebalances"`
	// RebalancesTotal counts the rebalances since this node started,
	// refused and failed ones included.
	RebalancesTotal int64 `json:"rebalances_total"`
	// Handbacks are the latest hand-backs of the leadership this node
	// took part in (as the leader that handed it over, or the node that
	// took it), newest first (a bounded history; HandbacksTotal counts
	// them all).
	Handbacks []Handback `json:"handbacks"`
	// HandbacksTotal counts the hand-backs since this node started,
	// failed ones included.
	HandbacksTotal int64 `json:"handbacks_total"`
}

// MemberState is a member's health as this node's failure detector sees
// it.
type MemberState string

// The states of a member.
const (
	// StateAlive: the member answers probes.
	StateAlive MemberState = "alive"
	// StateSuspect: the member missed probes and may be declared dead.
	StateSuspect MemberState = "suspect"
	// StateDead: the failure detector declared the member dead.
	StateDead MemberState = "dead"
	// StateLeft: the member left gracefully (a drain, or a shutdown).
	StateLeft MemberState = "left"
)

// Valid reports whether s is one of the four states.
func (s MemberState) Valid() bool {
	switch s {
	case StateAlive, StateSuspect, StateDead, StateLeft:
		return true
	}
	return false
}

// MemberStates lists the states in the order the CLI, the dashboard and
// the metrics show them.
var MemberStates = []MemberState{StateAlive, StateSuspect, StateDead, StateLeft}

// MemberStatus is one member of Status.Members.
type MemberStatus struct {
	ID string `json:"id"`
	// Address is the member's data transport address (Meta.Transport).
	Address string `json:"address"`
	// API is the member's REST API address, where its own GET /cluster
	// answers: its cluster.peers entry's api, and for this node the
	// address its API listens on (node.listen).
	API   string      `json:"api"`
	State MemberState `json:"state"`
	// Leader marks the member this node takes for the leader.
	Leader bool `json:"leader"`
	// SeesMajority is whether the member reaches a majority of the
	// cluster's configured size (members whose death memberlist is still
	// confirming count as gone); a member that does not owns nothing.
	// Known for this node only: false for the others (ask their own
	// GET /cluster).
	SeesMajority bool `json:"sees_majority"`
	// Capacity is the most keyed subtasks the member may run (its
	// cluster.capacity); 0 means no limit. A drain or rebalance that
	// would put more on it is refused with ErrOverCapacity.
	Capacity int `json:"capacity"`
	// Weight is the member's share of the subtasks placement spreads,
	// relative to the others' (its cluster.weight; 1 by default).
	Weight int `json:"weight"`
	// Drained marks a member drained by the job masters' node: it gets
	// no subtasks until it is undrained or restarts.
	Drained bool `json:"drained,omitempty"`
	// OtherPipelines marks a live member that gossips another pipelines
	// fingerprint than this node: another config or version. It gets no
	// subtasks until it restarts with the same pipelines. On a node that
	// differs from the leader it follows, it marks the members that
	// differ from the leader's, this node among them.
	OtherPipelines bool `json:"other_pipelines,omitempty"`
}

// KeyGroups is a range of key groups, first and last inclusive; in JSON
// the array [first, last].
type KeyGroups [2]int

// KeyGroupsOf returns the inclusive form of the half-open range r.
func KeyGroupsOf(r keygroup.Range) KeyGroups { return KeyGroups{r.Start, r.End - 1} }

// Len returns the number of key groups in g (0 for an empty or inverted
// range).
func (g KeyGroups) Len() int { return max(0, g[1]-g[0]+1) }

// NodePlacement is one node's share of Status.Placement.
type NodePlacement struct {
	Node string `json:"node"`
	// Subtasks are the keyed subtasks the node runs, sorted by operator
	// and subtask.
	Subtasks []PlacedSubtask `json:"subtasks"`
}

// PlacedSubtask is one subtask of a keyed operator and the key groups it
// owns.
type PlacedSubtask struct {
	// Job names the job when the node runs several; empty otherwise.
	Job      string `json:"job,omitempty"`
	Operator string `json:"operator"`
	// UID is the operator's stable UID (state is matched to it).
	UID string `json:"uid"`
	// Subtask is the subtask's index, from 0.
	Subtask   int       `json:"subtask"`
	KeyGroups KeyGroups `json:"key_groups"`
}

// CheckpointReplicas is where the files of one checkpoint are kept.
type CheckpointReplicas struct {
	Checkpoint int64 `json:"checkpoint"`
	// Job names the job when the node runs several; empty otherwise.
	Job   string        `json:"job,omitempty"`
	Files []ReplicaFile `json:"files"`
}

// ReplicaFile is one snapshot file and the nodes that hold a copy of it
// (its writer included).
type ReplicaFile struct {
	File  string   `json:"file"`
	Size  int64    `json:"size"`
	Nodes []string `json:"nodes"`
}

// Failover is one failover: a node declared dead, its subtasks placed on
// the survivors and restored there. The durations are in milliseconds;
// 0 for a phase not reached.
type Failover struct {
	// At is when the node was declared dead.
	At       time.Time `json:"at"`
	DeadNode string    `json:"dead_node"`
	// Epoch is the epoch of the placement that took over.
	Epoch uint64 `json:"epoch"`
	// DetectionMS is from the node's last sign of life to its
	// declaration as dead.
	DetectionMS float64 `json:"detection_ms"`
	// PlacementMS is from the declaration to the new placement decided.
	PlacementMS float64 `json:"placement_ms"`
	// RestoreMS is from the decision to the moved subtasks restored.
	RestoreMS float64 `json:"restore_ms"`
	// FirstRecordMS is from the restore to the first record processed by
	// a moved subtask.
	FirstRecordMS float64 `json:"first_record_ms"`
}

// TotalMS is the failover's duration from the last sign of life to the
// first record processed again.
func (f Failover) TotalMS() float64 {
	return f.DetectionMS + f.PlacementMS + f.RestoreMS + f.FirstRecordMS
}

// Handback is one hand-back of the leadership: the leader From stopped
// its jobs with a savepoint, made sure node To had the savepoint's
// metadata and files, stepped down and told To to take over; To restored
// the jobs from that savepoint. The durations are in milliseconds; 0 for
// a step not reached.
type Handback struct {
	// At is when the hand-back started.
	At   time.Time `json:"at"`
	From string    `json:"from"`
	To   string    `json:"to"`
	// Epoch is the epoch floor sent with it: the new leader deploys
	// above it.
	Epoch uint64 `json:"epoch"`
	// Savepoints are the checkpoint ids of the savepoints the jobs were
	// stopped with, by job.
	Savepoints map[string]uint64 `json:"savepoints"`
	// SavepointMS is the stop of every job with a savepoint.
	SavepointMS float64 `json:"savepoint_ms"`
	// ReplicateMS is the new leader checking, and copying in, the
	// savepoints' metadata and files.
	ReplicateMS float64 `json:"replicate_ms"`
	// TakeoverMS is from the message to take over until the new leader
	// answered it.
	TakeoverMS float64 `json:"takeover_ms"`
	// RestoreMS is, on the new leader, from the message until every job
	// ran again.
	RestoreMS float64 `json:"restore_ms"`
	// Outcome is "done", "failed" (the old leader leads on),
	// "unknown" (the new leader did not answer; the old one follows it)
	// or "yielded" (two nodes led at once after a restart the others had
	// not seen; From cancelled its jobs and follows To).
	Outcome string `json:"outcome"`
	// Error is why it failed.
	Error string `json:"error,omitempty"`
}

// HandbackSteps are the steps of a hand-back, in order.
var HandbackSteps = []string{"savepoint", "replicate", "takeover", "restore"}

// TimedBy reports whether node, whose record h is, timed step (one of
// HandbackSteps): the leader that handed over (From) times the savepoint,
// the replication and the take-over message, the node that took over
// (To) the restore; a yield times none. The record carries 0 for the
// steps its node did not time: shown as durations, they would read as
// steps that took no time.
func (h Handback) TimedBy(node, step string) bool {
	if h.Outcome == "yielded" {
		return false
	}
	if step == "restore" {
		return node == h.To
	}
	return node == h.From
}

// StepMS returns the duration of step (one of HandbackSteps) in
// milliseconds.
func (h Handback) StepMS(step string) float64 {
	switch step {
	case "savepoint":
		return h.SavepointMS
	case "replicate":
		return h.ReplicateMS
	case "takeover":
		return h.TakeoverMS
	case "restore":
		return h.RestoreMS
	}
	return 0
}

// RebalanceOutcome is how a rebalance ended.
type RebalanceOutcome string

// The outcomes of a rebalance (see Migration for the steps).
const (
	// RebalanceRunning: the rebalance is under way.
	RebalanceRunning RebalanceOutcome = "running"
	// RebalanceDone: the moved subtasks run on their new nodes.
	RebalanceDone RebalanceOutcome = "done"
	// RebalanceRefused: the rebalance was refused before it started (a
	// node over its capacity, no node left); nothing moved.
	RebalanceRefused RebalanceOutcome = "refused"
	// RebalanceAborted: the savepoint failed; nothing moved.
	RebalanceAborted RebalanceOutcome = "aborted"
	// RebalanceFellBack: a step failed and the previous placement resumed
	// from the savepoint.
	RebalanceFellBack RebalanceOutcome = "fell-back"
	// RebalanceFailed: the fallback failed too; recovery from the latest
	// checkpoint took over.
	RebalanceFailed RebalanceOutcome = "failed"
)

// RebalanceMode is how a rebalance moved its subtasks.
type RebalanceMode string

// The modes of a rebalance.
const (
	// RebalanceHandover: the moved keyed subtasks were handed over at a
	// savepoint barrier while every other subtask kept running.
	RebalanceHandover RebalanceMode = "handover"
	// RebalanceRedeploy: every job was redeployed from a savepoint on
	// the new placement: every subtask paused.
	RebalanceRedeploy RebalanceMode = "redeploy"
)

// Rebalance is one rebalance by savepoint migration.
type Rebalance struct {
	// At is when the rebalance started (or was refused).
	At      time.Time `json:"at"`
	Trigger Trigger   `json:"trigger"`
	// MovedKeyGroups counts the key groups that changed node.
	MovedKeyGroups int `json:"moved_key_groups"`
	// BytesShipped is the state sent to the new owners.
	BytesShipped int64 `json:"bytes_shipped"`
	// PauseMS is how long each moved subtask paused, in milliseconds, by
	// subtask (operator/index); subtasks that did not move are absent.
	PauseMS map[string]float64 `json:"pause_ms"`
	// Mode is how the subtasks moved: RebalanceHandover (only the moved
	// subtasks paused) or RebalanceRedeploy (every job restarted from a
	// savepoint); empty when nothing moved.
	Mode RebalanceMode `json:"mode,omitempty"`
	// Unpaused lists, after a handover, the keyed subtasks that did not
	// move and kept running through it, neither stopped nor restarted.
	Unpaused []string         `json:"unpaused,omitempty"`
	Outcome  RebalanceOutcome `json:"outcome"`
	// Error is why the rebalance was refused or failed.
	Error string `json:"error,omitempty"`
	// Note says why a rebalance that was done moved nothing (every job
	// ran on the placement it would make already).
	Note string `json:"note,omitempty"`
}

// MaxPauseMS returns the longest pause of r's moved subtasks, and which.
func (r Rebalance) MaxPauseMS() (subtask string, ms float64) {
	first := true
	for s, v := range r.PauseMS {
		if first || v > ms || (v == ms && s < subtask) {
			subtask, ms, first = s, v, false
		}
	}
	return subtask, ms
}

// StatusProvider is a node's cluster as its operations surface (the
// daemon's REST API, metrics and dashboard) sees it. The daemon calls it
// from its HTTP handlers' goroutines, concurrently: implementations are
// safe for concurrent use.
type StatusProvider interface {
	// Status returns what the node knows of its cluster now. It must not
	// block for long (no network round trip): it is read on every poll
	// of the dashboard and every scrape of the metrics.
	Status() Status
	// Drain moves all the subtasks of node to the other members and then
	// lets node leave gracefully. It returns once that is done, or when
	// ctx ends. It returns an error wrapping ErrUnknownNode for a node the
	// cluster does not know, and one wrapping ErrRefused (or
	// ErrOverCapacity) when the drain is refused, with the reason.
	Drain(ctx context.Context, node string) error
	// Rebalance asks for a rebalance of the whole cluster and returns
	// once it has ended, or when ctx ends. A refused rebalance returns an
	// error wrapping ErrRefused or ErrOverCapacity, with the reason.
	Rebalance(ctx context.Context) error
}

// ErrRefused is wrapped by a StatusProvider's error when the operation was
// refused (for instance: a rebalance already running, no majority, this
// node not the leader and unable to reach it). It is declared here rather
// than in errors.go because only the operations surface uses it.
var ErrRefused = errors.New("cluster: operation refused")

// MarshalJSON encodes s; a disabled status is {"enabled":false} and
// nothing else.
func (s Status) MarshalJSON() ([]byte, error) {
	if !s.Enabled {
		return []byte(`{"enabled":false}`), nil
	}
	type plain Status // without this method
	return json.Marshal(plain(s))
}

// Normalized returns r with an empty PauseMS map in place of nil, as
// JSON answers show it.
func (r Rebalance) Normalized() Rebalance {
	if r.PauseMS == nil {
		r.PauseMS = map[string]float64{}
	}
	return r
}

// Normalized returns s with its lists sorted as documented and non-nil,
// so that its JSON carries [] rather than null; a disabled status keeps
// only Enabled.
func (s Status) Normalized() Status {
	if !s.Enabled {
		return Status{}
	}
	s.Members = nonNil(slices.Clone(s.Members))
	slices.SortFunc(s.Members, func(a, b MemberStatus) int { return cmp.Compare(a.ID, b.ID) })
	s.Placement = nonNil(slices.Clone(s.Placement))
	for i, p := range s.Placement {
		p.Subtasks = nonNil(slices.Clone(p.Subtasks))
		slices.SortFunc(p.Subtasks, func(a, b PlacedSubtask) int {
			return cmp.Or(cmp.Compare(a.Job, b.Job), cmp.Compare(a.Operator, b.Operator), cmp.Compare(a.Subtask, b.Subtask))
		})
		s.Placement[i] = p
	}
	slices.SortFunc(s.Placement, func(a, b NodePlacement) int { return cmp.Compare(a.Node, b.Node) })
	s.Replicas = nonNil(slices.Clone(s.Replicas))
	for i, c := range s.Replicas {
		c.Files = nonNil(slices.Clone(c.Files))
		for j, f := range c.Files {
			f.Nodes = nonNil(f.Nodes)
			c.Files[j] = f
		}
		s.Replicas[i] = c
	}
	slices.SortStableFunc(s.Replicas, func(a, b CheckpointReplicas) int { return cmp.Compare(b.Checkpoint, a.Checkpoint) })
	s.Failovers = nonNil(slices.Clone(s.Failovers))
	slices.SortStableFunc(s.Failovers, func(a, b Failover) int { return b.At.Compare(a.At) })
	s.Rebalances = nonNil(slices.Clone(s.Rebalances))
	for i, r := range s.Rebalances {
		s.Rebalances[i] = r.Normalized()
	}
	slices.SortStableFunc(s.Rebalances, func(a, b Rebalance) int { return b.At.Compare(a.At) })
	s.Handbacks = nonNil(slices.Clone(s.Handbacks))
	for i, h := range s.Handbacks {
		if h.Savepoints == nil {
			h.Savepoints = map[string]uint64{}
		}
		s.Handbacks[i] = h
	}
	slices.SortStableFunc(s.Handbacks, func(a, b Handback) int { return b.At.Compare(a.At) })
	s.HandbacksTotal = max(s.HandbacksTotal, int64(len(s.Handbacks)))
	s.FailoversTotal = max(s.FailoversTotal, int64(len(s.Failovers)))
	s.RebalancesTotal = max(s.RebalancesTotal, int64(len(s.Rebalances)))
	return s
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// Member returns the member with id, if s knows it.
func (s Status) Member(id string) (MemberStatus, bool) {
	for _, m := range s.Members {
		if m.ID == id {
			return m, true
		}
	}
	return MemberStatus{}, false
}

// KeyGroupsOwned returns, per node of s.Placement, how many key groups its
// subtasks own, summed over the keyed operators.
func (s Status) KeyGroupsOwned() map[string]int {
	out := make(map[string]int, len(s.Placement))
	for _, p := range s.Placement {
		n := 0
		for _, st := range p.Subtasks {
			n += st.KeyGroups.Len()
		}
		out[p.Node] = n
	}
	return out
}

// MembersByState counts s.Members by state; every state of MemberStates
// is present.
func (s Status) MembersByState() map[MemberState]int {
	out := make(map[MemberState]int, len(MemberStates))
	for _, st := range MemberStates {
		out[st] = 0
	}
	for _, m := range s.Members {
		out[m.State]++
	}
	return out
}
