package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/edgedio/edged/snapshot"
)

// A node whose data dir keeps no epoch took part in no deployment: at a
// first start of the cluster it never takes over from a leader it has
// not followed in this run, which may merely not be up yet (absence).
// A device replaced while the site had no power (same node id, empty
// data dir) starts so too; were it the lowest live node, the others,
// which defer to it, would wait for the leader forever. So a node that
// took part in no deployment asks its peers, until it follows a leader,
// whether the cluster ran before: once one answers that it saw an epoch,
// the node adopts the cluster's history (adoptHistory) — the highest
// epoch its peers saw, kept in its data dir as one it saw itself, and
// the metadata of the newest snapshot of each job they have, with the
// holders of its state files — and counts from then on as a node that
// took part in a deployment: the same rule as for the others decides
// whether and when it takes over (the lowest live node of a majority,
// once the leader has stayed away for restartGrace). Its takeover then
// deploys in a term above every epoch its peers saw and numbers
// checkpoints above it and above the snapshot it restores, whose state
// files it copies in from their holders as any takeover does.

// historyReply is a peer's answer about the cluster's history.
type historyReply struct {
	node string
	w    workerReply
}

// adoptHistory makes one attempt to adopt the cluster's history from the
// node's peers (see above). It reports whether the node now counts as
// one that took part in a deployment; false with a nil error when no
// peer answered that the cluster ran before, or when the node follows a
// leader or leads meanwhile.
func (c *clusterNode) adoptHistory(ctx context.Context) (bool, error) {
	c.lead.mu.Lock()
	done, skip := c.lead.before, c.lead.followed || c.lead.took || c.lead.stopped
	c.lead.mu.Unlock()
	if done || skip {
		return done, nil
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	var replies []historyReply
	for _, p := range c.cfg.Peers {
		wg.Go(func() {
			w, err := c.peers.workerStatus(ctx, p.ID)
			if err != nil || w.Epoch == 0 {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			replies = append(replies, historyReply{node: p.ID, w: w})
		})
	}
	wg.Wait()
	if len(replies) == 0 {
		return false, nil
	}
	slices.SortFunc(replies, func(a, b historyReply) int { return strings.Compare(a.node, b.node) })
	var epoch uint64
	for _, r := range replies {
		epoch = max(epoch, r.w.Epoch)
	}
	adopted := map[string]uint64{}
	for _, job := range slices.Sorted(maps.Keys(c.rep.jobs)) {
		// The newest snapshot any peer has the metadata of; the peers
		// named first (lowest id) on a tie.
		var from string
		var id uint64
		for _, r := range replies {
			if r.w.Checkpoints[job] > id {
				from, id = r.node, r.w.Checkpoints[job]
			}
		}
		if id == 0 {
			continue
		}
		if err := c.rep.fetchMetadata(ctx, from, job, snapshot.ID(id)); err != nil {
			return false, err
		}
		adopted[job] = id
	}
	if err := c.raiseEpoch(epoch); err != nil {
		return false, err
	}
	c.lead.mu.Lock()
	ok := !c.lead.followed && !c.lead.took
	if ok {
		c.lead.before = true
	}
	leads := c.master && !c.lead.stepped
	c.lead.mu.Unlock()
	switch {
	case ok && leads:
		// The leader of a first start (the epoch its peers saw is its
		// own deployment's), or one that leads on an empty data dir: it
		// takes over from no one. Nothing to warn about.
		c.log.Info("cluster: this node leads and took part in no deployment before: it keeps the highest epoch its peers saw as one it took part in",
			"epoch", epoch, "snapshots", adopted, "peers", len(replies))
	case ok:
		c.log.Warn("cluster: this node took part in no deployment, but its peers did: it adopts the cluster's history and may take over from a leader that stays away",
			"epoch", epoch, "snapshots", adopted, "peers", len(replies))
	}
	return ok, nil
}

// adoptLoop calls adoptHistory every poll until it succeeds, the node
// follows a leader or leads, or stop is closed.
func (c *clusterNode) adoptLoop(stop <-chan struct{}, poll time.Duration) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	t := time.NewTicker(poll)
	defer t.Stop()
	for {
		ok, err := c.adoptHistory(ctx)
		if err != nil && ctx.Err() == nil {
			c.log.Warn("cluster: cannot adopt the cluster's history from the peers yet; trying again", "err", err)
		}
		c.lead.mu.Lock()
		over := ok || c.lead.followed || c.lead.took || c.lead.stopped
		c.lead.mu.Unlock()
		if over {
			return
		}
		select {
		case <-stop:
			return
		case <-t.C:
		}
	}
}

// fetchMetadata copies the metadata of snapshot id of job, with the
// holders of its state files, from peer into the node's store (GET
// /cluster/jobs/{job}/checkpoints/{id}/metadata).
func (r *replicas) fetchMetadata(ctx context.Context, peer, job string, id snapshot.ID) error {
	s, err := r.store(job)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, r.callTimeout)
	defer cancel()
	resp, err := r.peers.do(ctx, http.MethodGet, peer, replicaPath(job, id, "/metadata"), nil, nil)
	if err != nil {
		return fmt.Errorf("metadata of snapshot %d of job %q from %q: %w", id, job, peer, err)
	}
	defer resp.Body.Close()
	var m snapshotMessage
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&m); err != nil {
		return fmt.Errorf("metadata of snapshot %d of job %q from %q: %w", id, job, peer, err)
	}
	md, err := snapshot.DecodeMetadata(m.Metadata)
	if err != nil {
		return fmt.Errorf("metadata of snapshot %d of job %q from %q: %w", id, job, peer, err)
	}
	if md.Job != job || md.Checkpoint != id {
		return fmt.Errorf("metadata of snapshot %d of job %q from %q: it is of snapshot %d of job %q", id, job, peer, md.Checkpoint, md.Job)
	}
	hb, err := json.Marshal(m.Holders)
	if err != nil {
		return err
	}
	dir, err := s.AddMetadata(md, replicasFile, hb)
	if err != nil {
		return err
	}
	if m.Committed {
		// A stop savepoint every sink committed: restored here (a
		// takeover), it publishes none of its held output again.
		return snapshot.MarkCommitted(dir)
	}
	return nil
}

