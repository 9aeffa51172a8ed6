package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/cluster"
	"github.com/edgedio/edged/keygroup"
	"github.com/edgedio/edged/pipeline"
	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/stream"
)

// DefaultListen is the REST API address when Options.Listen is empty.
const DefaultListen = "127.0.0.1:8081"

// DefaultIdleTimeout is how long the REST API keeps an idle keep-alive
// connection (Options.IdleTimeout): a client that opens connections and
// never closes them (a poller that makes a new HTTP client each time)
// would otherwise hold a goroutine, its buffers and a file descriptor of
// the node's for each, until the process runs out of descriptors for its
// ingest logs, snapshots and devices.
const DefaultIdleTimeout = 2 * time.Minute

// Options configures Run. The zero value is usable.
type Options struct {
	// Listen is the REST API's TCP address; default DefaultListen. Use
	// "127.0.0.1:0" for a free port (Ready reports it).
	Listen string
	// Stdout receives the lines of every pipeline's stdout sinks; default
	// io.Discard. Run serialises its writes.
	Stdout io.Writer
	// Logger receives the node's and the runtime's logs; default discards.
	Logger *slog.Logger
	// Savepoint, when set, starts the pipeline it was taken of (the job
	// its metadata names; with a single pipeline, that one whatever its
	// name) from this savepoint (or retained checkpoint) directory
	// (stream.WithSavepoint); the other pipelines resume from their own
	// snapshots as on a restart. Run refuses a savepoint of no pipeline of
	// a config of several.
	Savepoint string
	// AllowNonRestored skips savepoint state of operators a job no longer
	// has instead of failing.
	AllowNonRestored bool
	// StopTimeout bounds a stop-with-savepoint, on shutdown and from the
	// API, before the job is cancelled instead; default 1m.
	StopTimeout time.Duration
	// PollInterval is how often a running job's checkpoint history is read
	// into the node's (for metrics and for jobs that have ended); default 1s.
	PollInterval time.Duration
	// Token is the bearer token the API and the dashboard require when
	// Listen is not a loopback address (node.token); when empty there, one
	// is generated and logged at start.
	Token string
	// RequireToken requires the token even on a loopback address.
	RequireToken bool
	// Cluster, when set, is the cluster the node's GET /cluster, drain,
	// rebalance, cluster metrics and dashboard view show and steer; nil on
	// a node without one (GET /cluster answers {"enabled":false}).
	Cluster cluster.StatusProvider
	// IdleTimeout is how long the REST API keeps a keep-alive connection
	// that waits for its next request before closing it; default
	// DefaultIdleTimeout.
	IdleTimeout time.Duration
	// Ready, if set, is called with the API's address once it listens and
	// the jobs have started; on Run's goroutine, so it must not block.
	Ready func(addr net.Addr)
}

