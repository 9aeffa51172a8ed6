package snapshot

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"time"
)

// Coordinator decides the checkpoints of one run of a job: when to trigger
// them, when they complete or fail, which to discard, and when too many
// failures fail the job. It is a pure machine: time enters only through
// Tick and Step, it starts no goroutine and does no I/O, and its decisions
// come back as Actions for the caller to carry out in order.
//
// Not safe for concurrent use: the job's coordinating actor calls every
// method from its own goroutine.
type Coordinator struct {
	cfg         Config
	tasks       []TaskID // sorted by vertex, then subtask
	index       map[TaskID]int
	sources     []TaskID
	parallelism map[string]int // by vertex

	started bool
	held    bool // Hold: no checkpoint is triggered, pending ones still expire
	// triggered: a checkpoint or savepoint was triggered in this run.
	triggered bool
	nextDue   time.Time // next periodic trigger
	lastEnd   time.Time // end of the last checkpoint or savepoint; zero if none
	nextID    ID

	pending       []*pending // by increasing ID
	completed     []ID       // retained completed checkpoints, ascending
	lastCompleted ID
	failures      []ID  // counted failures with IDs above lastCompleted
	halted        error // why the coordinator halted; nil while running
	stopping      ID    // the pending stop-with-savepoint, 0 if none
	stopped       bool
	// finishing is set by EndOfData: only final checkpoints are triggered
	// from then on; final is the pending one (0 if none), retryAt when
	// the next is due after one failed, finished once one completed.
	finishing bool
	final     ID
	retryAt   time.Time
	finished  bool
	hist      history
}

// pending is a triggered checkpoint or savepoint not yet completed or
// failed.
type pending struct {
	id         ID
	savepoint  bool
	stop       bool
	path       string
	triggered  time.Time
	acked      []bool      // by task index
	states     []TaskState // by task index
	nacked     int
	size       int64
	alignment  time.Duration
	finalizing bool // Complete issued, waiting for Persisted
	final      bool // the final checkpoint after EndOfData
}

// Progress is what a coordinator carries over to the next run of its job:
// where IDs continue, which completed checkpoints retention still counts,
// and the history. Store.Progress rebuilds it from disk after a crash.
type Progress struct {
	// NextID is the ID of the next checkpoint or savepoint. After a
	// restore it must exceed the restored snapshot's ID.
	NextID ID
	// Completed lists the completed checkpoints on disk, ascending.
	Completed []ID
	// Incomplete lists checkpoint directories that never completed; the
	// new coordinator discards them.
	Incomplete []ID
	// History is the previous run's History.
	History []Stats
}

// NewCoordinator returns a coordinator for a job with the given tasks, of
// which sources are the ones Trigger actions go to. Every vertex's
// subtasks must be numbered 0 to n-1. Checkpoint IDs start at 1 unless
// Recover says otherwise. The first Tick or Step starts the clock: the
// first periodic checkpoint is due Interval after it.
func NewCoordinator(cfg Config, tasks []TaskID, sources []TaskID) (*Coordinator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := &Coordinator{
		cfg:         cfg,
		tasks:       slices.Clone(tasks),
		index:       make(map[TaskID]int, len(tasks)),
		sources:     slices.Clone(sources),
		parallelism: map[string]int{},
		nextID:      1,
	}
	if len(tasks) == 0 {
		return nil, fmt.Errorf("%w: no tasks", ErrInvalidTasks)
	}
	if len(sources) == 0 {
		return nil, fmt.Errorf("%w: no sources", ErrInvalidTasks)
	}
	slices.SortFunc(c.tasks, compareTasks)
	for i, t := range c.tasks {
		if t.Vertex == "" {
			return nil, fmt.Errorf("%w: task %s has an empty vertex UID", ErrInvalidTasks, t)
		}
		if _, dup := c.index[t]; dup {
			return nil, fmt.Errorf("%w: task %s listed twice", ErrInvalidTasks, t)
		}
		if t.Subtask != c.parallelism[t.Vertex] {
			return nil, fmt.Errorf("%w: vertex %q: subtask %d where %d was expected (subtasks must be 0..n-1)",
				ErrInvalidTasks, t.Vertex, t.Subtask, c.parallelism[t.Vertex])
		}
		c.index[t] = i
		c.parallelism[t.Vertex]++
	}
	seen := map[TaskID]bool{}
	for _, s := range sources {
		if _, ok := c.index[s]; !ok {
			return nil, fmt.Errorf("%w: source %s is not a task", ErrInvalidTasks, s)
		}
		if seen[s] {
			return nil, fmt.Errorf("%w: source %s listed twice", ErrInvalidTasks, s)
		}
		seen[s] = true
	}
	return c, nil
}

