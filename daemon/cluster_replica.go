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
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgedio/edged/cluster"
	"github.com/edgedio/edged/keygroup"
	"github.com/edgedio/edged/pipeline"
	"github.com/edgedio/edged/snapshot"
)

// replicasFile is written beside a snapshot's _metadata on every node: the
// nodes that hold a copy of each of its state files.
const replicasFile = "_replicas"

// Header names of the replica routes.
const (
	sizeHeader     = "X-Edged-Size"
	checksumHeader = "X-Edged-Checksum"
	holdersHeader  = "X-Edged-Holders"
	epochHeader    = "X-Edged-Epoch"
)

// replicas is the node's part in replicated checkpoints. Every node keeps,
// per job, a snapshot store in the job's checkpoint.dir, in the layout of
// the job master's: the state files it wrote or holds copies of, and the
// metadata of every snapshot the job master completed (with the nodes
// that hold each file). A node can so restore the job from its own disk,
// through the same path as a restarted master, once it has copied in the
// files it lacks from a node the metadata names.
type replicas struct {
	self string
	// n is how many peers get a copy of each state file the node writes.
	n     int
	alive func() []string
	peers *peerClient
	log   *slog.Logger
	// jobs are the jobs with checkpoints: their checkpoint.dir and
	// checkpoint.retain.
	jobs map[string]replicaJob
	// epoch returns the highest deployment epoch the node saw: metadata
	// of an older one comes from a master that lost its place.
	epoch func() uint64

	mu     sync.Mutex
	stores map[string]*snapshot.Store
	// holders are, on the job master, the nodes that hold each state file
	// of the pending snapshots, by job and snapshot id.
	holders map[string]map[snapshot.ID]map[string][]string

	// bad counts the copies found corrupt, missing or unreachable when
	// one was read (another holder was used, if any).
	bad atomic.Int64
	// readFrom is, by job, the snapshot of it the node last copied files
	// of in (fetchFirst) and, for each of those files, the node whose copy
	// was used (this node's own id: its own replica); a read of another
	// snapshot of the job starts anew. Jobs restore side by side (a
	// failover, a takeover), so each keeps its own.
	readFrom map[string]readSnapshot

	// bodies bounds the memory the node's peers' request bodies take
	// while they are read, the deployments' too (clusterNode reads them
	// through it).
	bodies *peerBodies

	// callTimeout bounds each call that carries a snapshot's metadata or
	// marks, not its files (peerCallTimeout): a peer that takes the
	// connection and never answers must not hold up a handover, a
	// redeployment or the adoption of the cluster's history.
	callTimeout time.Duration
}

// peerCallTimeout is replicas.callTimeout's default.
const peerCallTimeout = 10 * time.Second

// readSnapshot is where the files of one snapshot were copied in from:
// the holder used, by file.
type readSnapshot struct {
	id    snapshot.ID
	files map[string]string
}

// replicaJob is what the replication needs of a job's config.
type replicaJob struct {
	dir    string
	retain int
}

func newReplicas(cfg *pipeline.ClusterConfig, pipelines []pipeline.PipelineConfig, peers *peerClient, alive func() []string, epoch func() uint64, log *slog.Logger) *replicas {
	r := &replicas{self: cfg.Node, n: cfg.ReplicaCount(), alive: alive, peers: peers, log: log, epoch: epoch, callTimeout: peerCallTimeout, bodies: newPeerBodies(peerBodyBudget),
		jobs: map[string]replicaJob{}, stores: map[string]*snapshot.Store{}, holders: map[string]map[snapshot.ID]map[string][]string{}}
	for _, pc := range pipelines {
		if pc.Checkpoint.Dir != "" {
			r.jobs[pc.Name] = replicaJob{dir: pc.Checkpoint.Dir, retain: pc.Checkpoint.Retain}
		}
	}
	return r
}

