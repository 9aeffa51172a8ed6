package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/cluster"
	"github.com/edgedio/edged/snapshot"
)

// Hand-back (with cluster.gossip). The leader is the lowest id among the
// members the majority sees: a node that took over from a dead leader
// leads only until a lower node is back. When the leader sees a lower
// node alive, with a majority, for the settle delay (damped: see
// handbackDecider), and that node has the metadata of the latest
// completed checkpoint of every job, the leader hands the leadership
// over, gate-queued (not while a checkpoint, failover or rebalance is in
// progress):
//
//  1. it stops its jobs with a savepoint (the savepoint's metadata goes to
//     every live node, its files to their replicas and to the leader);
//  2. it asks the lower node to prepare: that node checks it has each
//     savepoint's metadata and copies in the files it lacks;
//  3. it steps down: it follows the lower node and runs no job master;
//  4. it tells the lower node to take over (POST /cluster/handback),
//     with the highest epoch it deployed: that node persists it as its
//     epoch floor, and restores every job from the savepoint in epochs
//     above it, numbering checkpoints above the savepoint's.
//
// Never two leaders: the old one steps down before the new one starts. A
// failure at any step leaves the old leader leading (it restarts its jobs
// from the savepoint when it had stopped them, retrying that restart with
// a backoff until it succeeds or the leadership is lost: retryResume) and
// is retried later, after a backoff. Should the lower node not answer the message to take
// over, the old leader asks it who leads: it leads again only when that
// node says it did not take over, and follows it otherwise (when that
// node dies meanwhile, the takeover rule of cluster_leader.go applies).

// handbackConfig damps hand-backs and times the leadership's polls and
// retries (cluster.leadership): Settle is how long a lower node must have
// been seen alive, in one run, before the leadership goes back to it. It
// doubles (up to MaxSettle) for each time the node died, or restarted,
// having been up for less than Stable, and falls back to Settle once the
// node has stayed up for Stable and its current settle delay.
// MinInterval is the least time between two hand-back attempts; it
// doubles (up to MaxInterval) after each failed attempt and falls back to
// MinInterval after one that succeeded.
type handbackConfig = cluster.LeadershipConfig

// defaultHandbackConfig returns the defaults: settle 5 s (the rebalance
// gate's), up to 5 min for a flapping node, stable after 1 min; 10 s
// between attempts, backing off to 5 min.
func defaultHandbackConfig() handbackConfig { return cluster.DefaultLeadershipConfig() }

// handbackTimeout bounds a hand-back from its start.
const handbackTimeout = 2 * time.Minute

// upRun is one run of a node as the leader sees it.
type upRun struct {
	boot  string
	since time.Time
}

// handbackDecider decides, on the leader, when and to whom it hands the
// leadership back. It is a pure state machine: times come with each call,
// and it starts nothing. Not safe for concurrent use.
type handbackDecider struct {
	cfg handbackConfig
	// up is when each live node's current run was first seen.
	up map[string]upRun
	// settle is the current settle delay of the nodes that flapped.
	settle map[string]time.Duration
	// next is the earliest next attempt; interval the current backoff.
	next     time.Time
	interval time.Duration
}

func newHandbackDecider(cfg handbackConfig) *handbackDecider {
	return &handbackDecider{cfg: cfg, up: map[string]upRun{}, settle: map[string]time.Duration{}, interval: cfg.MinInterval}
}

// settleOf returns node's current settle delay.
func (d *handbackDecider) settleOf(node string) time.Duration {
	if s, ok := d.settle[node]; ok {
		return s
	}
	return d.cfg.Settle
}

// observe records the live nodes (id to boot id: another boot is a
// restart) at now. A node gone, or restarted, after less than Stable up
// flapped: its settle delay doubles.
func (d *handbackDecider) observe(now time.Time, alive map[string]string) {
	for id, r := range d.up {
		if boot, ok := alive[id]; ok && boot == r.boot {
			if now.Sub(r.since) >= max(d.cfg.Stable, d.settleOf(id)) {
				delete(d.settle, id)
			}
			continue
		}
		if now.Sub(r.since) < d.cfg.Stable {
			d.settle[id] = min(2*d.settleOf(id), d.cfg.MaxSettle)
		}
		delete(d.up, id)
	}
	for id, boot := range alive {
		if _, ok := d.up[id]; !ok {
			d.up[id] = upRun{boot: boot, since: now}
		}
	}
}

// decide returns the node self (the leader) hands the leadership to now,
// given the live nodes alive (in id order) of a cluster of size: the
// lowest live node below self that has been up for its settle delay and
// does not run other pipelines than self (others), provided self sees a
// majority and the backoff since the last attempt has passed. Otherwise
// it returns "" and, if a lower node waits, why.
func (d *handbackDecider) decide(now time.Time, self string, alive []string, others map[string]bool, size int) (target, waiting string) {
	if !cluster.HasQuorum(len(alive), size) {
		return "", ""
	}
	var lower []string
	for _, id := range alive {
		if id < self && !others[id] {
			lower = append(lower, id)
		}
	}
	if len(lower) == 0 {
		return "", ""
	}
	if now.Before(d.next) {
		// The wait is the interval after an attempt, or after one that
		// was not ready a second (the node busy) or the settle delay (the
		// lower node did not answer): say how long it is.
		return "", fmt.Sprintf("damping: the next hand-back attempt in %v", d.next.Sub(now).Round(time.Millisecond))
	}
	for _, id := range lower {
		r, ok := d.up[id]
		if ok && now.Sub(r.since) >= d.settleOf(id) {
			return id, ""
		}
	}
	return "", fmt.Sprintf("node %s settling: it must be up for %v in one run", lower[0], d.settleOf(lower[0]))
}

