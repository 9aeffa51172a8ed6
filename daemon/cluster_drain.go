package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/cluster"
	"github.com/edgedio/edged/snapshot"
)

// Drain and leave, and the guards of every rebalance, on the node that
// runs the job masters.
//
// Every rebalance (a join, edged cluster drain, edged cluster rebalance)
// goes through one queue: the cluster.RebalanceGate, polled by one loop
// (rebalancer.run). The gate holds what is queued while a failover runs
// (liveView.follow tells it), while a checkpoint triggered before the
// request is in progress (polled from the jobs' checkpoint histories), and
// for the damping interval after the previous rebalance; it batches joins
// over the settle delay. When it opens, the loop checks that the cluster
// has room for the new placement (a majority left once the drained nodes
// are gone, no node over its cluster.capacity) and refuses the batch with
// the reason otherwise; then it moves the subtasks by handover (or, when
// a job cannot make its moves while it runs, redeploys every job from a
// savepoint: cluster_handover.go), lets every drained node leave the
// jobs' running deployments, and asks it to leave the membership.

// rebalancePoll is how often the loop polls the gate.
const rebalancePoll = 50 * time.Millisecond

// rebalanceTimeout bounds a rebalance from its start.
const rebalanceTimeout = 2 * time.Minute

// drainCatchUp bounds the wait for a drained node's source splits to have
// read (and completed checkpoints to cover) what its ingest logs held when
// the drain started.
const drainCatchUp = 30 * time.Second

// rebalanceWaiter is one caller waiting for its queued rebalance.
type rebalanceWaiter struct {
	trigger cluster.Trigger
	node    string // the drained node (TriggerDrain)
	done    chan batchResult
}

// batchResult is what a batch tells its waiters: its error and the last
// rebalance it recorded (nil when it recorded none).
type batchResult struct {
	err error
	rec *cluster.Rebalance
}

// actionRecord is where a cluster action asked through the API finds the
// rebalance its batch recorded: ask fills it. Without it, the API could
// only take the newest record of the history, which may be another
// action's that ended meanwhile.
type actionRecord struct {
	mu     sync.Mutex
	filled bool
	rec    *cluster.Rebalance
}

type actionRecordKey struct{}

// withActionRecord returns ctx carrying r.
func withActionRecord(ctx context.Context, r *actionRecord) context.Context {
	return context.WithValue(ctx, actionRecordKey{}, r)
}

// fillActionRecord hands rec to the action record ctx carries, if any.
func fillActionRecord(ctx context.Context, rec *cluster.Rebalance) {
	if r, ok := ctx.Value(actionRecordKey{}).(*actionRecord); ok {
		r.mu.Lock()
		r.filled, r.rec = true, rec
		r.mu.Unlock()
	}
}

// get returns the record and whether ask filled it.
func (r *actionRecord) get() (*cluster.Rebalance, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rec, r.filled
}

// rebalancer queues rebalances behind the gate and runs them one at a
// time from its loop. Its gate is shared with liveView.follow (joins,
// failovers), under gateMu.
type rebalancer struct {
	clock clockwork.Clock
	log   *slog.Logger

	gateMu *sync.Mutex // guards gate and the fields below
	gate   *cluster.RebalanceGate
	// queuedAt is when the oldest request still queued was made; zero
	// when nothing is queued.
	queuedAt time.Time
	waiters  []*rebalanceWaiter
	waiting  string // why the gate held at the last poll
	// inBatch is set while a batch runs; batchRec is then the last
	// rebalance the batch recorded (clusterNode.recordRebalance).
	inBatch  bool
	batchRec *cluster.Rebalance
	// runningDrain are the nodes the running batch drains; joined are the
	// waiters that asked for one of them while it ran (awaitRunning).
	runningDrain []string
	joined       []*rebalanceWaiter

	// checkpointing reports whether a checkpoint triggered before since
	// is in progress in any job.
	checkpointing func(since time.Time) bool
	// exec runs a batch the gate let start and returns its record.
	exec func(ctx context.Context, s cluster.Start) error

	stop chan struct{}
	wg   sync.WaitGroup
}

// ask queues a rebalance for t (with node, for a drain) and waits for it
// to run, or for ctx to end; the request then stays queued and runs with
// the next batch.
func (b *rebalancer) ask(ctx context.Context, t cluster.Trigger, node string) error {
	w := &rebalanceWaiter{trigger: t, node: node, done: make(chan batchResult, 1)}
	b.gateMu.Lock()
	now := b.clock.Now()
	b.gate.Request(now, t, node)
	if b.queuedAt.IsZero() {
		b.queuedAt = now
	}
	b.waiters = append(b.waiters, w)
	b.gateMu.Unlock()
	select {
	case res := <-w.done:
		fillActionRecord(ctx, res.rec)
		return res.err
	case <-ctx.Done():
		b.gateMu.Lock()
		why := b.waiting
		b.waiters = slices.DeleteFunc(b.waiters, func(x *rebalanceWaiter) bool { return x == w })
		b.gateMu.Unlock()
		if why != "" {
			why = " (" + why + ")"
		}
		return fmt.Errorf("%w: the %s is still queued%s and runs when the gate opens", ctx.Err(), t, why)
	}
}