// store returns the node's snapshot store of job.
func (r *replicas) store(job string) (*snapshot.Store, error) {
	j, ok := r.jobs[job]
	if !ok {
		return nil, fmt.Errorf("%w %q: no pipeline of the node's config takes checkpoints under that name", ErrUnknownJob, job)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.stores[job]; s != nil {
		return s, nil
	}
	s, err := snapshot.OpenStore(j.dir, job, keygroup.DefaultMaxParallelism, r.log)
	if err != nil {
		return nil, err
	}
	r.stores[job] = s
	return s, nil
}

// targets returns the live peers that get a copy of the state files node
// writes: r.n of them (fewer when fewer are alive), chosen by rendezvous
// hashing on node's id.
func (r *replicas) targets(node string) []string {
	return cluster.ReplicaTargets(node, r.alive(), r.n)
}

func replicaPath(job string, id snapshot.ID, rest string) string {
	return "/cluster/jobs/" + url.PathEscape(job) + "/checkpoints/" + strconv.FormatUint(uint64(id), 10) + rest
}

// push copies the state file at path (handle h of snapshot id of job),
// written on this node, to the peers that keep replicas of it and to the
// job master on node master, and keeps a copy in the node's own store;
// it returns once every copy is durable. The master learns who holds it.
func (r *replicas) push(ctx context.Context, master, job string, epoch uint64, id snapshot.ID, path string, h snapshot.Handle) error {
	var keep error
	var wg sync.WaitGroup
	if master != r.self {
		// The node keeps its own copy: a restore here needs no fetch.
		wg.Go(func() {
			s, err := r.store(job)
			if err == nil {
				err = importFile(s, id, path, h)
			}
			if err != nil {
				keep = fmt.Errorf("keep a copy of %s of checkpoint %d: %w", h.File, id, err)
			}
		})
	}
	targets, err := r.replicate(ctx, master, job, id, path, h)
	wg.Wait()
	if err := errors.Join(err, keep); err != nil {
		return err
	}
	holders := append([]string{r.self}, targets...)
	if master != r.self && !slices.Contains(holders, master) {
		holders = append(holders, master)
	}
	slices.Sort(holders)
	if master == r.self {
		r.hold(job, id, h.File, holders)
		return nil
	}
	return r.putFile(ctx, master, "PUT", filePath(job, epoch, "/checkpoints/"+strconv.FormatUint(uint64(id), 10)+"/files/"+url.PathEscape(h.File)), path, h,
		http.Header{holdersHeader: {strings.Join(holders, ",")}})
}

// replicate copies the state file at path (handle h of snapshot id of
// job) to the node's replica targets, the job master on node master
// excepted (the push gives it the file), and returns the targets, which
// then hold it. A target whose copy failed and that is no longer a live
// replica peer once the copies are done (it left, said it is leaving or
// was declared dead meanwhile: a drained node that stops) needs no copy:
// the next peer in the ranking takes its place. A target that failed and
// is still a live peer fails the replication.
func (r *replicas) replicate(ctx context.Context, master, job string, id snapshot.ID, path string, h snapshot.Handle) ([]string, error) {
	done := map[string]bool{}
	failed := map[string]error{}
	for {
		// Each round copies to at least one target not tried before, or
		// returns.
		targets := r.targets(r.self)
		var todo []string
		var errs []error
		for _, t := range targets {
			switch {
			case failed[t] != nil:
				errs = append(errs, failed[t])
			case t != master && !done[t]:
				todo = append(todo, t)
			}
		}
		if len(errs) > 0 {
			return nil, errors.Join(errs...)
		}
		if len(todo) == 0 {
			return targets, nil
		}
		res := make([]error, len(todo))
		var wg sync.WaitGroup
		for i, peer := range todo {
			wg.Go(func() {
				if err := r.putFile(ctx, peer, "PUT", replicaPath(job, id, "/replicas/"+url.PathEscape(h.File)), path, h, nil); err != nil {
					res[i] = fmt.Errorf("%w: %s of checkpoint %d on %q: %w", cluster.ErrReplication, h.File, id, peer, err)
				}
			})
		}
		wg.Wait()
		for i, peer := range todo {
			if res[i] != nil {
				failed[peer] = res[i]
			} else {
				done[peer] = true
			}
		}
		for _, peer := range r.gone(todo, res) {
			r.log.Warn("cluster: a replica peer left while it was copied a state file; the next peer takes the copy", "job", job, "checkpoint_id", uint64(id), "file", h.File, "peer", peer, "err", failed[peer])
		}
	}
}

// gone returns the peers whose call failed (errs[i] is peers[i]'s error)
// and that are no longer live replica peers, asked after the calls: they
// left, said they are leaving or were declared dead meanwhile, and need
// no copy.
func (r *replicas) gone(peers []string, errs []error) []string {
	var alive, out []string
	for i, err := range errs {
		if err == nil {
			continue
		}
		if alive == nil {
			alive = r.alive()
		}
		if !slices.Contains(alive, peers[i]) {
			out = append(out, peers[i])
		}
	}
	return out
}

// dropGone clears in errs the errors of the peers that are gone (see
// gone) and logs each as what was not sent.
func (r *replicas) dropGone(what string, peers []string, errs []error) {
	for _, peer := range r.gone(peers, errs) {
		i := slices.Index(peers, peer)
		r.log.Warn("cluster: a peer left while it was sent "+what+"; it needs none", "peer", peer, "err", errs[i])
		errs[i] = nil
	}
}

func importFile(s *snapshot.Store, id snapshot.ID, path string, h snapshot.Handle) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return s.ImportReplica(id, h.File, h.Size, h.Checksum, f)
}