// completedOf returns the metadata of the completed snapshot that req's
// path names ({job}, {id}) in the node's store, or answers req with 400
// (a bad id), 404 (no such job or snapshot) or 500 and returns false.
func (r *replicas) completedOf(w http.ResponseWriter, req *http.Request) (*snapshot.Metadata, bool) {
	job := req.PathValue("job")
	id, err := strconv.ParseUint(req.PathValue("id"), 10, 64)
	if err != nil {
		clusterError(w, http.StatusBadRequest, fmt.Errorf("snapshot id %q: %w", req.PathValue("id"), err))
		return nil, false
	}
	s, err := r.store(job)
	if err != nil {
		clusterError(w, http.StatusNotFound, err)
		return nil, false
	}
	mds, err := s.Completed()
	if err != nil {
		clusterError(w, http.StatusInternalServerError, err)
		return nil, false
	}
	i := slices.IndexFunc(mds, func(md *snapshot.Metadata) bool { return md.Checkpoint == snapshot.ID(id) })
	if i < 0 {
		clusterError(w, http.StatusNotFound, fmt.Errorf("node %q has no metadata of snapshot %d of job %q", r.self, id, job))
		return nil, false
	}
	return mds[i], true
}

// handleGetMetadata serves the metadata of a snapshot the node's store
// has, with the holders of its state files.
func (r *replicas) handleGetMetadata(w http.ResponseWriter, req *http.Request) {
	md, ok := r.completedOf(w, req)
	if !ok {
		return
	}
	b, err := snapshot.EncodeMetadata(md)
	if err != nil {
		clusterError(w, http.StatusInternalServerError, err)
		return
	}
	holders := map[string][]string{}
	if hb, err := snapshot.ReadExtra(md.Dir, replicasFile); err == nil {
		if err := json.Unmarshal(hb, &holders); err != nil {
			holders = map[string][]string{}
		}
	}
	_, err = os.Stat(filepath.Join(md.Dir, snapshot.CommittedFile))
	writeJSON(w, http.StatusOK, snapshotMessage{Metadata: b, Holders: holders, Committed: err == nil})
}
