package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/cluster"
	"github.com/edgedio/edged/pipeline"
	"github.com/edgedio/edged/snapshot"
)

// Leadership (with cluster.gossip). The job masters run on one node, the
// leader. At the cluster's first start it is the node with the lowest id
// (cluster.node order). When the leader dies (memberlist declares it
// dead), the lowest live node that sees a majority and followed it takes
// over: it stops its worker's tasks, restores every job from the newest
// snapshot its store has the metadata of (copying in the files it lacks
// from their holders), places the subtasks on the live nodes and deploys
// them in an epoch above every epoch it saw, numbering checkpoints from
// its term's base (the epoch base: start counter × 2^32), above every id
// an earlier leader triggered, whether or not a live node saw it.
//
// A node that starts asks its peers which node leads, and follows the
// leader they name; only when none names another does the lowest id
// lead. A node that comes back so never runs a job while another node is
// master; it joins as a worker and gets its subtasks back by the master's
// rebalance. Once it has been up for the settle delay and has caught up,
// the leader hands the leadership back to it (cluster_handback.go), so
// that the lowest id among the members the majority sees leads.
//
// A node takes over only from a leader it followed: whose deployment
// reached it in this run, or, for a node that took part in a deployment
// in an earlier run (the whole cluster lost power and a majority came
// back without the leader), the leader it follows once that one has
// stayed away for restartGrace while a majority was up (absence). At the
// cluster's first start the nodes wait for the lowest id.

// leaderState is what a node knows of the leader.
type leaderState struct {
	mu sync.Mutex
	// id is the node whose job masters this node follows (or itself).
	id string
	// followed is set once a deployment of that leader came here: only a
	// node that followed a leader takes over from it (at a first start,
	// the lowest node may merely not be up yet).
	followed bool
	// took is set while this node leads after taking over (from a dead
	// leader, or by a hand-back).
	took bool
	// stepped is set once this node handed the leadership over: from
	// then on only took makes it the leader, whatever it started as.
	stepped bool
	// stopped is set on shutdown: no takeover starts after it.
	stopped bool
	// quit is closed on shutdown (quitChan creates it): background
	// work of the leadership ends with it.
	quit     chan struct{}
	quitOnce sync.Once
	// nextCheckpoint is the lowest checkpoint id of the jobs this node
	// masters after a takeover.
	nextCheckpoint snapshot.ID
	// detected is when the takeover began (the leader seen dead).
	detected time.Time
	// before is set when the node took part in a deployment in an
	// earlier run (its data_dir keeps the highest epoch it saw): the
	// cluster ran before, so a leader it has not followed in this run
	// is one it may take over from once that leader stayed away
	// (absent), as after a power loss of the whole cluster.
	before bool
	// absent times the leader's absence from this run's membership
	// while a majority is up, for a node that has not followed it.
	absent absence
	// waitLogged is set once the node logged that it waits for the
	// leader to start (it never took part in a deployment).
	waitLogged bool
}

// leader returns the node whose job masters this node follows.
func (c *clusterNode) leader() string {
	c.lead.mu.Lock()
	defer c.lead.mu.Unlock()
	if c.lead.id == "" {
		return c.cfg.Master()
	}
	return c.lead.id
}

// isMaster reports whether the node runs the job masters: it started as
// the leader or took over.
func (c *clusterNode) isMaster() bool {
	c.lead.mu.Lock()
	defer c.lead.mu.Unlock()
	return c.master && !c.lead.stepped || c.lead.took
}

// followed records a deployment of the leader master.
func (c *clusterNode) followed(master string) {
	c.lead.mu.Lock()
	defer c.lead.mu.Unlock()
	if c.lead.took {
		return
	}
	c.lead.id, c.lead.followed = master, true
}

// quitChan returns the channel closed on shutdown.
func (c *clusterNode) quitChan() chan struct{} {
	c.lead.mu.Lock()
	defer c.lead.mu.Unlock()
	if c.lead.quit == nil {
		c.lead.quit = make(chan struct{})
	}
	return c.lead.quit
}

// stopTakeover makes sure no takeover starts jobs from now on; one under
// way finishes starting them first.
func (c *clusterNode) stopTakeover() {
	quit := c.quitChan()
	c.lead.mu.Lock()
	c.lead.stopped = true
	c.lead.mu.Unlock()
	c.lead.quitOnce.Do(func() { close(quit) })
	c.startMu.Lock()
	defer c.startMu.Unlock()
}

