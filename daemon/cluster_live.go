package daemon

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/cluster"
)

// liveView is the node's view of which configured nodes are alive, from
// gossip (cluster.gossip), and what the job masters last deployed on.
type liveView struct {
	c *clusterNode
	// m is the membership of the node's current (or, once it left, last)
	// gossip run; nil without cluster.gossip, when every configured node
	// counts as alive. Replaced by rejoin.
	m  atomic.Pointer[cluster.Membership]
	mu sync.Mutex // guards the fields below
	// drained are nodes drained by the operator: they get no subtasks;
	// left are those of them seen gone since (cluster_drain.go).
	drained, left map[string]bool
	// failovers and rebalances are the latest of each, newest last.
	failovers               []cluster.Failover
	rebalances              []cluster.Rebalance
	nFailovers, nRebalances int64
	// pending are the failovers under way, oldest first: a death seen
	// while one is pending is a failover of its own, recorded beside it.
	pending []*pendingChange
	// gate batches joins and damps rebalance storms; joining are the
	// nodes asked of it.
	gate    *cluster.RebalanceGate
	joining map[string]bool
	// warned are the members (id/boot) whose pipelines fingerprint was
	// found to differ from this node's.
	warned map[string]bool
	// deployed are the nodes of the latest deployment (master only).
	deployed []string
	// survivors, while a failover's deployment is not made yet (deployed
	// nil), are the nodes of the latest deployment that outlived it: one
	// of them dying meanwhile is a failover too.
	survivors []string
	// aliveFn, when set, gives the live nodes in place of the membership
	// (the failover scripts declare nodes dead with it).
	aliveFn func() []string
	// reachableFn, when set, gives the reachable nodes in place of the
	// membership (the failover scripts cut a node off with it).
	reachableFn func() []string
	// lastSeenFn, when set, gives a node's last sign of life in place of
	// the membership's (the failover scripts' record of a kill).
	lastSeenFn func(id string) (time.Time, bool)
	// othersFn, when set, gives the members running other pipelines in
	// place of the membership's fingerprints (otherPipelines).
	othersFn func() map[string]bool

	// gossipMu serialises stopGossip and rejoin, and guards out, stop
	// and stopOnce: stop ends the gossip run (its loop and what waits on
	// the view); rejoin replaces stop and stopOnce once the loop of the
	// run it ends has returned.
	gossipMu sync.Mutex
	// stopMu guards replacing stop (Rejoin, under gossipMu too) against
	// stopCtx reading it.
	stopMu sync.Mutex
	// out is set while the node is out of the membership: it left it
	// (drained) and has not rejoined. outNow mirrors it for Status, which
	// must not wait for gossipMu.
	out      bool
	outNow   atomic.Bool
	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
}

// membership returns the membership of the node's current or last gossip
// run; nil without cluster.gossip.
func (v *liveView) membership() *cluster.Membership { return v.m.Load() }

// startGossip starts the node's membership and the loop that follows it.
func (c *clusterNode) startGossip() error {
	host, port, err := net.SplitHostPort(c.cfg.Gossip)
	if err != nil {
		return fmt.Errorf("cluster.gossip: %w", err)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return fmt.Errorf("cluster.gossip: port %q: %w", port, err)
	}
	var peers []string
	for _, peer := range c.cfg.Peers {
		peers = append(peers, peer.Gossip)
	}
	key, err := c.cfg.GossipKey()
	if err != nil {
		return fmt.Errorf("cluster.secret_key: %w", err)
	}
	m, err := cluster.NewMembership(cluster.MembershipConfig{
		Meta:     cluster.Meta{ID: c.cfg.Node, Transport: c.tr.Addr(), Capacity: c.cfg.WeightOf(c.cfg.Node), Fingerprint: c.fingerprint, Nodes: c.nodesDigest},
		BindAddr: host, BindPort: p, Peers: peers, Logger: c.log,
		SecretKey: key, Profile: cluster.Profile(c.cfg.Profile),
	})
	if err != nil {
		return err
	}
	if err := m.Start(); err != nil {
		return err
	}
	c.live.m.Store(m)
	c.live.wg.Add(1)
	go c.live.loop(m, c.live.stop, peers, c.executions)
	c.lead.mu.Lock()
	fresh := !c.lead.before
	c.lead.mu.Unlock()
	if fresh {
		// The node took part in no deployment: it asks its peers
		// whether the cluster ran before (cluster_history.go).
		stop := c.live.stop
		c.live.wg.Go(func() { c.adoptLoop(stop, c.leadership().RestartPoll) })
	}
	return nil
}

