package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/edgedio/edged/cluster"
)

// Undrain: a drained node back into the cluster without a restart.
//
// On the job masters' node, Undrain clears the node's drained mark, asks
// the node to rejoin the membership (POST /cluster/rejoin: a drained node
// left it), waits a moment for the membership to see it, and queues a join
// for it behind the rebalance gate, as liveView.follow queues a node that
// joins: the join is batched over the settle delay, held while a
// checkpoint or failover runs, damped, and moves the node in at the
// rebalance it starts.

// rejoinWait bounds the wait of an undrain for the membership to see the
// node again before it queues the join. A node seen later is moved in by
// the join liveView.follow queues when it sees it.
const rejoinWait = 15 * time.Second

// undrainer is the cluster's undrain, beside cluster.StatusProvider.
// Called from API handlers, on their goroutines; it blocks until the
// rebalance it queued has ended or ctx ends.
type undrainer interface {
	Undrain(ctx context.Context, node string) error
}

// rejoiner puts a drained node back into the membership. Called from the
// API handler of POST /cluster/rejoin.
type rejoiner interface {
	Rejoin() (bool, error)
}

// Undrain ends the drain of node: it takes subtasks again from the
// rebalance the undrain queues (a join, through the rebalance gate), which
// it waits for. It returns an error wrapping cluster.ErrUnknownNode for a
// node the cluster does not know, ErrNotDrained for a node that is not
// drained, and cluster.ErrRefused when asked of a node that does not run
// the job masters.
func (c *clusterNode) Undrain(ctx context.Context, node string) error {
	if !slices.Contains(c.cfg.Nodes(), node) {
		return fmt.Errorf("%w: %q is not a node of the cluster %v", cluster.ErrUnknownNode, node, c.cfg.Nodes())
	}
	if !c.isMaster() {
		return fmt.Errorf("%w: node %q does not run the job masters; ask node %q", cluster.ErrRefused, c.cfg.Node, c.leader())
	}
	// A drain of the node that runs now, or is queued, would make it
	// leave after this undrain asked it to rejoin (it had not left yet,
	// so the rejoin did nothing) and after the join found it still
	// there: the undrain would answer done while the node is out of the
	// cluster (or, for a queued drain, "not drained" while it is about to
	// be). Wait for that drain to end first, as a drain asked again does.
	if ok, err := c.rb.awaitDrain(ctx, node); ok && ctx.Err() != nil {
		return fmt.Errorf("undrain: %w; node %q is not undrained: ask again once its drain has ended", err, node)
	}
	v := c.live
	v.mu.Lock()
	drained := v.drained[node]
	if drained {
		delete(v.drained, node)
		delete(v.left, node)
		// The join is queued below; liveView.follow must not queue
		// another when it sees the node back.
		v.joining[node] = true
	}
	v.mu.Unlock()
	if !drained && !slices.Contains(v.alive(), node) {
		// A node drained under another job master (the leader before a
		// hand-back or a takeover) has no drained mark here: it left
		// the membership, and still serves its API. Asked to rejoin, it
		// says whether it had left: then this is its undrain.
		if left, err := c.peers.rejoin(ctx, node); err == nil && left {
			v.mu.Lock()
			delete(v.left, node)
			v.joining[node] = true
			v.mu.Unlock()
			c.log.Info("cluster: node drained under another job master undrained; it rejoins and is moved in like a join", "undrained", node)
			c.waitAlive(ctx, node)
			return c.rb.ask(ctx, cluster.TriggerUndrain, node)
		}
	}
	if !drained {
		return fmt.Errorf("%w: node %q takes subtasks already", ErrNotDrained, node)
	}
	c.log.Info("cluster: node undrained; it rejoins and is moved in like a join", "undrained", node)
	if _, err := c.peers.rejoin(ctx, node); err != nil {
		var ae *APIError
		if errors.As(err, &ae) {
			// The node answered and refused (it is still leaving): it
			// stays drained, so that the undrain can be asked again.
			v.mu.Lock()
			v.drained[node] = true
			delete(v.joining, node)
			v.mu.Unlock()
			c.log.Warn("cluster: the undrained node refused to rejoin; it stays drained", "node", node, "err", err)
			return fmt.Errorf("%w: undrain: node %q did not rejoin: %w", cluster.ErrRefused, node, err)
		}
		c.log.Warn("cluster: the undrained node did not rejoin the membership now; it takes subtasks once it is back", "undrained", node, "err", err)
	} else {
		c.waitAlive(ctx, node)
	}
	return c.rb.ask(ctx, cluster.TriggerUndrain, node)
}

// waitAlive waits, at most rejoinWait, until the membership sees node.
func (c *clusterNode) waitAlive(ctx context.Context, node string) {
	ctx, cancel := context.WithTimeout(ctx, rejoinWait)
	defer cancel()
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for !slices.Contains(c.live.alive(), node) {
		select {
		case <-ctx.Done():
			c.log.Warn("cluster: the undrained node is not seen in the membership yet; queueing its join anyway", "undrained", node)
			return
		case <-t.C:
		}
	}
}

// rejoin asks node to rejoin the membership and reports whether it had
// left it (POST /cluster/rejoin answers {"rejoined": bool}). An answer
// that does not decode counts as not left: the request itself went
// through.
func (p *peerClient) rejoin(ctx context.Context, node string) (left bool, err error) {
	resp, err := p.do(ctx, http.MethodPost, node, "/cluster/rejoin", nil, nil)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	var r struct {
		Rejoined bool `json:"rejoined"`
	}
	_ = json.NewDecoder(io.LimitReader(resp.Body, 4096)).Decode(&r)
	return r.Rejoined, nil
}

// Rejoin puts this node back into the membership after it left it
// (drained): a new gossip run, with a new boot id, so that the others see
// it join. It reports whether the node had left; a node that had not
// does nothing.
func (c *clusterNode) Rejoin() (bool, error) {
	v := c.live
	v.gossipMu.Lock()
	defer v.gossipMu.Unlock()
	if !v.out {
		return false, nil
	}
	if v.membership() != nil {
		select {
		case <-v.stop:
		default:
			// leave marked the node out and has not stopped its gossip
			// run yet.
			return false, fmt.Errorf("%w: rejoin: node %q is still leaving the membership", cluster.ErrRefused, v.c.cfg.Node)
		}
		// The loop of the run that ended has returned (stopGossip waited
		// for it): nothing reads stop now.
		v.stopMu.Lock()
		v.stop = make(chan struct{})
		v.stopMu.Unlock()
		v.stopOnce = sync.Once{}
		if err := c.startGossip(); err != nil {
			v.stopOnce.Do(func() { close(v.stop) })
			return true, fmt.Errorf("cluster: rejoin: %w", err)
		}
	}
	v.out = false
	v.outNow.Store(false)
	if c.pauseIngest != nil {
		c.pauseIngest(false)
	}
	c.log.Info("cluster: undrained; this node rejoined the membership and takes work from the next rebalance")
	return true, nil
}

// markOut records that the node leaves the membership; false when it
// had left already.
func (v *liveView) markOut() bool {
	v.gossipMu.Lock()
	defer v.gossipMu.Unlock()
	if v.out {
		return false
	}
	v.out = true
	v.outNow.Store(true)
	return true
}