// putFile sends the file at path, described by h, to peer.
func (r *replicas) putFile(ctx context.Context, peer, method, path, file string, h snapshot.Handle, hdr http.Header) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	if hdr == nil {
		hdr = http.Header{}
	}
	hdr.Set("Content-Type", "application/octet-stream")
	hdr.Set(sizeHeader, strconv.FormatInt(h.Size, 10))
	hdr.Set(checksumHeader, strconv.FormatUint(uint64(h.Checksum), 16))
	resp, err := r.peers.do(ctx, method, peer, path, f, hdr)
	if err != nil {
		return err
	}
	return resp.Body.Close()
}

// hold records, on the job master, the nodes that hold a state file of a
// pending snapshot.
func (r *replicas) hold(job string, id snapshot.ID, file string, nodes []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	byID := r.holders[job]
	if byID == nil {
		byID = map[snapshot.ID]map[string][]string{}
		r.holders[job] = byID
	}
	if byID[id] == nil {
		byID[id] = map[string][]string{}
	}
	byID[id][file] = nodes
}

// snapshotMessage is the body of a snapshot's metadata sent to a node.
type snapshotMessage struct {
	Metadata []byte              `json:"metadata"`
	Holders  map[string][]string `json:"holders"`
	// Committed says, in an answer to GET .../metadata, that the node's
	// copy is marked committed by every sink (snapshot.CommittedFile):
	// the node that adopts it marks its copy too.
	Committed bool `json:"committed,omitempty"`
}

// publish stores the metadata of snapshot md, committed by the job master
// on this node, on every live node, with the nodes that hold each of its
// files (also written beside it here). It returns once every live node
// has it durably: only then is the snapshot's completion announced.
func (r *replicas) publish(ctx context.Context, epoch uint64, md *snapshot.Metadata) error {
	r.mu.Lock()
	held := r.holders[md.Job][md.Checkpoint]
	for id := range r.holders[md.Job] {
		if id <= md.Checkpoint {
			delete(r.holders[md.Job], id)
		}
	}
	r.mu.Unlock()
	holders := map[string][]string{}
	for _, o := range md.Operators {
		for _, h := range o.Subtasks {
			if h.File == "" {
				continue
			}
			nodes := slices.Clone(held[h.File])
			if !slices.Contains(nodes, r.self) {
				nodes = append(nodes, r.self)
			}
			slices.Sort(nodes)
			holders[h.File] = nodes
		}
	}
	hb, err := json.Marshal(holders)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(md.Dir, replicasFile), hb, 0o644); err != nil {
		return err
	}
	b, err := snapshot.EncodeMetadata(md)
	if err != nil {
		return err
	}
	body, err := json.Marshal(snapshotMessage{Metadata: b, Holders: holders})
	if err != nil {
		return err
	}
	var peers []string
	for _, id := range r.alive() {
		if id != r.self {
			peers = append(peers, id)
		}
	}
	errs := make([]error, len(peers))
	var wg sync.WaitGroup
	for i, peer := range peers {
		wg.Go(func() {
			hdr := http.Header{"Content-Type": {"application/json"}, epochHeader: {strconv.FormatUint(epoch, 10)}}
			ctx, cancel := context.WithTimeout(ctx, r.callTimeout)
			defer cancel()
			resp, err := r.peers.do(ctx, http.MethodPut, peer, replicaPath(md.Job, md.Checkpoint, "/metadata"), bytes.NewReader(body), hdr)
			if err == nil {
				err = resp.Body.Close()
			}
			if err != nil {
				errs[i] = fmt.Errorf("%w: metadata of snapshot %d on %q: %w", cluster.ErrReplication, md.Checkpoint, peer, err)
			}
		})
	}
	wg.Wait()
	r.dropGone("a snapshot's metadata", peers, errs)
	return errors.Join(errs...)
}

