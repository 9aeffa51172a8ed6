package daemon

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/dashboard"
	"github.com/edgedio/edged/pipeline"
)

// GraphChain is one chain (a task's run of operators) of GET
// /jobs/{name}/graph.
type GraphChain struct {
	// ID is the chain's index in the plan, in topological order.
	ID int `json:"id"`
	// Name is the chain's name, as in TaskInfo.Chain.
	Name        string   `json:"name"`
	Operators   []string `json:"operators"`
	Parallelism int      `json:"parallelism"`
	Source      bool     `json:"source"`
	// Sink is set when the chain sends nothing to other chains.
	Sink bool `json:"sink"`
}

// GraphEdge is one edge between two chains of GET /jobs/{name}/graph.
type GraphEdge struct {
	From int `json:"from"`
	To   int `json:"to"`
	// Partitioner is how the records are spread over To's subtasks:
	// forward, rebalance, key-by or broadcast.
	Partitioner string `json:"partitioner"`
	// SideOutput names the side output the edge leaves From by; absent
	// for the main output.
	SideOutput string `json:"side_output,omitempty"`
}

// JobGraph is the body of GET /jobs/{name}/graph: the running attempt's
// execution plan.
type JobGraph struct {
	Job    string       `json:"job"`
	Chains []GraphChain `json:"chains"`
	Edges  []GraphEdge  `json:"edges"`
}

// DeadLetterInfo is one dead letter of GET /jobs/{name}/deadletters.
type DeadLetterInfo struct {
	Error   string `json:"error"`
	Payload string `json:"payload"`
	// Node is the cluster node whose subtask sent it there (in a cluster).
	Node string `json:"node,omitempty"`
}

// DeadLetterList is the body of GET /jobs/{name}/deadletters: the count
// and the latest payloads, newest first.
type DeadLetterList struct {
	Job   string `json:"job"`
	Total int64  `json:"total"`
	// ByNode is Total by cluster node (in a cluster): each node counts
	// those of the subtasks it hosts, since it started.
	ByNode map[string]int64 `json:"by_node,omitempty"`
	Recent []DeadLetterInfo `json:"recent"`
}

// IngestInfo is one pipeline's ingest log of GET /ingest. Counters start
// when the node opens the log; rates are the client's to compute from two
// readings.
type IngestInfo struct {
	Pipeline  string `json:"pipeline"`
	DiskBytes int64  `json:"disk_bytes"`
	Segments  int    `json:"segments"`
	// FirstOffset is the oldest record still on disk.
	FirstOffset uint64 `json:"first_offset"`
	// NextOffset is the offset the next message gets.
	NextOffset uint64 `json:"next_offset"`
	// DurableOffset is one past the last fsynced record.
	DurableOffset uint64 `json:"durable_offset"`
	// ReleasedOffset is where the source's completed checkpoints have
	// released the log to.
	ReleasedOffset uint64 `json:"released_offset"`
	// LagRecords is NextOffset - ReleasedOffset: the messages the source
	// has not yet committed through a checkpoint.
	LagRecords      uint64 `json:"lag_records"`
	UnreleasedBytes int64  `json:"unreleased_bytes"`
	// Appends counts the messages appended (the rate in).
	Appends       uint64 `json:"appends"`
	AppendedBytes uint64 `json:"appended_bytes"`
	// Fsyncs counts the log's fsyncs (of segment files and of its
	// directory): appends share them (group commit), so Appends / Fsyncs
	// is how many messages one fsync made durable.
	Fsyncs uint64 `json:"fsyncs"`
	// Blocked counts the appends that waited for space (the log full).
	Blocked uint64 `json:"blocked"`
	// Waiting is the appends waiting for space now.
	Waiting int `json:"waiting"`
	// SourceBroker is the external broker the pipeline subscribes to
	// (source.mqtt.broker, its password left out); empty for the
	// embedded broker.
	SourceBroker string `json:"source_broker,omitempty"`
	// SourceConnected tells, for an external broker, whether the
	// subscriber holds a connection the broker accepted; absent for the
	// embedded broker.
	SourceConnected *bool `json:"source_connected,omitempty"`
	// SourceConnects counts the connections the external broker accepted
	// since the node started (1 + reconnects).
	SourceConnects uint64 `json:"source_connects,omitempty"`
}