func (o Options) withDefaults() Options {
	if o.Listen == "" {
		o.Listen = DefaultListen
	}
	if o.Stdout == nil {
		o.Stdout = io.Discard
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.StopTimeout <= 0 {
		o.StopTimeout = time.Minute
	}
	if o.PollInterval <= 0 {
		o.PollInterval = time.Second
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = DefaultIdleTimeout
	}
	return o
}

// node is a running Run: its jobs, in config order.
type node struct {
	opts Options
	// savepointFor is the pipeline opts.Savepoint starts ("" without one).
	savepointFor string
	log          *slog.Logger
	out          io.Writer // opts.Stdout, serialised
	// jobsMu guards jobs and byName: a node of a cluster that takes over
	// as the job masters' node adds its jobs while the API serves.
	jobsMu sync.RWMutex
	jobs   []*job
	byName map[string]*job
	// starting are the names of the jobs being started, from just before
	// their job master starts to their record in jobs and byName (guarded
	// by jobsMu): each channel is closed once the job is recorded or its
	// start failed. A lookup by name waits for it (see job): the job
	// master invites its workers at once, and they fetch state files from
	// it through the API.
	starting map[string]chan struct{}
	// lingering are jobs a yielding leader cancelled that had not ended
	// (guarded by jobsMu; cluster_handback.go).
	lingering []*job
	// ctx is Run's context; late tracks the watchers of jobs started
	// after Run began serving (a takeover).
	ctx    context.Context
	late   sync.WaitGroup
	inputs pipeline.Inputs // the MQTT side, for the pipelines
	// deadCounts are the dead letters of the subtasks the node's worker
	// hosts and the workers' counts the job masters' node last read.
	deadCounts deadLetterCounts
	mem        pipeline.MemoryConfig // node.memory, defaults filled in
	mqtt       *mqttNode
	// cluster is the node's part in a cluster; nil on a single node.
	cluster *clusterNode
	// startHook, when set, is called between the start of a job's master
	// and the job's record, on the starting goroutine: tests hold a start
	// there.
	startHook func(name string)
	// graphHook, when set, is called with the graph of every job the
	// node builds, its job masters' and its worker's, before the job
	// runs: tests wrap an operator of it there.
	graphHook func(*actors.Job)
	// startWaits counts the lookups by name that waited for a job being
	// started.
	startWaits atomic.Int64

	provider clusterSlot // the cluster's provider (cluster_api.go)

	errMu    sync.Mutex // guards firstErr
	firstErr error
}

// jobList returns the node's jobs, in the order they started.
func (n *node) jobList() []*job {
	n.jobsMu.RLock()
	defer n.jobsMu.RUnlock()
	return slices.Clone(n.jobs)
}

// addJob records a started job.
func (n *node) addJob(j *job) {
	n.jobsMu.Lock()
	defer n.jobsMu.Unlock()
	n.jobs = append(n.jobs, j)
	n.byName[j.name] = j
}

// startWait bounds how long a lookup by name waits for a job being
// started (its record follows the start of its master at once; only a
// hung start makes a lookup wait so long).
const startWait = 10 * time.Second

// beginStart marks job name as being started and returns the function
// that ends the mark: with the job, once its master runs, it records the
// job (and the master's execution, in a cluster); with nil, after a start
// that failed, it records nothing. Either way the lookups waiting for the
// job go on.
func (n *node) beginStart(name string) func(*job) {
	started := make(chan struct{})
	n.jobsMu.Lock()
	if n.starting == nil {
		n.starting = map[string]chan struct{}{}
	}
	n.starting[name] = started
	n.jobsMu.Unlock()
	return func(j *job) {
		if j != nil {
			if n.cluster != nil {
				n.cluster.addExecution(j.run.Execution())
			}
			n.addJob(j)
		}
		n.jobsMu.Lock()
		if n.starting[name] == started {
			delete(n.starting, name)
		}
		n.jobsMu.Unlock()
		close(started)
	}
}

// job returns the job named name. A job being started is waited for
// (bounded by ctx and startWait): the workers its master invites ask for
// it at once.
func (n *node) job(ctx context.Context, name string) (*job, error) {
	n.jobsMu.RLock()
	started, starting := n.starting[name]
	n.jobsMu.RUnlock()
	if starting {
		n.startWaits.Add(1)
		t := time.NewTimer(startWait)
		defer t.Stop()
		select {
		case <-started:
		case <-ctx.Done():
			return nil, fmt.Errorf("%w %q: %w", ErrStarting, name, context.Cause(ctx))
		case <-t.C:
			return nil, fmt.Errorf("%w %q: not started after %s", ErrStarting, name, startWait)
		}
	}
	n.jobsMu.RLock()
	j, ok := n.byName[name]
	n.jobsMu.RUnlock()
	if !ok {
		if c := n.cluster; c != nil && !c.isMaster() {
			master := c.leader()
			peer, _ := c.cfg.Peer(master)
			return nil, fmt.Errorf("%w %q on node %q: in a cluster the job runs on node %q (api %s)", ErrUnknownJob, name, c.cfg.Node, master, peer.API)
		}
		return nil, fmt.Errorf("%w %q", ErrUnknownJob, name)
	}
	return j, nil
}

func (n *node) setErr(err error) {
	n.errMu.Lock()
	defer n.errMu.Unlock()
	if n.firstErr == nil {
		n.firstErr = err
	}
}

// Run starts every pipeline of cfg as a job and serves the REST API on
// opts.Listen. It returns once every job has ended: by itself (a bounded
// source), stopped or cancelled through the API, or stopped because ctx was
// cancelled: then each job with checkpointing is stopped with a savepoint
// (its path is logged) and each other job is cancelled; a worker of a
// cluster first asks the job masters to drain it (they move its subtasks
// away when the others keep a majority and the capacity). It returns the
// first job error, or an error if a job could not be built or started or
// the API could not listen.
func Run(ctx context.Context, cfg *pipeline.Config, opts Options) error {
	opts = opts.withDefaults()
	if cfg == nil || len(cfg.Pipelines) == 0 {
		return ErrNoPipelines
	}
	savepointFor, err := savepointPipeline(cfg, opts.Savepoint, opts.Cluster == nil && cfg.Cluster == nil)
	if err != nil {
		return err
	}
	n := &node{opts: opts, savepointFor: savepointFor, log: opts.Logger, out: &lockedWriter{w: opts.Stdout}, byName: map[string]*job{},
		mem: cfg.Node.Memory.WithDefaults(), ctx: ctx}
	n.setCluster(opts.Cluster)
	dataDir := cfg.Node.DataDir
	if dataDir == "" {
		dataDir = DefaultDataDir
	}
	if file := fileInTheWay(dataDir); file != "" {
		return fmt.Errorf("daemon: node.data_dir: %q cannot be a directory: %s is a file: %w", dataDir, file, pipeline.ErrInvalidConfig)
	}
	warnUnowned(n.log, cfg)
	defer applyMemory(n.mem, n.log, os.Getenv)()

	ln, err := net.Listen("tcp", opts.Listen)
	if err != nil {
		return fmt.Errorf("daemon: listen: %w", err)
	}
	// The broker, ingest logs and simulator outlive the jobs.
	defer func() {
		if err := n.stopMQTT(); err != nil {
			n.log.Warn("mqtt shutdown", "err", err)
		}
	}()
	if n.inputs, err = n.startMQTT(ctx, cfg); err != nil {
		ln.Close()
		return fmt.Errorf("daemon: mqtt: %w", err)
	}
	if cfg.Cluster != nil {
		if err := n.joinCluster(cfg, ln.Addr().String()); err != nil {
			ln.Close()
			if errors.Is(err, ErrSavepointNotLeader) {
				return err // says "daemon:" already
			}
			return fmt.Errorf("daemon: %w", err)
		}
		// The worker's hosts read the ingest logs: they stop first.
		defer n.cluster.stop()
	}
	var watchers sync.WaitGroup
	if err := n.startJobs(ctx, cfg.Pipelines, &watchers); err != nil {
		// The node ends: the started pipelines run again when it
		// restarts, so no log of theirs sheds as they end.
		n.noShedding()
		for _, started := range n.jobList() {
			started.cancel()
		}
		watchers.Wait()
		ln.Close()
		return err
	}
	// Serve only now: the handlers read n.jobs without a lock.
	srv := &http.Server{Handler: newAPI(n), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: n.opts.IdleTimeout}
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			n.log.Error("api failed", "addr", ln.Addr().String(), "err", err)
		}
	})
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			srv.Close()
		}
		wg.Wait()
	}()

	n.log.Info("api listening", "addr", ln.Addr().String())
	if opts.Ready != nil {
		opts.Ready(ln.Addr())
	}

	allDone := make(chan struct{})
	go func() {
		watchers.Wait()
		if c := n.cluster; c != nil && (!c.master || c.hb != nil) {
			// A worker serves until it is stopped (with cluster.gossip so
			// does the leader: it may hand the leadership over and host
			// tasks); then it asks the job masters to drain it first,
			// while its API still serves (they tell it to leave through
			// it).
			<-ctx.Done()
			c.drainSelf(context.WithoutCancel(ctx), n.opts.StopTimeout)
		}
		close(allDone)
	}()
	select {
	case <-allDone:
	case <-ctx.Done():
		n.log.Info("shutting down", "reason", context.Cause(ctx).Error())
		// The pipelines run again when the node restarts: a full log
		// holds its devices back from now on, and they send the
		// readings again to the restarted node.
		n.noShedding()
		var stops sync.WaitGroup
		if c := n.cluster; c != nil {
			// No takeover starts jobs from now on.
			c.stopTakeover()
		}
		for _, j := range n.jobList() {
			stops.Go(func() { n.shutdown(ctx, j) })
		}
		stops.Wait()
		<-allDone
		n.late.Wait()
	}
	n.errMu.Lock()
	defer n.errMu.Unlock()
	return n.firstErr
}

