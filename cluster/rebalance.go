package cluster

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Trigger is why a rebalance is asked for.
type Trigger string

// The triggers of a rebalance.
const (
	// TriggerJoin: a node joined (rebalances wait a settle delay that
	// batches several joins).
	TriggerJoin Trigger = "join"
	// TriggerDrain: an operator drains a node (edged cluster drain).
	TriggerDrain Trigger = "drain"
	// TriggerManual: an operator asked (edged cluster rebalance).
	TriggerManual Trigger = "manual"
	// TriggerUndrain: an operator undrained a node (edged cluster
	// undrain). The gate queues it as a join, recorded as one, that
	// settles as joins do but is not damped: an operator's request, as a
	// drain is, and the node's source splits hold their jobs' watermarks
	// until it is moved in, so a damped undrain stalled every window of
	// those jobs for the damping gap (up to MaxInterval).
	TriggerUndrain Trigger = "undrain"
)

// Move is one unit changing node in a rebalance.
type Move struct {
	Unit     Unit
	From, To string
}

// RebalancePlan is what a rebalance would do.
type RebalancePlan struct {
	// Placement is the placement after the rebalance.
	Placement Placement
	// Moves are the units that change node, sorted by unit.
	Moves []Move
}

// PlanRebalance computes the placement that members (less the draining
// ones) should have for units, and the moves from current to it. A plan
// that would put more units on a node than its Slots is refused with
// ErrOverCapacity, naming the node, and so is a plan with no node left.
func PlanRebalance(current Placement, members []Member, draining []string, units []Unit) (RebalancePlan, error) {
	var live []Member
	for _, m := range members {
		if !slices.Contains(draining, m.ID) {
			live = append(live, m)
		}
	}
	if len(live) == 0 {
		return RebalancePlan{}, fmt.Errorf("%w: no node left to run %d units (draining %v)", ErrOverCapacity, len(units), draining)
	}
	p, err := Place(live, units)
	if err != nil {
		return RebalancePlan{}, err
	}
	byNode := p.ByNode()
	var over []string
	for _, m := range live {
		if n := len(byNode[m.ID]); m.Slots > 0 && n > m.Slots {
			over = append(over, fmt.Sprintf("%s would run %d units, it has %d slots", m.ID, n, m.Slots))
		}
	}
	if len(over) > 0 {
		return RebalancePlan{}, fmt.Errorf("%w: %s", ErrOverCapacity, strings.Join(over, "; "))
	}
	plan := RebalancePlan{Placement: p}
	for _, u := range Moved(current, p) {
		if to, ok := p[u]; ok && current[u] != "" {
			plan.Moves = append(plan.Moves, Move{Unit: u, From: current[u], To: to})
		}
	}
	return plan, nil
}

// GateConfig configures a RebalanceGate.
type GateConfig struct {
	// Settle is how long a join waits for more joins before the
	// rebalance starts; each further join restarts the wait, up to
	// MaxSettle after the first.
	Settle    time.Duration
	MaxSettle time.Duration
	// MinInterval is the least time between the end of one rebalance and
	// the start of the next; it doubles (up to MaxInterval) for each
	// rebalance asked for (its first request queued) within twice the
	// current interval after the previous one ended, so flapping nodes
	// cannot start a rebalance storm, and falls back to MinInterval after
	// a longer quiet spell. (It counts from the request, not the start:
	// joins that keep coming settle for MaxSettle, and a storm would
	// otherwise look like a quiet spell.)
	MinInterval time.Duration
	MaxInterval time.Duration
}

// DefaultGateConfig returns the defaults: settle 5 s (at most 30 s), 10 s
// between rebalances, backing off to 5 min.
func DefaultGateConfig() GateConfig {
	return GateConfig{Settle: 5 * time.Second, MaxSettle: 30 * time.Second, MinInterval: 10 * time.Second, MaxInterval: 5 * time.Minute}
}