// stopGossip leaves the cluster gracefully and stops the loop.
func (v *liveView) stopGossip() {
	v.gossipMu.Lock()
	defer v.gossipMu.Unlock()
	m := v.membership()
	if m == nil {
		return
	}
	v.stopOnce.Do(func() {
		close(v.stop)
		v.wg.Wait()
		if err := m.Leave(time.Second); err != nil {
			v.c.log.Warn("cluster: leave", "err", err)
		}
		if err := m.Shutdown(); err != nil {
			v.c.log.Warn("cluster: gossip shutdown", "err", err)
		}
	})
}

// alive returns the configured nodes the node sees alive, itself
// included, in id order.
func (v *liveView) alive() []string {
	if v.aliveFn != nil {
		return v.aliveFn()
	}
	mem := v.membership()
	if mem == nil {
		return v.c.cfg.Nodes()
	}
	return v.configured(mem.Members())
}

// alike returns the live nodes, itself included, less the members that
// run other pipelines (otherPipelines) and the peers that said they are
// leaving: the nodes that keep replicas of this node's checkpoints. A
// member whose config names none of the jobs would refuse their state
// files and metadata (ErrUnknownJob), and every checkpoint would be
// declined for it; a leaving peer (a drained node that leaves, a node
// that stops) is about to stop answering.
func (v *liveView) alike() []string {
	alive := v.alive()
	others := v.otherPipelines()
	leaving := v.leaving()
	if len(others) == 0 && len(leaving) == 0 {
		return alive
	}
	return slices.DeleteFunc(slices.Clone(alive), func(id string) bool {
		return others[id] || id != v.c.cfg.Node && slices.Contains(leaving, id)
	})
}

// leaving returns the members that said they are leaving
// (cluster.Membership.Leaving).
func (v *liveView) leaving() []string {
	if v.aliveFn != nil {
		return nil
	}
	mem := v.membership()
	if mem == nil {
		return nil
	}
	return mem.Leaving()
}

// reachable returns the configured nodes the node reaches, itself
// included, in id order: the live ones less those whose death memberlist
// is confirming (cluster.Membership.Reachable).
func (v *liveView) reachable() []string {
	if v.reachableFn != nil {
		return v.reachableFn()
	}
	mem := v.membership()
	if mem == nil {
		return v.alive()
	}
	return v.configured(mem.Reachable())
}

// configured returns the configured nodes among members, the node itself
// included, in id order.
func (v *liveView) configured(members []cluster.Meta) []string {
	seen := map[string]bool{v.c.cfg.Node: true}
	for _, m := range members {
		seen[m.ID] = true
	}
	var out []string
	for _, id := range v.c.cfg.Nodes() {
		if seen[id] {
			out = append(out, id)
		}
	}
	return out
}