// awaitRunning waits, when the running batch drains node, for that batch
// to end and returns its error (ok true); ok is false when no running
// batch drains node. ctx ending gives up the wait: the drain runs on.
func (b *rebalancer) awaitRunning(ctx context.Context, node string) (ok bool, err error) {
	w := &rebalanceWaiter{trigger: cluster.TriggerDrain, node: node, done: make(chan batchResult, 1)}
	b.gateMu.Lock()
	if !b.inBatch || !slices.Contains(b.runningDrain, node) {
		b.gateMu.Unlock()
		return false, nil
	}
	b.joined = append(b.joined, w)
	b.gateMu.Unlock()
	select {
	case res := <-w.done:
		fillActionRecord(ctx, res.rec)
		return true, res.err
	case <-ctx.Done():
		b.gateMu.Lock()
		b.joined = slices.DeleteFunc(b.joined, func(x *rebalanceWaiter) bool { return x == w })
		b.gateMu.Unlock()
		return true, fmt.Errorf("%w: the drain of %q is in progress and goes on", ctx.Err(), node)
	}
}

// awaitDrain waits for the batch that drains node, when one runs (as
// awaitRunning) or is queued, to end and returns its error (ok true); ok
// is false when no drain of node runs or is queued. ctx ending gives up
// the wait: the drain goes on.
func (b *rebalancer) awaitDrain(ctx context.Context, node string) (ok bool, err error) {
	if ok, err := b.awaitRunning(ctx, node); ok {
		return true, err
	}
	w := &rebalanceWaiter{trigger: cluster.TriggerDrain, node: node, done: make(chan batchResult, 1)}
	b.gateMu.Lock()
	if !b.gate.DrainQueued(node) {
		running := b.inBatch && slices.Contains(b.runningDrain, node)
		b.gateMu.Unlock()
		if running {
			// Its batch started since awaitRunning looked.
			return b.awaitRunning(ctx, node)
		}
		return false, nil
	}
	// Answered with the queued drain's batch, as its own waiter is.
	b.waiters = append(b.waiters, w)
	b.gateMu.Unlock()
	select {
	case res := <-w.done:
		fillActionRecord(ctx, res.rec)
		return true, res.err
	case <-ctx.Done():
		b.gateMu.Lock()
		b.waiters = slices.DeleteFunc(b.waiters, func(x *rebalanceWaiter) bool { return x == w })
		b.gateMu.Unlock()
		return true, fmt.Errorf("%w: the drain of %q is queued and runs when the gate opens", ctx.Err(), node)
	}
}

// requested notes a join queued by liveView.follow (with gateMu held).
func (b *rebalancer) requestedLocked(now time.Time) {
	if b.queuedAt.IsZero() {
		b.queuedAt = now
	}
}

// step polls the gate once and, if it opens, runs the batch and tells its
// waiters. It returns whether a batch ran.
func (b *rebalancer) step(ctx context.Context) bool {
	b.gateMu.Lock()
	now := b.clock.Now()
	b.gate.Checkpoint(!b.queuedAt.IsZero() && b.checkpointing(b.queuedAt))
	s, ok, waiting := b.gate.Poll(now)
	if waiting != b.waiting && waiting != "" {
		b.log.Info("cluster: rebalance queued", "waiting", waiting)
	}
	b.waiting = waiting
	var ws []*rebalanceWaiter
	if ok {
		ws, b.waiters = b.waiters, nil
		b.queuedAt = time.Time{}
		b.inBatch, b.batchRec = true, nil
		b.runningDrain = s.Drain
	}
	b.gateMu.Unlock()
	if !ok {
		return false
	}
	err := b.exec(ctx, s)
	b.gateMu.Lock()
	b.gate.Done(b.clock.Now())
	rec := b.batchRec
	b.inBatch, b.batchRec = false, nil
	ws = append(ws, b.joined...)
	b.runningDrain, b.joined = nil, nil
	b.gateMu.Unlock()
	for _, w := range ws {
		w.done <- batchResult{err: err, rec: rec}
	}
	return true
}

// start starts the loop.
func (b *rebalancer) start() {
	b.wg.Add(1)
	go b.run()
}

// close stops the loop and waits for it (and a rebalance it runs).
func (b *rebalancer) close() {
	select {
	case <-b.stop:
		return
	default:
	}
	close(b.stop)
	b.wg.Wait()
}