func compareTasks(a, b TaskID) int {
	return cmp.Or(cmp.Compare(a.Vertex, b.Vertex), cmp.Compare(a.Subtask, b.Subtask))
}

// Recover continues from a previous run (another coordinator's Progress, or
// Store.Progress after a crash): IDs continue at p.NextID (or past the
// highest completed ID), retention counts p.Completed, and History starts
// with p.History, where entries left in progress are marked failed. It
// returns Discard actions for p.Incomplete and for completed checkpoints
// beyond Config.Retain. It must be called before the first Tick or Step.
func (c *Coordinator) Recover(p Progress) ([]Action, error) {
	if c.started {
		return nil, ErrStarted
	}
	c.nextID = max(c.nextID, p.NextID)
	c.completed = slices.Compact(slices.Sorted(slices.Values(p.Completed)))
	if n := len(c.completed); n > 0 {
		c.lastCompleted = c.completed[n-1]
		c.nextID = max(c.nextID, c.lastCompleted+1)
	}
	var out []Action
	for _, id := range slices.Sorted(slices.Values(p.Incomplete)) {
		c.nextID = max(c.nextID, id+1)
		if !slices.Contains(c.completed, id) {
			out = append(out, Discard{Checkpoint: id})
		}
	}
	out = c.retire(out)
	for _, s := range p.History[max(0, len(p.History)-HistorySize):] {
		if s.Status == InProgress {
			s.Status = Failed
			s.Err = ErrHalted
		}
		c.hist.add(s)
	}
	return out, nil
}

// Progress returns what the next run of the job needs from this one: see
// Recover.
func (c *Coordinator) Progress() Progress {
	return Progress{
		NextID:    c.nextID,
		Completed: slices.Clone(c.completed),
		History:   c.hist.list(),
	}
}

// Sources returns the tasks every Trigger goes to.
func (c *Coordinator) Sources() []TaskID { return slices.Clone(c.sources) }

// History returns the Stats of the last HistorySize checkpoints and
// savepoints, oldest first. The slice is a copy.
func (c *Coordinator) History() []Stats { return c.hist.list() }

// Next returns the earliest time at which Tick may have something to do
// (a periodic trigger falls due or a pending checkpoint expires), so the
// caller can arm one timer instead of ticking often; false if nothing is
// scheduled (before the first Tick or Step, too). Ticking earlier or later
// is harmless: Tick acts on the time it is given.
func (c *Coordinator) Next() (time.Time, bool) {
	var at time.Time
	ok := false
	consider := func(t time.Time) {
		if !ok || t.Before(at) {
			at, ok = t, true
		}
	}
	for _, p := range c.pending {
		if !p.finalizing {
			consider(p.triggered.Add(c.cfg.Timeout))
		}
	}
	if c.periodic() && len(c.pending) < c.cfg.MaxConcurrent {
		consider(c.due())
	}
	if c.finalDue() {
		consider(c.retryAt)
	}
	return at, ok
}

// Hold stops (held) or resumes the triggering of periodic and final
// checkpoints; checkpoints in progress still expire at their timeout. An
// end of data while held triggers the final checkpoint once resumed. The
// runner holds them while a handover runs: no barrier but the handover's
// then crosses a channel the handover parks or replaces.
func (c *Coordinator) Hold(held bool) { c.held = held }

// finalDue reports whether a final checkpoint is to be triggered (again)
// at retryAt.
func (c *Coordinator) finalDue() bool {
	return !c.held && c.finishing && c.final == 0 && !c.finished && c.halted == nil && !c.stopped && c.stopping == 0
}

// finalRetry is how long after a failed final checkpoint the next one is
// triggered.
func (c *Coordinator) finalRetry() time.Duration {
	if d := max(c.cfg.Interval, c.cfg.MinPause); d > 0 {
		return d
	}
	return 100 * time.Millisecond
}