// shouldTakeOver is the takeover rule: node self, following leader (and
// having followed its deployments), takes over when the leader is not
// among the live nodes alive (in id order), those are a majority of size,
// and self is the lowest of them that does not run other pipelines than
// self (others: such a member never followed, and could not host the
// jobs).
func shouldTakeOver(self, leader string, followed bool, alive []string, others map[string]bool, size int) bool {
	if !followed || leader == self || !cluster.HasQuorum(len(alive), size) || slices.Contains(alive, leader) {
		return false
	}
	for _, id := range alive {
		if !others[id] {
			return id == self
		}
	}
	return false
}

// absence decides when a node that has not followed the leader in this
// run counts that leader as dead: once a majority of the cluster has
// been alive without it for a grace. At a first start the leader may
// merely not be up yet, so only a node that took part in a deployment
// in an earlier run applies it (leaderState.before): all the nodes lost
// power, and those that came back are a majority without the leader.
// The grace lets a leader that boots a little later than the others
// lead on. Not safe for concurrent use: the membership loop's step
// calls it under leaderState.mu; time enters as an argument.
type absence struct {
	// leader is the node whose absence is timed, since when a majority
	// was first seen without it (zero while it is seen, or while no
	// majority is).
	leader string
	since  time.Time
}

// step records that alive (in id order) are the live nodes at now, of a
// cluster of size, and reports whether leader has been absent while a
// majority was alive for at least grace, and whether its absence began
// at this step.
func (a *absence) step(now time.Time, leader string, alive []string, size int, grace time.Duration) (dead, began bool) {
	if leader != a.leader {
		a.leader, a.since = leader, time.Time{}
	}
	if slices.Contains(alive, leader) || !cluster.HasQuorum(len(alive), size) {
		a.since = time.Time{}
		return false, false
	}
	if a.since.IsZero() {
		a.since, began = now, true
	}
	return now.Sub(a.since) >= grace, began
}

// chooseLeader is the rule a starting node follows: the leader the peers
// that answered name (the lowest, should they disagree), else the lowest
// configured id.
func chooseLeader(lowest string, named []string) string {
	var out string
	for _, id := range named {
		if id != "" && (out == "" || id < out) {
			out = id
		}
	}
	if out == "" {
		return lowest
	}
	return out
}

// restartGrace returns how long a node that restarted while it led waits
// at most, asking its peers every cluster.leadership.restart_poll, for them to see it die
// and one of them to take over: about three times the failure detection
// of the membership profile (about 1 s with "device", 5–6 s with "lan").
// Its own gossip starts only after the wait, so that its peers do see its
// old run die. It is also how long a leader not seen since the cluster
// restarted must stay away before a majority takes over (absence).
func restartGrace(profile string) time.Duration {
	if cluster.Profile(profile) == cluster.ProfileLAN {
		return 15 * time.Second
	}
	return 3 * time.Second
}

// now returns the time of the leadership's clock (a fake one in the
// failover scripts).
func (c *clusterNode) now() time.Time {
	if c.hb != nil && c.hb.clock != nil {
		return c.hb.clock.Now()
	}
	return time.Now()
}

// leadership returns the node's cluster.leadership timings.
func (c *clusterNode) leadership() cluster.LeadershipConfig {
	if c.hb != nil {
		return c.hb.cfg
	}
	return cluster.DefaultLeadershipConfig()
}