// envOptions returns the options of a pipeline's environment on this
// node: the pipeline's own, the node's logger and its memory bounds.
func (n *node) envOptions(pc pipeline.PipelineConfig) ([]stream.Option, error) {
	envOpts, err := pipeline.EnvOptions(pc)
	if err != nil {
		return nil, err
	}
	return append(envOpts, stream.WithLogger(n.log),
		stream.WithBatchSize(n.mem.BatchSize), stream.WithCredits(n.mem.Credits)), nil
}

// savepointPipeline returns the name of the pipeline of cfg that the
// savepoint at path starts: the job its metadata names, or the one
// pipeline of a config of one ("" for no path). A savepoint restores into
// the job it was taken of: given to every pipeline, it failed the others
// (their operators are not in it), or with AllowNonRestored started them
// without their state. With load, the savepoint's metadata is read even
// for a config of one pipeline, so that a path that holds no savepoint
// is refused before the broker, the ingest logs or the simulator start;
// a node of a cluster leaves that to the job start, after it learnt
// whether it leads (a follower is told so, whatever the path).
func savepointPipeline(cfg *pipeline.Config, path string, load bool) (string, error) {
	if path == "" {
		return "", nil
	}
	if len(cfg.Pipelines) == 1 && !load {
		// Loaded, and its operators checked, when the job starts.
		return cfg.Pipelines[0].Name, nil
	}
	md, err := snapshot.Load(path)
	if err != nil {
		return "", fmt.Errorf("daemon: savepoint: %w", err)
	}
	if len(cfg.Pipelines) == 1 {
		// Its operators are checked when the job starts.
		return cfg.Pipelines[0].Name, nil
	}
	names := make([]string, len(cfg.Pipelines))
	for i, pc := range cfg.Pipelines {
		if pc.Name == md.Job {
			return pc.Name, nil
		}
		names[i] = pc.Name
	}
	return "", fmt.Errorf("daemon: savepoint %s is of job %q, which is none of the pipelines (%s): a savepoint starts the pipeline it was taken of", path, md.Job, strings.Join(names, ", "))
}