// attempt records that a hand-back starts at now.
func (d *handbackDecider) attempt(now time.Time) { d.next = now.Add(d.interval) }

// done records how the attempt ended: a failure doubles the backoff, a
// success resets it; one not ready retries without backing off: after
// handbackBusyRetry (at most the settle delay) when the node had not
// caught up or a rebalance or checkpoint was under way (each ends within
// about a checkpoint interval), after the settle delay when the node did
// not answer.
func (d *handbackDecider) done(now time.Time, err error) {
	switch {
	case err == nil:
		d.interval = d.cfg.MinInterval
		d.next = now.Add(d.interval)
	case errors.Is(err, errHandbackBusy):
		d.next = now.Add(min(d.cfg.Settle, handbackBusyRetry))
	case errors.Is(err, errHandbackNotReady):
		d.next = now.Add(d.cfg.Settle)
	default:
		d.interval = min(max(2*d.interval, d.cfg.MinInterval), d.cfg.MaxInterval)
		d.next = now.Add(d.interval)
	}
}

// errHandbackNotReady is a hand-back not started: the lower node did not
// answer, or it was busy (errHandbackBusy).
var errHandbackNotReady = errors.New("hand-back not ready")

// errHandbackBusy is a hand-back not started because the lower node had
// not caught up, a checkpoint, failover or rebalance was in progress, or
// this node no longer led. It wraps errHandbackNotReady.
var errHandbackBusy = fmt.Errorf("%w (busy)", errHandbackNotReady)

// handbackBusyRetry is how soon a hand-back that found the node busy is
// tried again.
const handbackBusyRetry = time.Second

// handback is the node's hand-back state.
type handback struct {
	cfg handbackConfig
	// clock times the retries' backoffs (the real clock but in tests).
	clock clockwork.Clock

	mu      sync.Mutex // guards the fields below
	dec     *handbackDecider
	running bool
	// resuming is set while the node retries restarting its jobs after
	// a failed hand-back (resumeLeading); no hand-back starts meanwhile.
	resuming bool
	// resumeRetries counts the retries of restarting the jobs.
	resumeRetries int64
	// lingering is how many jobs a yield cancelled that have not ended
	// yet: they stay listed, and their cancellation is retried until
	// they end; recancelling is set while that retry runs.
	lingering    int
	recancelling bool
	waiting      string
	// queuedAt is when the pending hand-back was first decided: only
	// checkpoints triggered before it hold it.
	queuedAt time.Time
	records  []cluster.Handback
	total    int64

	// stop stops every job of the node with a savepoint and returns the
	// savepoints' checkpoint ids by job; on error it has stopped nothing
	// or, having stopped some, stopped every job (resume restarts them).
	stop func(ctx context.Context) (map[string]snapshot.ID, bool, error)
	// drop forgets the node's jobs that ended; one still running stays
	// listed.
	drop func()
	// cancel cancels every job of the node (a leader that yields) and
	// returns how many have not ended by the end of ctx: those stay
	// listed and are cancelled again by recancel.
	cancel func(ctx context.Context) int
	// recancel cancels again the jobs cancel left running, forgets the
	// ones that ended, and returns how many still run.
	recancel func(ctx context.Context) int
	// polling is set while the leader asks its peers whether one leads
	// too; polled is when it last did.
	polling bool
	polled  time.Time
}

func newHandback(cfg handbackConfig) *handback {
	return &handback{cfg: cfg, clock: clockwork.NewRealClock(), dec: newHandbackDecider(cfg)}
}

// record adds rec to the history.
func (h *handback) record(rec cluster.Handback) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.total++
	h.records = lastN(append(h.records, rec), 10)
}

// status returns the history and the total.
func (h *handback) status() ([]cluster.Handback, int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.records), h.total
}

// handbackMessage is the body of POST /cluster/handback.
type handbackMessage struct {
	// From is the leader handing over.
	From string `json:"from"`
	// Prepare asks only whether the node has the savepoints (and copies
	// in the files it lacks); the leader has not stepped down.
	Prepare bool `json:"prepare,omitempty"`
	// Epoch is the highest epoch From deployed: the new leader's floor.
	Epoch uint64 `json:"epoch"`
	// NextCheckpoint is above every checkpoint id From triggered.
	NextCheckpoint uint64 `json:"next_checkpoint"`
	// Savepoints are the savepoints the jobs were stopped with, by job.
	Savepoints map[string]uint64 `json:"savepoints"`
}

// boots returns the live nodes with their boot ids (cluster.Meta.Boot).
func (v *liveView) boots() map[string]string {
	out := map[string]string{}
	mem := v.membership()
	if mem == nil {
		for _, id := range v.c.cfg.Nodes() {
			out[id] = ""
		}
		return out
	}
	out[v.c.cfg.Node] = ""
	for _, m := range mem.Members() {
		if slices.Contains(v.c.cfg.Nodes(), m.ID) {
			out[m.ID] = m.Boot
		}
	}
	return out
}