// askLeader returns the leader the node follows at start: the one its
// peers name (see chooseLeader). A peer that names this node followed it
// before it restarted, and a peer that answered but whose answer could
// not be read (an error status, a garbled or cut answer) may follow
// another leader: in both cases the node asks again until a peer names
// another leader (one took over), or until no peer names this node and
// every peer answered readably or not at all, or restartGrace passed;
// only then does the lowest id lead. Peers that do not answer (down, or
// starting and asking their own peers) are no reason to wait: the whole
// cluster may be starting.
func (c *clusterNode) askLeader(ctx context.Context) string {
	a := c.namedLeaders(ctx)
	if len(a.named) == 0 && (a.self || len(a.unread) > 0) {
		grace := restartGrace(c.cfg.Profile)
		if a.self {
			c.log.Info("cluster: the peers still follow this node; waiting for them to see it restarted", "wait", grace)
		} else {
			c.log.Warn("cluster: peers are up but their answers could not be read; asking again before leading", "peers", a.unread, "err", a.err, "wait", grace)
		}
		start := time.Now()
		deadline := time.NewTimer(grace)
		defer deadline.Stop()
		tick := time.NewTicker(c.leadership().RestartPoll)
		defer tick.Stop()
	wait:
		for {
			select {
			case <-deadline.C:
				break wait
			case <-ctx.Done():
				break wait
			case <-tick.C:
			}
			if a = c.namedLeaders(ctx); len(a.named) > 0 || !a.self && len(a.unread) == 0 {
				break
			}
		}
		if len(a.named) == 0 && len(a.unread) > 0 {
			c.log.Warn("cluster: peers still unread after the wait; the lowest id leads", "peers", a.unread, "err", a.err, "took", time.Since(start))
		}
		c.log.Info("cluster: asked the peers who leads after the restart", "named", a.named, "still_this_node", a.self, "took", time.Since(start))
	}
	return chooseLeader(c.cfg.Master(), a.named)
}

// leaderAnswers is what the peers said about the leader.
type leaderAnswers struct {
	// named are the other nodes the peers name as leader.
	named []string
	// self is set when a peer that followed a leader named this node.
	self bool
	// unread are the peers that answered but whose answer could not be
	// read, and err the last such error.
	unread []string
	err    error
}

// namedLeaders asks every peer which node leads.
func (c *clusterNode) namedLeaders(ctx context.Context) leaderAnswers {
	var mu sync.Mutex
	var wg sync.WaitGroup
	var a leaderAnswers
	unread := func(id string, err error) {
		mu.Lock()
		defer mu.Unlock()
		a.unread, a.err = append(a.unread, id), err
	}
	for _, p := range c.cfg.Peers {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			resp, err := c.peers.do(ctx, http.MethodGet, p.ID, "/cluster/worker", nil, nil)
			if ae := (*APIError)(nil); errors.As(err, &ae) {
				unread(p.ID, err)
			}
			if err != nil {
				// No answer at all (or an error status, above): the
				// peer is down or not serving yet (a peer that starts
				// too asks its own peers first).
				return
			}
			defer resp.Body.Close()
			var w struct {
				Master   string `json:"master"`
				Followed bool   `json:"followed"`
			}
			if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&w); err != nil {
				unread(p.ID, fmt.Errorf("node %q: GET /cluster/worker: %w", p.ID, err))
				return
			}
			mu.Lock()
			defer mu.Unlock()
			switch {
			case w.Master == c.cfg.Node:
				a.self = a.self || w.Followed
			case w.Master != "":
				a.named = append(a.named, w.Master)
			}
		})
	}
	wg.Wait()
	slices.Sort(a.unread)
	return a
}

// following reports whether the node follows a leader whose deployment
// came here.
func (c *clusterNode) following() bool {
	c.lead.mu.Lock()
	defer c.lead.mu.Unlock()
	return c.lead.followed && !c.lead.took
}

// maybeTakeOver takes over as leader when the rule says so (see
// shouldTakeOver); called by the membership loop on a worker. A node
// that has not followed the leader in this run counts as following it
// when it took part in a deployment in an earlier run and the leader has
// been absent, with a majority alive, for restartGrace (see absence).
func (v *liveView) maybeTakeOver(alive []string) {
	c := v.c
	size := len(c.cfg.Nodes())
	grace := restartGrace(c.cfg.Profile)
	at := c.now()
	c.lead.mu.Lock()
	leader := c.lead.id
	if leader == "" {
		leader = c.cfg.Master()
	}
	followed, absent, began, waiting := c.lead.followed, false, false, false
	if !followed && !c.lead.took && leader != c.cfg.Node {
		if c.lead.before {
			absent, began = c.lead.absent.step(at, leader, alive, size, grace)
			followed = absent
		} else if !slices.Contains(alive, leader) && !c.lead.waitLogged {
			c.lead.waitLogged, waiting = true, true
		}
	}
	if c.lead.took || c.lead.stopped || c.takeover == nil || !shouldTakeOver(c.cfg.Node, leader, followed, alive, v.otherPipelines(), size) {
		c.lead.mu.Unlock()
		switch {
		case began:
			c.log.Warn("cluster: the leader is not up; the cluster ran before, so the lowest live node takes over if it stays away",
				"leader", leader, "alive", alive, "wait", grace)
		case waiting:
			c.log.Info("cluster: waiting for the leader to start: this node took part in no deployment yet, so it takes over from none",
				"leader", leader, "alive", alive)
		}
		return
	}
	c.lead.took, c.lead.id, c.lead.detected = true, c.cfg.Node, time.Now()
	c.lead.mu.Unlock()
	if absent {
		c.log.Warn("cluster: the leader stayed away after the cluster's restart; this node takes over the job masters", "dead", leader, "alive", alive, "waited", grace)
	} else {
		c.log.Warn("cluster: the leader died; this node takes over the job masters", "dead", leader, "alive", alive)
	}
	v.mu.Lock()
	now := time.Now()
	p := &pendingChange{at: now, dead: leader, detectionMS: v.detectionMS(now, leader)}
	v.pending = append(v.pending, p)
	v.mu.Unlock()
	v.wg.Add(1)
	go func() {
		defer v.wg.Done()
		if c.takeOverRetrying(leader) != nil {
			return
		}
		v.wg.Add(1)
		v.recordFailover(p, c.executions(), map[*actors.Execution]*actors.Runner{})
	}()
}