// start builds and starts the job of one pipeline and records it: from
// the moment its master starts, a lookup of its name waits for the record
// (see job).
func (n *node) start(ctx context.Context, pc pipeline.PipelineConfig) (*job, error) {
	if err := checkDirs(pc); err != nil {
		return nil, err
	}
	envOpts, err := n.envOptions(pc)
	if err != nil {
		return nil, err
	}
	resume, fromLatest := "", false
	if pc.Name == n.savepointFor {
		resume = n.opts.Savepoint
	}
	if resume == "" && pc.Checkpoint.Dir != "" {
		// A node that restarts (after a crash, kill -9 or a graceful stop)
		// resumes each job from its latest complete checkpoint or savepoint,
		// so nothing acknowledged is lost and nothing is emitted twice.
		md, err := actors.ResumePoint(pc.Checkpoint.Dir, pc.Name, keygroup.DefaultMaxParallelism, pc.Checkpoint.PreferCheckpointForRecovery, n.cluster == nil, n.log)
		switch {
		case err != nil:
			return nil, err
		case md == nil:
			n.warnLogReadAgain(pc)
		case md.Finished:
			// The job ran to its end before: restoring its final
			// checkpoint commits what it holds and runs nothing.
			resume = md.Dir
			n.log.Info("job already finished; it does not run again (to run it anew, remove its checkpoint directory or point checkpoint.dir elsewhere)",
				"job", pc.Name, "checkpoint_id", md.Checkpoint, "path", md.Dir)
		default:
			resume, fromLatest = md.Dir, true
			n.log.Info("resuming from the latest snapshot", "job", pc.Name, "checkpoint_id", md.Checkpoint, "path", md.Dir)
		}
	}
	if resume != "" {
		envOpts = append(envOpts, stream.WithSavepoint(resume, n.opts.AllowNonRestored))
	}
	var placed *actors.Cluster
	if n.cluster != nil {
		placed = &actors.Cluster{}
		envOpts = append(envOpts, stream.WithCluster(placed))
	}
	env := stream.NewEnvironment(pc.Name, envOpts...)
	in := n.inputs
	if n.cluster == nil {
		// A stop while the sinks' broker is away waits for it for half
		// the stop's bound, leaving the other half to the savepoint.
		in.CommitWait = n.opts.StopTimeout / 2
	}
	pj, err := pipeline.BuildJobWith(pc, env, n.out, in)
	if err != nil {
		return nil, err
	}
	if n.graphHook != nil {
		g, err := env.Graph()
		if err != nil {
			return nil, err
		}
		n.graphHook(g)
	}
	if placed != nil {
		ac, err := n.cluster.jobCluster(env)
		if err != nil {
			return nil, err
		}
		*placed = *ac
	}
	// The job's context is not ctx: on shutdown a job is stopped with a
	// savepoint first and cancelled only if that fails.
	jctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	record := n.beginStart(pc.Name)
	sj, err := env.ExecuteAsync(jctx)
	if err != nil {
		record(nil)
		cancel()
		return nil, err
	}
	if n.startHook != nil {
		n.startHook(pc.Name)
	}
	j := &job{name: pc.Name, checkpointing: pc.Checkpoint.Dir != "", checkpointDir: pc.Checkpoint.Dir,
		restoredFrom: resume, fromLatest: fromLatest, run: sj, pj: pj, cancelFn: cancel, status: StatusRunning}
	record(j)
	n.log.Info("job started", "job", j.name, "checkpointing", j.checkpointing, "restored_from", resume)
	return j, nil
}

