package snapshot

import (
	"errors"
	"flag"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func TestNewCoordinatorRefusesBadTaskSets(t *testing.T) {
	src, m0, m1, m2 := TaskID{"src", 0}, TaskID{"map", 0}, TaskID{"map", 1}, TaskID{"map", 2}
	for name, tc := range map[string]struct{ tasks, sources []TaskID }{
		"no tasks":         {nil, []TaskID{src}},
		"no sources":       {[]TaskID{src}, nil},
		"duplicate task":   {[]TaskID{src, m0, m0}, []TaskID{src}},
		"gap in subtasks":  {[]TaskID{src, m0, m2}, []TaskID{src}},
		"no subtask 0":     {[]TaskID{src, m1}, []TaskID{src}},
		"unknown source":   {[]TaskID{src, m0}, []TaskID{{"other", 0}}},
		"duplicate source": {[]TaskID{src, m0}, []TaskID{src, src}},
		"empty vertex":     {[]TaskID{src, {"", 0}}, []TaskID{src}},
	} {
		if _, err := NewCoordinator(DefaultConfig(), tc.tasks, tc.sources); !errors.Is(err, ErrInvalidTasks) {
			t.Errorf("%s: NewCoordinator = %v, want ErrInvalidTasks", name, err)
		}
	}
	// Order does not matter.
	if _, err := NewCoordinator(DefaultConfig(), []TaskID{m1, src, m0}, []TaskID{src}); err != nil {
		t.Error(err)
	}
	if _, err := NewCoordinator(Config{}, []TaskID{src}, []TaskID{src}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("zero Config: %v, want ErrInvalidConfig", err)
	}
}

func TestHistoryIsBounded(t *testing.T) {
	c, err := NewCoordinator(DefaultConfig(), []TaskID{{"src", 0}}, []TaskID{{"src", 0}})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	c.Step(now, TaskFailed{Task: TaskID{"src", 0}, Err: errors.New("boom")})
	for range 150 {
		c.Step(now, TriggerSavepoint{}) // refused, recorded
	}
	h := c.History()
	if len(h) != HistorySize || h[0].Checkpoint != 51 || h[len(h)-1].Checkpoint != 150 {
		t.Fatalf("History: %d entries, %d..%d", len(h), h[0].Checkpoint, h[len(h)-1].Checkpoint)
	}
	h[0].Checkpoint = 0 // a copy
	if c.History()[0].Checkpoint != 51 {
		t.Fatal("History returned the coordinator's own slice")
	}
}

func TestRecoverCarriesHistory(t *testing.T) {
	tasks := []TaskID{{"src", 0}}
	cfg := DefaultConfig()
	cfg.Interval, cfg.Dir = time.Second, "/data"
	a, err := NewCoordinator(cfg, tasks, tasks)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(0, 0)
	a.Tick(t0)
	if acts := a.Tick(t0.Add(time.Second)); len(acts) != 1 {
		t.Fatalf("no trigger: %v", acts)
	}
	a.Step(t0.Add(2*time.Second), TaskFailed{Task: tasks[0], Err: errors.New("boom")})

	b, err := NewCoordinator(cfg, tasks, tasks)
	if err != nil {
		t.Fatal(err)
	}
	p := a.Progress()
	p.History = append(p.History, Stats{Checkpoint: 1, Status: InProgress}) // as if cut off mid-way
	if _, err := b.Recover(p); err != nil {
		t.Fatal(err)
	}
	h := b.History()
	if len(h) != 2 || h[0].Status != Failed || !errors.Is(h[0].Err, ErrTaskFailed) ||
		h[1].Status != Failed || !errors.Is(h[1].Err, ErrHalted) {
		t.Fatalf("History after Recover: %+v", h)
	}
	b.Tick(t0.Add(10 * time.Second))
	acts := b.Tick(t0.Add(11 * time.Second))
	if len(acts) != 1 || acts[0].(Trigger).Checkpoint != 2 {
		t.Fatalf("first trigger after Recover: %v", acts)
	}
}

// TestCoordinatorRandom drives coordinators with random schedules and
// checks every action against a simple model of the rules: IDs increase,
// periodic triggers respect the interval, min pause and max concurrent and
// happen as soon as they are due, nothing pending outlives the timeout,
// retention keeps at most Retain checkpoints and never discards a
// savepoint, and the job fails exactly when the counted failures exceed
// the tolerable number.
func TestCoordinatorRandom(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	n := 300
	if *randomSeed != 0 {
		seed, n = *randomSeed, 1
	}
	for i := range n {
		s := seed + uint64(i)
		if !t.Run("", func(t *testing.T) { runRandom(t, s) }) {
			t.Fatalf("failed with seed %d", s)
		}
	}
}

var randomSeed = flag.Uint64("seed", 0, "run TestCoordinatorRandom with this seed only, logging every action")

// model is what the random test knows of a coordinator's state.
type model struct {
	cfg            Config
	tasks          []TaskID
	lastID         ID
	pending        map[ID]*modelPending
	completed      []ID // retained checkpoints
	savepoints     map[ID]bool
	lastCompleted  ID
	failures       []ID // counted failures newer than lastCompleted
	lastEnd        time.Time
	nextDue        time.Time
	halted         bool
	stopping       bool
	stopped        bool
	persistFailure bool // fail the next Persisted
}

type modelPending struct {
	savepoint, stop bool
	triggered       time.Time
	acked           map[TaskID]bool
	completing      bool
}

func runRandom(t *testing.T, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 0))
	cfg := DefaultConfig()
	cfg.Dir = "/data"
	cfg.Interval = time.Duration(10+r.IntN(20)) * time.Second
	cfg.Timeout = time.Duration(5+r.IntN(40)) * time.Second
	cfg.MaxConcurrent = 1 + r.IntN(3)
	cfg.MinPause = time.Duration(r.IntN(6)) * time.Second
	cfg.TolerableFailures = r.IntN(4)
	cfg.Retain = 1 + r.IntN(3)
	var tasks, sources []TaskID
	for i := range 1 + r.IntN(2) {
		tasks = append(tasks, TaskID{"src", i})
		sources = append(sources, TaskID{"src", i})
	}
	for i := range 1 + r.IntN(3) {
		tasks = append(tasks, TaskID{"op", i})
	}
	c, err := NewCoordinator(cfg, tasks, sources)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	m := &model{cfg: cfg, tasks: tasks, pending: map[ID]*modelPending{}, savepoints: map[ID]bool{},
		nextDue: now.Add(cfg.Interval)}
	check := func(what string, acts []Action) {
		t.Helper()
		if *randomSeed != 0 {
			t.Logf("%s %s: %+v", now.Format("15:04:05.000"), what, acts)
		}
		m.apply(t, c, now, what, acts)
	}
	check("tick", c.Tick(now))
	for step := 0; step < 400 && !m.stopped; step++ {
		now = now.Add(time.Duration(r.IntN(4000)) * time.Millisecond)
		ids := slices.Sorted(func(yield func(ID) bool) {
			for id := range m.pending {
				if !yield(id) {
					return
				}
			}
		})
		switch x := r.IntN(100); {
		case x < 30:
			check("tick", c.Tick(now))
		case x < 80 && len(ids) > 0:
			id := ids[r.IntN(len(ids))]
			task := tasks[r.IntN(len(tasks))]
			m.persistFailure = r.IntN(20) == 0
			if !m.pending[id].completing {
				m.pending[id].acked[task] = true
			}
			check("ack", c.Step(now, Ack{Checkpoint: id, Task: task, State: TaskState{Operators: map[string]Handle{
				task.Vertex: {File: task.Vertex + ".state", Size: 10},
			}}}))
		case x < 85 && len(ids) > 0:
			check("decline", c.Step(now, Decline{Checkpoint: ids[r.IntN(len(ids))], Task: tasks[r.IntN(len(tasks))], Reason: errors.New("no")}))
		case x < 90:
			check("savepoint", c.Step(now, TriggerSavepoint{Stop: r.IntN(10) == 0}))
		case x < 91:
			check("task failed", c.Step(now, TaskFailed{Task: tasks[0], Err: errors.New("boom")}))
			m.halted = true
		default:
			// Late or bogus input is ignored.
			if acts := c.Step(now, Ack{Checkpoint: m.lastID + 5, Task: tasks[0]}); len(acts) > 0 {
				t.Fatalf("ack of an unknown checkpoint: %v", acts)
			}
		}
		if m.halted {
			// A halted coordinator does nothing more.
			now = now.Add(time.Hour)
			if acts := c.Tick(now); len(acts) > 0 {
				t.Fatalf("tick after halting: %v", acts)
			}
			if acts := c.Step(now, TriggerSavepoint{}); len(acts) != 1 || !errors.Is(acts[0].(Abort).Reason, ErrHalted) {
				t.Fatalf("savepoint after halting: %v", acts)
			}
			return
		}
	}
}