// IngestList is the body of GET /ingest, by pipeline name.
type IngestList struct {
	Pipelines []IngestInfo `json:"pipelines"`
}

// BrokerClient is one client connected to the embedded broker.
type BrokerClient struct {
	ID              string `json:"id"`
	Remote          string `json:"remote"`
	Listener        string `json:"listener"`
	ProtocolVersion byte   `json:"protocol_version"`
	CleanSession    bool   `json:"clean_session"`
}

// BrokerClients is the body of GET /broker/clients.
type BrokerClients struct {
	// Embedded is set when the node runs the embedded broker; Clients is
	// then its connected clients, by id.
	Embedded bool           `json:"embedded"`
	Address  string         `json:"address,omitempty"`
	Clients  []BrokerClient `json:"clients"`
}

// mountDashboard adds the dashboard's endpoints and the dashboard itself
// (at /) to mux.
func (n *node) mountDashboard(mux *http.ServeMux) {
	mux.HandleFunc("GET /jobs/{name}/graph", n.handleGraph)
	mux.HandleFunc("GET /jobs/{name}/deadletters", n.handleDeadLetters)
	mux.HandleFunc("GET /ingest", n.handleIngest)
	mux.HandleFunc("GET /broker/clients", n.handleBrokerClients)
	mux.Handle("GET /", dashboard.Handler())
}

func (n *node) handleGraph(w http.ResponseWriter, r *http.Request) {
	j, err := n.job(r.Context(), r.PathValue("name"))
	if err != nil {
		writeError(w, err)
		return
	}
	p := j.run.Plan()
	if p == nil {
		writeJSON(w, http.StatusConflict, ErrorBody{Error: fmt.Errorf("%w: %q", ErrNoPlan, j.name).Error()})
		return
	}
	writeJSON(w, http.StatusOK, graphOf(j.name, p))
}

// graphOf describes plan p of job name.
func graphOf(name string, p *actors.Plan) JobGraph {
	g := JobGraph{Job: name, Chains: make([]GraphChain, 0, len(p.Chains)), Edges: []GraphEdge{}}
	chainOf := map[*actors.Vertex]int{}
	for i, c := range p.Chains {
		ops := make([]string, 0, len(c.Vertices))
		for _, v := range c.Vertices {
			ops = append(ops, v.Name)
			chainOf[v] = i
		}
		g.Chains = append(g.Chains, GraphChain{ID: i, Name: c.Name(), Operators: ops,
			Parallelism: c.Head().Parallelism, Source: c.Head().IsSource(), Sink: len(c.Out) == 0})
	}
	for i, c := range p.Chains {
		for _, e := range c.Out {
			g.Edges = append(g.Edges, GraphEdge{From: i, To: chainOf[e.To], Partitioner: e.Partition.String(), SideOutput: e.Output})
		}
	}
	return g
}

func (n *node) handleDeadLetters(w http.ResponseWriter, r *http.Request) {
	j, err := n.job(r.Context(), r.PathValue("name"))
	if err != nil {
		writeError(w, err)
		return
	}
	limit := pipeline.RecentDeadLetters
	if s := r.URL.Query().Get("n"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 0 {
			writeJSON(w, http.StatusBadRequest, ErrorBody{Error: fmt.Sprintf("n (%q) must be a whole number from 0 (at most %d are kept)", s, pipeline.RecentDeadLetters)})
			return
		}
		limit = min(v, limit)
	}
	if n.cluster == nil {
		writeJSON(w, http.StatusOK, deadLetters(j.name, j.pj.DeadLetters(), j.pj.RecentDeadLetters(), limit))
		return
	}
	by, total, recent := n.clusterDeadLetters(r.Context(), j, limit)
	writeJSON(w, http.StatusOK, DeadLetterList{Job: j.name, Total: total, ByNode: by, Recent: recent})
}

