package stream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/keygroup"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/snapshot"
)

// Environment builds one job and runs it.
type Environment struct {
	name        string
	parallelism int
	cfg         actors.Config
	job         actors.Job
	errs        []error
	names       map[string]int
	nodes       map[*actors.Vertex]*node
	autoEdges   map[*actors.Edge]bool
	// last is the runner of the latest Execute, for Stats.
	last    *actors.Runner
	restart snapshot.RestartStrategy
	// atMostOnce lets a checkpointed job read sources that cannot replay.
	atMostOnce bool
	// running is set from Execute or ExecuteAsync until the job ends.
	running atomic.Bool
}

// Option configures an Environment.
type Option func(*Environment)

// WithParallelism sets the default parallelism of operators (default 1).
func WithParallelism(n int) Option { return func(e *Environment) { e.parallelism = n } }

// WithMaxParallelism sets the number of key groups (default 128); it is
// fixed for the life of a job's state. n must be in [1,32768]
// (keygroup.MaxMaxParallelism): Plan and Execute refuse any other value,
// 0 included.
func WithMaxParallelism(n int) Option { return func(e *Environment) { e.job.MaxParallelism = n } }

// WithBatchSize sets the number of records per batch (default 512).
func WithBatchSize(n int) Option { return func(e *Environment) { e.cfg.BatchSize = n } }

// WithWireBatchSize sets the number of records per batch on an edge that
// crosses nodes (default 4 × the batch size).
func WithWireBatchSize(n int) Option { return func(e *Environment) { e.cfg.WireBatchSize = n } }

// WithLinger sets how long a partly filled batch may wait (default 5ms).
func WithLinger(d time.Duration) Option { return func(e *Environment) { e.cfg.Linger = d } }

// WithCredits sets the batches in flight per channel (default 16).
func WithCredits(n int) Option { return func(e *Environment) { e.cfg.Credits = n } }

// WithSerializedKeyBy sends every key-by edge through encode and decode, as
// channels between devices do; results must not change.
func WithSerializedKeyBy(on bool) Option { return func(e *Environment) { e.cfg.SerializeKeyBy = on } }

// WithLogger sets the logger (default: discard).
func WithLogger(l *slog.Logger) Option { return func(e *Environment) { e.cfg.Logger = l } }

// WithClock sets the processing-time clock (default: the real clock). The
// runtime's own timing runs on it too: the checkpoint interval, pause and
// timeout, the restart strategy's delays and failure-rate interval, and
// state TTL. With a fake clock, a restart with a Delay waits until the
// clock is advanced past it.
func WithClock(c clockwork.Clock) Option { return func(e *Environment) { e.cfg.Clock = c } }

// AllowAtMostOnceSources lets a job with checkpoints read sources that
// cannot be rewound (operators.Replayer, such as the socket source). Such a
// job is at-most-once for those sources' records: after a restart they
// continue with what comes next, and what they had read since the
// restored checkpoint is lost. It also lets it read a source that records
// no position (none of operators.Replayer, operators.Snapshotter and
// operators.Restorer), which a restart reads from its beginning again. Without this option Execute refuses the
// job with ErrNotReplayable; with it, Execute logs a warning naming each
// such source when the job starts.
func AllowAtMostOnceSources() Option { return func(e *Environment) { e.atMostOnce = true } }

// NewEnvironment returns an empty environment for the job called name.
func NewEnvironment(name string, opts ...Option) *Environment {
	e := &Environment{
		name:        name,
		parallelism: 1,
		cfg:         actors.DefaultConfig(),
		job:         actors.Job{Name: name, MaxParallelism: keygroup.DefaultMaxParallelism},
		names:       make(map[string]int),
		nodes:       make(map[*actors.Vertex]*node),
		autoEdges:   make(map[*actors.Edge]bool),
	}
	for _, o := range opts {
		o(e)
	}
	return e
}

// MaxParallelism returns the job's number of key groups.
func (e *Environment) MaxParallelism() int {
	e.mustEnv("MaxParallelism")
	return e.job.MaxParallelism
}

// addVertex appends v with a fresh id, the default parallelism and a uid
// derived from its name when none is set later.
func (e *Environment) addVertex(v *actors.Vertex) *actors.Vertex {
	v.ID = len(e.job.Vertices)
	if v.Parallelism == 0 {
		v.Parallelism = e.parallelism
	}
	e.names[v.Name]++
	if n := e.names[v.Name]; n > 1 {
		v.UID = fmt.Sprintf("%s-%d", v.Name, n)
	} else {
		v.UID = v.Name
	}
	e.job.Vertices = append(e.job.Vertices, v)
	return v
}

func (e *Environment) addError(err error) { e.errs = append(e.errs, err) }