// jobErr returns err, the failure of job name, naming the job: in front
// of it, unless err already starts with it (a task's failure,
// actors.TaskError, does).
func jobErr(name string, err error) error {
	var te *actors.TaskError
	if errors.As(err, &te) && te.Job == name && strings.HasPrefix(err.Error(), fmt.Sprintf("job %q: ", name)) {
		return err
	}
	return fmt.Errorf("job %q: %w", name, err)
}

// watch waits for j to end, polling its checkpoint history meanwhile, and
// records and logs how it ended.
func (n *node) watch(j *job) {
	t := time.NewTicker(n.opts.PollInterval)
	defer t.Stop()
	for done := false; !done; {
		select {
		case <-j.run.Done():
			done = true
		case <-t.C:
			j.observe()
		}
	}
	err := j.explainRestore(j.run.Wait())
	j.cancelFn()
	status := j.finish(err)
	switch status {
	case StatusFailed:
		n.log.Error("job failed", "job", j.name, "attempts", j.run.Attempts(), "err", err)
		n.setErr(jobErr(j.name, err))
	default:
		n.log.Info("job finished", "job", j.name, "status", string(status), "attempts", j.run.Attempts())
	}
	if n.cluster == nil {
		// In a cluster, a job that ended here may run on another
		// master, its source subtask on this node reading the log.
		n.shedStopped(j, status)
	}
}