// handbackBusy returns why a hand-back queued at since must wait: a
// failover in progress, a rebalance queued, a checkpoint triggered
// before since in progress (later ones do not hold it: at a short
// interval they would starve it; its savepoint runs beside them); "" if
// none.
func (c *clusterNode) handbackBusy(since time.Time) string {
	v := c.live
	v.mu.Lock()
	failover := len(v.pending) > 0
	queued := c.rb != nil && !c.rb.queuedAt.IsZero()
	v.mu.Unlock()
	switch {
	case failover:
		return "a failover is in progress"
	case queued:
		return "a rebalance is queued"
	case c.checkpointing(since):
		return "a checkpoint is in progress"
	}
	return ""
}

// maybeHandBack hands the leadership back to a lower node when the rule
// says so (see handbackDecider); called by the membership loop on the
// leader. The hand-back runs beside the loop.
func (v *liveView) maybeHandBack(alive []string) {
	c := v.c
	h := c.hb
	if h == nil || h.stop == nil || c.takeover == nil {
		return
	}
	now := time.Now()
	h.mu.Lock()
	h.dec.observe(now, v.boots())
	if h.running || h.resuming {
		h.mu.Unlock()
		return
	}
	target, waiting := h.dec.decide(now, c.cfg.Node, alive, v.otherPipelines(), len(c.cfg.Nodes()))
	if target == "" {
		h.queuedAt = time.Time{}
	} else if h.queuedAt.IsZero() {
		h.queuedAt = now
	}
	queuedAt := h.queuedAt
	if target != "" {
		if busy := c.handbackBusy(queuedAt); busy != "" {
			target, waiting = "", fmt.Sprintf("hand-back to %s queued: %s", target, busy)
		}
	}
	if waiting != h.waiting && waiting != "" {
		c.log.Info("cluster: hand-back waits", "waiting", waiting)
	}
	h.waiting = waiting
	if target == "" {
		h.mu.Unlock()
		return
	}
	h.running = true
	h.queuedAt = time.Time{}
	h.dec.attempt(now)
	h.mu.Unlock()
	v.wg.Add(1)
	go func() {
		defer v.wg.Done()
		ctx, cancel := v.stopCtx(handbackTimeout)
		defer cancel()
		err := c.handBack(ctx, target, queuedAt)
		h.mu.Lock()
		h.running = false
		h.dec.done(time.Now(), err)
		h.mu.Unlock()
	}()
}

// highestEpoch returns the highest epoch the node deployed or saw.
func (c *clusterNode) highestEpoch() uint64 {
	e := c.seen.Load()
	for _, x := range c.executions() {
		if r, _ := x.Runner(); r != nil {
			e = max(e, r.Epoch())
		}
	}
	return e
}

// latestCheckpoints returns the id of the newest snapshot with metadata in
// the node's store of each job with checkpoints.
func (c *clusterNode) latestCheckpoints() map[string]uint64 {
	out := map[string]uint64{}
	if c.rep == nil {
		return out
	}
	for job := range c.rep.jobs {
		s, err := c.rep.store(job)
		if err != nil {
			continue
		}
		if mds, err := s.Completed(); err == nil && len(mds) > 0 {
			out[job] = uint64(mds[0].Checkpoint)
		}
	}
	return out
}