// takeOverRetrying takes over from leader (dead, or handing the
// leadership to this node); should that fail for
// some jobs (a snapshot whose holders are down, say), it tries again for
// those, after cluster.leadership.resume_backoff and then twice as long
// each time up to max_resume_backoff, while the node leads. It returns
// nil once every job runs, else the last failure.
func (c *clusterNode) takeOverRetrying(leader string) error {
	err := c.takeover(leader)
	if err == nil {
		return nil
	}
	if c.hb == nil {
		c.log.Error("cluster: takeover failed", "err", err)
		return err
	}
	c.log.Error("cluster: takeover failed; retrying for the jobs that do not run", "err", err, "retry_in", c.hb.cfg.ResumeBackoff)
	c.backoff(func(next time.Duration) bool {
		if !c.leadsOn() {
			c.log.Info("cluster: this node no longer leads; it stops retrying the takeover")
			return true
		}
		if err = c.takeover(leader); err != nil {
			c.log.Error("cluster: takeover failed; retrying for the jobs that do not run", "err", err, "retry_in", next)
			return false
		}
		c.log.Info("cluster: takeover retried: every job runs")
		return true
	})
	if err == nil && !c.leadsOn() {
		err = errNoLongerLeads
	}
	return err
}

// takeOver makes this node the job masters' node after the leader from
// died (or handed the leadership back to it): its worker's tasks stop,
// and every pipeline starts here as a job master restored from the
// newest snapshot the node can complete.
func (n *node) takeOver(from string, pipelines []pipeline.PipelineConfig) error {
	c := n.cluster
	// A retried takeover, or a retried restart of this leader's jobs
	// after a failed hand-back, and the node yielded or stepped down
	// meanwhile: the worker's tasks are the new leader's, and no job
	// starts here (checked again once the start is serialised with a
	// yield's step-down).
	if !c.stopping() && !c.leadsOn() {
		return errNoLongerLeads
	}
	if c.worker != nil {
		c.worker.Evict()
	}
	c.startMu.Lock()
	defer c.startMu.Unlock()
	if c.stopping() {
		return nil
	}
	if !c.leadsOn() {
		return errNoLongerLeads
	}
	// The jobs an earlier attempt of this takeover started (it failed for
	// the others) run on in its term, and the rest join it: in a new
	// term, the jobs started now would make the peers refuse the running
	// ones' checkpoints, commits and redeployments as a stale master's.
	base := c.epochBase
	if base == 0 || !slices.ContainsFunc(pipelines, func(pc pipeline.PipelineConfig) bool { return n.mastering(pc.Name) }) {
		var err error
		if base, err = nextEpochBase(filepath.Join(c.dataDir, "cluster"), c.seen.Load(), c.cfg.Nodes(), c.cfg.Node); err != nil {
			return err
		}
		c.epochBase = base
	}
	// Checkpoint ids of this leadership start at its term's base, as its
	// epochs do: above every id an earlier leader triggered (each term
	// numbers fewer than 2^32), even one no live node saw, whose files
	// or sink transactions may linger on the dead leader's disk.
	next := snapshot.ID(base)
	if c.worker != nil {
		next = max(next, c.worker.HighestCheckpoint()+1)
	}
	var failed []error
	for _, pc := range pipelines {
		if n.mastering(pc.Name) {
			// Started by an earlier attempt of this takeover (a retry
			// after a failure starts only the rest).
			continue
		}
		if n.lingers(pc.Name) {
			// A yield cancelled it and it has not ended yet: a second
			// run of it would share its store and its sinks. A later
			// attempt starts it once it ended.
			failed = append(failed, fmt.Errorf("job %q: its earlier run, cancelled by a yield, has not ended yet", pc.Name))
			continue
		}
		if pc.Checkpoint.Dir != "" {
			ctx, cancel := context.WithTimeout(n.ctx, time.Minute)
			md, err := c.rep.recover(ctx, pc.Name)
			cancel()
			switch {
			case err != nil:
				failed = append(failed, err)
				continue
			case md != nil:
				next = max(next, md.Checkpoint+1)
				c.log.Info("cluster: restoring the job from the replicated snapshot", "job", pc.Name, "checkpoint_id", uint64(md.Checkpoint), "dir", md.Dir)
			default:
				c.log.Warn("cluster: no snapshot of the job on this node; it starts from the beginning", "job", pc.Name)
			}
		}
		c.lead.mu.Lock()
		c.lead.nextCheckpoint = max(c.lead.nextCheckpoint, next)
		c.lead.mu.Unlock()
		j, err := n.start(n.ctx, pc)
		if err != nil {
			failed = append(failed, fmt.Errorf("start pipeline %q: %w", pc.Name, err))
			continue
		}
		n.late.Go(func() { n.watch(j) })
	}
	c.log.Info("cluster: took over the job masters", "from", from, "epoch_base", base, "next_checkpoint", uint64(c.nextCheckpoint()))
	if len(failed) > 0 {
		return fmt.Errorf("cluster: takeover: %v", failed)
	}
	return nil
}

