package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"
	"unicode"

	"github.com/edgedio/edged/cluster"
)

// Errors of the cluster endpoints. They are declared beside the endpoints
// rather than in errors.go so that the cluster surface stays in one file.
var (
	// ErrNoCluster answers a drain or a rebalance asked of a node that runs
	// no cluster (HTTP 501).
	ErrNoCluster = errors.New("daemon: this node runs no cluster")
	// ErrBadNodeID answers a drain of a node id that no node could have:
	// empty, too long, or with spaces or control characters (HTTP 400).
	ErrBadNodeID = errors.New("daemon: bad node id")
	// ErrNotDrained answers an undrain of a node that is not drained
	// (HTTP 409).
	ErrNotDrained = errors.New("daemon: node not drained")
)

// ClusterActionResult is the body of a successful POST
// /cluster/drain/{node}, POST /cluster/undrain/{node} and POST
// /cluster/rebalance.
type ClusterActionResult struct {
	// Action is "drain", "undrain" or "rebalance".
	Action string `json:"action"`
	// Node is the drained or undrained node (drain and undrain only).
	Node string `json:"node,omitempty"`
	// Rebalance is the rebalance the action ran, when the cluster recorded
	// one after the action started.
	Rebalance *cluster.Rebalance `json:"rebalance,omitempty"`
}

// clusterSlot holds the node's cluster provider; nil on a node without a
// cluster. Set once the cluster runs, read by every cluster handler and
// scrape, hence atomic.
type clusterSlot struct {
	p atomic.Pointer[cluster.StatusProvider]
}

// setCluster makes p the provider of the node's cluster endpoints and
// metrics (nil: the node runs no cluster). Safe to call while the API
// serves, e.g. once the cluster has started.
func (n *node) setCluster(p cluster.StatusProvider) {
	if p == nil {
		n.provider.p.Store(nil)
		return
	}
	n.provider.p.Store(&p)
}

// clusterProvider returns the node's cluster provider, or nil.
func (n *node) clusterProvider() cluster.StatusProvider {
	if p := n.provider.p.Load(); p != nil {
		return *p
	}
	return nil
}

// clusterStatus returns the node's cluster status, normalized; disabled
// without a provider.
func (n *node) clusterStatus() cluster.Status {
	p := n.clusterProvider()
	if p == nil {
		return cluster.Status{}
	}
	return p.Status().Normalized()
}

// mountCluster adds the cluster endpoints to mux.
func (n *node) mountCluster(mux *http.ServeMux) {
	mux.HandleFunc("GET /cluster", n.handleCluster)
	mux.HandleFunc("POST /cluster/drain/{node}", n.handleDrain)
	mux.HandleFunc("POST /cluster/undrain/{node}", n.handleUndrain)
	mux.HandleFunc("POST /cluster/rebalance", n.handleRebalance)
	mux.HandleFunc("POST /cluster/rejoin", n.handleRejoin)
}

func (n *node) handleCluster(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, n.clusterStatus())
}

func (n *node) handleDrain(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("node")
	p, s, err := n.clusterFor("drain")
	if err == nil {
		err = checkNodeID(id)
	}
	if err == nil {
		if _, ok := s.Member(id); !ok {
			err = fmt.Errorf("drain: %w %q (members: %d)", cluster.ErrUnknownNode, id, len(s.Members))
		}
	}
	if err != nil {
		writeClusterError(w, err)
		return
	}
	n.clusterAction(w, r, ClusterActionResult{Action: "drain", Node: id}, func(ctx context.Context) error {
		return p.Drain(ctx, id)
	})
}

func (n *node) handleUndrain(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("node")
	p, s, err := n.clusterFor("undrain")
	if err == nil {
		err = checkNodeID(id)
	}
	if err == nil {
		if _, ok := s.Member(id); !ok {
			err = fmt.Errorf("undrain: %w %q (members: %d)", cluster.ErrUnknownNode, id, len(s.Members))
		}
	}
	u, ok := p.(undrainer)
	if err == nil && !ok {
		err = fmt.Errorf("undrain: %w: this node's cluster cannot undrain", cluster.ErrRefused)
	}
	if err != nil {
		writeClusterError(w, err)
		return
	}
	n.clusterAction(w, r, ClusterActionResult{Action: "undrain", Node: id}, func(ctx context.Context) error {
		return u.Undrain(ctx, id)
	})
}

