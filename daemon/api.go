package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/snapshot"
)

// JobInfo is one job of GET /jobs.
type JobInfo struct {
	Name   string `json:"name"`
	Status Status `json:"status"`
	// Attempts is how many times the job was started (1 + restarts).
	Attempts      int  `json:"attempts"`
	Checkpointing bool `json:"checkpointing"`
	// DeadLetters counts records sent to the dead-letter output; in a
	// cluster, on every node (each node counts those of the subtasks it
	// hosts, since it started).
	DeadLetters int64 `json:"dead_letters"`
	// DeadLettersByNode is DeadLetters by cluster node (in a cluster).
	DeadLettersByNode map[string]int64 `json:"dead_letters_by_node,omitempty"`
	// Savepoint is the path of the latest savepoint taken through the node.
	Savepoint string `json:"savepoint,omitempty"`
	// Error is why the job failed.
	Error string `json:"error,omitempty"`
	// LastFailure is why the latest failed attempt ended (the job
	// restarted after it, or waits to: StatusRestarting), and
	// LastFailureAt when; empty if none failed.
	LastFailure   string     `json:"last_failure,omitempty"`
	LastFailureAt *time.Time `json:"last_failure_at,omitempty"`
	// TasksHere is, in a list a worker answers, how many tasks of the job
	// the worker hosts (0: none); absent elsewhere.
	TasksHere *int `json:"tasks_here,omitempty"`
}

// JobList is the body of GET /jobs.
type JobList struct {
	Jobs []JobInfo `json:"jobs"`
	// Node is the node that answered, Leader the node that runs the job
	// masters, and From the node whose jobs Jobs are: the leader, or the
	// worker that answered when the leader did not (see Note). All three
	// empty without a cluster.
	Node   string `json:"node,omitempty"`
	Leader string `json:"leader,omitempty"`
	From   string `json:"from,omitempty"`
	// Note says, on a worker whose leader did not answer, why Jobs are
	// only the jobs the worker hosts tasks of.
	Note string `json:"note,omitempty"`
}

// CheckpointInfo is one checkpoint or savepoint of GET
// /jobs/{name}/checkpoints (snapshot.Stats).
type CheckpointInfo struct {
	ID     uint64 `json:"id"`
	Kind   string `json:"kind"`   // checkpoint or savepoint
	Status string `json:"status"` // in_progress, completed or failed
	// Stop marks a stop-with-savepoint.
	Stop        bool      `json:"stop,omitempty"`
	TriggerTime time.Time `json:"trigger_time"`
	// DurationMS is from the trigger to completion or failure, in ms; 0
	// while in progress.
	DurationMS  float64 `json:"duration_ms"`
	Acked       int     `json:"acked"`
	Tasks       int     `json:"tasks"`
	SizeBytes   int64   `json:"size_bytes"`
	AlignmentMS float64 `json:"alignment_ms"`
	Path        string  `json:"path,omitempty"`
	Error       string  `json:"error,omitempty"`
	// Gone marks a completed checkpoint or savepoint whose metadata is no
	// longer at Path on this node: retention discarded it, or its
	// directory was removed.
	Gone bool `json:"gone,omitempty"`
}

// CheckpointList is the body of GET /jobs/{name}/checkpoints, oldest
// first.
type CheckpointList struct {
	Job         string           `json:"job"`
	Checkpoints []CheckpointInfo `json:"checkpoints"`
}

// SavepointResult is the body of POST /jobs/{name}/savepoint and
// /jobs/{name}/stop. Path is absolute, on the node that took it.
type SavepointResult struct {
	Job  string `json:"job"`
	Path string `json:"path"`
}

// CancelResult is the body of POST /jobs/{name}/cancel.
type CancelResult struct {
	Job    string `json:"job"`
	Status Status `json:"status"`
}

// ErrorBody is the body of every error response.
type ErrorBody struct {
	Error string `json:"error"`
}

// newAPI returns the REST API of n and its dashboard, behind the token
// check when the API requires one (see NeedsToken).
func newAPI(n *node) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		newJobCollector(n),
		newTaskCollector(n),
		newClusterCollector(n),
	)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /jobs", n.handleList)
	mux.HandleFunc("GET /jobs/{name}/checkpoints", n.handleCheckpoints)
	mux.HandleFunc("GET /jobs/{name}/operators", n.handleOperators)
	mux.HandleFunc("POST /jobs/{name}/savepoint", n.handleSavepoint(false))
	mux.HandleFunc("POST /jobs/{name}/stop", n.handleSavepoint(true))
	mux.HandleFunc("POST /jobs/{name}/cancel", n.handleCancel)
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	n.mountCluster(mux)
	n.mountDashboard(mux)
	if n.cluster != nil {
		n.cluster.mount(mux, n)
	}
	return requireToken(n.apiToken(), apiErrors(mux))
}