func (b *rebalancer) run() {
	defer b.wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-b.stop
		cancel()
	}()
	t := b.clock.NewTicker(rebalancePoll)
	defer t.Stop()
	for {
		select {
		case <-b.stop:
			return
		case <-t.Chan():
			b.step(ctx)
		}
	}
}

// newRebalancer returns the rebalancer of c's job masters. It starts
// nothing.
func (c *clusterNode) newRebalancer() *rebalancer {
	v := c.live
	return &rebalancer{clock: clockwork.NewRealClock(), log: c.log, gateMu: &v.mu, gate: v.gate,
		checkpointing: c.checkpointing, exec: c.runRebalance, stop: make(chan struct{})}
}

// checkpointing reports whether a checkpoint triggered before since is in
// progress in any job: a rebalance asked meanwhile waits for it to end.
// Checkpoints triggered later do not hold it (they would starve it at a
// short interval); its savepoint runs beside them.
func (c *clusterNode) checkpointing(since time.Time) bool {
	for _, e := range c.executions() {
		r, _ := e.Runner()
		if r == nil {
			continue
		}
		if checkpointBefore(r.History(), since) {
			return true
		}
	}
	return false
}

// checkpointBefore reports whether hist has a checkpoint in progress that
// was triggered before since.
func checkpointBefore(hist []snapshot.Stats, since time.Time) bool {
	for _, s := range hist {
		if s.Status == snapshot.InProgress && s.Triggered.Before(since) {
			return true
		}
	}
	return false
}

// jobHome is a job's home placement (cluster_node.go's jobCluster) and
// which vertices are keyed.
type jobHome struct {
	placement map[actors.TaskKey]string
	keyed     map[string]bool
}

// setHome records the home placement of a job.
func (c *clusterNode) setHome(job *actors.Job, placement map[actors.TaskKey]string) {
	h := jobHome{placement: placement, keyed: map[string]bool{}}
	for _, v := range job.Vertices {
		if v.Keyed {
			h.keyed[v.UID] = true
		}
	}
	c.homesMu.Lock()
	defer c.homesMu.Unlock()
	if c.homes == nil {
		c.homes = map[string]jobHome{}
	}
	c.homes[job.Name] = h
}

func (c *clusterNode) jobHomes() map[string]jobHome {
	c.homesMu.Lock()
	defer c.homesMu.Unlock()
	out := make(map[string]jobHome, len(c.homes))
	for k, h := range c.homes {
		out[k] = h
	}
	return out
}

// roomCheck is what checkRoom decides on.
type roomCheck struct {
	size     int              // configured nodes
	alive    []string         // nodes alive now
	drained  []string         // nodes drained before
	draining []string         // nodes this rebalance drains
	master   string           // always placed
	capacity func(string) int // 0: no limit
	weight   func(string) int // placement weight; nil: 1 each
	homes    map[string]jobHome
}

// checkRoom decides whether the cluster has room for a rebalance: the
// nodes left once the draining ones are gone must be a majority of the
// configured ones, and the placement the redeployment would make (each
// subtask on its home node when that is placed, else spread by
// rendezvous hashing weighted by the nodes' cluster.weight, as
// liveView.update does) must put no more keyed subtasks on a node than its
// capacity. It returns that placement, by job, and its keyed subtasks per
// node, or an error wrapping cluster.ErrRefused or cluster.ErrOverCapacity
// with the reason.
func checkRoom(rc roomCheck) (map[string]int, map[string]map[actors.TaskKey]string, error) {
	var remaining []string
	for _, id := range rc.alive {
		if !slices.Contains(rc.draining, id) {
			remaining = append(remaining, id)
		}
	}
	if len(rc.draining) > 0 && !cluster.HasQuorum(len(remaining), rc.size) {
		return nil, nil, fmt.Errorf("%w: draining %v would leave %d of %d nodes (%v): no majority, nothing would run",
			cluster.ErrRefused, rc.draining, len(remaining), rc.size, remaining)
	}
	placed := map[string]bool{}
	var members []cluster.Member
	for _, id := range remaining {
		if id == rc.master || !slices.Contains(rc.drained, id) {
			placed[id] = true
			m := cluster.Member{ID: id}
			if rc.weight != nil {
				m.Capacity = rc.weight(id)
			}
			members = append(members, m)
		}
	}
	load := map[string]int{}
	placement := map[string]map[actors.TaskKey]string{}
	for _, job := range slices.Sorted(mapKeys(rc.homes)) {
		h := rc.homes[job]
		p := make(map[actors.TaskKey]string, len(h.placement))
		placement[job] = p
		var units []cluster.Unit
		for k, node := range h.placement {
			if !placed[node] {
				units = append(units, cluster.Unit(k.String()))
				continue
			}
			p[k] = node
		}
		moved, err := cluster.Place(members, units)
		if err != nil {
			return nil, nil, fmt.Errorf("%w: %w", cluster.ErrRefused, err)
		}
		for k, node := range h.placement {
			if !placed[node] {
				p[k] = moved[cluster.Unit(k.String())]
			}
		}
		for k, node := range p {
			if h.keyed[k.UID] {
				load[node]++
			}
		}
	}
	var over []string
	for _, id := range slices.Sorted(mapKeys(load)) {
		if capa := rc.capacity(id); capa > 0 && load[id] > capa {
			over = append(over, fmt.Sprintf("node %s would run %d keyed subtasks, its cluster.capacity is %d", id, load[id], capa))
		}
	}
	if len(over) > 0 {
		return load, placement, fmt.Errorf("%w: %s", cluster.ErrOverCapacity, strings.Join(over, "; "))
	}
	return load, placement, nil
}