// mount adds the replica routes to the node's API.
func (r *replicas) mount(mux *http.ServeMux) {
	mux.HandleFunc("PUT /cluster/jobs/{job}/checkpoints/{id}/replicas/{name}", r.handlePut)
	mux.HandleFunc("GET /cluster/jobs/{job}/checkpoints/{id}/replicas/{name}", r.handleGet)
	mux.HandleFunc("PUT /cluster/jobs/{job}/checkpoints/{id}/metadata", r.handleMetadata)
	mux.HandleFunc("PUT /cluster/jobs/{job}/checkpoints/{id}/own", r.handleOwnSavepoint)
	mux.HandleFunc("PUT /cluster/jobs/{job}/checkpoints/{id}/committed", r.handleCommitted)
	mux.HandleFunc("GET /cluster/jobs/{job}/checkpoints/{id}/metadata", r.handleGetMetadata)
}

func replicaRequest(r *http.Request) (snapshot.ID, snapshot.Handle, error) {
	id, err1 := strconv.ParseUint(r.PathValue("id"), 10, 64)
	size, err2 := strconv.ParseInt(r.Header.Get(sizeHeader), 10, 64)
	sum, err3 := strconv.ParseUint(r.Header.Get(checksumHeader), 16, 32)
	if err := errors.Join(err1, err2, err3); err != nil {
		return 0, snapshot.Handle{}, fmt.Errorf("state file: %w", err)
	}
	return snapshot.ID(id), snapshot.Handle{File: r.PathValue("name"), Size: size, Checksum: uint32(sum)}, nil
}

func (r *replicas) handlePut(w http.ResponseWriter, req *http.Request) {
	id, h, err := replicaRequest(req)
	if err != nil {
		clusterError(w, http.StatusBadRequest, err)
		return
	}
	s, err := r.store(req.PathValue("job"))
	if err != nil {
		clusterError(w, http.StatusNotFound, err)
		return
	}
	if err := s.ImportReplica(id, h.File, h.Size, h.Checksum, req.Body); err != nil {
		status := http.StatusInternalServerError
		if errors.Is(err, snapshot.ErrSize) || errors.Is(err, snapshot.ErrChecksum) || errors.Is(err, snapshot.ErrName) {
			status = http.StatusBadRequest
		}
		clusterError(w, status, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"stored": h.File})
}

// handleGet serves a copy of a state file the node holds, checked against
// the size and CRC32C the reader expects first: a damaged copy is never
// served.
func (r *replicas) handleGet(w http.ResponseWriter, req *http.Request) {
	id, h, err := replicaRequest(req)
	if err != nil {
		clusterError(w, http.StatusBadRequest, err)
		return
	}
	s, err := r.store(req.PathValue("job"))
	if err != nil {
		clusterError(w, http.StatusNotFound, err)
		return
	}
	path, err := r.localFile(s, id, h)
	if err != nil {
		status := http.StatusUnprocessableEntity
		if errors.Is(err, os.ErrNotExist) {
			status = http.StatusNotFound
		}
		clusterError(w, status, err)
		return
	}
	f, err := os.Open(path)
	if err != nil {
		clusterError(w, http.StatusNotFound, err)
		return
	}
	defer f.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(h.Size, 10))
	io.Copy(w, io.LimitReader(f, h.Size))
}

// localFile returns the path of the node's intact copy of state file h of
// snapshot id: an error wrapping os.ErrNotExist when it has none, or
// snapshot.ErrSize or ErrChecksum when its copy is damaged (counted and
// logged).
func (r *replicas) localFile(s *snapshot.Store, id snapshot.ID, h snapshot.Handle) (string, error) {
	if h.File == "" || h.File != filepath.Base(h.File) || strings.HasPrefix(h.File, ".") || strings.HasPrefix(h.File, "_") {
		return "", fmt.Errorf("%w: %q", snapshot.ErrName, h.File)
	}
	dirs := []string{s.CheckpointDir(id)}
	if mds, err := s.Completed(); err == nil {
		for _, md := range mds {
			if md.Checkpoint == id && md.Dir != dirs[0] {
				dirs = append(dirs, md.Dir)
			}
		}
	}
	for _, dir := range dirs {
		path := filepath.Join(dir, h.File)
		size, sum, err := snapshot.Checksum(path)
		switch {
		case errors.Is(err, os.ErrNotExist):
			continue
		case err != nil:
			return "", err
		case size != h.Size:
			err = fmt.Errorf("%w: copy of %s of snapshot %d on %q has %d bytes, want %d", snapshot.ErrSize, h.File, id, r.self, size, h.Size)
		case sum != h.Checksum:
			err = fmt.Errorf("%w: copy of %s of snapshot %d on %q has CRC32C %08x, want %08x", snapshot.ErrChecksum, h.File, id, r.self, sum, h.Checksum)
		default:
			return path, nil
		}
		r.bad.Add(1)
		r.log.Warn("cluster: damaged copy of a state file", "file", h.File, "checkpoint_id", uint64(id), "path", path, "err", err)
		return "", err
	}
	return "", fmt.Errorf("node %q holds no copy of %s of snapshot %d: %w", r.self, h.File, id, os.ErrNotExist)
}