// Validate reports what is wrong with c.
func (c GateConfig) Validate() error {
	if c.Settle < 0 || c.MaxSettle < c.Settle || c.MinInterval < 0 || c.MaxInterval < c.MinInterval {
		return fmt.Errorf("%w: settle %v, max settle %v, interval %v..%v", ErrBadGateConfig, c.Settle, c.MaxSettle, c.MinInterval, c.MaxInterval)
	}
	return nil
}

// RebalanceGate decides when a rebalance may start: it queues requests,
// batches joins over a settle delay, holds everything while a checkpoint
// or a failover is in progress or a rebalance runs, and damps storms. It
// is a pure state machine: it reads no clock (times come with each call)
// and starts nothing. Not safe for concurrent use.
type RebalanceGate struct {
	cfg GateConfig

	pending    []Trigger // queued, deduplicated, in arrival order
	drains     []string  // nodes asked to drain, queued
	undrain    bool      // an undrain's join is queued
	firstReq   time.Time // first request of what is queued
	firstJoin  time.Time // first join of the batch being settled
	lastJoin   time.Time
	checkpoint bool
	failover   bool
	running    bool
	lastEnd    time.Time
	interval   time.Duration
}

// NewRebalanceGate returns a gate with nothing queued.
func NewRebalanceGate(cfg GateConfig) (*RebalanceGate, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &RebalanceGate{cfg: cfg, interval: cfg.MinInterval}, nil
}

// Request queues a rebalance for trigger (with the node, for a drain).
func (g *RebalanceGate) Request(now time.Time, t Trigger, node string) {
	if t == TriggerUndrain {
		g.undrain = true
		t = TriggerJoin
	}
	if len(g.pending) == 0 {
		g.firstReq = now
	}
	if !slices.Contains(g.pending, t) {
		g.pending = append(g.pending, t)
	}
	switch t {
	case TriggerJoin:
		if g.firstJoin.IsZero() {
			g.firstJoin = now
		}
		g.lastJoin = now
	case TriggerDrain:
		if node != "" && !slices.Contains(g.drains, node) {
			g.drains = append(g.drains, node)
		}
	}
}

// DrainQueued reports whether a drain of node is queued (asked, not
// started yet).
func (g *RebalanceGate) DrainQueued(node string) bool { return slices.Contains(g.drains, node) }

// Checkpoint says whether a checkpoint is in progress.
func (g *RebalanceGate) Checkpoint(inProgress bool) { g.checkpoint = inProgress }

// Failover says whether a failover is in progress.
func (g *RebalanceGate) Failover(inProgress bool) { g.failover = inProgress }

// Start is what Poll returns when a rebalance may begin: the triggers
// batched into it and the nodes to drain.
type Start struct {
	Triggers []Trigger
	Drain    []string
}

// Poll returns the rebalance to start now, if one may: something is
// queued, no checkpoint, failover or rebalance is in progress, joins have
// settled, and the damping interval since the last rebalance has passed
// unless a drain is queued (a drained node leaves either way: a stopping
// node's drain would end with its stop timeout, and its subtasks would
// fail over, restarting every job) or an undrain (TriggerUndrain).
// Otherwise it returns ok false and, if
// something waits, why.
func (g *RebalanceGate) Poll(now time.Time) (s Start, ok bool, waiting string) {
	switch {
	case len(g.pending) == 0:
		return Start{}, false, ""
	case g.running:
		return Start{}, false, "a rebalance is in progress"
	case g.failover:
		return Start{}, false, "a failover is in progress"
	case g.checkpoint:
		return Start{}, false, "a checkpoint is in progress"
	}
	if !g.lastEnd.IsZero() && now.Sub(g.lastEnd) < g.interval && len(g.drains) == 0 && !g.undrain {
		return Start{}, false, fmt.Sprintf("damping: %v after the last rebalance", g.interval)
	}
	if onlyJoins := len(g.pending) == 1 && g.pending[0] == TriggerJoin; onlyJoins &&
		now.Sub(g.lastJoin) < g.cfg.Settle && now.Sub(g.firstJoin) < g.cfg.MaxSettle {
		return Start{}, false, "joins settling"
	}
	s = Start{Triggers: g.pending, Drain: g.drains}
	g.pending, g.drains, g.undrain = nil, nil, false
	g.firstJoin, g.lastJoin = time.Time{}, time.Time{}
	if !g.lastEnd.IsZero() && g.firstReq.Sub(g.lastEnd) < 2*g.interval {
		g.interval = min(max(2*g.interval, g.cfg.MinInterval), g.cfg.MaxInterval)
	} else {
		g.interval = g.cfg.MinInterval
	}
	g.running = true
	return s, true, ""
}