func mapKeys[K comparable, V any](m map[K]V) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// room checks the cluster's room for a rebalance that drains draining and
// returns the placement it would make, by job.
func (c *clusterNode) room(draining []string) (map[string]map[actors.TaskKey]string, error) {
	v := c.live
	alive := v.alive()
	v.mu.Lock()
	var drained []string
	for id := range v.drained {
		drained = append(drained, id)
	}
	v.mu.Unlock()
	// A member running other pipelines gets no subtasks, as a drained one.
	for id := range v.otherPipelines() {
		drained = append(drained, id)
	}
	_, placement, err := checkRoom(roomCheck{size: len(c.cfg.Nodes()), alive: alive, drained: drained, draining: draining,
		master: c.leader(), capacity: c.cfg.CapacityOf, weight: c.cfg.WeightOf, homes: c.jobHomes()})
	return placement, err
}

// unchanged reports whether every job runs an attempt whose placement is
// placement already: a rebalance then has nothing to move (a restart
// after a failure placed a node that joined meanwhile, say, or a node
// drained or dead: the placement spreads its subtasks as the attempt
// running without it did). A chain runs where placement puts the first
// of its operators it names (targetOf), as a deployment places it.
func (c *clusterNode) unchanged(placement map[string]map[actors.TaskKey]string) bool {
	execs := c.executions()
	if len(execs) == 0 {
		return false
	}
	for _, e := range execs {
		r, _ := e.Runner()
		p, ok := placement[e.Name()]
		if r == nil || !ok {
			return false
		}
		for _, ch := range r.Plan().Chains {
			for sub := range ch.Head().Parallelism {
				if want, ok := targetOf(p, ch, sub); ok && want != r.NodeOf(ch.Head().UID, sub) {
					return false
				}
			}
		}
	}
	return true
}

// targetOf returns the node placement puts subtask sub of chain ch on:
// that of the chain's first operator it names, as actors places a
// chain. The placement places every operator on its own (the operators
// of a node that is absent may be spread over different nodes), but a
// chain runs where its first operator is placed.
func targetOf(placement map[actors.TaskKey]string, ch *actors.Chain, sub int) (string, bool) {
	for _, v := range ch.Vertices {
		if n, ok := placement[actors.TaskKey{UID: v.UID, Subtask: sub}]; ok {
			return n, true
		}
	}
	return "", false
}

// nothingMoved is the note of a rebalance that found every job on its
// placement already.
const nothingMoved = "every job runs on that placement already: nothing moved, nothing restarted"

// recordUnchanged records a rebalance that found every job on its
// placement already: done, no mode, nothing moved or restarted.
func (c *clusterNode) recordUnchanged(trigger cluster.Trigger) cluster.Rebalance {
	rec := cluster.Rebalance{At: time.Now(), Trigger: trigger, Outcome: cluster.RebalanceDone, PauseMS: map[string]float64{}, Note: nothingMoved}
	c.recordRebalance(rec)
	c.log.Info("cluster: rebalance: every job runs on that placement already; nothing moved, nothing restarted", "trigger", trigger)
	return rec
}

// triggerOf is the trigger a batch is recorded under: a drain, else a
// manual rebalance, else a join.
func triggerOf(s cluster.Start) cluster.Trigger {
	for _, t := range []cluster.Trigger{cluster.TriggerDrain, cluster.TriggerManual} {
		if slices.Contains(s.Triggers, t) {
			return t
		}
	}
	return cluster.TriggerJoin
}

// recordRebalance adds rec, recorded by the batch that runs, to the
// history; the batch's waiters are answered with the last one.
func (c *clusterNode) recordRebalance(rec cluster.Rebalance) {
	c.addRebalance(rec, true)
}