// periodic reports whether periodic checkpoints may be triggered at all.
func (c *Coordinator) periodic() bool {
	return !c.held && c.started && c.cfg.Interval > 0 && c.halted == nil && !c.stopped && c.stopping == 0 && !c.finishing
}

// due returns when the next periodic checkpoint may start, leaving aside
// the max concurrent checkpoints: at the interval, but not before the min
// pause after the last end.
func (c *Coordinator) due() time.Time {
	if !c.lastEnd.IsZero() {
		if t := c.lastEnd.Add(c.cfg.MinPause); t.After(c.nextDue) {
			return t
		}
	}
	return c.nextDue
}

func (c *Coordinator) start(now time.Time) {
	if !c.started {
		c.started = true
		c.nextDue = now.Add(c.cfg.Interval)
	}
}

// Tick advances the coordinator to now: it expires pending checkpoints and
// savepoints older than Config.Timeout, and triggers a periodic checkpoint
// if one is due (the interval has passed since the last periodic trigger,
// the min pause since the last end, and fewer than MaxConcurrent are
// pending). The next periodic checkpoint is due Interval after this one.
func (c *Coordinator) Tick(now time.Time) []Action {
	c.start(now)
	var out []Action
	for _, p := range slices.Clone(c.pending) {
		if c.find(p.id) == nil || p.finalizing || now.Before(p.triggered.Add(c.cfg.Timeout)) {
			continue
		}
		out = c.fail(out, now, p, fmt.Errorf("%w: not acknowledged by %d of %d tasks within %s",
			ErrExpired, len(c.tasks)-p.nacked, len(c.tasks), c.cfg.Timeout), true)
	}
	out = c.triggerPeriodic(out, now)
	if c.finalDue() && !now.Before(c.retryAt) {
		out = c.triggerFinal(out, now)
	}
	return out
}

// triggerPeriodic triggers a periodic checkpoint if one is due at now;
// the next is then due Interval after it.
func (c *Coordinator) triggerPeriodic(out []Action, now time.Time) []Action {
	if c.periodic() && len(c.pending) < c.cfg.MaxConcurrent && !now.Before(c.due()) {
		out = c.trigger(out, now, false, false, "")
		c.nextDue = now.Add(c.cfg.Interval)
	}
	return out
}

// triggerFinal triggers the final checkpoint.
func (c *Coordinator) triggerFinal(out []Action, now time.Time) []Action {
	out = c.trigger(out, now, false, false, "")
	t := out[len(out)-1].(Trigger)
	t.Final = true
	out[len(out)-1] = t
	p := c.pending[len(c.pending)-1]
	p.final = true
	c.final = p.id
	return out
}

// Step feeds one input to the coordinator at time now and returns what to
// do about it. Inputs for unknown, finished or already-acknowledged
// checkpoints, and from unknown tasks, are ignored: they are late, not
// wrong.
func (c *Coordinator) Step(now time.Time, in Input) []Action {
	c.start(now)
	switch in := in.(type) {
	case Ack:
		return c.ack(now, in)
	case Decline:
		p := c.find(in.Checkpoint)
		if _, known := c.index[in.Task]; p == nil || p.finalizing || !known {
			return nil
		}
		return c.fail(nil, now, p, fmt.Errorf("%w by %s: %w", ErrDeclined, in.Task, in.Reason), true)
	case TriggerSavepoint:
		var reason error
		switch {
		case c.halted != nil:
			reason = fmt.Errorf("%w: %w", ErrHalted, c.halted)
		case c.stopped:
			reason = ErrStopped
		case c.stopping != 0:
			reason = fmt.Errorf("%w (savepoint %d)", ErrStopping, c.stopping)
		case c.finishing:
			reason = ErrFinished
		}
		if reason == nil {
			return c.trigger(nil, now, true, in.Stop, in.Path)
		}
		id := c.nextID
		c.nextID++
		c.hist.add(Stats{Checkpoint: id, Kind: KindSavepoint, Status: Failed, Stop: in.Stop,
			Triggered: now, Tasks: len(c.tasks), Err: reason})
		return []Action{Abort{Checkpoint: id, Savepoint: true, Reason: reason}}
	case EndOfData:
		if c.finishing || c.halted != nil || c.stopped {
			return nil
		}
		c.finishing = true
		if c.stopping != 0 {
			// The stop ends the job; should it fail, the final
			// checkpoint follows at the next Tick.
			return nil
		}
		if c.held {
			// Held (a handover runs): the final checkpoint follows at
			// the first Tick once resumed.
			c.retryAt = now
			return nil
		}
		return c.triggerFinal(nil, now)
	case Persisted:
		return c.persisted(now, in)
	case TaskFailed:
		if c.halted != nil {
			return nil
		}
		cause := fmt.Errorf("%w: %s: %w", ErrTaskFailed, in.Task, in.Err)
		return c.halt(nil, now, cause, cause)
	case OutputHeld:
		if _, known := c.index[in.Task]; !known || c.triggered {
			return nil
		}
		if now.Before(c.nextDue) {
			c.nextDue = now
		}
		return c.triggerPeriodic(nil, now)
	}
	return nil
}