// Done says the running rebalance ended (whether it succeeded or fell
// back).
func (g *RebalanceGate) Done(now time.Time) {
	g.running = false
	g.lastEnd = now
}

// Interval returns the current damping interval.
func (g *RebalanceGate) Interval() time.Duration { return g.interval }

// MigrationStep is where a rebalance by savepoint migration stands.
type MigrationStep string

// The steps of a migration, in order; it ends in Done, Aborted (nothing
// changed), FellBack (the previous placement resumed from the savepoint)
// or Failed (the fallback failed too: recovery from the latest checkpoint
// takes over).
const (
	StepSavepoint MigrationStep = "savepoint"
	StepShip      MigrationStep = "ship"
	StepRestore   MigrationStep = "restore"
	StepResume    MigrationStep = "resume"
	StepFallback  MigrationStep = "fallback"
	StepDone      MigrationStep = "done"
	StepAborted   MigrationStep = "aborted"
	StepFellBack  MigrationStep = "fell-back"
	StepFailed    MigrationStep = "failed"
)

// MigrationAction is what the migration asks its driver to do next.
type MigrationAction struct {
	Step MigrationStep
	// Move is the unit to ship (from its old node to its new one) or to
	// restore on its new node (StepShip, StepRestore).
	Move Move
	// Savepoint is the savepoint the state comes from (all but
	// StepSavepoint).
	Savepoint int64
	// Placement is the placement to resume (StepResume: the new one;
	// StepFallback: the previous one).
	Placement Placement
}

// MigrationEvent is one line of a migration's progress.
type MigrationEvent struct {
	At       time.Time
	Step     MigrationStep
	Took     time.Duration // the step's duration, when it ended
	Unit     Unit          // for ship and restore
	Err      string
	Finished bool // the step ended
}

// Migration is the pure state machine of one rebalance by savepoint
// migration: take a savepoint; ship each moved unit's state (its key-group
// sections) from its old node to its new one; restore it there; resume
// the job with the new placement. A failure at any step after the
// savepoint falls back to the previous placement restored from that
// savepoint, never to a half-moved state; a failed savepoint changes
// nothing. It reads no clock and starts nothing. Not safe for concurrent
// use.
type Migration struct {
	Trigger []Trigger
	prev    Placement
	plan    RebalancePlan

	step      MigrationStep
	savepoint int64
	pending   map[Unit]bool // units of the current step not yet done
	started   time.Time
	stepStart time.Time
	events    []MigrationEvent
	err       error
}

// NewMigration starts a migration from placement prev to plan.
func NewMigration(now time.Time, triggers []Trigger, prev Placement, plan RebalancePlan) *Migration {
	m := &Migration{Trigger: triggers, prev: prev, plan: plan, started: now}
	m.enter(now, StepSavepoint)
	return m
}

// Step returns where the migration stands.
func (m *Migration) Step() MigrationStep { return m.step }

// Ended reports whether the migration reached a final step.
func (m *Migration) Ended() bool {
	switch m.step {
	case StepDone, StepAborted, StepFellBack, StepFailed:
		return true
	}
	return false
}

// Err returns the failure that made the migration abort or fall back.
func (m *Migration) Err() error { return m.err }

// Events returns the migration's progress so far.
func (m *Migration) Events() []MigrationEvent { return m.events }