// addRebalance adds rec to the history; of the batch that runs, when
// ofBatch (a drain refused at once, before it is queued, is of none).
func (c *clusterNode) addRebalance(rec cluster.Rebalance, ofBatch bool) {
	c.tally.add(rec)
	v := c.live
	v.mu.Lock()
	defer v.mu.Unlock()
	v.nRebalances++
	v.rebalances = lastN(append(v.rebalances, rec), 10)
	if b := c.rb; ofBatch && b != nil && b.gateMu == &v.mu && b.inBatch {
		r := rec
		b.batchRec = &r
	}
}

// runRebalance runs a batch the gate let start: it checks the room, marks
// the drained nodes, waits for their ingest logs to be read, moves every
// job to the new placement (rebalanceJobs: by handover, else by
// redeploying from a savepoint), and asks the drained nodes to leave.
func (c *clusterNode) runRebalance(ctx context.Context, s cluster.Start) error {
	ctx, cancel := context.WithTimeout(ctx, rebalanceTimeout)
	defer cancel()
	v := c.live
	trigger := triggerOf(s)
	defer func() {
		v.mu.Lock()
		v.joining = map[string]bool{}
		v.mu.Unlock()
	}()
	var draining []string
	v.mu.Lock()
	for _, id := range s.Drain {
		if !v.drained[id] {
			draining = append(draining, id)
		}
	}
	v.mu.Unlock()
	placement, err := c.room(draining)
	if err != nil {
		c.recordRebalance(cluster.Rebalance{At: time.Now(), Trigger: trigger, Outcome: cluster.RebalanceRefused, Error: err.Error()})
		c.log.Warn("cluster: rebalance refused", "trigger", trigger, "draining", draining, "err", err)
		return err
	}
	if len(draining) == 0 && c.unchanged(placement) {
		c.recordUnchanged(trigger)
		return nil
	}
	v.mu.Lock()
	if v.drained == nil {
		v.drained = map[string]bool{}
	}
	for _, id := range draining {
		v.drained[id] = true
	}
	v.mu.Unlock()
	hosts := c.inDeployment
	if c.hostsFn != nil {
		hosts = c.hostsFn
	}
	if onlyDrains(s) && len(draining) > 0 && !slices.ContainsFunc(draining, hosts) {
		// No running attempt of a job has the drained nodes in its
		// deployment (they host none of its subtasks, or the jobs
		// ended or wait to restart, which places nothing on them now):
		// nothing to hand over, no ingest log anyone would read.
		v.mu.Lock()
		if v.deployed != nil {
			v.deployed = slices.DeleteFunc(slices.Clone(v.deployed), func(id string) bool { return slices.Contains(draining, id) })
		}
		v.mu.Unlock()
		c.recordRebalance(cluster.Rebalance{At: time.Now(), Trigger: trigger, Outcome: cluster.RebalanceDone, PauseMS: map[string]float64{}, Note: nothingHosted})
		c.log.Info("cluster: drain: the drained nodes are in no running deployment; nothing to hand over, no ingest log to wait for", "draining", draining)
	} else {
		for _, id := range draining {
			if slices.Contains(v.alive(), id) {
				c.waitIngest(ctx, id, draining)
			}
		}
		if len(draining) > 0 {
			// A node that died during the wait may have taken the room the
			// drain had when it started: check again, with the nodes alive now.
			if placement, err = c.room(draining); err != nil {
				return c.abandonDrain(trigger, draining, fmt.Errorf("%w (the room the drain had when it started is gone; alive now: %v)", err, v.alive()))
			}
		}
		reason := fmt.Sprintf("rebalance (%v)", s.Triggers)
		if len(draining) > 0 {
			reason = fmt.Sprintf("drain of %v", draining)
		}
		rec, err := c.rebalanceJobs(ctx, trigger, reason, placement, draining)
		if rec.Outcome == cluster.RebalanceAborted {
			// Nothing moved: the drained nodes keep their subtasks.
			v.mu.Lock()
			for _, id := range draining {
				delete(v.drained, id)
			}
			v.mu.Unlock()
			return err
		}
		if err != nil {
			return err
		}
	}
	if err := c.drainRoomLost(draining); err != nil {
		// A node died while the subtasks moved: leaving now would take
		// the majority with it.
		return c.abandonDrain(trigger, draining, err)
	}
	for _, id := range s.Drain {
		if !slices.Contains(v.alive(), id) {
			continue
		}
		if lerr := c.peers.leave(ctx, id); lerr != nil {
			if c.declaredDead(ctx, id) {
				// It crashed before the drain (its death not yet
				// declared when the drain began): nothing to leave.
				c.log.Info("cluster: drained node is dead; it needs no leave", "drained", id, "err", lerr)
				continue
			}
			c.log.Warn("cluster: drained node did not leave the membership", "drained", id, "err", lerr)
			return fmt.Errorf("node %q drained, but it did not leave the membership: %w", id, lerr)
		}
		c.log.Info("cluster: drained node left the membership", "drained", id)
	}
	return nil
}