func (c *Coordinator) find(id ID) *pending {
	for _, p := range c.pending {
		if p.id == id {
			return p
		}
	}
	return nil
}

func (c *Coordinator) remove(p *pending) {
	c.pending = slices.DeleteFunc(c.pending, func(q *pending) bool { return q == p })
}

func (c *Coordinator) trigger(out []Action, now time.Time, savepoint, stop bool, path string) []Action {
	p := &pending{
		id:        c.nextID,
		savepoint: savepoint,
		stop:      stop,
		path:      path,
		triggered: now,
		acked:     make([]bool, len(c.tasks)),
		states:    make([]TaskState, len(c.tasks)),
	}
	c.nextID++
	c.triggered = true
	c.pending = append(c.pending, p)
	if stop {
		c.stopping = p.id
	}
	kind, mode := KindCheckpoint, c.cfg.Mode
	if savepoint {
		kind, mode = KindSavepoint, ExactlyOnce
	}
	c.hist.add(Stats{Checkpoint: p.id, Kind: kind, Status: InProgress, Stop: stop,
		Triggered: now, Tasks: len(c.tasks)})
	return append(out, Trigger{Checkpoint: p.id, Timestamp: now.UnixMilli(), Mode: mode,
		Savepoint: savepoint, Stop: stop, Path: path})
}

func (c *Coordinator) ack(now time.Time, in Ack) []Action {
	p := c.find(in.Checkpoint)
	i, known := c.index[in.Task]
	if p == nil || p.finalizing || !known || p.acked[i] {
		return nil
	}
	p.acked[i] = true
	p.states[i] = in.State
	p.nacked++
	for _, h := range in.State.Operators {
		p.size += h.Size
	}
	p.alignment = max(p.alignment, in.AlignmentTime)
	if s := c.hist.get(p.id); s != nil {
		s.Acked, s.Size, s.Alignment = p.nacked, p.size, p.alignment
	}
	if p.nacked < len(c.tasks) {
		return nil
	}
	md, err := c.metadata(p)
	if err != nil {
		return c.fail(nil, now, p, err, true)
	}
	md.Finished = p.final
	p.finalizing = true
	return []Action{Complete{Checkpoint: p.id, Savepoint: p.savepoint, Stop: p.stop, Final: p.final, Metadata: md}}
}

// metadata gathers the acknowledged handles by operator.
func (c *Coordinator) metadata(p *pending) (*Metadata, error) {
	ops := map[string]*Operator{}
	vertexOf := map[string]string{}
	for i, t := range c.tasks {
		for _, uid := range slices.Sorted(maps.Keys(p.states[i].Operators)) {
			h := p.states[i].Operators[uid]
			if uid == "" {
				return nil, fmt.Errorf("%w: %s reported an operator with an empty UID", ErrInvalidAck, t)
			}
			if err := h.validate(); err != nil {
				return nil, fmt.Errorf("%w: %s, operator %q: %w", ErrInvalidAck, t, uid, err)
			}
			if v, seen := vertexOf[uid]; seen && v != t.Vertex {
				return nil, fmt.Errorf("%w: operator %q reported by tasks of vertices %q and %q",
					ErrInvalidAck, uid, v, t.Vertex)
			}
			vertexOf[uid] = t.Vertex
			o := ops[uid]
			if o == nil {
				n := c.parallelism[t.Vertex]
				o = &Operator{UID: uid, Parallelism: n, Subtasks: make([]Handle, n)}
				ops[uid] = o
			}
			o.Subtasks[t.Subtask] = h
		}
	}
	md := &Metadata{Checkpoint: p.id, Kind: KindCheckpoint, Timestamp: p.triggered.UnixMilli()}
	if p.savepoint {
		md.Kind = KindSavepoint
	}
	for _, uid := range slices.Sorted(maps.Keys(ops)) {
		md.Operators = append(md.Operators, *ops[uid])
	}
	return md, nil
}