// shutdown ends j for Run's shutdown: stop with a savepoint when it has
// checkpointing, else (or if that fails) cancel.
func (n *node) shutdown(ctx context.Context, j *job) {
	if j.snapshot().Status != StatusRunning {
		return
	}
	// A job waiting out its restart delay after a failure stops now, not
	// once it runs again (or has used up its restarts).
	j.run.StopRestarting()
	if j.checkpointing {
		j.markShutdown()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), n.opts.StopTimeout)
		defer cancel()
		path, err := n.stop(sctx, j, "")
		if err == nil {
			n.log.Info("job stopped with savepoint", "job", j.name, "savepoint", path)
			if n.cluster == nil {
				n.pruneStopSavepoints(j.name, path)
			} else {
				n.cluster.rep.ownSavepoint(sctx, j.name, path)
			}
			return
		}
		if errors.Is(err, ErrNotRunning) {
			return
		}
		n.log.Error("stop with savepoint failed; cancelling", "job", j.name, "err", err)
	}
	j.cancel()
}

// savepoint takes a savepoint of j (stop: and ends it) and returns its
// path. ctx is cut short when the job ends.
func (n *node) savepoint(ctx context.Context, j *job, path string, stop bool) (string, error) {
	if !j.checkpointing {
		return "", fmt.Errorf("%w: %q", ErrNoCheckpointing, j.name)
	}
	if j.snapshot().Status != StatusRunning {
		return "", fmt.Errorf("%w: %q", ErrNotRunning, j.name)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-j.run.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	var p string
	var err error
	began := time.Now()
	if stop {
		j.markStopping()
		p, err = j.run.StopWithSavepoint(ctx, path)
	} else {
		p, err = j.run.TriggerSavepoint(ctx, path)
	}
	j.observe()
	if err != nil {
		if j.wasCancelled() && errors.Is(err, context.Canceled) {
			// The runtime answers the savepoint as soon as the cancel
			// ends the attempt, before the job's Done: the caller asked
			// nothing wrong of the node, the job went away first.
			if done := completedStop(j.run.History(), began); stop && done != "" {
				// Cancelled while the sinks published what the stop's
				// savepoint commits (a sink waiting for its broker).
				return "", fmt.Errorf("%w: %q was cancelled after its stop savepoint %s completed, before its sinks had published what it holds: "+
					"it is not marked committed, so a job resumed from it publishes those results again", ErrNotRunning, j.name, done)
			}
			return "", fmt.Errorf("%w: %q was cancelled before the savepoint completed", ErrNotRunning, j.name)
		}
		select {
		case <-j.run.Done():
			return "", fmt.Errorf("%w: %q ended before the savepoint completed: %v", ErrNotRunning, j.name, err)
		default:
		}
		if errors.Is(err, context.DeadlineExceeded) {
			// The wait for an attempt to take it ran out: say why none
			// did, when the job is restarting after failures.
			e := j.run.Execution()
			if last, at := e.LastFailure(); last != nil && (e.Restarting() || at.After(began)) {
				return "", fmt.Errorf("savepoint of job %q: the job is restarting after failures and no attempt took the savepoint (attempts %d; the last failed at %s: %v): %w",
					j.name, j.run.Attempts(), at.UTC().Format(time.RFC3339), last, err)
			}
		}
		return "", fmt.Errorf("savepoint of job %q: %w", j.name, err)
	}
	j.setSavepoint(p)
	n.log.Info("savepoint taken", "job", j.name, "savepoint", p, "stop", stop)
	return p, nil
}

// completedStop returns the path of the newest stop-with-savepoint in
// hist that was triggered at or after began and completed, "" if none.
func completedStop(hist []snapshot.Stats, began time.Time) string {
	for i := len(hist) - 1; i >= 0; i-- {
		s := hist[i]
		if s.Stop && s.Kind == snapshot.KindSavepoint && s.Status == snapshot.Completed && !s.Triggered.Before(began) {
			return s.Path
		}
	}
	return ""
}

func (n *node) stop(ctx context.Context, j *job, path string) (string, error) {
	return n.savepoint(ctx, j, path, true)
}

// warnUnowned logs a warning for every ingest log under the data dir and
// every checkpoint directory beside the configured ones (or under
// <data_dir>/checkpoints) that no configured pipeline owns, with what it
// holds: a renamed or removed pipeline leaves them behind, and an ingest
// log's messages were acknowledged to their publishers. It deletes
// nothing.
func warnUnowned(log *slog.Logger, cfg *pipeline.Config) {
	dataDir := cfg.Node.DataDir
	if dataDir == "" {
		dataDir = DefaultDataDir
	}
	logs := map[string]bool{}
	ckps := map[string]bool{}
	roots := []string{filepath.Join(dataDir, "checkpoints")}
	for _, pc := range cfg.Pipelines {
		if pc.Source.MQTT != nil {
			logs[pc.Name] = true
		}
		if pc.Checkpoint.Dir != "" {
			d := absDir(pc.Checkpoint.Dir)
			ckps[d] = true
			roots = append(roots, filepath.Dir(d))
		}
	}
	ingestRoot := filepath.Join(dataDir, "ingest")
	entries, _ := os.ReadDir(ingestRoot) // none yet: nothing to warn about
	for _, e := range entries {
		if !e.IsDir() || logs[e.Name()] {
			continue
		}
		dir := filepath.Join(ingestRoot, e.Name())
		segs, bytes, first := ingestLogContents(dir)
		log.Warn("ingest log owned by no configured pipeline: its messages were acknowledged to their publishers and no pipeline will read them (renamed or removed pipeline?); left in place",
			"dir", dir, "segments", segs, "bytes", bytes, "first_offset", first)
	}
	seen := map[string]bool{}
	for _, root := range roots {
		root = absDir(root)
		if seen[root] {
			continue
		}
		seen[root] = true
		entries, _ := os.ReadDir(root)
		for _, e := range entries {
			dir := filepath.Join(root, e.Name())
			if !e.IsDir() || ckps[dir] || seen[dir] {
				continue
			}
			// A snapshot store has a LAYOUT file (snapshot/doc.go).
			if _, err := os.Stat(filepath.Join(dir, "LAYOUT")); err != nil {
				continue
			}
			seen[dir] = true
			cps, sps := countDirs(filepath.Join(dir, "checkpoints")), countDirs(filepath.Join(dir, "savepoints"))
			log.Warn("checkpoint dir owned by no configured pipeline: its job will not resume from it (renamed or removed pipeline?); left in place",
				"dir", dir, "checkpoints", cps, "savepoints", sps, "bytes", dirBytes(dir))
		}
	}
}

// warnLogReadAgain logs a warning when pc, an MQTT pipeline that starts
// without a snapshot, reads an ingest log that a completed checkpoint
// already read: the job reads it from its first record, so the results
// of the records up to that checkpoint's offset, committed before, are
// committed again (its checkpoint.dir was changed, or its snapshots
// removed). A node of a cluster reads its own split's log and records
// no offset there that this could trust.
func (n *node) warnLogReadAgain(pc pipeline.PipelineConfig) {
	if pc.Source.MQTT == nil || n.mqtt == nil || n.cluster != nil {
		return
	}
	l, ok := n.mqtt.logs[pc.Name]
	if !ok {
		return
	}
	first, read := l.Stats().FirstOffset, l.Checkpointed()
	if read <= first {
		return
	}
	n.log.Warn("pipeline starts without a snapshot, but a completed checkpoint already read its ingest log: the records it read are read again and their results committed again (checkpoint.dir changed, or its snapshots removed?); to resume instead, put the pipeline's checkpoints back in checkpoint.dir",
		"job", pc.Name, "checkpoint_dir", pc.Checkpoint.Dir, "first_offset", first, "checkpointed_offset", read, "records", read-first)
}

// absDir is the absolute, cleaned form of dir.
func absDir(dir string) string {
	if abs, err := filepath.Abs(dir); err == nil {
		return abs
	}
	return filepath.Clean(dir)
}

// ingestLogContents returns the segments of the ingest log in dir, their
// bytes and the offset of the first one (its name; mqtt/ingestlog/doc.go),
// without opening the log.
func ingestLogContents(dir string) (segs int, bytes int64, first uint64) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".seg")
		if !ok || e.IsDir() {
			continue
		}
		base, err := strconv.ParseUint(name, 10, 64)
		if err != nil {
			continue
		}
		if info, err := e.Info(); err == nil {
			bytes += info.Size()
		}
		if segs == 0 || base < first {
			first = base
		}
		segs++
	}
	return segs, bytes, first
}