// handBack hands the leadership to target (see the steps above), queued
// at since. It returns an error wrapping errHandbackNotReady when it did
// not start.
func (c *clusterNode) handBack(ctx context.Context, target string, since time.Time) error {
	h := c.hb
	start := time.Now()
	log := c.log.With("to", target)
	// The node must have caught up: the metadata of the latest completed
	// checkpoint of every job.
	ours := c.latestCheckpoints()
	theirs, err := c.peers.latestCheckpoints(ctx, target)
	if err != nil {
		log.Info("cluster: hand-back: the lower node does not answer; retrying later", "err", err)
		return fmt.Errorf("%w: %w", errHandbackNotReady, err)
	}
	for job, id := range ours {
		if theirs[job] < id {
			log.Info("cluster: hand-back: the lower node has not caught up; retrying later", "job", job, "checkpoint_id", id, "its_latest", theirs[job])
			return fmt.Errorf("%w: node %q has checkpoint %d of job %q, the latest is %d", errHandbackBusy, target, theirs[job], job, id)
		}
	}
	// Not beside a rebalance (the rebalancer's runs take redeployMu).
	if !c.redeployMu.TryLock() {
		log.Info("cluster: hand-back: a rebalance is in progress; retrying later")
		return fmt.Errorf("%w: a rebalance is in progress", errHandbackBusy)
	}
	defer c.redeployMu.Unlock()
	if busy := c.handbackBusy(since); busy != "" || !c.isMaster() {
		log.Info("cluster: hand-back: not now", "busy", busy, "leads", c.isMaster())
		return fmt.Errorf("%w: %s", errHandbackBusy, busy)
	}
	c.handing.Store(true)
	defer c.handing.Store(false)
	rec := cluster.Handback{At: start, From: c.cfg.Node, To: target, Savepoints: map[string]uint64{}}
	fail := func(step string, err error) error {
		rec.Outcome, rec.Error = "failed", fmt.Sprintf("%s: %v", step, err)
		h.record(rec)
		log.Warn("cluster: hand-back failed; this node leads on", "step", step, "err", err, "took", time.Since(start))
		return fmt.Errorf("%w: %s: %w", ErrHandback, step, err)
	}
	log.Info("cluster: handing the leadership back to a lower node; stopping the jobs with a savepoint", "caught_up", ours)

	// 1. Stop every job with a savepoint.
	rec.Epoch = c.highestEpoch()
	t := time.Now()
	ids, stopped, err := h.stop(ctx)
	rec.SavepointMS = msSince(t)
	if err != nil {
		if stopped {
			c.resumeLeading(log, "the savepoint before the hand-back failed")
		}
		return fail("savepoint", err)
	}
	next := uint64(0)
	for job, id := range ids {
		rec.Savepoints[job] = uint64(id)
		next = max(next, uint64(id)+1)
	}
	rec.Epoch = max(rec.Epoch, c.highestEpoch())
	log.Info("cluster: hand-back: jobs stopped with a savepoint", "savepoints", rec.Savepoints, "epoch", rec.Epoch, "took_ms", rec.SavepointMS)
	msg := handbackMessage{From: c.cfg.Node, Prepare: true, Epoch: rec.Epoch, NextCheckpoint: next, Savepoints: rec.Savepoints}

	// 2. The new leader has the savepoints' metadata and files.
	t = time.Now()
	if err := c.peers.handback(ctx, target, msg); err != nil {
		rec.ReplicateMS = msSince(t)
		c.resumeLeading(log, "the lower node does not have the savepoints")
		return fail("replicate", err)
	}
	rec.ReplicateMS = msSince(t)
	log.Info("cluster: hand-back: the lower node has the savepoints' metadata and files", "took_ms", rec.ReplicateMS)

	// 3. Step down.
	c.stepDown(target)
	log.Info("cluster: hand-back: stepped down; this node follows the lower node")

	// 4. Tell it to take over.
	msg.Prepare = false
	t = time.Now()
	err = c.peers.handback(ctx, target, msg)
	rec.TakeoverMS = msSince(t)
	var ae *APIError
	switch {
	case err == nil:
	case errors.As(err, &ae):
		c.resumeLeading(log, "the lower node refused to take over")
		return fail("takeover", err)
	default:
		// Ask with a context of its own: the hand-back's may have ended,
		// and the lower node may have taken over all the same.
		actx, cancel := context.WithTimeout(context.Background(), askWhoLeadsTimeout)
		leader := c.askWhoLeads(actx, target)
		cancel()
		switch leader {
		case target:
			log.Info("cluster: hand-back: the lower node did not answer but leads", "err", err)
		case "":
			// It may have taken over: never lead beside it. Ask it
			// until it answers: if it did not take over, lead again
			// (else both would follow each other and none would lead);
			// the takeover rule applies if it is seen dead meanwhile.
			rec.Outcome, rec.Error = "unknown", err.Error()
			h.record(rec)
			log.Warn("cluster: hand-back: the lower node does not answer; this node follows it until it does", "err", err)
			go c.resolveUnknownHandback(log, target)
			return fmt.Errorf("%w: takeover: %w", ErrHandback, err)
		case c.cfg.Node:
			c.resumeLeading(log, "the lower node did not take over")
			return fail("takeover", err)
		default:
			log.Warn("cluster: hand-back: the lower node names another leader; following it", "leader", leader)
			c.lead.mu.Lock()
			c.lead.id = leader
			c.lead.mu.Unlock()
		}
	}
	rec.Outcome = "done"
	h.record(rec)
	log.Info("cluster: handed the leadership back", "epoch", rec.Epoch, "savepoints", rec.Savepoints,
		"savepoint_ms", rec.SavepointMS, "replicate_ms", rec.ReplicateMS, "takeover_ms", rec.TakeoverMS, "took", time.Since(start))
	return nil
}

// askWhoLeadsTimeout bounds askWhoLeads after a take-over message that
// got no answer.
const askWhoLeadsTimeout = 15 * time.Second