func (c *Coordinator) persisted(now time.Time, in Persisted) []Action {
	p := c.find(in.Checkpoint)
	if p == nil || !p.finalizing {
		return nil
	}
	if in.Err != nil {
		return c.fail(nil, now, p, fmt.Errorf("%w: %w", ErrMetadataWrite, in.Err), true)
	}
	c.remove(p)
	c.lastEnd = now
	if s := c.hist.get(p.id); s != nil {
		s.Status, s.Duration, s.Path = Completed, now.Sub(p.triggered), in.Path
	}
	out := []Action{NotifyComplete{Checkpoint: p.id, Stop: p.stop, Final: p.final}}
	if p.final {
		c.final = 0
		c.finished = true
	}
	if p.savepoint {
		if p.stop {
			c.stopping = 0
			c.stopped = true
			for _, q := range slices.Clone(c.pending) {
				if !q.finalizing {
					out = c.fail(out, now, q, ErrStopped, false)
				}
			}
		}
		return out
	}
	i, _ := slices.BinarySearch(c.completed, p.id)
	c.completed = slices.Insert(c.completed, i, p.id)
	c.lastCompleted = max(c.lastCompleted, p.id)
	c.failures = slices.DeleteFunc(c.failures, func(id ID) bool { return id <= c.lastCompleted })
	for _, q := range slices.Clone(c.pending) {
		if q.id < p.id && !q.savepoint && !q.finalizing {
			out = c.fail(out, now, q, fmt.Errorf("%w (%d)", ErrSubsumed, p.id), false)
		}
	}
	return c.retire(out)
}

// retire discards the oldest completed checkpoints beyond Config.Retain.
func (c *Coordinator) retire(out []Action) []Action {
	for len(c.completed) > c.cfg.Retain {
		out = append(out, Discard{Checkpoint: c.completed[0]})
		c.completed = c.completed[1:]
	}
	return out
}

// fail aborts p. Counted failures of checkpoints newer than the latest
// completed one accumulate; more than TolerableFailures of them fail the
// job.
func (c *Coordinator) fail(out []Action, now time.Time, p *pending, reason error, counted bool) []Action {
	c.remove(p)
	c.lastEnd = now
	if p.id == c.stopping {
		c.stopping = 0
	}
	if p.id == c.final {
		c.final = 0
		c.retryAt = now.Add(c.finalRetry())
	}
	if s := c.hist.get(p.id); s != nil {
		s.Status, s.Duration, s.Err = Failed, now.Sub(p.triggered), reason
	}
	out = append(out, Abort{Checkpoint: p.id, Savepoint: p.savepoint, Reason: reason}, Discard{Checkpoint: p.id})
	if !counted || p.savepoint || c.halted != nil || p.id <= c.lastCompleted {
		return out
	}
	c.failures = append(c.failures, p.id)
	if len(c.failures) <= c.cfg.TolerableFailures {
		return out
	}
	err := fmt.Errorf("%w: %d since the latest completed checkpoint (tolerable %d), the last %d: %w",
		ErrTooManyFailures, len(c.failures), c.cfg.TolerableFailures, p.id, reason)
	out = c.halt(out, now, err, fmt.Errorf("%w: %w", ErrHalted, err))
	return append(out, FailJob{Reason: err})
}

// halt stops the coordinator for good: every pending checkpoint and
// savepoint still waiting for acknowledgements is aborted with reason.
func (c *Coordinator) halt(out []Action, now time.Time, cause, reason error) []Action {
	c.halted = cause
	c.failures = nil
	for _, q := range slices.Clone(c.pending) {
		if !q.finalizing {
			out = c.fail(out, now, q, reason, false)
		}
	}
	return out
}
