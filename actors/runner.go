package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/edgedio/edged/keygroup"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/state"
	"github.com/edgedio/edged/watermark"
)

// Runner executes one job. Make it with NewRunner, call Run once.
type Runner struct {
	job  *Job
	cfg  Config
	plan *Plan
	maxP int
	log  *slog.Logger

	system *actor.ActorSystem
	tasks  []*task
	chans  []*channel

	// done is closed when the job stops (finished, failed or cancelled);
	// tasks blocked on credit unwind when it closes.
	done     chan struct{}
	stopOnce sync.Once
	// started is closed once every task is built and spawned.
	started chan struct{}
	// events receives one report per task: nil when it finished, its error
	// when it failed.
	events chan taskEvent
	// waiters tracks the goroutines awaiting source availability.
	waiters sync.WaitGroup

	// Checkpointing, when the config has a checkpoint directory.
	store *snapshot.Store
	coord *snapshot.Coordinator
	// inputs receives the tasks' acknowledgements and declines.
	inputs chan snapshot.Input
	// snapshots tracks the goroutines writing snapshots.
	snapshots  sync.WaitGroup
	savepoints chan savepointReq
	waiting    map[snapshot.ID]savepointReq
	paths      map[snapshot.ID]string
	// closing is the checkpoint whose completion ends the job (the final
	// checkpoint or a stop-with-savepoint), 0 before; acks receives one
	// signal per task that handled its notification, counted in acked.
	closing snapshot.ID
	acks    chan struct{}
	acked   int
	histMu  sync.Mutex // guards history
	history []snapshot.Stats
}

type taskEvent struct {
	t   *task
	err error
}

// NewRunner validates the job and the config and plans the job's tasks. It
// starts nothing.
func NewRunner(job *Job, cfg Config) (*Runner, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("actors: config: %w", err)
	}
	plan, err := BuildPlan(job)
	if err != nil {
		return nil, err
	}
	if md := cfg.Restore; md != nil {
		if err := checkRestore(job, md, cfg.AllowNonRestoredState); err != nil {
			return nil, err
		}
	}
	if cfg.SerializeKeyBy {
		var errs []error
		for _, e := range job.Edges {
			if e.Partition == KeyBy {
				if err := e.From.Out.hasCodec(); err != nil {
					errs = append(errs, fmt.Errorf("edge %q -> %q: %w", e.From.Name, e.To.Name, err))
				}
			}
		}
		if err := errors.Join(errs...); err != nil {
			return nil, err
		}
	}
	return &Runner{
		job:        job,
		cfg:        cfg,
		plan:       plan,
		maxP:       job.maxParallelism(),
		log:        cfg.Logger.With("job", job.Name),
		done:       make(chan struct{}),
		started:    make(chan struct{}),
		inputs:     make(chan snapshot.Input, 64),
		savepoints: make(chan savepointReq),
		waiting:    make(map[snapshot.ID]savepointReq),
		paths:      make(map[snapshot.ID]string),
	}, nil
}

// Started returns a channel closed once Run has built and spawned every
// task; the runner's tasks and channels do not change after that.
func (r *Runner) Started() <-chan struct{} { return r.started }

// Plan returns the job's execution plan.
func (r *Runner) Plan() *Plan { return r.plan }

// Run executes the job until every task has finished (bounded sources),
// a task fails, or ctx is cancelled. It returns nil, the first task's
// *TaskError, or ctx's error. Every goroutine it started has ended when it
// returns.
func (r *Runner) Run(ctx context.Context) (err error) {
	r.system = actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(minLevel{r.cfg.Logger.Handler(), slog.LevelWarn}).With("component", "protoactor")
	}))
	defer r.system.Shutdown()
	// Whatever happens, the job is over when Run returns: wake whoever
	// waits for it.
	defer r.stopOnce.Do(func() { close(r.done) })

	if md := r.cfg.Restore; md != nil && md.Finished {
		return r.runFinished(md)
	}
	if err := r.build(); err != nil {
		r.closeOperators()
		return err
	}
	r.log.Info("job starting", "tasks", len(r.tasks), "chains", len(r.plan.Chains))
	r.events = make(chan taskEvent, len(r.tasks))
	r.acks = make(chan struct{}, len(r.tasks))
	// Every pid is known before any task runs, so tasks can send to each
	// other from their first message on.
	for i, t := range r.tasks {
		t.pid = r.system.NewLocalPID(fmt.Sprintf("task-%d", i))
	}
	for i, t := range r.tasks {
		props := actor.PropsFromProducer(func() actor.Actor { return t })
		if _, err := r.system.Root.SpawnNamed(props, fmt.Sprintf("task-%d", i)); err != nil {
			r.stop()
			r.closeOperators()
			return fmt.Errorf("actors: spawn task %d: %w", i, err)
		}
	}
	if err := r.openCheckpointing(); err != nil {
		r.stop()
		r.closeOperators()
		return err
	}
	close(r.started)
	for _, t := range r.tasks {
		if t.source != nil {
			r.system.Root.Send(t.pid, startMsg{})
		}
	}

	clock := r.cfg.Clock
	timer, tick := r.coordinatorTimer(clock, nil)
	remaining := len(r.tasks)