// hasSink reports whether the job has an operator added by To or ForEach.
func (e *Environment) hasSink() bool {
	for _, v := range e.job.Vertices {
		if n := e.nodes[v]; n != nil && n.sink {
			return true
		}
	}
	return false
}

// emptyUID refuses the job because UID("") was called on operator name.
func (e *Environment) emptyUID(name string) {
	e.addError(fmt.Errorf("stream: operator %q: UID(\"\") is empty: give it a stable, non-empty uid", name))
}

func (e *Environment) node(v *actors.Vertex) *node {
	n := e.nodes[v]
	if n == nil {
		n = &node{}
		e.nodes[v] = n
	}
	return n
}

// resolve fixes what depends on settings made after an operator was added:
// automatic edges become forward when the parallelisms match and rebalance
// when not; stateful operators must have a uid.
func (e *Environment) resolve() error {
	errs := append([]error(nil), e.errs...)
	for _, v := range e.job.Vertices { // in creation order: inputs first
		if n := e.nodes[v]; n != nil && n.inherit && !n.parallelismSet {
			for _, ed := range e.job.Edges {
				if ed.To == v {
					v.Parallelism = ed.From.Parallelism
				}
			}
		}
	}
	for _, ed := range e.job.Edges {
		if !e.autoEdges[ed] {
			continue
		}
		if ed.From.Parallelism == ed.To.Parallelism {
			ed.Partition = actors.Forward
		} else {
			ed.Partition = actors.Rebalance
		}
	}
	if err := keygroup.Validate(1, e.job.MaxParallelism); err != nil {
		errs = append(errs, fmt.Errorf("stream: WithMaxParallelism: %w", err))
	}
	for i, v := range e.job.Vertices {
		if v.Name != "" {
			continue
		}
		after := ""
		if i > 0 {
			after = fmt.Sprintf(" (after %q)", e.job.Vertices[i-1].Name)
		}
		errs = append(errs, fmt.Errorf("stream: operator %d%s has an empty name: give every operator one (the name argument of FromSource, Map, To, ...)", i, after))
	}
	for _, v := range e.job.Vertices {
		if n := e.nodes[v]; n != nil && n.stateful && !n.uidSet {
			errs = append(errs, fmt.Errorf("stream: operator %q keeps state and needs a stable uid: call UID(...) on it", v.Name))
		}
	}
	if len(e.job.Vertices) > 0 && !e.hasSink() {
		errs = append(errs, fmt.Errorf("stream: job %q has no sink: its results would go nowhere; end it with To or ForEach", e.job.Name))
	}
	errs = append(errs, e.checkRepeatedNames()...)
	errs = append(errs, e.checkReplay())
	return errors.Join(errs...)
}

// checkRepeatedNames refuses, in a job with checkpoints or started from
// a savepoint, an operator that may keep state (a source, a sink given
// to To, a timestamp assigner, an operator of Transform or Process) whose
// name another operator has too and which has no UID of its own. Its uid
// is then derived from its name and the order the operators were created
// in (name, name-2, ...), so a job that creates them in another order, or
// one fewer, would restore one operator's state (a source's position, a
// sink's transactions) into another and lose or repeat records without
// an error.
func (e *Environment) checkRepeatedNames() []error {
	if e.cfg.Checkpoint.Dir == "" && e.cfg.Restore == nil {
		return nil
	}
	var errs []error
	for _, v := range e.job.Vertices {
		n := e.nodes[v]
		if e.names[v.Name] < 2 || (n != nil && (n.uidSet || n.stateless)) {
			continue
		}
		errs = append(errs, fmt.Errorf("stream: operator %q (uid %q): %d operators are named %q; with checkpoints state is matched by uid, "+
			"and a uid derived from a repeated name depends on the order the operators are created in: call UID(...) on it",
			v.Name, v.UID, e.names[v.Name], v.Name))
	}
	return errs
}