// apply checks acts against the model and updates it; a Complete is
// answered with Persisted at once.
func (m *model) apply(t *testing.T, c *Coordinator, now time.Time, what string, acts []Action) {
	t.Helper()
	triggered := false
	for _, a := range acts {
		switch a := a.(type) {
		case Trigger:
			if a.Checkpoint <= m.lastID {
				t.Fatalf("%s: trigger %d after %d", what, a.Checkpoint, m.lastID)
			}
			m.lastID = a.Checkpoint
			if m.halted || m.stopped || m.stopping {
				t.Fatalf("%s: trigger %d while halted/stopped/stopping", what, a.Checkpoint)
			}
			if !a.Savepoint {
				triggered = true
				if len(m.pending) >= m.cfg.MaxConcurrent {
					t.Fatalf("%s: trigger %d with %d pending", what, a.Checkpoint, len(m.pending))
				}
				if now.Before(m.nextDue) || !m.lastEnd.IsZero() && now.Before(m.lastEnd.Add(m.cfg.MinPause)) {
					t.Fatalf("%s: trigger %d too early at %v (due %v, last end %v)", what, a.Checkpoint, now, m.nextDue, m.lastEnd)
				}
				m.nextDue = now.Add(m.cfg.Interval)
			}
			m.stopping = a.Stop
			m.pending[a.Checkpoint] = &modelPending{savepoint: a.Savepoint, stop: a.Stop, triggered: now, acked: map[TaskID]bool{}}
		case Complete:
			p := m.pending[a.Checkpoint]
			if p == nil || p.completing || len(p.acked) != len(m.tasks) {
				t.Fatalf("%s: complete %d not fully acknowledged: %+v", what, a.Checkpoint, p)
			}
			p.completing = true
			in := Persisted{Checkpoint: a.Checkpoint, Path: "/x"}
			if m.persistFailure {
				in.Err = errors.New("disk")
			}
			m.apply(t, c, now, "persisted", c.Step(now, in))
		case NotifyComplete:
			p := m.pending[a.Checkpoint]
			if p == nil || !p.completing || m.persistFailure {
				t.Fatalf("%s: notify %d without successful persist", what, a.Checkpoint)
			}
			delete(m.pending, a.Checkpoint)
			m.lastEnd = now
			if p.savepoint {
				m.savepoints[a.Checkpoint] = true
				if p.stop {
					m.stopping, m.stopped = false, true
				}
				continue
			}
			m.completed = append(m.completed, a.Checkpoint)
			slices.Sort(m.completed)
			m.lastCompleted = max(m.lastCompleted, a.Checkpoint)
			m.failures = slices.DeleteFunc(m.failures, func(id ID) bool { return id <= m.lastCompleted })
		case Abort:
			p := m.pending[a.Checkpoint]
			if p == nil {
				if !a.Savepoint || a.Checkpoint <= m.lastID {
					t.Fatalf("%s: abort of unknown %d", what, a.Checkpoint)
				}
				m.lastID = a.Checkpoint // a refused savepoint
				continue
			}
			delete(m.pending, a.Checkpoint)
			m.lastEnd = now
			if p.stop {
				m.stopping = false
			}
			uncounted := errors.Is(a.Reason, ErrSubsumed) || errors.Is(a.Reason, ErrHalted) ||
				errors.Is(a.Reason, ErrTaskFailed) || errors.Is(a.Reason, ErrStopped)
			counted := !uncounted && (errors.Is(a.Reason, ErrDeclined) || errors.Is(a.Reason, ErrExpired) ||
				errors.Is(a.Reason, ErrMetadataWrite))
			if counted == uncounted {
				t.Fatalf("%s: abort %d for an unexpected reason: %v", what, a.Checkpoint, a.Reason)
			}
			if errors.Is(a.Reason, ErrSubsumed) && (p.savepoint || a.Checkpoint >= m.lastCompleted) {
				t.Fatalf("%s: abort %d subsumed by %d", what, a.Checkpoint, m.lastCompleted)
			}
			if counted && !p.savepoint && !m.halted && a.Checkpoint > m.lastCompleted {
				m.failures = append(m.failures, a.Checkpoint)
			}
			if errors.Is(a.Reason, ErrTaskFailed) || errors.Is(a.Reason, ErrHalted) {
				m.halted = true
			}
		case Discard:
			if m.savepoints[a.Checkpoint] {
				t.Fatalf("%s: discard of savepoint %d", what, a.Checkpoint)
			}
			m.completed = slices.DeleteFunc(m.completed, func(id ID) bool { return id == a.Checkpoint })
		case FailJob:
			if !errors.Is(a.Reason, ErrTooManyFailures) || len(m.failures) <= m.cfg.TolerableFailures {
				t.Fatalf("%s: fail job with %d failures (tolerable %d): %v", what, m.failures, m.cfg.TolerableFailures, a.Reason)
			}
			m.halted = true
		}
	}
	if !m.halted && len(m.failures) > m.cfg.TolerableFailures {
		t.Fatalf("%s: %d failures (tolerable %d) and no FailJob", what, m.failures, m.cfg.TolerableFailures)
	}
	if len(m.completed) > m.cfg.Retain {
		t.Fatalf("%s: %d checkpoints retained: %v", what, len(m.completed), m.completed)
	}
	if what != "tick" {
		return
	}
	for id, p := range m.pending {
		if !p.completing && !now.Before(p.triggered.Add(m.cfg.Timeout)) {
			t.Fatalf("tick: %d pending past its timeout", id)
		}
	}
	due := !now.Before(m.nextDue) && (m.lastEnd.IsZero() || !now.Before(m.lastEnd.Add(m.cfg.MinPause)))
	if due && !triggered && !m.halted && !m.stopped && !m.stopping && len(m.pending) < m.cfg.MaxConcurrent {
		t.Fatalf("tick at %v: a checkpoint was due (next due %v, last end %v) and none started", now, m.nextDue, m.lastEnd)
	}
}