// countDirs returns the number of directories in dir.
func countDirs(dir string) int {
	entries, _ := os.ReadDir(dir)
	n := 0
	for _, e := range entries {
		if e.IsDir() {
			n++
		}
	}
	return n
}

// dirBytes returns the bytes of the regular files under dir.
func dirBytes(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if info, err := d.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	return n
}

// lockedWriter serialises writes to w from the sinks of all pipelines.
type lockedWriter struct {
	mu sync.Mutex // guards w
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// checkDirs refuses a pipeline whose checkpoint.dir or state_dir is a
// file, or lies under one, naming the key: the store would fail to
// create it with a bare "mkdir ...: not a directory".
func checkDirs(pc pipeline.PipelineConfig) error {
	var errs []error
	for _, d := range []struct{ key, dir string }{{"checkpoint.dir", pc.Checkpoint.Dir}, {"state_dir", pc.StateDir}} {
		if d.dir == "" {
			continue
		}
		if file := fileInTheWay(d.dir); file != "" {
			errs = append(errs, fmt.Errorf("pipeline %q: %s: %q cannot be a directory: %s is a file: %w", pc.Name, d.key, d.dir, file, pipeline.ErrInvalidConfig))
		}
	}
	return errors.Join(errs...)
}

// fileInTheWay returns dir, or the directory on the way to it, that
// exists and is not a directory; "" if none is.
func fileInTheWay(dir string) string {
	for p := filepath.Clean(dir); ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		switch {
		case err == nil && !fi.IsDir():
			return p
		case err == nil || p == filepath.Dir(p):
			return ""
		}
	}
}