// stopping reports whether the node stops: no takeover starts jobs.
func (c *clusterNode) stopping() bool {
	c.lead.mu.Lock()
	defer c.lead.mu.Unlock()
	return c.lead.stopped
}

// mastering reports whether a job named name runs here as a job master
// of the node's current leadership.
func (n *node) mastering(name string) bool {
	j, err := n.job(context.Background(), name)
	if err != nil || j.snapshot().Status != StatusRunning || ended(j) {
		return false
	}
	return slices.Contains(n.cluster.executions(), j.run.Execution())
}

// lingers reports whether a run of job name that a yield cancelled is
// still listed and has not ended.
func (n *node) lingers(name string) bool {
	n.jobsMu.Lock()
	defer n.jobsMu.Unlock()
	for _, j := range n.lingering {
		if j.name == name && !ended(j) {
			return true
		}
	}
	return false
}

// recover readies the node's store of job for a restore: the newest
// snapshot it has the metadata of whose missing files it can copy in
// from their holders; an older one when that fails (logged). It returns
// nil when the store has none, and an error when it has some but none
// can be completed: the job ran, and starting it from the beginning
// would commit its output again.
func (r *replicas) recover(ctx context.Context, job string) (*snapshot.Metadata, error) {
	s, err := r.store(job)
	if err != nil {
		return nil, err
	}
	mds, err := s.Completed()
	if err != nil {
		return nil, err
	}
	var errs []error
	for _, md := range mds {
		if err := r.complete(ctx, md); err != nil {
			r.log.Warn("cluster: snapshot cannot be completed from its holders; trying an older one", "job", job, "checkpoint_id", uint64(md.Checkpoint), "err", err)
			errs = append(errs, err)
			continue
		}
		r.learnCommitted(ctx, md)
		return md, nil
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("job %q: none of its %d snapshots on this node can be completed from the live holders, and starting it from the beginning would commit its output again: %w", job, len(errs), errors.Join(errs...))
	}
	return nil, nil
}

// nextCheckpoint returns the lowest checkpoint id of the jobs the node
// masters (0 unless it took over).
func (c *clusterNode) nextCheckpoint() snapshot.ID {
	c.lead.mu.Lock()
	defer c.lead.mu.Unlock()
	return c.lead.nextCheckpoint
}

// masterFirst returns ids with master first, the others in their order:
// the first node of an actors.Cluster runs the job master.
func masterFirst(ids []string, master string) []string {
	out := []string{master}
	for _, id := range ids {
		if id != master {
			out = append(out, id)
		}
	}
	return out
}