// declaredDead reports whether the membership declares node dead (it is
// no longer among the live nodes) within one failure detection of the
// profile: a drained node whose leave call failed because it had crashed
// just before or during its drain, not yet declared dead then. A node
// that answers again meanwhile (restarted at once) stays alive.
func (c *clusterNode) declaredDead(ctx context.Context, node string) bool {
	deadline := time.Now().Add(restartGrace(c.cfg.Profile) / 3)
	for {
		if !slices.Contains(c.live.alive(), node) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// nothingHosted is the note of a drain whose nodes were in no running
// deployment.
const nothingHosted = "the drained nodes were in no running deployment: nothing to hand over, nothing moved"

// onlyDrains reports whether the batch s holds drains only (no join or
// manual rebalance, which may move other subtasks).
func onlyDrains(s cluster.Start) bool {
	for _, t := range s.Triggers {
		if t != cluster.TriggerDrain {
			return false
		}
	}
	return len(s.Triggers) > 0
}

// inDeployment reports whether node may host subtasks of a job: it is in
// the deployment of a job's running attempt, or a job is between attempts
// (starting, or restarting after a failure) and node was in the latest
// deployment, which that attempt may yet be placed like. A job that
// ended (finished, failed for good, stopped or cancelled) hosts nothing.
func (c *clusterNode) inDeployment(node string) bool {
	v := c.live
	v.mu.Lock()
	deployed := slices.Contains(v.deployed, node)
	v.mu.Unlock()
	for _, e := range c.executions() {
		select {
		case <-e.Ended():
			continue
		default:
		}
		r, _ := e.Runner()
		if r == nil {
			if deployed {
				return true
			}
			continue
		}
		select {
		case <-r.Started():
			if slices.Contains(r.Nodes(), node) {
				return true
			}
		default:
			// Deploying: placed before the node was marked drained,
			// perhaps.
			if deployed {
				return true
			}
		}
	}
	return false
}

// readsOn returns the jobs whose running attempt has node in its
// deployment: the pipelines whose source split there reads its ingest
// log.
func (c *clusterNode) readsOn(node string) map[string]bool {
	out := map[string]bool{}
	for _, e := range c.executions() {
		r, _ := e.Runner()
		if r != nil && slices.Contains(r.Nodes(), node) {
			out[e.Name()] = true
		}
	}
	return out
}

// drainRoomLost returns why draining can no longer go on, if it cannot:
// the live nodes but the draining ones are no majority of the configured
// size any more (a node died during the drain).
func (c *clusterNode) drainRoomLost(draining []string) error {
	if len(draining) == 0 {
		return nil
	}
	var remaining []string
	for _, id := range c.live.alive() {
		if !slices.Contains(draining, id) {
			remaining = append(remaining, id)
		}
	}
	size := len(c.cfg.Nodes())
	if cluster.HasQuorum(len(remaining), size) {
		return nil
	}
	return fmt.Errorf("%w: a node died during the drain: draining %v would leave %d of %d nodes (%v): no majority, nothing would run",
		cluster.ErrRefused, draining, len(remaining), size, remaining)
}

// abandonDrain ends a drain that lost its room (why): the draining nodes
// are undrained and stay, the refusal is recorded, and a rebalance is
// queued that gives them their subtasks back (the failover of the node
// that died placed none on them, as they were being drained). It
// returns why.
func (c *clusterNode) abandonDrain(trigger cluster.Trigger, draining []string, why error) error {
	v := c.live
	now := time.Now()
	c.recordRebalance(cluster.Rebalance{At: now, Trigger: trigger, Outcome: cluster.RebalanceRefused, Error: why.Error()})
	c.log.Warn("cluster: drain abandoned; the nodes stay and get their subtasks back", "draining", draining, "err", why)
	v.mu.Lock() // the rebalancer's gateMu too
	for _, id := range draining {
		delete(v.drained, id)
	}
	v.gate.Request(now, cluster.TriggerManual, "")
	c.rb.requestedLocked(now)
	v.mu.Unlock()
	return why
}

// waitIngest waits (at most drainCatchUp) until completed checkpoints
// cover what node's ingest logs held when the drain started, so that the
// savepoint after it leaves nothing of them unread: once the node's split
// runs elsewhere it reads nothing until the node is back. It waits only
// for the logs of the jobs whose running attempt has node in its
// deployment (readsOn): no other log is released while it waits. It ends
// early when the drain of draining loses its room (drainRoomLost).
func (c *clusterNode) waitIngest(ctx context.Context, node string, draining []string) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, drainCatchUp)
	defer cancel()
	first, err := c.peers.ingest(ctx, node)
	if err != nil {
		c.log.Warn("cluster: drain: the node's ingest logs are unknown; not waiting for them", "drained", node, "err", err)
		return
	}
	// Only the logs that a running attempt reads on node: a pipeline no
	// job of the masters runs there (another pipeline of the node's, a
	// job that ended or waits to restart) releases nothing, however long
	// the drain waits.
	reading := c.readsOn(node)
	target := map[string]uint64{}
	var unread []string
	for _, p := range first.Pipelines {
		if !reading[p.Pipeline] {
			if p.ReleasedOffset < p.NextOffset {
				unread = append(unread, p.Pipeline)
			}
			continue
		}
		target[p.Pipeline] = p.NextOffset
	}
	if len(unread) > 0 {
		c.log.Info("cluster: drain: not waiting for the ingest logs of pipelines no running attempt reads on the node; they wait on its disk until it is back",
			"drained", node, "pipelines", unread)
	}
	if len(target) == 0 {
		c.log.Info("cluster: drain: no ingest log of the node to wait for", "drained", node)
		return
	}
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		l, err := c.peers.ingest(ctx, node)
		if err == nil && ingestCovered(l, target) {
			c.log.Info("cluster: drain: the node's ingest logs are read and checkpointed", "drained", node, "offsets", target, "took", time.Since(start))
			return
		}
		if c.drainRoomLost(draining) != nil {
			return
		}
		select {
		case <-ctx.Done():
			c.log.Warn("cluster: drain: the node's ingest logs still hold records no checkpoint covers; they wait on its disk until it is back",
				"drained", node, "offsets", target, "err", err, "took", time.Since(start))
			return
		case <-t.C:
		}
	}
}