func (r *replicas) handleMetadata(w http.ResponseWriter, req *http.Request) {
	job := req.PathValue("job")
	if e, err := strconv.ParseUint(req.Header.Get(epochHeader), 10, 64); err != nil || staleTerm(e, r.epoch()) {
		clusterError(w, http.StatusConflict, fmt.Errorf("%w: metadata of epoch %q, the node saw epoch %d", ErrStaleMaster, req.Header.Get(epochHeader), r.epoch()))
		return
	}
	var m snapshotMessage
	if status, err := r.bodies.decode(req, 64<<20, &m); err != nil {
		clusterError(w, status, fmt.Errorf("snapshot metadata: %w", err))
		return
	}
	md, err := snapshot.DecodeMetadata(m.Metadata)
	if err != nil {
		clusterError(w, http.StatusBadRequest, fmt.Errorf("snapshot metadata: %w", err))
		return
	}
	if md.Job != job {
		clusterError(w, http.StatusBadRequest, fmt.Errorf("snapshot metadata of job %q sent for %q", md.Job, job))
		return
	}
	s, err := r.store(job)
	if err != nil {
		clusterError(w, http.StatusNotFound, err)
		return
	}
	hb, err := json.Marshal(m.Holders)
	if err == nil {
		_, err = s.AddMetadata(md, replicasFile, hb)
	}
	if err != nil {
		clusterError(w, http.StatusInternalServerError, err)
		return
	}
	if err := s.RetainCompleted(r.jobs[job].retain); err != nil {
		r.log.Warn("cluster: retain copies of checkpoints", "job", job, "err", err)
	}
	writeJSON(w, http.StatusOK, map[string]any{"stored": uint64(md.Checkpoint)})
}

// holdersOf returns the nodes that hold a copy of file of the snapshot in
// dir, as its _replicas file names them (nil if unknown).
func holdersOf(dir, file string) []string {
	b, err := snapshot.ReadExtra(dir, replicasFile)
	if err != nil {
		return nil
	}
	var m map[string][]string
	if json.Unmarshal(b, &m) != nil {
		return nil
	}
	return m[file]
}

// fetchSource is one place a copy of a state file may be read from.
type fetchSource struct {
	node string
	open func(ctx context.Context) (io.ReadCloser, error)
}

// fetchFirst copies state file h to path from the first of sources that
// serves it intact (size and CRC32C). A source whose copy is missing,
// damaged or unreachable is logged and counted, and the next one tried;
// the error, if none serves it, names each source's failure. A copy this
// node cannot write (its disk full or read-only, path not writable) is
// no fault of the source: it is logged as this node's, not counted, and
// the other sources are not tried, since they would fail the same way.
func (r *replicas) fetchFirst(ctx context.Context, job string, id snapshot.ID, h snapshot.Handle, path string, sources []fetchSource) (string, error) {
	var errs []error
	for _, src := range sources {
		rc, err := src.open(ctx)
		if err == nil {
			in := &sourceReader{r: rc}
			err = snapshot.CopyFile(in, h, path)
			rc.Close()
			if err != nil && in.err == nil && !errors.Is(err, snapshot.ErrSize) && !errors.Is(err, snapshot.ErrChecksum) {
				r.log.Error("cluster: this node cannot store a copy of a state file; its other holders are not tried", "file", h.File, "checkpoint_id", uint64(id), "path", path, "holder", src.node, "err", err)
				return "", fmt.Errorf("%s of snapshot %d: this node cannot store a copy at %s (read from %q, whose copy is not at fault): %w", h.File, id, path, src.node, err)
			}
		}
		if err == nil {
			r.mu.Lock()
			if r.readFrom == nil {
				r.readFrom = map[string]readSnapshot{}
			}
			read := r.readFrom[job]
			if read.files == nil || read.id != id {
				read = readSnapshot{id: id, files: map[string]string{}}
				r.readFrom[job] = read
			}
			read.files[h.File] = src.node
			r.mu.Unlock()
			return src.node, nil
		}
		r.bad.Add(1)
		r.log.Warn("cluster: copy of a state file unusable; trying the next holder", "file", h.File, "checkpoint_id", uint64(id), "holder", src.node, "err", err)
		errs = append(errs, fmt.Errorf("%s: %w", src.node, err))
	}
	return "", fmt.Errorf("%w: %s of snapshot %d: %w", cluster.ErrNoReplica, h.File, id, errors.Join(errs...))
}