// Took returns the time from the start to now, or to the end.
func (m *Migration) Took(now time.Time) time.Duration {
	if m.Ended() {
		return m.events[len(m.events)-1].At.Sub(m.started)
	}
	return now.Sub(m.started)
}

// Actions returns what the driver must do for the current step (for
// ship and restore, one action per unit still pending).
func (m *Migration) Actions() []MigrationAction {
	switch m.step {
	case StepSavepoint:
		return []MigrationAction{{Step: StepSavepoint}}
	case StepShip, StepRestore:
		var out []MigrationAction
		for _, mv := range m.plan.Moves {
			if m.pending[mv.Unit] {
				out = append(out, MigrationAction{Step: m.step, Move: mv, Savepoint: m.savepoint})
			}
		}
		return out
	case StepResume:
		return []MigrationAction{{Step: StepResume, Savepoint: m.savepoint, Placement: m.plan.Placement}}
	case StepFallback:
		return []MigrationAction{{Step: StepFallback, Savepoint: m.savepoint, Placement: m.prev}}
	}
	return nil
}

func (m *Migration) enter(now time.Time, s MigrationStep) {
	m.step, m.stepStart = s, now
	m.pending = map[Unit]bool{}
	if s == StepShip || s == StepRestore {
		for _, mv := range m.plan.Moves {
			m.pending[mv.Unit] = true
		}
	}
	m.events = append(m.events, MigrationEvent{At: now, Step: s})
}

func (m *Migration) finish(now time.Time, unit Unit, err error) {
	e := MigrationEvent{At: now, Step: m.step, Took: now.Sub(m.stepStart), Unit: unit, Finished: true}
	if err != nil {
		e.Err = err.Error()
	}
	m.events = append(m.events, e)
}

// fail ends the current step with err: before the savepoint exists
// nothing changed; after, the previous placement is restored from it.
func (m *Migration) fail(now time.Time, unit Unit, err error) {
	m.finish(now, unit, err)
	m.err = fmt.Errorf("%w: %s: %w", ErrRebalance, m.step, err)
	switch m.step {
	case StepSavepoint:
		m.enter(now, StepAborted)
	case StepFallback:
		m.enter(now, StepFailed)
	default:
		m.enter(now, StepFallback)
	}
}

// SavepointDone reports the savepoint's outcome.
func (m *Migration) SavepointDone(now time.Time, id int64, err error) {
	if m.step != StepSavepoint {
		return
	}
	if err != nil {
		m.fail(now, "", err)
		return
	}
	m.savepoint = id
	m.finish(now, "", nil)
	if len(m.plan.Moves) == 0 {
		m.enter(now, StepResume)
		return
	}
	m.enter(now, StepShip)
}

// Shipped reports that unit's state reached its new node (or failed to).
func (m *Migration) Shipped(now time.Time, unit Unit, err error) {
	m.unitDone(now, StepShip, unit, err)
}

// Restored reports that unit was restored on its new node (or failed to).
func (m *Migration) Restored(now time.Time, unit Unit, err error) {
	m.unitDone(now, StepRestore, unit, err)
}

func (m *Migration) unitDone(now time.Time, s MigrationStep, unit Unit, err error) {
	if m.step != s || !m.pending[unit] {
		return // late or repeated: ignored
	}
	if err != nil {
		m.fail(now, unit, err)
		return
	}
	delete(m.pending, unit)
	m.finish(now, unit, nil)
	if len(m.pending) > 0 {
		return
	}
	if s == StepShip {
		m.enter(now, StepRestore)
	} else {
		m.enter(now, StepResume)
	}
}

// Resumed reports the outcome of resuming (StepResume) or of the
// fallback (StepFallback).
func (m *Migration) Resumed(now time.Time, err error) {
	switch m.step {
	case StepResume:
		if err != nil {
			m.fail(now, "", err)
			return
		}
		m.finish(now, "", nil)
		m.enter(now, StepDone)
	case StepFallback:
		if err != nil {
			m.fail(now, "", err)
			return
		}
		m.finish(now, "", nil)
		m.enter(now, StepFellBack)
	}
}