// ingestCovered reports whether every log of l was released up to its
// offset in target.
func ingestCovered(l IngestList, target map[string]uint64) bool {
	for _, p := range l.Pipelines {
		if off, ok := target[p.Pipeline]; ok && p.ReleasedOffset < off {
			return false
		}
	}
	return true
}

// ingest reads node's GET /ingest.
func (p *peerClient) ingest(ctx context.Context, node string) (IngestList, error) {
	var l IngestList
	resp, err := p.do(ctx, http.MethodGet, node, "/ingest", nil, nil)
	if err != nil {
		return l, err
	}
	defer resp.Body.Close()
	return l, json.NewDecoder(io.LimitReader(resp.Body, maxPeerAnswer)).Decode(&l)
}

// leave asks a drained node to leave the membership.
func (p *peerClient) leave(ctx context.Context, node string) error {
	resp, err := p.do(ctx, http.MethodPost, node, "/cluster/leave", nil, nil)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// drain asks the job masters' node to drain node (this one).
func (p *peerClient) drain(ctx context.Context, master, node string) (ClusterActionResult, error) {
	var r ClusterActionResult
	resp, err := p.do(ctx, http.MethodPost, master, "/cluster/drain/"+url.PathEscape(node), nil, nil)
	if err != nil {
		return r, err
	}
	defer resp.Body.Close()
	return r, json.NewDecoder(io.LimitReader(resp.Body, maxPeerAnswer)).Decode(&r)
}

// Drain moves every subtask off node and then lets it leave the membership
// (cluster.StatusProvider). The drain is queued behind the gate (a
// checkpoint or failover in progress, the damping interval), refused when
// the others would not keep a majority or a node would go over its
// cluster.capacity, and waits for the node's ingest logs to be read
// before the savepoint. A drained node gets no subtasks until it is
// undrained (Undrain) or restarts (it rejoins the membership and is moved
// in like any join) or, without cluster.gossip, until the master
// restarts.
func (c *clusterNode) Drain(ctx context.Context, node string) error {
	if !slices.Contains(c.cfg.Nodes(), node) {
		return fmt.Errorf("%w: %q is not a node of the cluster %v", cluster.ErrUnknownNode, node, c.cfg.Nodes())
	}
	if !c.isMaster() {
		return fmt.Errorf("%w: node %q does not run the job masters; ask node %q", cluster.ErrRefused, c.cfg.Node, c.leader())
	}
	if node == c.cfg.Node {
		return fmt.Errorf("%w: node %q runs the job masters and cannot be drained", cluster.ErrRefused, node)
	}
	v := c.live
	v.mu.Lock()
	already := v.drained[node]
	v.mu.Unlock()
	if already {
		// A drain of the node in progress: its answer is that drain's
		// outcome, once it ends (a drain asked again, or the node's own
		// SIGTERM, must not answer "drained" while its subtasks move).
		if ok, err := c.rb.awaitRunning(ctx, node); ok {
			return err
		}
		c.log.Info("cluster: node already drained", "drained", node)
		return nil
	}
	if _, err := c.room([]string{node}); err != nil {
		c.addRebalance(cluster.Rebalance{At: time.Now(), Trigger: cluster.TriggerDrain, Outcome: cluster.RebalanceRefused, Error: err.Error()}, false)
		c.log.Warn("cluster: drain refused", "drained", node, "err", err)
		return err
	}
	return c.rb.ask(ctx, cluster.TriggerDrain, node)
}

// Rebalance redeploys every job on the live, undrained nodes
// (cluster.StatusProvider), queued behind the gate; refused when a node
// would go over its cluster.capacity.
func (c *clusterNode) Rebalance(ctx context.Context) error {
	if !c.isMaster() {
		return fmt.Errorf("%w: node %q does not run the job masters; ask node %q", cluster.ErrRefused, c.cfg.Node, c.leader())
	}
	return c.rb.ask(ctx, cluster.TriggerManual, "")
}

// sawGone records the drained nodes that evs show gone (failed or left)
// as left, also when the same batch shows them back: a node restarted
// before the gossip saw its old run die comes back as "failed, joined"
// at once, and is never missing from the live nodes the loop's step
// reads. undrainReturnedLocked then moves it in as a join.
func (v *liveView) sawGone(evs []cluster.Event) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, e := range evs {
		if (e.Kind == cluster.MemberFailed || e.Kind == cluster.MemberLeft) && v.drained[e.Node.ID] {
			if v.left == nil {
				v.left = map[string]bool{}
			}
			v.left[e.Node.ID] = true
		}
	}
}