// resolveUnknownHandback settles a hand-back whose take-over message got
// no answer: it asks target every AnswerPoll (cluster.leadership, 2 s by
// default) which node it follows until it
// answers, the node follows another leader, or the node stops. If target
// follows this node (it never took over), this node leads again; if it
// names another node, this node follows that one.
func (c *clusterNode) resolveUnknownHandback(log *slog.Logger, target string) {
	quit := c.quitChan()
	for {
		select {
		case <-quit:
			return
		case <-c.hb.clock.After(c.hb.cfg.AnswerPoll):
		}
		c.lead.mu.Lock()
		still := !c.lead.stopped && c.lead.id == target && !c.lead.took
		c.lead.mu.Unlock()
		if !still {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		w, err := c.peers.workerStatus(ctx, target)
		cancel()
		if err != nil {
			continue
		}
		switch w.Master {
		case target:
			log.Info("cluster: hand-back: the lower node answers; it leads")
		case c.cfg.Node, "":
			c.resumeLeading(log, "the lower node answers that it did not take over")
		default:
			c.lead.mu.Lock()
			if c.lead.id == target && !c.lead.took {
				c.lead.id = w.Master
			}
			c.lead.mu.Unlock()
			log.Warn("cluster: hand-back: the lower node names another leader; following it", "leader", w.Master)
		}
		return
	}
}

// askWhoLeads asks node which node it follows, a few times: "" when it
// does not answer.
func (c *clusterNode) askWhoLeads(ctx context.Context, node string) string {
	for range 5 {
		if w, err := c.peers.workerStatus(ctx, node); err == nil {
			return w.Master
		}
		select {
		case <-ctx.Done():
			return ""
		case <-c.hb.clock.After(c.hb.cfg.AnswerPoll / 2):
		}
	}
	return ""
}

// stepDown makes the node a follower of leader: it runs no job master
// from now on.
func (c *clusterNode) stepDown(leader string) {
	c.lead.mu.Lock()
	c.lead.stepped, c.lead.took, c.lead.id, c.lead.followed = true, false, leader, true
	c.lead.mu.Unlock()
	c.mu.Lock()
	c.execs = nil
	c.mu.Unlock()
	if c.hb.drop != nil {
		c.hb.drop()
	}
	v := c.live
	v.mu.Lock()
	v.deployed, v.survivors, v.pending = nil, nil, nil
	clear(v.joining) // joins are the new leader's to rebalance
	v.mu.Unlock()
}

// resumeLeading makes the node lead again after a hand-back that failed
// once its jobs had stopped: it restarts them from their latest snapshot
// (the savepoint).
func (c *clusterNode) resumeLeading(log *slog.Logger, why string) {
	c.lead.mu.Lock()
	if c.lead.stopped {
		c.lead.mu.Unlock()
		return
	}
	c.lead.stepped, c.lead.took, c.lead.id = true, true, c.cfg.Node
	c.lead.mu.Unlock()
	c.mu.Lock()
	c.execs = nil
	c.mu.Unlock()
	if c.hb.drop != nil {
		c.hb.drop()
	}
	v := c.live
	v.mu.Lock()
	v.deployed, v.survivors = nil, nil
	v.mu.Unlock()
	log.Info("cluster: hand-back: this node leads on; restarting its jobs from the savepoint", "why", why)
	err := c.takeover(c.cfg.Node)
	if err == nil {
		return
	}
	h := c.hb
	h.mu.Lock()
	if h.resuming {
		h.mu.Unlock()
		log.Error("cluster: hand-back: restarting the jobs failed; the retries go on", "err", err)
		return
	}
	h.resuming = true
	h.mu.Unlock()
	log.Error("cluster: hand-back: restarting the jobs failed; retrying", "err", err, "retry_in", h.cfg.ResumeBackoff)
	c.live.wg.Add(1)
	go func() {
		defer c.live.wg.Done()
		c.retryResume(log)
	}()
}

// leadsOn reports whether the node still leads after a hand-back that
// failed: it took the leadership back, has not stepped down since, and
// does not stop.
func (c *clusterNode) leadsOn() bool {
	c.lead.mu.Lock()
	defer c.lead.mu.Unlock()
	return c.lead.took && c.lead.id == c.cfg.Node && !c.lead.stopped
}

// retryResume retries restarting the node's jobs (c.takeover, which
// starts only the jobs not running yet) with a backoff from
// cluster.leadership.resume_backoff, doubling up to max_resume_backoff,
// until they all run, the node no longer leads, or it stops.
func (c *clusterNode) retryResume(log *slog.Logger) {
	h := c.hb
	defer func() {
		h.mu.Lock()
		h.resuming = false
		h.mu.Unlock()
	}()
	c.backoff(func(next time.Duration) bool {
		if !c.leadsOn() {
			log.Info("cluster: hand-back: this node no longer leads; it stops restarting its jobs")
			return true
		}
		h.mu.Lock()
		h.resumeRetries++
		h.mu.Unlock()
		err := c.takeover(c.cfg.Node)
		if err == nil {
			log.Info("cluster: hand-back: the jobs restarted; this node leads on")
			return true
		}
		log.Error("cluster: hand-back: restarting the jobs failed; retrying", "err", err, "retry_in", next)
		return false
	})
}

// backoff calls try after cluster.leadership.resume_backoff, then again
// after twice as long each time up to max_resume_backoff (next is the
// wait before the following call), until try returns true or the node
// stops.
func (c *clusterNode) backoff(try func(next time.Duration) bool) {
	h := c.hb
	quit := c.quitChan()
	wait := h.cfg.ResumeBackoff
	for {
		select {
		case <-quit:
			return
		case <-h.clock.After(wait):
		}
		next := min(2*wait, h.cfg.MaxResumeBackoff)
		if try(next) {
			return
		}
		wait = next
	}
}

// handleHandback answers POST /cluster/handback on the lower node: with
// prepare, whether it has the savepoints (copying in the files it lacks);
// else it takes over from the leader that sent it, which stepped down.
func (c *clusterNode) handleHandback(w http.ResponseWriter, r *http.Request) {
	var m handbackMessage
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&m); err != nil {
		clusterError(w, http.StatusBadRequest, fmt.Errorf("hand-back: %w", err))
		return
	}
	start := time.Now()
	refuse := func(code int, err error) {
		c.log.Warn("cluster: hand-back refused", "from", m.From, "prepare", m.Prepare, "err", err)
		clusterError(w, code, err)
	}
	if c.takeover == nil || c.hb == nil {
		refuse(http.StatusConflict, fmt.Errorf("%w: node %q runs without cluster.gossip", ErrHandback, c.cfg.Node))
		return
	}
	if leader := c.leader(); leader != m.From || c.isMaster() {
		refuse(http.StatusConflict, fmt.Errorf("%w: node %q follows %q, not %q", ErrHandback, c.cfg.Node, leader, m.From))
		return
	}
	if seen := c.seen.Load(); staleTerm(m.Epoch, seen) {
		refuse(http.StatusConflict, fmt.Errorf("%w: epoch %d, the node saw epoch %d", ErrStaleMaster, m.Epoch, seen))
		return
	}
	for _, job := range slices.Sorted(maps.Keys(m.Savepoints)) {
		if err := c.rep.completeSnapshot(r.Context(), job, snapshot.ID(m.Savepoints[job])); err != nil {
			refuse(http.StatusServiceUnavailable, fmt.Errorf("%w: %w", ErrHandback, err))
			return
		}
	}
	if m.Prepare {
		c.log.Info("cluster: hand-back: this node has the savepoints", "from", m.From, "savepoints", m.Savepoints, "took", time.Since(start))
		writeJSON(w, http.StatusOK, map[string]any{"node": c.cfg.Node, "ready": true})
		return
	}
	if err := c.raiseEpoch(m.Epoch); err != nil {
		refuse(http.StatusInternalServerError, fmt.Errorf("%w: persist the epoch floor: %w", ErrHandback, err))
		return
	}
	c.lead.mu.Lock()
	if c.lead.took || c.lead.stopped || c.lead.id != m.From {
		c.lead.mu.Unlock()
		refuse(http.StatusConflict, fmt.Errorf("%w: node %q leads already or stops", ErrHandback, c.cfg.Node))
		return
	}
	c.lead.took, c.lead.id, c.lead.detected = true, c.cfg.Node, start
	c.lead.nextCheckpoint = max(c.lead.nextCheckpoint, snapshot.ID(m.NextCheckpoint))
	c.lead.mu.Unlock()
	c.log.Info("cluster: hand-back: this node takes over the job masters", "from", m.From, "epoch_floor", m.Epoch,
		"next_checkpoint", m.NextCheckpoint, "savepoints", m.Savepoints)
	rec := cluster.Handback{At: start, From: m.From, To: c.cfg.Node, Epoch: m.Epoch, Savepoints: m.Savepoints}
	v := c.live
	v.wg.Add(1)
	go func() {
		defer v.wg.Done()
		// A takeover that failed for some jobs is retried for those
		// while the node leads.
		err := c.takeOverRetrying(m.From)
		if err == nil {
			ctx, cancel := v.stopCtx(5 * time.Minute)
			for _, e := range c.executions() {
				if err = waitNewRunner(ctx, e, nil); err != nil {
					break
				}
			}
			cancel()
		}
		rec.RestoreMS, rec.Outcome = msSince(start), "done"
		if err != nil {
			rec.Outcome, rec.Error = "failed", err.Error()
			c.log.Error("cluster: hand-back: the takeover failed", "from", m.From, "err", err)
		}
		c.hb.record(rec)
		c.log.Info("cluster: hand-back: took over; every job runs here", "from", m.From, "restore_ms", rec.RestoreMS, "err", err)
	}()
	writeJSON(w, http.StatusOK, map[string]any{"node": c.cfg.Node, "leader": c.cfg.Node})
}