// apiPrefixes are the first path segments of the REST API; the dashboard
// serves the other paths.
var apiPrefixes = []string{"/jobs", "/cluster", "/metrics", "/ingest", "/broker"}

// apiErrors answers a request to an API path that no endpoint takes with
// a JSON error, as the endpoints answer theirs: 405 with an Allow header
// when the path takes other methods, else 404. Without it the dashboard's
// "GET /" took every GET (a plain-text 404 for GET /jobs/x/savepoint) and
// its method made every other unknown request a 405 allowing GET.
func apiErrors(mux *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !isAPIPath(r.URL.Path) || routed(mux, r) {
			mux.ServeHTTP(w, r)
			return
		}
		var allow []string
		for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete} {
			other := r.Clone(r.Context())
			other.Method = m
			if routed(mux, other) {
				allow = append(allow, m)
				if m == http.MethodGet {
					allow = append(allow, http.MethodHead)
				}
			}
		}
		if len(allow) == 0 {
			writeJSON(w, http.StatusNotFound, ErrorBody{Error: fmt.Sprintf("daemon: no endpoint %s", r.URL.Path)})
			return
		}
		w.Header().Set("Allow", strings.Join(allow, ", "))
		writeJSON(w, http.StatusMethodNotAllowed, ErrorBody{Error: fmt.Sprintf("daemon: %s %s: the endpoint takes %s", r.Method, r.URL.Path, strings.Join(allow, ", "))})
	})
}

// routed reports whether an endpoint of mux, not the dashboard, takes r.
func routed(mux *http.ServeMux, r *http.Request) bool {
	_, pattern := mux.Handler(r)
	return pattern != "" && pattern != "GET /"
}

func isAPIPath(p string) bool {
	for _, prefix := range apiPrefixes {
		if p == prefix || strings.HasPrefix(p, prefix+"/") {
			return true
		}
	}
	return false
}

func (n *node) info(ctx context.Context, j *job) JobInfo {
	s := j.snapshot()
	ji := JobInfo{Name: j.name, Status: s.Status, Attempts: j.run.Attempts(), Checkpointing: j.checkpointing,
		DeadLetters: j.pj.DeadLetters(), Savepoint: s.Savepoint}
	if n.cluster != nil {
		ji.DeadLettersByNode, ji.DeadLetters, _ = n.clusterDeadLetters(ctx, j, 0)
	}
	if s.Err != nil {
		ji.Error = s.Err.Error()
	}
	e := j.run.Execution()
	if s.Status == StatusRunning && e.Restarting() {
		ji.Status = StatusRestarting
	}
	if err, at := e.LastFailure(); err != nil {
		ji.LastFailure, ji.LastFailureAt = err.Error(), &at
	}
	return ji
}

// handleList answers GET /jobs: the node's own jobs (job masters); with
// ?cluster=1, on a cluster's worker, which runs no job master, the
// leader's (workerJobList), as edged list asks.
func (n *node) handleList(w http.ResponseWriter, r *http.Request) {
	c := n.cluster
	q := r.URL.Query()
	if c != nil && !c.isMaster() && q.Get(clusterParam) != "" && q.Get(localParam) == "" {
		writeJSON(w, http.StatusOK, c.workerJobList(r.Context()))
		return
	}
	jobs := n.jobList()
	l := JobList{Jobs: make([]JobInfo, 0, len(jobs))}
	for _, j := range jobs {
		l.Jobs = append(l.Jobs, n.info(r.Context(), j))
	}
	if c != nil {
		l.Node, l.Leader, l.From = c.cfg.Node, c.leader(), c.cfg.Node
	}
	writeJSON(w, http.StatusOK, l)
}

func (n *node) handleCheckpoints(w http.ResponseWriter, r *http.Request) {
	j, err := n.job(r.Context(), r.PathValue("name"))
	if err != nil {
		writeError(w, err)
		return
	}
	j.observe()
	s := j.snapshot()
	l := CheckpointList{Job: j.name, Checkpoints: make([]CheckpointInfo, 0, len(s.History))}
	for _, st := range s.History {
		l.Checkpoints = append(l.Checkpoints, checkpointInfo(st))
	}
	writeJSON(w, http.StatusOK, l)
}