// startJobs starts pipelines as the node's jobs, each watched on
// watchers, unless the node is a cluster node that does not lead: the job
// master on the leader places tasks here, and the worker hosts them.
//
// A cluster node decides under startMu, on its leadership as it is then:
// its gossip runs already, and a yield to another leader (which takes
// startMu to cancel the jobs and step down) can come before this start.
// Decided on the leadership the node started with, the jobs started after
// such a yield, in a newer term than the leader the node now follows,
// whose deployments it then refused as a stale master's while the leader
// refused its own: two nodes killed at once and started again, the
// cluster ran no job until every node was restarted.
func (n *node) startJobs(ctx context.Context, pipelines []pipeline.PipelineConfig, watchers *sync.WaitGroup) error {
	if c := n.cluster; c != nil {
		c.startMu.Lock()
		defer c.startMu.Unlock()
		if c.stopping() || !c.isMaster() {
			if c.master && !c.stopping() {
				n.log.Info("cluster: this node yielded the leadership before it started its jobs; it follows the leader", "leader", c.leader())
			}
			return nil
		}
	}
	for i, pc := range pipelines {
		j, err := n.start(ctx, pc)
		if err != nil {
			return fmt.Errorf("daemon: start pipelines[%d] %q: %w", i, pc.Name, err)
		}
		watchers.Go(func() { n.watch(j) })
	}
	return nil
}
