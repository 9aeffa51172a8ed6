package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"

	"github.com/edgedio/edged/cluster"
	"github.com/edgedio/edged/snapshot"
)

// A stop-with-savepoint that every task handled is marked committed
// (snapshot.MarkCommitted) by the job master in its own store: a job
// resumed from it restores its state, but its write-ahead sinks publish
// none of the output it holds again. In a cluster every live node holds a
// copy of the savepoint's metadata, and the node that takes the job
// masters over (after the leader died, at a hand-back) restores its own
// copy. So the master marks the peers' copies too, before the stop
// returns (markCommitted, PUT /cluster/jobs/{job}/checkpoints/{id}/committed);
// a copy left unmarked (its node was down, or did not answer) learns the
// mark from a peer when its node takes over (learnCommitted). Only when
// no live peer holds a marked copy (the master died before it marked
// any) is it restored as any other snapshot: its held output is
// published again under the same ids.

// markCommitted tells every live peer that stop savepoint id of job is
// committed by every sink: each marks its copy. It returns once every
// peer answered; the error names each peer that did not mark its copy. A
// node without replicas (nil) has no peers to tell.
func (r *replicas) markCommitted(ctx context.Context, epoch uint64, job string, id snapshot.ID) error {
	if r == nil {
		return nil
	}
	var peers []string
	for _, p := range r.alive() {
		if p != r.self {
			peers = append(peers, p)
		}
	}
	errs := make([]error, len(peers))
	var wg sync.WaitGroup
	for i, peer := range peers {
		wg.Go(func() {
			hdr := http.Header{epochHeader: {strconv.FormatUint(epoch, 10)}}
			ctx, cancel := context.WithTimeout(ctx, r.callTimeout)
			defer cancel()
			resp, err := r.peers.do(ctx, http.MethodPut, peer, replicaPath(job, id, "/committed"), nil, hdr)
			if err == nil {
				err = resp.Body.Close()
			}
			if err != nil {
				errs[i] = fmt.Errorf("%w: mark of snapshot %d committed on %q: %w", cluster.ErrReplication, id, peer, err)
			}
		})
	}
	wg.Wait()
	r.dropGone("a stop savepoint's committed mark", peers, errs)
	return errors.Join(errs...)
}

// handleCommitted marks the node's copy of a snapshot committed by every
// sink: 404 when the node holds no metadata of it, 409 from a master of
// an older term than the node saw (staleTerm).
func (r *replicas) handleCommitted(w http.ResponseWriter, req *http.Request) {
	if e, err := strconv.ParseUint(req.Header.Get(epochHeader), 10, 64); err != nil || staleTerm(e, r.epoch()) {
		clusterError(w, http.StatusConflict, fmt.Errorf("%w: committed mark of epoch %q, the node saw epoch %d", ErrStaleMaster, req.Header.Get(epochHeader), r.epoch()))
		return
	}
	md, ok := r.completedOf(w, req)
	if !ok {
		return
	}
	if err := snapshot.MarkCommitted(md.Dir); err != nil {
		clusterError(w, http.StatusInternalServerError, err)
		return
	}
	r.log.Debug("cluster: copy of a stop savepoint marked committed", "job", md.Job, "checkpoint_id", uint64(md.Checkpoint), "path", md.Dir)
	writeJSON(w, http.StatusOK, map[string]any{"committed": uint64(md.Checkpoint)})
}

// learnCommitted marks the node's copy md of a savepoint or final
// checkpoint committed when a live peer holds its copy marked: the node
// was down, or did not answer, when the master marked the copies, and is
// about to restore md as it takes the job masters over. Peers that do not
// answer, or hold no copy, are passed over: the copy then stays as it is.
func (r *replicas) learnCommitted(ctx context.Context, md *snapshot.Metadata) {
	if md.Committed || (md.Kind != snapshot.KindSavepoint && !md.Finished) {
		return
	}
	for _, peer := range r.alive() {
		if peer == r.self {
			continue
		}
		committed, err := r.peerCommitted(ctx, peer, md.Job, md.Checkpoint)
		if err != nil {
			r.log.Debug("cluster: cannot ask a peer whether its copy of the snapshot is marked committed", "peer", peer, "job", md.Job, "checkpoint_id", uint64(md.Checkpoint), "err", err)
			continue
		}
		if !committed {
			continue
		}
		if err := snapshot.MarkCommitted(md.Dir); err != nil {
			r.log.Warn("cluster: cannot mark the copy of a committed snapshot; its held output is published again under the same ids", "job", md.Job, "checkpoint_id", uint64(md.Checkpoint), "err", err)
			return
		}
		md.Committed = true
		r.log.Info("cluster: copy of a stop savepoint marked committed, as a peer holds it: its held output is not published again", "job", md.Job, "checkpoint_id", uint64(md.Checkpoint), "peer", peer)
		return
	}
}

// peerCommitted asks peer whether its copy of snapshot id of job is
// marked committed (GET /cluster/jobs/{job}/checkpoints/{id}/metadata).
func (r *replicas) peerCommitted(ctx context.Context, peer, job string, id snapshot.ID) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, r.callTimeout)
	defer cancel()
	resp, err := r.peers.do(ctx, http.MethodGet, peer, replicaPath(job, id, "/metadata"), nil, nil)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	var m snapshotMessage
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&m); err != nil {
		return false, err
	}
	return m.Committed, nil
}