wait:
	for !r.over(remaining) {
		var acts []snapshot.Action
		select {
		case ev := <-r.events:
			if ev.err != nil {
				err = ev.err
				break wait
			}
			remaining--
			if remaining == 0 && r.coord != nil {
				// Every task finished its input: the final checkpoint
				// commits the sinks' last results, then the job ends.
				r.log.Info("input ended; taking the final checkpoint")
				acts = r.coord.Step(clock.Now(), snapshot.EndOfData{})
			}
		case <-r.acks:
			r.acked++
		case in := <-r.inputs:
			acts = r.coord.Step(clock.Now(), in)
		case req := <-r.savepoints:
			acts = r.coord.Step(clock.Now(), snapshot.TriggerSavepoint{Path: req.path, Stop: req.stop})
			for _, a := range acts {
				switch a := a.(type) {
				case snapshot.Trigger:
					if a.Savepoint {
						r.waiting[a.Checkpoint] = req
					}
				case snapshot.Abort:
					if a.Savepoint {
						r.waiting[a.Checkpoint] = req
					}
				}
			}
		case <-tick:
			acts = r.coord.Tick(clock.Now())
		case <-ctx.Done():
			err = ctx.Err()
			break wait
		}
		if len(acts) > 0 {
			if ferr := r.handle(clock.Now(), acts); ferr != nil {
				err = ferr
				break wait
			}
			timer, tick = r.coordinatorTimer(clock, timer)
		}
	}
	if timer != nil {
		timer.Stop()
	}
	if req, ok := r.waiting[r.closing]; ok && err == nil && r.closing != 0 {
		// A stop-with-savepoint: every sink committed it.
		req.reply <- savepointResult{path: r.paths[r.closing]}
		delete(r.waiting, r.closing)
	}
	for id, req := range r.waiting {
		if err != nil {
			req.reply <- savepointResult{err: fmt.Errorf("savepoint %d: the job failed first: %w", id, err)}
			continue
		}
		req.reply <- savepointResult{err: fmt.Errorf("savepoint %d: the job ended first", id)}
	}
	r.stop()
	if cerr := r.closeOperators(); err == nil {
		err = cerr
	}
	if err != nil {
		r.log.Warn("job stopped", "err", err)
	} else {
		r.log.Info("job finished")
	}
	return err
}

// over reports whether the job is over: every task finished and, with
// checkpoints, the final checkpoint (or a stop-with-savepoint) completed
// and every task handled its notification.
func (r *Runner) over(remaining int) bool {
	if r.closing != 0 {
		return r.acked == len(r.tasks)
	}
	return remaining == 0 && r.coord == nil
}

// notified tells the runner that a task handled the notification of the
// checkpoint that ends the job; called from the task's goroutine.
func (r *Runner) notified() {
	select {
	case r.acks <- struct{}{}:
	case <-r.done:
	}
}

// runFinished handles a restore from the final checkpoint of a job that
// finished: the operators are built and restored, so the sinks commit
// what that checkpoint holds, and closed; nothing runs and nothing is
// emitted.
func (r *Runner) runFinished(md *snapshot.Metadata) error {
	r.log.Debug("job already finished: committing what its final checkpoint holds; nothing runs",
		"checkpoint_id", md.Checkpoint, "path", md.Dir)
	err := r.build()
	if cerr := r.closeOperators(); err == nil {
		err = cerr
	}
	return err
}

// stop unblocks every task, stops every actor and waits for the goroutines
// the runner started.
func (r *Runner) stop() {
	r.stopOnce.Do(func() { close(r.done) })
	for _, t := range r.tasks {
		if t.pid != nil {
			_ = r.system.Root.StopFuture(t.pid).Wait()
		}
	}
	r.waiters.Wait()
	r.snapshots.Wait()
}

func (r *Runner) stopping() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

// report delivers a task's end; called from the task's goroutine.
func (r *Runner) report(t *task, err error) {
	r.events <- taskEvent{t: t, err: err}
}

