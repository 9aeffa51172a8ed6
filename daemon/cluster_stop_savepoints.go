package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"

	"github.com/edgedio/edged/snapshot"
)

// In a cluster the savepoints the cluster takes on its own — at the stop
// of the job masters' node (SIGTERM), before a redeployment (a drain, a
// rebalance), at a handover and at a hand-back — are marked and pruned
// as a standalone node's stop savepoints are: every node keeps the newest
// keepStopSavepoints of them per job. Their metadata is on every node and
// their state files on several, so:
//
//   - the node whose job master took one marks its own copy once it reads
//     back complete there (the master holds every state file), prunes its
//     store, then tells every live peer (ownSavepoint);
//   - a peer marks its copies of the savepoints the master names, and
//     prunes its store only when its copy of the new one is there and the
//     state files it holds of it are intact (handleOwnSavepoint);
//   - a node deletes only directories of its own store in their own place
//     (savepoints/sp-<id>-<ts>), never a peer's copy, and never the
//     snapshot its store's metadata names as the one to restore from (the
//     newest with metadata) or a newer one.
//
// A savepoint a user asked for carries no mark on any node and is never
// deleted. A peer down when a savepoint was marked keeps its copy of it
// until a later message names it (every message names all the marked
// savepoints the master still has); one the master deleted meanwhile is
// named no more and stays on that peer.

// ownSavepointMessage is the body of PUT
// /cluster/jobs/{job}/checkpoints/{id}/own: savepoint id of the job is the
// cluster's own, and so are the others the master has marked.
type ownSavepointMessage struct {
	// Marked are the ids of the job's savepoints marked on the master up
	// to the route's id (that one included), newest first.
	Marked []uint64 `json:"marked"`
}

// ownSavepoint marks path, a savepoint of job the cluster took on its
// own on this node (the job master's), prunes the node's store, and
// tells every live peer to do the same with its copies. Failures are
// logged: a savepoint not marked is only kept. A node without replicas
// (nil) marks nothing.
func (r *replicas) ownSavepoint(ctx context.Context, job, path string) {
	if r == nil {
		return
	}
	s, err := r.store(job)
	if err != nil {
		return
	}
	newest, ok := ownSavepointDir(path)
	dir := filepath.Join(s.Dir(), "savepoints")
	if !ok || filepath.Clean(filepath.Dir(path)) != filepath.Clean(dir) {
		return
	}
	if _, err := snapshot.Load(path); err != nil {
		r.log.Warn("stop savepoint does not read back; older ones kept", "job", job, "savepoint", path, "err", err)
		return
	}
	if !markStopSavepoint(r.log, job, path) {
		return
	}
	m := ownSavepointMessage{}
	for _, sp := range stopSavepointsIn(dir, newest) {
		m.Marked = append(m.Marked, uint64(sp.id))
	}
	pruneStopSavepointsIn(r.log, job, dir, newest, restoredFrom(s))
	body, err := json.Marshal(m)
	if err != nil {
		return
	}
	var wg sync.WaitGroup
	for _, peer := range r.alive() {
		if peer == r.self {
			continue
		}
		wg.Go(func() {
			hdr := http.Header{"Content-Type": {"application/json"}, epochHeader: {strconv.FormatUint(r.epoch(), 10)}}
			ctx, cancel := context.WithTimeout(ctx, r.callTimeout)
			defer cancel()
			resp, err := r.peers.do(ctx, http.MethodPut, peer, replicaPath(job, newest, "/own"), bytes.NewReader(body), hdr)
			if err == nil {
				err = resp.Body.Close()
			}
			if err != nil {
				r.log.Warn("cluster: a peer did not mark its copy of a stop savepoint; it keeps its older copies until the next one", "job", job, "checkpoint_id", uint64(newest), "peer", peer, "err", err)
			}
		})
	}
	wg.Wait()
}

// restoredFrom returns whether snapshot id is the one the metadata in
// store s names to restore from (the newest snapshot with metadata) or
// newer: such a snapshot is never pruned.
func restoredFrom(s *snapshot.Store) func(snapshot.ID) bool {
	return func(id snapshot.ID) bool {
		mds, err := s.Completed()
		if err != nil {
			return true
		}
		return len(mds) > 0 && id >= mds[0].Checkpoint
	}
}

// savepointDirs returns the savepoint directories in dir (a store's
// savepoints/) of the store's own naming, by id; symbolic links (a
// savepoint on a path of the user's) are left out.
func savepointDirs(dir string) map[snapshot.ID]string {
	des, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	out := map[snapshot.ID]string{}
	for _, de := range des {
		if id, ok := snapshot.SavepointDirID(de.Name()); ok && de.IsDir() {
			out[id] = filepath.Join(dir, de.Name())
		}
	}
	return out
}

// checkHeldCopy reads back the node's copy of savepoint id in dir: its
// metadata, and every state file the node holds of it (as its _replicas
// names the holders) intact.
func (r *replicas) checkHeldCopy(dir string, id snapshot.ID) error {
	b, err := os.ReadFile(filepath.Join(dir, "_metadata"))
	if err != nil {
		return err
	}
	md, err := snapshot.DecodeMetadata(b)
	if err != nil {
		return err
	}
	if md.Checkpoint != id {
		return fmt.Errorf("%w: metadata of snapshot %d in the directory of %d", snapshot.ErrCorrupt, md.Checkpoint, id)
	}
	md.Dir = dir
	for _, h := range snapshot.Missing(md) {
		if slices.Contains(holdersOf(dir, h.File), r.self) {
			return fmt.Errorf("the node's copy of %s is missing or damaged", h.File)
		}
	}
	return nil
}

func (r *replicas) handleOwnSavepoint(w http.ResponseWriter, req *http.Request) {
	job := req.PathValue("job")
	id, err := strconv.ParseUint(req.PathValue("id"), 10, 64)
	if err != nil {
		clusterError(w, http.StatusBadRequest, fmt.Errorf("savepoint id %q: %w", req.PathValue("id"), err))
		return
	}
	if e, err := strconv.ParseUint(req.Header.Get(epochHeader), 10, 64); err != nil || staleTerm(e, r.epoch()) {
		clusterError(w, http.StatusConflict, fmt.Errorf("%w: stop savepoint of epoch %q, the node saw epoch %d", ErrStaleMaster, req.Header.Get(epochHeader), r.epoch()))
		return
	}
	var m ownSavepointMessage
	if err := json.NewDecoder(io.LimitReader(req.Body, 1<<20)).Decode(&m); err != nil {
		clusterError(w, http.StatusBadRequest, fmt.Errorf("stop savepoints: %w", err))
		return
	}
	s, err := r.store(job)
	if err != nil {
		clusterError(w, http.StatusNotFound, err)
		return
	}
	newest := snapshot.ID(id)
	dir := filepath.Join(s.Dir(), "savepoints")
	have := savepointDirs(dir)
	complete := false
	var marked []uint64
	for _, mid := range m.Marked {
		p, ok := have[snapshot.ID(mid)]
		if !ok || mid > id {
			continue
		}
		if mid == id {
			if err := r.checkHeldCopy(p, newest); err != nil {
				r.log.Warn("stop savepoint does not read back; older ones kept", "job", job, "savepoint", p, "err", err)
				continue
			}
			complete = true
		}
		if markStopSavepoint(r.log, job, p) {
			marked = append(marked, mid)
		} else if mid == id {
			complete = false
		}
	}
	if complete {
		pruneStopSavepointsIn(r.log, job, dir, newest, restoredFrom(s))
	}
	writeJSON(w, http.StatusOK, map[string]any{"marked": marked, "pruned": complete})
}