// completeSnapshot makes sure the node's store of job has the metadata of
// snapshot id and every one of its state files, copying in the ones it
// lacks from their holders.
func (r *replicas) completeSnapshot(ctx context.Context, job string, id snapshot.ID) error {
	s, err := r.store(job)
	if err != nil {
		return err
	}
	mds, err := s.Completed()
	if err != nil {
		return err
	}
	for _, md := range mds {
		if md.Checkpoint == id {
			return r.complete(ctx, md)
		}
	}
	return fmt.Errorf("node %q has no metadata of snapshot %d of job %q", r.self, id, job)
}

// workerReply is what GET /cluster/worker answers.
type workerReply struct {
	Node     string `json:"node"`
	Master   string `json:"master"`
	Followed bool   `json:"followed"`
	// Epoch is the highest epoch the node deployed or saw.
	Epoch uint64 `json:"epoch"`
	// Checkpoints is the newest snapshot with metadata in the node's
	// store, by job.
	Checkpoints map[string]uint64  `json:"checkpoints"`
	Jobs        []actors.WorkerJob `json:"jobs"`
	// DeadLetters are the dead letters of the subtasks the node's worker
	// hosted since it started, by pipeline.
	DeadLetters map[string]workerDeadLetters `json:"dead_letters,omitempty"`
}

// workerStatus reads node's GET /cluster/worker.
func (p *peerClient) workerStatus(ctx context.Context, node string) (workerReply, error) {
	var w workerReply
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	resp, err := p.do(ctx, http.MethodGet, node, "/cluster/worker", nil, nil)
	if err != nil {
		return w, err
	}
	defer resp.Body.Close()
	return w, json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&w)
}

// latestCheckpoints returns the newest snapshot node has the metadata of,
// by job.
func (p *peerClient) latestCheckpoints(ctx context.Context, node string) (map[string]uint64, error) {
	w, err := p.workerStatus(ctx, node)
	if err != nil {
		return nil, err
	}
	if w.Checkpoints == nil {
		w.Checkpoints = map[string]uint64{}
	}
	return w.Checkpoints, nil
}

// handback sends m to node's POST /cluster/handback.
func (p *peerClient) handback(ctx context.Context, node string, m handbackMessage) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	resp, err := p.do(ctx, http.MethodPost, node, "/cluster/handback", bytes.NewReader(b), http.Header{"Content-Type": {"application/json"}})
	if err != nil {
		return err
	}
	return resp.Body.Close()
}