// sourceReader is a source's copy of a state file being read: err keeps
// the read error, so that a failed copy tells the source's fault from
// the writing node's.
type sourceReader struct {
	r   io.Reader
	err error
}

func (s *sourceReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if err != nil && err != io.EOF {
		s.err = err
	}
	return n, err
}

// readFromNode returns the node whose copy of state file file of
// snapshot id of job the node copied in last; "" if it copied none (or
// has copied in files of another snapshot of the job since).
func (r *replicas) readFromNode(job string, id snapshot.ID, file string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	read := r.readFrom[job]
	if read.id != id {
		return ""
	}
	return read.files[file]
}

// sources returns where a copy of state file h of snapshot id of job may
// be read, best first: the node's own store, the nodes first (the job
// master, when restoring from it), then the holders the snapshot's
// _replicas names, then every other live node.
func (r *replicas) sources(job string, id snapshot.ID, h snapshot.Handle, local bool, first []fetchSource) []fetchSource {
	var out []fetchSource
	seen := map[string]bool{}
	s, err := r.store(job)
	if err != nil {
		s = nil
	}
	if s != nil && local {
		// The node's own copy, if it holds one: none is no error (a
		// damaged one is counted and logged by localFile).
		if path, err := r.localFile(s, id, h); err == nil {
			out = append(out, fetchSource{node: r.self, open: func(context.Context) (io.ReadCloser, error) { return os.Open(path) }})
		}
	}
	for _, f := range first {
		out = append(out, f)
		seen[f.node] = true
	}
	seen[r.self] = true
	var holders []string
	if s != nil {
		holders = holdersOf(s.CheckpointDir(id), h.File)
		if holders == nil {
			if mds, err := s.Completed(); err == nil {
				for _, md := range mds {
					if md.Checkpoint == id {
						holders = holdersOf(md.Dir, h.File)
					}
				}
			}
		}
	}
	for _, node := range append(holders, r.alive()...) {
		if seen[node] {
			continue
		}
		seen[node] = true
		out = append(out, fetchSource{node: node, open: func(ctx context.Context) (io.ReadCloser, error) {
			hdr := http.Header{sizeHeader: {strconv.FormatInt(h.Size, 10)}, checksumHeader: {strconv.FormatUint(uint64(h.Checksum), 16)}}
			resp, err := r.peers.do(ctx, http.MethodGet, node, replicaPath(job, id, "/replicas/"+url.PathEscape(h.File)), nil, hdr)
			if err != nil {
				return nil, err
			}
			return resp.Body, nil
		}})
	}
	return out
}

// complete copies into the node's store the state files of snapshot md
// (read from the store) that it lacks, from the nodes that hold them.
func (r *replicas) complete(ctx context.Context, md *snapshot.Metadata) error {
	for _, h := range snapshot.Missing(md) {
		if _, err := r.fetchFirst(ctx, md.Job, md.Checkpoint, h, filepath.Join(md.Dir, h.File), r.sources(md.Job, md.Checkpoint, h, false, nil)); err != nil {
			return err
		}
	}
	return nil
}

// status returns where the files of each snapshot in the node's stores
// are kept, as their _replicas files name the holders.
func (r *replicas) status() []cluster.CheckpointReplicas {
	var out []cluster.CheckpointReplicas
	names := slices.Sorted(maps.Keys(r.jobs))
	for _, job := range names {
		s, err := r.store(job)
		if err != nil {
			continue
		}
		mds, err := s.Completed()
		if err != nil {
			continue
		}
		for _, md := range mds {
			cr := cluster.CheckpointReplicas{Checkpoint: int64(md.Checkpoint), Files: []cluster.ReplicaFile{}}
			if len(names) > 1 {
				cr.Job = job
			}
			for _, o := range md.Operators {
				for _, h := range o.Subtasks {
					if h.File != "" {
						cr.Files = append(cr.Files, cluster.ReplicaFile{File: h.File, Size: h.Size, Nodes: holdersOf(md.Dir, h.File)})
					}
				}
			}
			out = append(out, cr)
		}
	}
	return out
}