// handleRejoin puts this node back into its cluster's membership after a
// drain made it leave; the job masters' node asks it when the node is
// undrained.
func (n *node) handleRejoin(w http.ResponseWriter, r *http.Request) {
	p, _, err := n.clusterFor("rejoin")
	rj, ok := p.(rejoiner)
	if err == nil && !ok {
		err = fmt.Errorf("rejoin: %w: this node's cluster cannot rejoin", cluster.ErrRefused)
	}
	if err != nil {
		writeClusterError(w, err)
		return
	}
	was, err := rj.Rejoin()
	if err != nil {
		writeClusterError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"rejoined": was})
}

func (n *node) handleRebalance(w http.ResponseWriter, r *http.Request) {
	p, _, err := n.clusterFor("rebalance")
	if err != nil {
		writeClusterError(w, err)
		return
	}
	n.clusterAction(w, r, ClusterActionResult{Action: "rebalance"}, p.Rebalance)
}

// clusterFor returns the provider and its status for an action, or
// ErrNoCluster.
func (n *node) clusterFor(action string) (cluster.StatusProvider, cluster.Status, error) {
	p := n.clusterProvider()
	if p == nil {
		return nil, cluster.Status{}, fmt.Errorf("%s: %w (a node joins one with the cluster section of its config)", action, ErrNoCluster)
	}
	s := p.Status()
	if !s.Enabled {
		return nil, cluster.Status{}, fmt.Errorf("%s: %w (the cluster is not enabled)", action, ErrNoCluster)
	}
	return p, s, nil
}

// clusterAction runs do, bounded by Options.StopTimeout, logs it, and
// answers with res and the rebalance it recorded.
func (n *node) clusterAction(w http.ResponseWriter, r *http.Request, res ClusterActionResult, do func(context.Context) error) {
	ctx, cancel := context.WithTimeout(r.Context(), n.opts.StopTimeout)
	defer cancel()
	start := time.Now()
	log := n.log.With("action", res.Action)
	if res.Node != "" {
		log = log.With("node", res.Node)
	}
	log.Info("cluster action asked through the API")
	own := &actionRecord{}
	if err := do(withActionRecord(ctx, own)); err != nil {
		log.Warn("cluster action not done", "took", time.Since(start), "err", err)
		writeClusterError(w, fmt.Errorf("%s: %w", res.Action, err))
		return
	}
	log.Info("cluster action done", "took", time.Since(start))
	if rec, ok := own.get(); ok {
		// The rebalance the action's own batch recorded (none: it
		// recorded nothing), not the newest of the history, which may be
		// another action's that ended meanwhile.
		if rec != nil {
			n := rec.Normalized()
			rec = &n
		}
		res.Rebalance = rec
	} else if p := n.clusterProvider(); p != nil {
		// Clocks of the provider and this handler are the same wall clock;
		// a record from before the action belongs to another one.
		s := p.Status().Normalized()
		if len(s.Rebalances) > 0 && !s.Rebalances[0].At.Before(start.Add(-time.Second)) {
			rb := s.Rebalances[0]
			res.Rebalance = &rb
		}
	}
	writeJSON(w, http.StatusOK, res)
}

// checkNodeID reports whether id could name a node.
func checkNodeID(id string) error {
	if id == "" || len(id) > 255 {
		return fmt.Errorf("%w %q: want 1 to 255 characters", ErrBadNodeID, id)
	}
	for _, c := range id {
		if unicode.IsSpace(c) || unicode.IsControl(c) || c == '/' || c == unicode.ReplacementChar {
			return fmt.Errorf("%w %q: no spaces, control characters or slashes", ErrBadNodeID, id)
		}
	}
	return nil
}

// writeClusterError answers err of a cluster endpoint with its status.
func writeClusterError(w http.ResponseWriter, err error) {
	writeJSON(w, clusterStatusOf(err), ErrorBody{Error: err.Error()})
}

func clusterStatusOf(err error) int {
	switch {
	case errors.Is(err, ErrNoCluster):
		return http.StatusNotImplemented
	case errors.Is(err, ErrBadNodeID):
		return http.StatusBadRequest
	case errors.Is(err, cluster.ErrUnknownNode):
		return http.StatusNotFound
	case errors.Is(err, cluster.ErrRefused), errors.Is(err, cluster.ErrOverCapacity), errors.Is(err, ErrNotDrained):
		return http.StatusConflict
	}
	return statusOf(err)
}