// stopWithoutMajority ends the running attempt of every job of the
// master's node once it reaches no majority of the configured nodes, as
// a worker stops its tasks (see loop): cut off by a partition, it stops
// before the majority confirms its death and one of them takes over.
// update deploys nothing until it reaches a majority again. It reports
// whether it ended an attempt.
func (v *liveView) stopWithoutMajority(reachable []string, jobs func() []*actors.Execution) bool {
	size := len(v.c.cfg.Nodes())
	if cluster.HasQuorum(len(reachable), size) {
		return false
	}
	stopped := false
	for _, e := range jobs() {
		if r, _ := e.Runner(); r != nil {
			e.Redeploy(fmt.Sprintf("node %q reaches %d of %d nodes (%v): no majority", v.c.cfg.Node, len(reachable), size, reachable))
			stopped = true
		}
	}
	if stopped {
		v.c.log.Warn("cluster: this node sees no majority; its jobs stopped", "reachable", reachable, "size", size)
	}
	return stopped
}

// loop follows the membership: it joins the peers until every configured
// node is seen; on the master, a change of the live set that the latest
// deployment does not match redeploys every job (a dead node's subtasks
// move to the live ones, a node that came back gets its own again); on a
// worker, and on the master, losing the majority stops every hosted task
// (and the master's jobs). m is the gossip run's membership, stop its end.
func (v *liveView) loop(m *cluster.Membership, stop <-chan struct{}, peers []string, jobs func() []*actors.Execution) {
	defer v.wg.Done()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	size := len(v.c.cfg.Nodes())
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
			if len(m.Members()) < size {
				// A node that started before the others, or a side of a
				// healed partition: join again through every peer, without
				// waiting for peers that do not answer.
				m.Rejoin(peers...)
			}
		case <-m.Events():
			evs := m.Drain()
			var what []string
			for _, e := range evs {
				what = append(what, e.Node.ID+" "+e.Kind.String())
			}
			v.c.log.Info("cluster membership changed", "events", strings.Join(what, ", "), "alive", v.alive())
			v.sawGone(evs)
			v.checkFingerprints()
		}
		v.step(jobs)
	}
}

// step is the loop's work after each membership event or tick. On the
// master: its jobs stop while it reaches no majority, and it follows the
// live nodes, hands the leadership back and settles a split. On a
// worker: its hosted tasks stop while it reaches no majority; else it
// takes over from a dead leader when the rule says so. Peers memberlist
// declared dead count as gone here before their death is confirmed: the
// majority places this node's work elsewhere only once it confirmed this
// node's, so a node cut off stops first.
func (v *liveView) step(jobs func() []*actors.Execution) {
	alive := v.alive()
	reachable := v.reachable()
	size := len(v.c.cfg.Nodes())
	switch w := v.c.worker; {
	case v.c.isMaster():
		if !v.c.handing.Load() {
			v.stopWithoutMajority(reachable, jobs)
			v.follow(alive, jobs)
			v.maybeHandBack(alive)
			v.maybeYield(alive)
		}
	case w != nil && !cluster.HasQuorum(len(reachable), size):
		// A leader's absence is timed only while a majority is up.
		v.c.lead.mu.Lock()
		v.c.lead.absent.since = time.Time{}
		v.c.lead.mu.Unlock()
		if n := w.Evict(); n > 0 {
			v.c.log.Warn("cluster: this node sees no majority; its tasks stopped", "alive", alive, "reachable", reachable, "size", size)
		}
	default:
		v.maybeTakeOver(alive)
	}
}