// checkReplay refuses, in a job with checkpoints, a source that cannot be
// rewound (its Replayable is false) or that keeps no position (it
// implements neither operators.Replayer nor operators.Snapshotter nor
// operators.Restorer), unless AllowAtMostOnceSources; then it logs a
// warning for each.
// It asks one instance of each source (never opened; constructors start
// nothing).
func (e *Environment) checkReplay() error {
	if e.cfg.Checkpoint.Dir == "" {
		return nil
	}
	var errs []error
	for _, v := range e.job.Vertices {
		if !v.IsSource() {
			continue
		}
		op, err := probeSource(v, &operators.Context{Job: e.name, Operator: v.Name, UID: v.UID, Parallelism: v.Parallelism,
			MaxParallelism: e.job.MaxParallelism, Logger: slog.New(slog.DiscardHandler)})
		if err != nil || op == nil {
			continue // the runner reports it (a panic or nil as a task failure)
		}
		r, says := op.(operators.Replayer)
		if says && r.Replayable() {
			continue
		}
		if !says && keepsPosition(op) {
			continue
		}
		if e.atMostOnce {
			e.cfg.Logger.Warn("source cannot replay: the job is at-most-once for its records (AllowAtMostOnceSources)",
				"job", e.name, "operator", v.Name)
			continue
		}
		if says {
			errs = append(errs, fmt.Errorf("%w: job %q has checkpoints (exactly-once or at-least-once), but its source %q cannot be rewound: "+
				"records it read after the latest checkpoint would be lost on a restart; use a replayable source, or stream.AllowAtMostOnceSources() to run it at-most-once",
				ErrNotReplayable, e.name, v.Name))
			continue
		}
		errs = append(errs, fmt.Errorf("%w: job %q has checkpoints (exactly-once or at-least-once), but its source %q (%T) keeps no position: "+
			"it implements neither operators.Snapshotter nor operators.Replayer, so after a restart it would start again from its beginning "+
			"and the records it read before the restored checkpoint would be repeated; record its position with SnapshotState and RestoreState, "+
			"implement Replayable() bool to say it replays by other means (true) or cannot (false), or use stream.AllowAtMostOnceSources() to run it anyway",
			ErrNotReplayable, e.name, v.Name, op))
	}
	return errors.Join(errs...)
}

// keepsPosition reports whether source op records state of its own that a
// restore gives back (its position): a source that does not is built
// afresh by a restart and reads from its beginning again.
func keepsPosition(op operators.Operator) bool {
	_, snap := op.(operators.Snapshotter)
	_, restore := op.(operators.Restorer)
	return snap || restore
}

// probeSource builds one instance of source v; a panic in the user's
// factory is returned as an error.
func probeSource(v *actors.Vertex, ctx *operators.Context) (op operators.Operator, err error) {
	defer func() {
		if r := recover(); r != nil {
			op, err = nil, fmt.Errorf("stream: source %q: panic: %v", v.Name, r)
		}
	}()
	return v.NewSource(ctx)
}

// Plan validates the graph and returns its execution plan without running
// it.
func (e *Environment) Plan() (*actors.Plan, error) {
	if err := e.errNil("Plan"); err != nil {
		return nil, err
	}
	r, err := e.runner()
	if err != nil {
		return nil, err
	}
	return r.Plan(), nil
}

// Graph validates the graph and returns the job graph, as a node in
// another process builds it for a job master's deployment
// (actors.WorkerConfig.Jobs).
func (e *Environment) Graph() (*actors.Job, error) {
	if err := e.errNil("Graph"); err != nil {
		return nil, err
	}
	if err := e.resolve(); err != nil {
		return nil, err
	}
	return &e.job, nil
}

// WithSettingsDigest sets the job's settings digest (actors.Job.Settings):
// a digest of the operator settings the graph does not show, which the
// plan fingerprint then covers, so that a node of a cluster that builds
// the job with other settings is refused (actors.ErrPlanMismatch). It
// must not depend on the node: leave node-local settings (directories,
// addresses) out of it. A job built without it is compared by its
// graph alone.
func WithSettingsDigest(d string) Option { return func(e *Environment) { e.job.Settings = d } }

// WithCluster runs the job's tasks on the nodes of c, placed by
// c.Placement (which may be filled in after the environment is built).
func WithCluster(c *actors.Cluster) Option { return func(e *Environment) { e.cfg.Cluster = c } }

// Config returns the runtime config the environment's options made.
func (e *Environment) Config() actors.Config {
	e.mustEnv("Config")
	return e.cfg
}

func (e *Environment) runner() (*actors.Runner, error) {
	if err := e.resolve(); err != nil {
		return nil, err
	}
	return actors.NewRunner(&e.job, e.cfg)
}

// Execute runs the job until its bounded sources end (nil), a task fails
// and the restart strategy gives up (the failure), the job is stopped with
// a savepoint (nil), or ctx is cancelled (ctx's error). While a job e
// started runs, it returns ErrAlreadyRunning.
func (e *Environment) Execute(ctx context.Context) error {
	if err := e.errNil("Execute"); err != nil {
		return err
	}
	if !e.running.CompareAndSwap(false, true) {
		return ErrAlreadyRunning
	}
	if e.restart == nil && e.cfg.Checkpoint.Dir == "" {
		defer e.running.Store(false)
		r, err := e.runner()
		if err != nil {
			return err
		}
		e.last = r
		return r.Run(ctx)
	}
	j, err := e.executeAsync(ctx)
	if err != nil {
		return err
	}
	return j.Wait()
}

// Stats returns the counters of the latest Execute, after it returned.
func (e *Environment) Stats() actors.Stats {
	e.mustEnv("Stats")
	if e.last == nil {
		return actors.Stats{}
	}
	return e.last.Stats()
}