// deadLetters builds the answer from the recent dead letters (oldest
// first), keeping the newest limit, newest first.
func deadLetters(name string, total int64, recent []pipeline.DeadLetter, limit int) DeadLetterList {
	l := DeadLetterList{Job: name, Total: total, Recent: []DeadLetterInfo{}}
	for i := len(recent) - 1; i >= 0 && len(l.Recent) < limit; i-- {
		l.Recent = append(l.Recent, DeadLetterInfo{Error: recent[i].Err, Payload: recent[i].Payload})
	}
	return l
}

func (n *node) handleIngest(w http.ResponseWriter, r *http.Request) {
	l := IngestList{Pipelines: []IngestInfo{}}
	if m := n.mqtt; m != nil {
		for name, log := range m.logs {
			s := log.Stats()
			l.Pipelines = append(l.Pipelines, IngestInfo{Pipeline: name, DiskBytes: s.DiskBytes, Segments: s.Segments,
				FirstOffset: s.FirstOffset, NextOffset: s.NextOffset, DurableOffset: s.DurableOffset,
				ReleasedOffset: s.ReleasedOffset, LagRecords: s.NextOffset - min(s.ReleasedOffset, s.NextOffset),
				UnreleasedBytes: s.UnreleasedBytes, Appends: s.Appends, AppendedBytes: s.AppendedBytes, Fsyncs: s.Fsyncs,
				Blocked: s.Blocked, Waiting: s.Waiting})
		}
		for _, s := range m.subs {
			for i := range l.Pipelines {
				if p := &l.Pipelines[i]; p.Pipeline == s.Pipeline() {
					up := s.Connected()
					p.SourceBroker, p.SourceConnected, p.SourceConnects = s.Broker(), &up, s.Connects()
				}
			}
		}
	}
	slices.SortFunc(l.Pipelines, func(a, b IngestInfo) int { return strings.Compare(a.Pipeline, b.Pipeline) })
	writeJSON(w, http.StatusOK, l)
}

func (n *node) handleBrokerClients(w http.ResponseWriter, r *http.Request) {
	b := BrokerClients{Clients: []BrokerClient{}}
	if m := n.mqtt; m != nil && m.broker != nil {
		b.Embedded, b.Address = true, m.broker.Addr()
		for _, c := range m.broker.Server().Clients.GetAll() {
			if c.Net.Inline {
				continue
			}
			if c.Closed() {
				continue
			}
			b.Clients = append(b.Clients, BrokerClient{ID: c.ID, Remote: c.Net.Remote, Listener: c.Net.Listener,
				ProtocolVersion: c.Properties.ProtocolVersion, CleanSession: c.Properties.Clean})
		}
	}
	slices.SortFunc(b.Clients, func(x, y BrokerClient) int { return strings.Compare(x.ID, y.ID) })
	writeJSON(w, http.StatusOK, b)
}

// apiToken resolves the token of the node's API and logs a generated one
// (with the dashboard's URL) so the operator can use it.
func (n *node) apiToken() string {
	t, generated, err := resolveToken(n.opts.Listen, n.opts.Token, n.opts.RequireToken)
	if err != nil {
		// Without a token the API must not be served on this address: use
		// one nobody knows rather than none.
		n.log.Error("api token: cannot generate one; the API refuses every request", "err", err)
		return "\x00unusable"
	}
	switch {
	case generated:
		n.log.Warn("api requires a token; generated one (set node.token to choose it)", "listen", n.opts.Listen,
			"token", t, "dashboard", "http://"+n.opts.Listen+"/?token="+t)
	case t != "":
		n.log.Info("api requires a token", "listen", n.opts.Listen)
	}
	return t
}