// update returns the nodes and placement of the next deployment (for
// actors.Cluster.Update): the live nodes, if they are a majority; each
// subtask on its home node (as with static placement) when that is
// alive, else on a live node chosen by rendezvous hashing weighted by the
// nodes' cluster.weight.
func (v *liveView) update(home *actors.Cluster) ([]actors.Node, map[actors.TaskKey]string, error) {
	alive := v.alive()
	size := len(v.c.cfg.Nodes())
	if !cluster.HasQuorum(len(alive), size) {
		return nil, nil, fmt.Errorf("node %q sees %d of %d nodes (%v): no majority, nothing runs", v.c.cfg.Node, len(alive), size, alive)
	}
	if r := v.reachable(); !cluster.HasQuorum(len(r), size) {
		return nil, nil, fmt.Errorf("node %q reaches %d of %d nodes (%v): no majority, nothing runs", v.c.cfg.Node, len(r), size, r)
	}
	start := time.Now()
	seen := alive
	live := map[string]bool{}
	var members []cluster.Member
	var nodes []actors.Node
	alive = v.placed(alive)
	for _, id := range masterFirst(alive, v.c.cfg.Node) {
		live[id] = true
		members = append(members, cluster.Member{ID: id, Capacity: v.c.cfg.WeightOf(id)})
		n := actors.Node{ID: id}
		if id == v.c.cfg.Node {
			n.Network = v.c.net
		}
		nodes = append(nodes, n)
	}
	placement := make(map[actors.TaskKey]string, len(home.Placement))
	var units []cluster.Unit
	for k, node := range home.Placement {
		if live[node] {
			placement[k] = node
			continue
		}
		units = append(units, cluster.Unit(k.String()))
	}
	moved, err := cluster.Place(members, units)
	if err != nil {
		return nil, nil, err
	}
	for k, node := range home.Placement {
		if !live[node] {
			placement[k] = moved[cluster.Unit(k.String())]
		}
	}
	v.mu.Lock()
	// A job that restarted on its own (its tasks on a dead node failed)
	// once the membership declared the node dead, before the loop's step
	// (follow) saw it, deploys here without the dead node: the failover
	// begins here, so that it is recorded all the same, also while an
	// earlier one is pending.
	var p *pendingChange
	dead := v.deadLocked(seen)
	if len(dead) > 0 {
		p = v.beginFailoverLocked(start, dead)
	}
	v.deployed, v.survivors = alive, nil
	// The placement that redeploys them: that of every failover under
	// way.
	for _, q := range v.pending {
		q.placementMS = msSince(start)
	}
	v.mu.Unlock()
	if len(units) > 0 {
		v.c.log.Warn("cluster: placing the subtasks of dead nodes on live ones", "alive", alive, "moved", len(units))
	}
	if p != nil {
		v.failOver(p, dead, seen, v.c.executions())
	}
	return nodes, placement, nil
}

// deadLocked returns the nodes of the latest deployment that are not
// among alive: dead since it was made. Between a failover's start and
// its deployment, those of the deployment before that outlived it.
func (v *liveView) deadLocked(alive []string) []string {
	from := v.deployed
	if from == nil {
		from = v.survivors
	}
	var dead []string
	for _, id := range from {
		if !slices.Contains(alive, id) {
			dead = append(dead, id)
		}
	}
	return dead
}

// beginFailoverLocked records the failover from the nodes dead, seen
// dead at now, as under way, beside any earlier one still pending: the
// next deployment's placement time goes to it, and the rebalance gate
// holds joins until every failover is done.
func (v *liveView) beginFailoverLocked(now time.Time, dead []string) *pendingChange {
	p := &pendingChange{at: now, dead: strings.Join(dead, ","), detectionMS: v.detectionMS(now, dead...)}
	v.pending = append(v.pending, p)
	v.gate.Failover(true)
	return p
}

// failOver redeploys every job of execs on the live nodes from its
// latest checkpoint (a job between two attempts takes its next one) and
// records the failover p from dead once every job runs again.
func (v *liveView) failOver(p *pendingChange, dead, alive []string, execs []*actors.Execution) {
	v.c.log.Warn("cluster: deployed nodes died; failing over to the live ones", "dead", dead, "alive", alive)
	old := map[*actors.Execution]*actors.Runner{}
	for _, e := range execs {
		old[e], _ = e.Runner()
		e.Redeploy(fmt.Sprintf("nodes %v died", dead))
	}
	v.wg.Add(1)
	go v.recordFailover(p, execs, old)
}

// pendingChange is a failover the next deployment makes.
type pendingChange struct {
	at          time.Time
	dead        string // the nodes that died, comma-separated
	detectionMS float64
	placementMS float64
}