// await sends pollMsg to pid once ready is ready, unless the job stops
// first.
func (r *Runner) await(ready <-chan struct{}, pid *actor.PID) {
	r.waiters.Add(1)
	go func() {
		defer r.waiters.Done()
		select {
		case <-ready:
			r.system.Root.Send(pid, pollMsg{})
		case <-r.done:
		}
	}()
}

// closeOperators closes every operator that was built, tail first, then
// the state backends.
func (r *Runner) closeOperators() error {
	var errs []error
	defer func() {
		for _, t := range r.tasks {
			for _, c := range t.closers {
				if err := c(); err != nil {
					r.log.Warn("close state backend", "err", err)
				}
			}
			t.closers = nil
		}
	}()
	for _, t := range r.tasks {
		for i := len(t.ops) - 1; i >= 0; i-- {
			if t.ops[i] == nil {
				continue
			}
			if err := t.ops[i].Close(); err != nil {
				v := t.chain.Vertices[i]
				errs = append(errs, fmt.Errorf("close operator %q subtask %d: %w", v.Name, t.subtask, err))
			}
		}
	}
	return errors.Join(errs...)
}

// build creates the tasks, the channels between them and the operator
// instances, and opens the operators.
func (r *Runner) build() error {
	byChain := make(map[*Chain][]*task)
	for _, c := range r.plan.Chains {
		for i := range c.Head().Parallelism {
			t := &task{run: r, chain: c, subtask: i}
			t.stats.Chain, t.stats.Subtask = c.Name(), i
			t.live.watermark.Store(math.MinInt64)
			byChain[c] = append(byChain[c], t)
			r.tasks = append(r.tasks, t)
		}
	}
	tailOf := make(map[*Vertex]*Chain)
	for _, c := range r.plan.Chains {
		tailOf[c.Tail()] = c
	}
	// outChans[task][edge] lists the channels of one outgoing edge by
	// target subtask.
	outChans := make(map[*task]map[*Edge][]*channel)
	for _, c := range r.plan.Chains {
		for _, e := range c.In {
			senders := byChain[tailOf[e.From]]
			wire := r.cfg.SerializeKeyBy && e.Partition == KeyBy
			for j, recv := range byChain[c] {
				for i, send := range senders {
					if e.Partition == Forward && i != j {
						continue
					}
					ch := newChannel(len(recv.inChans), recv, make([]any, 0, r.cfg.Credits))
					ch.gate = e.Input
					for range r.cfg.Credits {
						ch.free = append(ch.free, e.Type().newBuffer(ch, r.cfg.BatchSize, wire))
					}
					recv.inChans = append(recv.inChans, ch)
					if outChans[send] == nil {
						outChans[send] = make(map[*Edge][]*channel)
					}
					outChans[send][e] = append(outChans[send][e], ch)
					send.outChans = append(send.outChans, ch)
					r.chans = append(r.chans, ch)
				}
			}
		}
	}
	for _, t := range r.tasks {
		if err := r.buildTask(t, outChans[t]); err != nil {
			return err
		}
	}
	return nil
}