// undrainReturnedLocked ends the drain of every drained node that left the
// membership and is alive again (it restarted): the caller then sees it as
// a join. With v.mu held.
func (v *liveView) undrainReturnedLocked(alive []string) {
	for id := range v.drained {
		switch {
		case !slices.Contains(alive, id):
			if v.left == nil {
				v.left = map[string]bool{}
			}
			v.left[id] = true
		case v.left[id]:
			delete(v.drained, id)
			delete(v.left, id)
			v.c.log.Info("cluster: a drained node is back; it is moved in like a join", "returned", id)
		}
	}
}

// handleLeave lets a drained worker leave the membership: it stops what
// it still hosts (the redeployment placed nothing on it) and leaves the
// gossip gracefully; it keeps serving its API until it is stopped.
func (c *clusterNode) handleLeave(w http.ResponseWriter, r *http.Request) {
	if c.isMaster() {
		clusterError(w, http.StatusConflict, fmt.Errorf("%w: node %q runs the job masters and does not leave", cluster.ErrRefused, c.cfg.Node))
		return
	}
	c.leave()
	writeJSON(w, http.StatusOK, map[string]any{"node": c.cfg.Node, "left": true})
}

// leave stops the node's hosts and leaves the membership, once until it
// rejoins (cluster_undrain.go).
func (c *clusterNode) leave() {
	if !c.live.markOut() {
		return
	}
	if c.pauseIngest != nil {
		// Readings acknowledged here now would wait on this disk, read
		// by nobody, until the node is back: its devices keep them.
		c.pauseIngest(true)
	}
	n := 0
	if c.worker != nil {
		n = c.worker.Evict()
	}
	c.live.stopGossip()
	c.log.Info("cluster: drained; this node left the membership and takes no work until it is undrained or restarts", "hosts_stopped", n)
}

// drainSelf asks the job masters to drain this worker before it stops
// (SIGTERM): they do so when the others keep a majority and have the
// capacity; otherwise the node stops as it would without (its subtasks
// fail over, or wait for it). Bounded by timeout.
func (c *clusterNode) drainSelf(ctx context.Context, timeout time.Duration) {
	if c.isMaster() {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	c.log.Info("cluster: stopping: asking the job masters to drain this node first", "master", c.leader())
	r, err := c.peers.drain(ctx, c.leader(), c.cfg.Node)
	var ae *APIError
	switch {
	case err == nil:
		moved, waited := 0, "the handover of its subtasks"
		if r.Rebalance != nil {
			moved = r.Rebalance.MovedKeyGroups
			if r.Rebalance.Note != "" {
				waited = r.Rebalance.Note
			}
		} else {
			waited = "nothing: the node was drained already"
		}
		c.log.Info("cluster: drained before stopping", "moved_key_groups", moved, "waited_for", waited, "took", time.Since(start))
		c.leave()
	case errors.As(err, &ae) && ae.StatusCode == http.StatusConflict:
		c.log.Warn("cluster: not drained before stopping (the job masters refused); stopping without", "err", err, "took", time.Since(start))
	default:
		c.log.Warn("cluster: not drained before stopping; stopping without", "err", err, "took", time.Since(start))
	}
}