// detectionMS returns the time from the last sign of life of the dead
// nodes (their last answer to this node's probes) until now: the
// failover's detection time; 0 without gossip or an answer seen.
func (v *liveView) detectionMS(now time.Time, dead ...string) float64 {
	lastSeen := v.lastSeenFn
	if lastSeen == nil {
		m := v.membership()
		if m == nil {
			return 0
		}
		lastSeen = m.LastSeen
	}
	var last time.Time
	for _, id := range dead {
		if t, ok := lastSeen(id); ok && t.After(last) {
			last = t
		}
	}
	if last.IsZero() || !now.After(last) {
		return 0
	}
	return float64(now.Sub(last).Microseconds()) / 1000
}

// follow compares the live nodes with the latest deployment, on the
// master: a deployed node that died fails over at once (every job is
// redeployed on the live nodes from its latest checkpoint); a node that
// joined (or came back) is asked of the rebalance gate, which batches
// joins and damps storms, and moved in by a rebalance when it opens.
func (v *liveView) follow(alive []string, jobs func() []*actors.Execution) {
	now := time.Now()
	v.mu.Lock()
	deployed := v.deployed
	var joined []string
	v.undrainReturnedLocked(alive)
	dead := v.deadLocked(alive)
	if deployed != nil {
		for _, id := range v.placedLocked(alive) {
			if !slices.Contains(deployed, id) && !v.joining[id] {
				joined = append(joined, id)
			}
		}
	}
	var p *pendingChange
	if len(dead) > 0 {
		from := v.deployed
		if from == nil {
			from = v.survivors
		}
		v.survivors = slices.DeleteFunc(slices.Clone(from), func(id string) bool { return slices.Contains(dead, id) })
		v.deployed = nil // until the next deployment
		p = v.beginFailoverLocked(now, dead)
	}
	for _, id := range joined {
		v.joining[id] = true
		v.gate.Request(now, cluster.TriggerJoin, id)
		v.c.rb.requestedLocked(now)
	}
	v.mu.Unlock()
	if len(joined) > 0 {
		v.c.log.Info("cluster: node joined; rebalancing after the settle delay", "joined", joined)
	}
	if p != nil {
		v.failOver(p, dead, alive, jobs())
	}
}