func (r *Runner) buildTask(t *task, out map[*Edge][]*channel) error {
	c := t.chain
	n := len(c.Vertices)
	t.ops = make([]operators.Operator, n)
	t.ctxs = make([]*operators.Context, n)
	t.time.Timestamp = operators.NoTimestamp
	if len(t.inChans) > 0 {
		t.merger = watermark.NewMerger(len(t.inChans))
		t.aligner = NewAligner(len(t.inChans), r.cfg.Checkpoint.Mode != snapshot.AtLeastOnce)
	}

	// The tail's outputs: one router per outgoing edge, the main ones
	// fanned out together and the side outputs by tag.
	tail := c.Tail()
	var mains []any
	sides := make(map[string][]any)
	for _, e := range c.Out {
		rt := e.Type().newRouter(t, e, out[e])
		t.routers = append(t.routers, rt)
		if e.Output == "" {
			mains = append(mains, rt)
		} else {
			sides[e.Output] = append(sides[e.Output], rt)
		}
	}
	var next any
	if tail.Out != nil {
		next = joinOutputs(tail.Out, mains)
	}
	sideOut := make(map[string]any, len(sides))
	for tag, rs := range sides {
		sideOut[tag] = joinOutputs(tail.SideOutputs[tag], rs)
	}

	// Operators from tail to head, each wired to the next one's input.
	for i := n - 1; i >= 0; i-- {
		v := c.Vertices[i]
		ctx, err := r.newContext(t, i)
		if err != nil {
			return r.buildError(v, t.subtask, fmt.Errorf("state backend: %w", err))
		}
		if i == n-1 {
			ctx.SideOutput = func(tag string) any { return sideOut[tag] }
		}
		t.ctxs[i] = ctx
		if v.IsSource() {
			src, err := v.NewSource(ctx)
			if err != nil {
				return r.buildError(v, t.subtask, err)
			}
			t.ops[i] = src
			if t.source, err = v.Out.newSourceDriver(src, next); err != nil {
				return r.buildError(v, t.subtask, err)
			}
			continue
		}
		op, in, err := v.NewOperator(ctx, next)
		if err != nil {
			return r.buildError(v, t.subtask, err)
		}
		t.ops[i] = op
		if i > 0 {
			// Records reaching a sink at the chain's end are the
			// chain's output.
			next = v.In.newTracker(t, i, in, i == n-1 && v.Out == nil)
		} else {
			next = in
		}
	}
	if head := c.Head(); !head.IsSource() {
		t.inputs = make([]input, len(t.inChans))
		for k, ch := range t.inChans {
			typ, in := head.In, next
			if head.In2 != nil {
				ins, ok := next.([2]any)
				if !ok {
					return r.buildError(head, t.subtask, fmt.Errorf("%w: two-input operator returned %T, want [2]any", ErrInvalidJob, next))
				}
				in = ins[ch.gate]
				if ch.gate == 1 {
					typ = head.In2
				}
			}
			input, err := typ.newInput(in, &t.time)
			if err != nil {
				return r.buildError(head, t.subtask, err)
			}
			t.inputs[k] = input
		}
	}
	// Restore keyed and operator state before Open, raw state after.
	raws := make([][][]byte, n)
	oldPs := make([]int, n)
	if md := r.cfg.Restore; md != nil {
		for i, v := range c.Vertices {
			var err error
			if raws[i], oldPs[i], err = r.restoreOperator(md, v, t.subtask, t.ctxs[i]); err != nil {
				return r.buildError(v, t.subtask, fmt.Errorf("restore from %s: %w", md.Dir, err))
			}
		}
		if err := r.restoreTime(md, t); err != nil {
			return r.buildError(c.Head(), t.subtask, fmt.Errorf("restore event time from %s: %w", md.Dir, err))
		}
	}
	for i := n - 1; i >= 0; i-- {
		if err := t.ops[i].Open(t.ctxs[i]); err != nil {
			return r.buildError(c.Vertices[i], t.subtask, fmt.Errorf("open: %w", err))
		}
	}
	for i, op := range t.ops {
		if raws[i] == nil {
			continue
		}
		if rs, ok := op.(operators.Restorer); ok {
			if err := rs.RestoreState(raws[i], oldPs[i]); err != nil {
				return r.buildError(c.Vertices[i], t.subtask, fmt.Errorf("restore: %w", err))
			}
		}
	}
	return nil
}

// joinOutputs returns the collector feeding every output in outs: the one
// output itself, a fan-out, or a discarding collector when there is none.
func joinOutputs(typ ElemType, outs []any) any {
	if len(outs) == 1 {
		return outs[0]
	}
	return typ.newFanout(outs)
}

func (r *Runner) buildError(v *Vertex, subtask int, err error) error {
	return &TaskError{Job: r.job.Name, Operator: v.Name, UID: v.UID, Subtask: subtask, Parallelism: v.Parallelism, Err: err}
}

func (r *Runner) newContext(t *task, i int) (*operators.Context, error) {
	v, subtask := t.chain.Vertices[i], t.subtask
	kg := keygroup.RangeFor(subtask, v.Parallelism, r.maxP)
	ctx := &operators.Context{
		Job:            r.job.Name,
		Operator:       v.Name,
		UID:            v.UID,
		Subtask:        subtask,
		Parallelism:    v.Parallelism,
		MaxParallelism: r.maxP,
		KeyGroups:      kg,
		Logger:         r.log.With("operator", v.Name, "subtask", subtask),
		Clock:          r.cfg.Clock,
		Time:           &t.time,
		OperatorState:  state.NewOperatorStore(),
		ProcessingTime: procService{t: t, op: i},
		EmitWatermark:  func(wm int64) { t.watermark(i+1, wm) },
		EmitIdle:       func(idle bool) { t.status(idle) },
	}
	// With checkpoints, the final checkpoint commits the sinks' last
	// records, not Finish.
	ctx.FinalCheckpoint = r.cfg.Checkpoint.Dir != ""
	if v.Keyed {
		switch r.cfg.StateBackend.Kind {
		case BoltBackend:
			dir := filepath.Join(r.cfg.StateBackend.Dir, r.job.Name)
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return nil, err
			}
			path := filepath.Join(dir, fmt.Sprintf("%s.%d.db", v.UID, subtask))
			b, err := state.NewBoltBackend(path, kg, r.cfg.Clock, r.cfg.StateBackend.Bolt)
			if err != nil {
				return nil, err
			}
			t.closers = append(t.closers, b.Close)
			ctx.State = b
		default:
			ctx.State = state.NewMemoryBackend(kg, r.cfg.Clock)
		}
	}
	return ctx, nil
}

