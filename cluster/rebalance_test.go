package cluster

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestPlanRebalanceDrainAndJoin(t *testing.T) {
	us := units([]string{"window"}, 12)
	three := members(3)
	cur := mustPlace(t, three, us)

	// Draining node-2 moves its units, and (bounded load) few others.
	plan, err := PlanRebalance(cur, three, []string{"node-2"}, us)
	if err != nil {
		t.Fatal(err)
	}
	if got := plan.Placement.ByNode()["node-2"]; len(got) != 0 {
		t.Fatalf("drained node keeps %v", got)
	}
	fromDrained := 0
	for _, mv := range plan.Moves {
		if mv.From == "node-2" {
			fromDrained++
		}
		if mv.To == "node-2" || mv.From == mv.To || cur[mv.Unit] != mv.From || plan.Placement[mv.Unit] != mv.To {
			t.Fatalf("bad move %+v", mv)
		}
	}
	if fromDrained != len(cur.ByNode()["node-2"]) {
		t.Fatalf("%d of node-2's %d units move", fromDrained, len(cur.ByNode()["node-2"]))
	}

	// A join moves about the newcomer's share onto it.
	four := members(4)
	plan, err = PlanRebalance(cur, four, nil, us)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(plan.Placement.ByNode()["node-4"]); n != 3 {
		t.Fatalf("newcomer runs %d units", n)
	}
	// Nothing changed: no moves.
	if plan, err := PlanRebalance(cur, three, nil, us); err != nil || len(plan.Moves) != 0 {
		t.Fatalf("%v %v", plan.Moves, err)
	}
}

func TestPlanRebalanceRefusesOverCapacity(t *testing.T) {
	us := units([]string{"window"}, 12)
	ms := members(3)
	for i := range ms {
		ms[i].Slots = 5
	}
	cur := mustPlace(t, ms, us)
	_, err := PlanRebalance(cur, ms, []string{"node-3"}, us)
	if !errors.Is(err, ErrOverCapacity) || !strings.Contains(err.Error(), "6 units, it has 5 slots") {
		t.Fatalf("drain onto too few slots: %v", err)
	}
	if _, err := PlanRebalance(cur, ms, []string{"node-1", "node-2", "node-3"}, us); !errors.Is(err, ErrOverCapacity) {
		t.Fatalf("drain of every node: %v", err)
	}
	if _, err := PlanRebalance(cur, ms, nil, us); err != nil {
		t.Fatalf("within slots: %v", err)
	}
}

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