// stopForHandback stops every running job of the node with a savepoint
// (a job without checkpoints is cancelled) and waits for each to end. It
// returns the savepoints' ids by job, and whether it stopped any; when one
// fails after others stopped, it cancels the rest, so that every job can
// restart from its latest snapshot.
func (n *node) stopForHandback(ctx context.Context) (map[string]snapshot.ID, bool, error) {
	ids := map[string]snapshot.ID{}
	stopped := false
	var jobs []*job
	for _, j := range n.jobList() {
		if j.snapshot().Status == StatusRunning {
			jobs = append(jobs, j)
		}
	}
	wait := func(j *job) error {
		select {
		case <-j.run.Done():
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	for i, j := range jobs {
		var err error
		if !j.checkpointing {
			j.cancel()
		} else {
			var path string
			if path, err = n.stop(ctx, j, ""); err == nil {
				var md *snapshot.Metadata
				if md, err = snapshot.Load(path); err == nil {
					ids[j.name] = md.Checkpoint
					if n.cluster != nil {
						n.cluster.rep.ownSavepoint(ctx, j.name, path)
					}
				}
			}
		}
		if err == nil {
			err = wait(j)
		}
		if err != nil {
			if stopped || j.snapshot().Status != StatusRunning {
				for _, rest := range jobs[i:] {
					rest.cancel()
					<-rest.run.Done()
				}
				stopped = true
			}
			return ids, stopped, fmt.Errorf("job %q: %w", j.name, err)
		}
		stopped = true
	}
	return ids, stopped, nil
}

// dropJobs forgets the node's jobs (stopped by a hand-back, or cancelled
// by a yield): the job masters run elsewhere now, or start here anew. A
// job a yield cancelled that has not ended yet (lingering) stays listed
// until recancelJobs sees it end.
func (n *node) dropJobs() {
	n.jobsMu.Lock()
	defer n.jobsMu.Unlock()
	n.jobs = slices.Clone(n.lingering)
	n.byName = map[string]*job{}
	for _, j := range n.jobs {
		n.byName[j.name] = j
	}
}

// Two leaders at once follow a leader's restart that its peers had not
// seen when it asked them who leads (see askLeader): it leads again, and
// a peer that then sees its old run dead takes over. They also follow a
// partition that cut the leader off from the majority, once it heals:
// the majority's lowest node took over meanwhile, in a newer term. Each
// refuses the other's deployments. The leader polls its peers (every
// splitPoll): a peer that says it leads itself is another leader, and
// the one of the two whose term (its highest epoch's start counter,
// epoch>>32) is the newer keeps leading: the nodes that saw the newer
// term refuse every epoch of the older one, so the older leader could
// never deploy again. In the same term, the one whose newest snapshots
// are the newer keeps leading (with equal ones, the lower id). The other
// cancels its jobs and follows it. The lower node then gets the
// leadership back by a hand-back, which restarts the jobs in a term above
// every epoch it saw. splitPoll is cluster.leadership.split_poll (2 s by
// default).

// splitLeader is what the split rule knows of one of two leaders.
type splitLeader struct {
	// id is the node.
	id string
	// epoch is the highest epoch it deployed or saw.
	epoch uint64
	// latest is the newest snapshot it has the metadata of, by job.
	latest map[string]uint64
}

// splitWinner returns which of two leaders, self and other, keeps
// leading: the one of the newer term (epoch>>32); in the same term, the
// one whose snapshots are newer for every job where they differ; with
// equal ones, or newer ones on both sides, the lower id.
func splitWinner(self, other splitLeader) string {
	switch st, ot := self.epoch>>32, other.epoch>>32; {
	case st > ot:
		return self.id
	case ot > st:
		return other.id
	}
	return snapshotWinner(self.id, other.id, self.latest, other.latest)
}

// snapshotWinner returns which of two leaders of the same term, self and
// other, keeps leading, given the newest snapshot each has the metadata
// of, by job: the one whose snapshots are newer for every job where they
// differ; with equal ones, or newer ones on both sides, the lower id.
func snapshotWinner(self, other string, ours, theirs map[string]uint64) string {
	var oursNewer, theirsNewer bool
	for _, job := range slices.Sorted(maps.Keys(ours)) {
		switch {
		case ours[job] > theirs[job]:
			oursNewer = true
		case ours[job] < theirs[job]:
			theirsNewer = true
		}
	}
	for job, id := range theirs {
		if _, ok := ours[job]; !ok && id > 0 {
			theirsNewer = true
		}
	}
	switch {
	case oursNewer && !theirsNewer:
		return self
	case theirsNewer && !oursNewer:
		return other
	}
	return min(self, other)
}

// maybeYield asks the live peers, at most every split_poll, whether one
// of them leads too, and yields to it if the split rule says so; called
// by the membership loop on the leader.
func (v *liveView) maybeYield(alive []string) {
	c := v.c
	h := c.hb
	if h == nil || h.cancel == nil {
		return
	}
	now := time.Now()
	h.mu.Lock()
	if h.running || h.polling || now.Sub(h.polled) < h.cfg.SplitPoll {
		h.mu.Unlock()
		return
	}
	h.polling, h.polled = true, now
	h.mu.Unlock()
	v.wg.Add(1)
	go func() {
		defer v.wg.Done()
		defer func() {
			h.mu.Lock()
			h.polling = false
			h.mu.Unlock()
		}()
		ctx, cancel := v.stopCtx(10 * time.Second)
		defer cancel()
		for _, peer := range alive {
			if peer == c.cfg.Node {
				continue
			}
			w, err := c.peers.workerStatus(ctx, peer)
			if err != nil || w.Master != peer {
				continue
			}
			if c.yield(ctx, peer, w.Epoch, w.Checkpoints) {
				return
			}
		}
	}()
}

// yield settles a split with other, which leads too, has deployed or
// seen epochs up to epoch and has the newest snapshots theirs: when the
// rule makes other the leader, this node cancels its jobs and follows it.
// It reports whether it yielded.
func (c *clusterNode) yield(ctx context.Context, other string, epoch uint64, theirs map[string]uint64) bool {
	ours := c.latestCheckpoints()
	ourEpoch := c.highestEpoch()
	winner := splitWinner(splitLeader{id: c.cfg.Node, epoch: ourEpoch, latest: ours}, splitLeader{id: other, epoch: epoch, latest: theirs})
	log := c.log.With("other", other)
	if winner == c.cfg.Node {
		log.Warn("cluster: another node leads too; it yields to this one (a newer term, newer snapshots, or a lower id)",
			"our_epoch", ourEpoch, "its_epoch", epoch, "ours", ours, "theirs", theirs)
		return false
	}
	if !c.redeployMu.TryLock() {
		return false
	}
	defer c.redeployMu.Unlock()
	h := c.hb
	h.mu.Lock()
	if h.running || !c.isMaster() {
		h.mu.Unlock()
		return false
	}
	h.running = true
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		h.running = false
		h.mu.Unlock()
	}()
	c.handing.Store(true)
	defer c.handing.Store(false)
	start := time.Now()
	log.Warn("cluster: another node leads too; this node yields to it (its term is newer, its snapshots are newer, or its id lower): cancelling the jobs",
		"our_epoch", ourEpoch, "its_epoch", epoch, "ours", ours, "theirs", theirs)
	// Not in the middle of a takeover's start of the jobs (a retried
	// restart after a failed hand-back): it ends first, and finds this
	// node no longer leading on its next attempt.
	c.startMu.Lock()
	left := h.cancel(ctx)
	c.stepDown(other)
	c.startMu.Unlock()
	rec := cluster.Handback{At: start, From: c.cfg.Node, To: other, Epoch: c.highestEpoch(), Outcome: "yielded",
		Error: fmt.Sprintf("two leaders: this node's epoch %d and newest snapshots %v, %s's epoch %d and %v", ourEpoch, ours, other, epoch, theirs)}
	if left > 0 {
		rec.Error += fmt.Sprintf("; %d jobs not ended yet, cancelled again until they end", left)
		log.Warn("cluster: yield: jobs did not end when cancelled; they stay listed and are cancelled again", "jobs", left)
		c.lingerOn(log, left)
	}
	h.record(rec)
	log.Info("cluster: yielded; this node follows the other leader", "took", time.Since(start))
	return true
}

// lingerOn records n jobs cancelled by a yield that have not ended, and
// retries their cancellation with a backoff (as retryResume) until they
// all ended or the node stops; the jobs that ended are forgotten.
func (c *clusterNode) lingerOn(log *slog.Logger, n int) {
	h := c.hb
	h.mu.Lock()
	h.lingering = n
	if h.recancelling || h.recancel == nil {
		h.mu.Unlock()
		return
	}
	h.recancelling = true
	h.mu.Unlock()
	c.live.wg.Add(1)
	go func() {
		defer c.live.wg.Done()
		defer func() {
			h.mu.Lock()
			h.recancelling = false
			h.mu.Unlock()
		}()
		c.backoff(func(next time.Duration) bool {
			ctx, cancel := context.WithTimeout(context.Background(), h.cfg.ResumeBackoff)
			left := h.recancel(ctx)
			cancel()
			h.mu.Lock()
			h.lingering = left
			h.mu.Unlock()
			if left == 0 {
				log.Info("cluster: yield: every cancelled job ended")
				return true
			}
			log.Warn("cluster: yield: jobs still running after their cancellation; cancelling again", "jobs", left, "retry_in", next)
			return false
		})
	}()
}

// lingeringJobs returns how many jobs a yield cancelled still run.
func (h *handback) lingeringJobs() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lingering
}