func checkpointInfo(s snapshot.Stats) CheckpointInfo {
	ci := CheckpointInfo{ID: uint64(s.Checkpoint), Kind: s.Kind.String(), Status: s.Status.String(), Stop: s.Stop,
		TriggerTime: s.Triggered, DurationMS: ms(s.Duration), Acked: s.Acked, Tasks: s.Tasks,
		SizeBytes: s.Size, AlignmentMS: ms(s.Alignment), Path: s.Path}
	if s.Err != nil {
		ci.Error = s.Err.Error()
	}
	if s.Status == snapshot.Completed && s.Path != "" {
		if _, err := os.Stat(filepath.Join(s.Path, "_metadata")); errors.Is(err, fs.ErrNotExist) {
			ci.Gone = true
		}
	}
	return ci
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func (n *node) handleSavepoint(stop bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		j, err := n.job(r.Context(), r.PathValue("name"))
		if err != nil {
			writeError(w, err)
			return
		}
		path, err := savepointPath(r)
		if err == nil {
			err = snapshot.CheckSavepointPath(path)
		}
		if err == nil {
			err = snapshot.CheckSavepointDir(path)
		}
		if err == nil {
			err = snapshot.CheckSavepointOutsideCheckpoints(j.checkpointDir, path)
		}
		if err != nil {
			// The snapshot store refuses it too, but only once the
			// savepoint began: a failed savepoint in the job's history
			// for the caller's mistake.
			writeJSON(w, http.StatusBadRequest, ErrorBody{Error: fmt.Errorf("daemon: savepoint path: %w", err).Error()})
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), n.opts.StopTimeout)
		defer cancel()
		p, err := n.savepoint(ctx, j, path, stop)
		if err != nil {
			writeError(w, err)
			return
		}
		// A checkpoint.dir relative to the node's working directory
		// gives a relative path, which the caller (the CLI, in its own
		// directory) would resolve against another one.
		if abs, err := filepath.Abs(p); err == nil {
			p = abs
		}
		writeJSON(w, http.StatusOK, SavepointResult{Job: j.name, Path: p})
	}
}

// maxSavepointBody bounds the body of a savepoint or stop request: a
// JSON object with the one key "path".
const maxSavepointBody = 64 << 10

// savepointPath returns the path a savepoint or stop request names: the
// query's "path" or a JSON body's {"path": "..."}. Both may be given when
// they agree. A body that is not such an object is refused rather than
// ignored, since a savepoint taken elsewhere than the caller asked is
// found missing only when it is needed.
func savepointPath(r *http.Request) (string, error) {
	q := r.URL.Query().Get("path")
	b, err := io.ReadAll(io.LimitReader(r.Body, maxSavepointBody+1))
	if err != nil {
		return "", fmt.Errorf("reading the request body: %w", err)
	}
	if len(b) > maxSavepointBody {
		return "", fmt.Errorf("the request body is over %d bytes", maxSavepointBody)
	}
	if len(bytes.TrimSpace(b)) == 0 {
		return q, nil
	}
	var body struct {
		Path *string `json:"path"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil {
		return "", fmt.Errorf(`the request body is not {"path": "<path>"}: %w`, err)
	}
	if dec.More() {
		return "", errors.New(`the request body is not one object {"path": "<path>"}`)
	}
	switch {
	case body.Path == nil:
		return q, nil
	case q != "" && q != *body.Path:
		return "", fmt.Errorf("the query's %q and the body's %q differ", q, *body.Path)
	}
	return *body.Path, nil
}

func (n *node) handleCancel(w http.ResponseWriter, r *http.Request) {
	j, err := n.job(r.Context(), r.PathValue("name"))
	if err != nil {
		writeError(w, err)
		return
	}
	if j.snapshot().Status != StatusRunning {
		writeError(w, fmt.Errorf("%w: %q", ErrNotRunning, j.name))
		return
	}
	n.log.Info("cancelling job", "job", j.name)
	j.cancel()
	select {
	case <-j.run.Done():
	case <-r.Context().Done():
		return
	}
	// The watcher records the status right after Done; wait for it so the
	// answer says how the job ended.
	writeJSON(w, http.StatusOK, CancelResult{Job: j.name, Status: j.finalStatus(r.Context())})
}

// finalStatus waits (bounded by ctx) for the watcher to record how the
// ended job ended.
func (j *job) finalStatus(ctx context.Context) Status {
	t := time.NewTicker(time.Millisecond)
	defer t.Stop()
	for {
		if s := j.snapshot().Status; s != StatusRunning {
			return s
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return StatusRunning
		}
	}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v) // the client went away; nothing to do
}

// writeError answers err with its status code.
func writeError(w http.ResponseWriter, err error) {
	writeJSON(w, statusOf(err), ErrorBody{Error: err.Error()})
}

func statusOf(err error) int {
	switch {
	case errors.Is(err, ErrUnknownJob):
		return http.StatusNotFound
	case errors.Is(err, ErrStarting):
		return http.StatusServiceUnavailable
	case errors.Is(err, snapshot.ErrName):
		return http.StatusBadRequest // a savepoint path the store refused
	case errors.Is(err, ErrNotRunning), errors.Is(err, ErrNoCheckpointing),
		errors.Is(err, actors.ErrNoCheckpointStore), errors.Is(err, snapshot.ErrStopping),
		errors.Is(err, snapshot.ErrStopped), errors.Is(err, snapshot.ErrExists):
		return http.StatusConflict
	case errors.Is(err, context.DeadlineExceeded):
		return http.StatusGatewayTimeout
	}
	return http.StatusInternalServerError
}