// stopCtx returns a context that ends after d or when the view stops.
func (v *liveView) stopCtx(d time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	// Not gossipMu: stopGossip holds it while it waits for the
	// goroutines that call this.
	v.stopMu.Lock()
	stop := v.stop
	v.stopMu.Unlock()
	go func() {
		select {
		case <-stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// recordFailover waits until every job runs again after the failover p
// and records it, with the time the new placement took and the time
// until every task of the new deployment was restored and started. A
// failover that another death overtook (its redeployment ended before
// every job ran) is done when the jobs run again after the later one.
func (v *liveView) recordFailover(p *pendingChange, execs []*actors.Execution, old map[*actors.Execution]*actors.Runner) {
	defer v.wg.Done()
	ctx, cancel := v.stopCtx(5 * time.Minute)
	defer cancel()
	var err error
	for _, e := range execs {
		if err = waitNewRunner(ctx, e, old[e]); err != nil {
			break
		}
	}
	restored := time.Now()
	v.mu.Lock()
	i := slices.Index(v.pending, p)
	if i >= 0 {
		v.pending = slices.Delete(v.pending, i, i+1)
	}
	if len(v.pending) == 0 {
		v.gate.Failover(false)
	}
	if i < 0 {
		// Dropped meanwhile: the node stepped down.
		v.mu.Unlock()
		return
	}
	f := cluster.Failover{At: p.at, DeadNode: p.dead, DetectionMS: p.detectionMS, PlacementMS: p.placementMS}
	for _, e := range execs {
		if r, _ := e.Runner(); r != nil {
			f.Epoch = max(f.Epoch, r.Epoch())
		}
	}
	if err == nil {
		f.RestoreMS = float64(restored.Sub(p.at).Microseconds()) / 1000
	}
	v.nFailovers++
	v.failovers = lastN(append(v.failovers, f), 10)
	v.mu.Unlock()
	v.c.log.Info("cluster: failover done", "dead", p.dead, "epoch", f.Epoch, "detection_ms", f.DetectionMS, "placement_ms", f.PlacementMS, "restore_ms", f.RestoreMS, "err", err)
	if err != nil {
		return
	}
	// The failover is recorded; its first record is added when it comes.
	at, ok := firstRecord(ctx, execs, time.Minute)
	if !ok {
		return
	}
	ms := float64(at.Sub(restored).Microseconds()) / 1000
	v.mu.Lock()
	for i := range v.failovers {
		if v.failovers[i].At.Equal(f.At) && v.failovers[i].DeadNode == f.DeadNode {
			v.failovers[i].FirstRecordMS = ms
		}
	}
	v.mu.Unlock()
	v.c.log.Info("cluster: first record after the failover", "dead", p.dead, "first_record_ms", ms)
}

// placed returns the nodes of alive that take subtasks: not drained.
func (v *liveView) placed(alive []string) []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.placedLocked(alive)
}

func (v *liveView) placedLocked(alive []string) []string {
	others := v.otherPipelines()
	var out []string
	for _, id := range alive {
		if id == v.c.cfg.Node || !v.drained[id] && !others[id] {
			out = append(out, id)
		}
	}
	return out
}

// otherPipelines returns the live members whose gossiped fingerprint
// differs from this node's: they run other pipelines (another config or
// version), so a job master's deployment would be refused there
// (actors.ErrPlanMismatch). They count as alive for the majority, but
// get no subtasks, take no leadership and are handed none; a member that
// restarts with matching pipelines joins as any node that comes back.
// Nil without cluster.gossip.
func (v *liveView) otherPipelines() map[string]bool {
	if v.othersFn != nil {
		return v.othersFn()
	}
	mem := v.membership()
	if mem == nil {
		return nil
	}
	var out map[string]bool
	for _, m := range mem.Members() {
		if m.ID != v.c.cfg.Node && v.differs(m) {
			if out == nil {
				out = map[string]bool{}
			}
			out[m.ID] = true
		}
	}
	return out
}

func lastN[T any](s []T, n int) []T {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func msSince(t time.Time) float64 { return float64(time.Since(t).Microseconds()) / 1000 }

// firstRecord waits, at most limit, until a task of the master's node in
// the running attempt of one of execs took a record in, and returns when
// it saw it (polled every 5 ms); false if none did.
func firstRecord(ctx context.Context, execs []*actors.Execution, limit time.Duration) (time.Time, bool) {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(limit)
	for {
		for _, e := range execs {
			r, _ := e.Runner()
			if r == nil {
				continue
			}
			for _, m := range r.Metrics() {
				if m.RecordsIn > 0 {
					return time.Now(), true
				}
			}
		}
		select {
		case <-tick.C:
		case <-deadline:
			return time.Time{}, false
		case <-ctx.Done():
			return time.Time{}, false
		}
	}
}

// differs reports whether member m runs other pipelines than this node
// (its gossiped fingerprint differs) or its config names other cluster
// nodes (its digest of the node ids differs). The node ids set the
// cluster's size, so the majority, and an MQTT source's parallelism (one
// split per node), so the job plan: such a member would refuse every
// deployment (actors.ErrPlanMismatch). A member that gossips no digest
// of the node ids (an older version) is compared by its fingerprint
// alone.
func (v *liveView) differs(m cluster.Meta) bool {
	if m.Fingerprint != "" && m.Fingerprint != v.c.fingerprint {
		return true
	}
	return v.otherNodes(m)
}

// otherNodes reports whether member m's config names other cluster
// nodes than this node's, or other channel credits.
func (v *liveView) otherNodes(m cluster.Meta) bool {
	return m.Nodes != "" && v.c.nodesDigest != "" && m.Nodes != v.c.nodesDigest
}

// otherThanLeader returns, for a node whose own pipelines or node ids
// differ from those of leader (the node whose job masters it follows),
// the live members, this node included, that differ from the leader's:
// those get no subtasks. It returns nil when this node leads, when the
// leader is not a live member, or when this node matches the leader:
// otherPipelines then says it from this node's side.
func (v *liveView) otherThanLeader(leader string) map[string]bool {
	mem := v.membership()
	if mem == nil || leader == v.c.cfg.Node {
		return nil
	}
	members := mem.Members()
	var lm cluster.Meta
	found := false
	for _, m := range members {
		if m.ID == leader {
			lm, found = m, true
		}
	}
	if !found || !v.differs(lm) {
		return nil
	}
	out := map[string]bool{v.c.cfg.Node: true}
	for _, m := range members {
		if m.ID == v.c.cfg.Node || m.ID == leader {
			continue
		}
		if m.Fingerprint != "" && lm.Fingerprint != "" && m.Fingerprint != lm.Fingerprint ||
			m.Nodes != "" && lm.Nodes != "" && m.Nodes != lm.Nodes {
			out[m.ID] = true
		}
	}
	return out
}

// checkFingerprints warns, once per run of each member, about a member
// whose pipelines differ from this node's (another config or version),
// or whose config names other cluster nodes: it hosts nothing until its
// config matches (otherPipelines). When the member is the leader this
// node follows, this node is the one that hosts nothing, and the error
// says so; the members that match the leader are not warned about.
func (v *liveView) checkFingerprints() {
	leader := v.c.leader()
	// When this node differs from the leader, a member that matches the
	// leader's pipelines takes subtasks: nothing to warn about.
	offLeader := v.otherThanLeader(leader)
	for _, m := range v.membership().Members() {
		if m.ID == v.c.cfg.Node || !v.differs(m) || offLeader != nil && m.ID != leader && !offLeader[m.ID] {
			continue
		}
		v.mu.Lock()
		if v.warned == nil {
			v.warned = map[string]bool{}
		}
		seen := v.warned[m.ID+"/"+m.Boot]
		v.warned[m.ID+"/"+m.Boot] = true
		v.mu.Unlock()
		switch {
		case seen:
		case m.ID == leader && v.otherNodes(m):
			v.c.log.Error("cluster: this node's config names other cluster nodes or channel credits than the leader's (cluster.node and the ids of cluster.peers must be the same set on every node, and cluster.channels.credits the same number); this node gets no subtasks until it restarts with the leader's",
				"leader", m.ID, "our_nodes", v.c.cfg.Nodes(), "our_channels", v.c.cfg.ChannelConfig().Shared(), "leader_nodes_digest", m.Nodes, "ours", v.c.nodesDigest)
		case m.ID == leader:
			v.c.log.Error("cluster: this node runs other pipelines than the leader (the shared settings of its pipelines, or its version, differ from the leader's); this node gets no subtasks until it restarts with the leader's pipelines",
				"leader", m.ID, "leader_fingerprint", m.Fingerprint, "ours", v.c.fingerprint)
		case v.otherNodes(m):
			v.c.log.Warn("cluster: a member's config names other cluster nodes or channel credits than this node's (cluster.node and the ids of cluster.peers must be the same set on every node, and cluster.channels.credits the same number); it gets no subtasks until they match",
				"member", m.ID, "our_nodes", v.c.cfg.Nodes(), "our_channels", v.c.cfg.ChannelConfig().Shared(), "its_nodes_digest", m.Nodes, "ours", v.c.nodesDigest)
		default:
			v.c.log.Warn("cluster: a member runs other pipelines than this node (its config or version differs); it gets no subtasks until they match",
				"member", m.ID, "its_fingerprint", m.Fingerprint, "ours", v.c.fingerprint)
		}
	}
}