// cancelJobs cancels every running job of the node and waits for each to
// end (or ctx). It returns how many had not ended: they are kept as
// lingering, for recancelJobs.
func (n *node) cancelJobs(ctx context.Context) int {
	var jobs, left []*job
	for _, j := range n.jobList() {
		if j.snapshot().Status == StatusRunning {
			// All at once: one job slow to end does not hold the others.
			j.cancel()
			jobs = append(jobs, j)
		}
	}
	for _, j := range jobs {
		select {
		case <-j.run.Done():
		case <-ctx.Done():
		}
		if !ended(j) {
			left = append(left, j)
		}
	}
	n.jobsMu.Lock()
	defer n.jobsMu.Unlock()
	n.lingering = append(n.lingering, left...)
	return len(left)
}

// recancelJobs cancels again the jobs cancelJobs left running, waits for
// them (or ctx), forgets the ones that ended and returns how many still
// run.
func (n *node) recancelJobs(ctx context.Context) int {
	n.jobsMu.RLock()
	jobs := slices.Clone(n.lingering)
	n.jobsMu.RUnlock()
	for _, j := range jobs {
		j.cancel()
	}
	for _, j := range jobs {
		select {
		case <-j.run.Done():
		case <-ctx.Done():
		}
	}
	n.jobsMu.Lock()
	defer n.jobsMu.Unlock()
	n.lingering = slices.DeleteFunc(n.lingering, ended)
	n.jobs = slices.DeleteFunc(n.jobs, func(j *job) bool {
		if !ended(j) || !slices.Contains(jobs, j) {
			return false
		}
		if n.byName[j.name] == j {
			delete(n.byName, j.name)
		}
		return true
	})
	return len(n.lingering)
}

// ended reports whether job j's run has returned.
func ended(j *job) bool {
	select {
	case <-j.run.Done():
		return true
	default:
		return false
	}
}