// Stats returns what every task did. Call it after Run has returned.
func (r *Runner) Stats() Stats {
	var s Stats
	for _, t := range r.tasks {
		st := t.stats
		st.BatchesIn, st.RecordsIn, st.BatchesOut = t.live.batchesIn.Load(), t.live.recordsIn.Load(), t.live.batchesOut.Load()
		st.Watermark, st.RecordsOut = t.live.watermark.Load(), t.live.recordsOut.Load()
		s.Tasks = append(s.Tasks, st)
	}
	for _, ch := range r.chans {
		s.Channels = append(s.Channels, ChannelStats{
			To:          ch.to.stats.Chain,
			ToSubtask:   ch.to.subtask,
			Batches:     ch.sent.Load(),
			MaxInFlight: ch.maxInFlight.Load(),
			Credits:     ch.credits,
		})
	}
	return s
}

// TaskMetrics are the live counters of one task (a chain's subtask).
type TaskMetrics struct {
	Chain     string
	Subtask   int
	Operators []string
	// Parallelism of the chain.
	Parallelism int
	RecordsIn   int64
	// RecordsOut counts the records the chain emitted: those it sent to
	// other tasks (a broadcast record once per target) and, for a chain
	// ending in a sink, those its last operator before the sink passed to
	// the sink.
	RecordsOut int64
	BatchesIn  int64
	BatchesOut int64
	// Watermark is the last watermark the task sent on (MinInt64 before
	// the first).
	Watermark int64
	// Backpressure is how long the task waited for credit to send.
	Backpressure time.Duration
	// Queued is the number of messages in its mailbox.
	Queued int64
}

// Metrics returns the live counters of every task; nil before the job is
// built. Safe to call from any goroutine while the job runs.
func (r *Runner) Metrics() []TaskMetrics {
	select {
	case <-r.started:
	default:
		return nil
	}
	out := make([]TaskMetrics, 0, len(r.tasks))
	for _, t := range r.tasks {
		m := TaskMetrics{
			Chain:       t.stats.Chain,
			Subtask:     t.subtask,
			Parallelism: t.chain.Head().Parallelism,
			RecordsIn:   t.live.recordsIn.Load(),
			RecordsOut:  t.live.recordsOut.Load(),
			BatchesIn:   t.live.batchesIn.Load(),
			BatchesOut:  t.live.batchesOut.Load(),
			Watermark:   t.live.watermark.Load(),
			Queued:      t.pending.Load(),
		}
		for _, v := range t.chain.Vertices {
			m.Operators = append(m.Operators, v.Name)
		}
		out = append(out, m)
	}
	for i, t := range r.tasks {
		var blocked int64
		for _, ch := range t.outChans {
			blocked += ch.blocked.Load()
		}
		out[i].Backpressure = time.Duration(blocked)
	}
	return out
}

// Stats are the counters of a finished job.
type Stats struct {
	Tasks    []TaskStats
	Channels []ChannelStats
}

// ChannelStats counts what one channel carried.
type ChannelStats struct {
	To          string
	ToSubtask   int
	Batches     int64
	MaxInFlight int64
	Credits     int
}

// checkRestore matches a snapshot to the job: the same number of key
// groups, and every operator with state in the snapshot still in the job
// unless allowNonRestored.
func checkRestore(job *Job, md *snapshot.Metadata, allowNonRestored bool) error {
	if md.MaxParallelism != job.maxParallelism() {
		return fmt.Errorf("actors: restore from %s: it has %d key groups, the job %d: max parallelism is fixed for the life of a job's state", md.Dir, md.MaxParallelism, job.maxParallelism())
	}
	uids := make(map[string]bool, len(job.Vertices))
	for _, v := range job.Vertices {
		uids[v.UID] = true
	}
	var missing []string
	for _, op := range md.Operators {
		if !uids[op.UID] && hasStateFile(op) {
			missing = append(missing, op.UID)
		}
	}
	if len(missing) > 0 && !allowNonRestored {
		return fmt.Errorf("actors: restore from %s: the job has no operator with uid %q; allow non-restored state to skip it", md.Dir, missing)
	}
	return nil
}