func newGate(t *testing.T) *RebalanceGate {
	g, err := NewRebalanceGate(GateConfig{Settle: 5 * time.Second, MaxSettle: 20 * time.Second, MinInterval: 10 * time.Second, MaxInterval: 80 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func mustWait(t *testing.T, g *RebalanceGate, now time.Time, why string) {
	t.Helper()
	if s, ok, waiting := g.Poll(now); ok || !strings.Contains(waiting, why) {
		t.Fatalf("at %v: started %+v (waiting %q), want to wait for %q", now.Sub(t0), s, waiting, why)
	}
}

func mustStart(t *testing.T, g *RebalanceGate, now time.Time) Start {
	t.Helper()
	s, ok, waiting := g.Poll(now)
	if !ok {
		t.Fatalf("at %v: not started: %s", now.Sub(t0), waiting)
	}
	return s
}

// Joins settle: several joins in a row start one rebalance, Settle after
// the last, at most MaxSettle after the first.
func TestGateBatchesJoins(t *testing.T) {
	g := newGate(t)
	if _, ok, w := g.Poll(at(0)); ok || w != "" {
		t.Fatal("nothing queued, yet something")
	}
	g.Request(at(0), TriggerJoin, "node-4")
	mustWait(t, g, at(3*time.Second), "settling")
	g.Request(at(4*time.Second), TriggerJoin, "node-5")
	mustWait(t, g, at(8*time.Second), "settling")
	s := mustStart(t, g, at(9*time.Second))
	if !slices.Equal(s.Triggers, []Trigger{TriggerJoin}) {
		t.Fatalf("%+v", s)
	}
	g.Done(at(10 * time.Second))

	// Joins every 4 s would settle forever: MaxSettle bounds the wait.
	g2 := newGate(t)
	var started bool
	for i := 0; i < 10 && !started; i++ {
		g2.Request(at(time.Duration(4*i)*time.Second), TriggerJoin, "")
		_, started, _ = g2.Poll(at(time.Duration(4*i+1) * time.Second))
	}
	if !started {
		t.Fatal("a steady stream of joins never let a rebalance start")
	}
}

// Nothing starts during a checkpoint, a failover or another rebalance:
// requests are queued and start once those end.
func TestGateHoldsAndQueues(t *testing.T) {
	g := newGate(t)
	g.Checkpoint(true)
	g.Request(at(0), TriggerManual, "")
	mustWait(t, g, at(time.Second), "checkpoint")
	g.Checkpoint(false)
	g.Failover(true)
	mustWait(t, g, at(2*time.Second), "failover")
	g.Failover(false)
	s := mustStart(t, g, at(3*time.Second))
	if !slices.Equal(s.Triggers, []Trigger{TriggerManual}) {
		t.Fatalf("%+v", s)
	}
	// A drain asked during the rebalance waits for it, and for a
	// checkpoint, but not for the damping interval: the node leaves
	// either way (a stopping node's drain ends with its stop timeout,
	// then it fails over, which restarts every job).
	g.Request(at(4*time.Second), TriggerDrain, "node-2")
	g.Request(at(4*time.Second), TriggerDrain, "node-2")
	mustWait(t, g, at(5*time.Second), "in progress")
	g.Done(at(6 * time.Second))
	g.Checkpoint(true)
	mustWait(t, g, at(7*time.Second), "checkpoint")
	g.Checkpoint(false)
	s = mustStart(t, g, at(7*time.Second))
	if !slices.Equal(s.Drain, []string{"node-2"}) || !slices.Equal(s.Triggers, []Trigger{TriggerDrain}) {
		t.Fatalf("%+v", s)
	}
	g.Done(at(8 * time.Second))
	// What else is asked is still damped.
	g.Request(at(9*time.Second), TriggerManual, "")
	mustWait(t, g, at(10*time.Second), "damping")
	if g.Interval() != 20*time.Second {
		t.Fatalf("interval after the drain: %v, want it doubled to 20s", g.Interval())
	}
	mustStart(t, g, at(28*time.Second))
}

// An undrain's join is not damped (the undrained node's source splits
// hold their jobs' watermarks until it is moved in), but settles, waits
// for a rebalance, checkpoint or failover in progress, starts as a join,
// and counts for the damping of what comes next. A join that comes
// from the membership alone is still damped and settles.
func TestGateUndrainIsNotDamped(t *testing.T) {
	g := newGate(t)
	g.Request(at(0), TriggerManual, "")
	mustStart(t, g, at(0))
	g.Done(at(time.Second))
	// A join is damped...
	g.Request(at(2*time.Second), TriggerJoin, "node-3")
	mustWait(t, g, at(3*time.Second), "damping")
	s := mustStart(t, g, at(11*time.Second))
	if !slices.Equal(s.Triggers, []Trigger{TriggerJoin}) {
		t.Fatalf("%+v", s)
	}
	g.Done(at(12 * time.Second))
	if g.Interval() != 20*time.Second {
		t.Fatalf("interval: %v, want 20s", g.Interval())
	}
	// ...an undrain is not, but it settles and waits for a checkpoint.
	g.Request(at(13*time.Second), TriggerUndrain, "node-2")
	g.Checkpoint(true)
	mustWait(t, g, at(13*time.Second), "checkpoint")
	g.Checkpoint(false)
	mustWait(t, g, at(14*time.Second), "settling")
	s = mustStart(t, g, at(18*time.Second))
	if !slices.Equal(s.Triggers, []Trigger{TriggerJoin}) || len(s.Drain) != 0 {
		t.Fatalf("undrain started as %+v, want one join", s)
	}
	g.Done(at(19 * time.Second))
	if g.Interval() != 40*time.Second {
		t.Fatalf("interval after the undrain: %v, want it doubled to 40s", g.Interval())
	}
	// What comes next is damped again.
	g.Request(at(20*time.Second), TriggerJoin, "node-3")
	mustWait(t, g, at(58*time.Second), "damping")
	mustStart(t, g, at(59*time.Second))
}

// Rebalances that follow each other closely double the damping interval,
// up to MaxInterval; a quiet spell brings it back.
func TestGateDampsStorms(t *testing.T) {
	g := newGate(t)
	now := at(0)
	var intervals []time.Duration
	for range 6 {
		g.Request(now, TriggerManual, "")
		for {
			if _, ok, _ := g.Poll(now); ok {
				break
			}
			now = now.Add(time.Second)
		}
		g.Done(now)
		intervals = append(intervals, g.Interval())
	}
	want := []time.Duration{10, 20, 40, 80, 80, 80}
	for i := range want {
		want[i] *= time.Second
	}
	if !slices.Equal(intervals, want) {
		t.Fatalf("intervals %v, want %v", intervals, want)
	}
	now = now.Add(10 * time.Minute)
	g.Request(now, TriggerManual, "")
	mustStart(t, g, now)
	if g.Interval() != 10*time.Second {
		t.Fatalf("interval after a quiet spell: %v", g.Interval())
	}
}

func testPlan(t *testing.T) (Placement, RebalancePlan) {
	us := units([]string{"window"}, 6)
	cur := mustPlace(t, members(2), us)
	plan, err := PlanRebalance(cur, members(3), nil, us)
	if err != nil || len(plan.Moves) == 0 {
		t.Fatalf("%v %v", plan, err)
	}
	return cur, plan
}

// The happy path: savepoint, ship each moved unit, restore each, resume
// with the new placement; every step logged with its duration.
func TestMigrationHappyPath(t *testing.T) {
	cur, plan := testPlan(t)
	m := NewMigration(at(0), []Trigger{TriggerJoin}, cur, plan)
	if a := m.Actions(); len(a) != 1 || a[0].Step != StepSavepoint {
		t.Fatalf("%+v", a)
	}
	m.SavepointDone(at(time.Second), 42, nil)
	for _, step := range []MigrationStep{StepShip, StepRestore} {
		acts := m.Actions()
		if len(acts) != len(plan.Moves) || m.Step() != step {
			t.Fatalf("%s: %+v", m.Step(), acts)
		}
		for i, a := range acts {
			if a.Savepoint != 42 || a.Move != plan.Moves[i] {
				t.Fatalf("%+v", a)
			}
			if step == StepShip {
				m.Shipped(at(2*time.Second), a.Move.Unit, nil)
				m.Shipped(at(2*time.Second), a.Move.Unit, nil) // repeated: ignored
			} else {
				m.Restored(at(3*time.Second), a.Move.Unit, nil)
			}
		}
	}
	acts := m.Actions()
	if len(acts) != 1 || acts[0].Step != StepResume || Moved(acts[0].Placement, plan.Placement) != nil {
		t.Fatalf("%+v", acts)
	}
	m.Resumed(at(4*time.Second), nil)
	if m.Step() != StepDone || m.Err() != nil || m.Took(at(time.Hour)) != 4*time.Second {
		t.Fatalf("%s %v %v", m.Step(), m.Err(), m.Took(at(time.Hour)))
	}
	var ended []MigrationStep
	for _, e := range m.Events() {
		if e.Finished && e.Unit == "" {
			ended = append(ended, e.Step)
		}
	}
	if !slices.Equal(ended, []MigrationStep{StepSavepoint, StepResume}) {
		t.Fatalf("%v", ended)
	}
}

// A failure at any step after the savepoint falls back to the previous
// placement from that savepoint; a failed savepoint changes nothing; a
// failed fallback leaves recovery to the checkpoints.
func TestMigrationFailures(t *testing.T) {
	cur, plan := testPlan(t)
	boom := errors.New("boom")
	unit := plan.Moves[0].Unit

	m := NewMigration(at(0), nil, cur, plan)
	m.SavepointDone(at(1), 0, boom)
	if m.Step() != StepAborted || !errors.Is(m.Err(), ErrRebalance) || len(m.Actions()) != 0 {
		t.Fatalf("savepoint failure: %s %v", m.Step(), m.Err())
	}

	for _, fail := range []func(*Migration){
		func(m *Migration) { m.Shipped(at(2), unit, boom) }, // old owner fails mid-handover
		func(m *Migration) { // new owner fails mid-restore
			for _, mv := range plan.Moves {
				m.Shipped(at(2), mv.Unit, nil)
			}
			m.Restored(at(3), unit, boom)
		},
		func(m *Migration) { // resume fails
			for _, mv := range plan.Moves {
				m.Shipped(at(2), mv.Unit, nil)
			}
			for _, mv := range plan.Moves {
				m.Restored(at(3), mv.Unit, nil)
			}
			m.Resumed(at(4), boom)
		},
	} {
		m := NewMigration(at(0), nil, cur, plan)
		m.SavepointDone(at(1), 7, nil)
		fail(m)
		acts := m.Actions()
		if m.Step() != StepFallback || len(acts) != 1 || acts[0].Savepoint != 7 || Moved(acts[0].Placement, cur) != nil {
			t.Fatalf("%s: %+v", m.Step(), acts)
		}
		m.Restored(at(5), unit, nil) // late: ignored
		m.Resumed(at(6), nil)
		if m.Step() != StepFellBack || !errors.Is(m.Err(), boom) {
			t.Fatalf("%s %v", m.Step(), m.Err())
		}
	}

	m = NewMigration(at(0), nil, cur, plan)
	m.SavepointDone(at(1), 7, nil)
	m.Shipped(at(2), unit, boom)
	m.Resumed(at(3), boom)
	if m.Step() != StepFailed || !m.Ended() {
		t.Fatalf("failed fallback: %s", m.Step())
	}
}

// A node that keeps flapping (a join every 2 s) keeps each batch settling
// until MaxSettle; the damping counts from the batch's first request, so
// the interval still doubles instead of looking like a quiet spell.
func TestGateDampsFlappingJoins(t *testing.T) {
	g := newGate(t)
	var starts []time.Duration
	for d := time.Duration(0); d < 10*time.Minute; d += time.Second {
		if d%(2*time.Second) == 0 {
			g.Request(at(d), TriggerJoin, "node-4")
		}
		if _, ok, _ := g.Poll(at(d)); ok {
			starts = append(starts, d)
			g.Done(at(d))
		}
	}
	if g.Interval() != 80*time.Second {
		t.Fatalf("interval %v after 10 min of flapping (rebalances at %v), want the maximum 80s", g.Interval(), starts)
	}
	if len(starts) > 12 {
		t.Fatalf("%d rebalances in 10 min of flapping: %v", len(starts), starts)
	}
}
