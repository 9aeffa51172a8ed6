package daemon

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/edgedio/edged/pipeline"
)

// A worker's GET /jobs reads the leader's list (GET /jobs?local=1 there)
// and names itself, the leader and whose jobs they are, each job with
// the tasks the worker hosts of it; when the leader does not answer it
// says so in a note instead of answering an empty list.
func TestWorkerJobListReadsTheLeaders(t *testing.T) {
	var asked []string
	mux := http.NewServeMux()
	mux.HandleFunc("GET /jobs", func(w http.ResponseWriter, r *http.Request) {
		asked = append(asked, r.URL.RawQuery)
		writeJSON(w, http.StatusOK, JobList{Jobs: []JobInfo{{Name: "sensors", Status: StatusRunning, Attempts: 2, Checkpointing: true}},
			Node: "a", Leader: "a", From: "a"})
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	cfg := &pipeline.ClusterConfig{Node: "b", Listen: "127.0.0.1:1",
		Peers: []pipeline.PeerConfig{{ID: "a", API: strings.TrimPrefix(srv.URL, "http://")}, {ID: "c"}}}
	c := &clusterNode{cfg: cfg, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	c.peers = &peerClient{cfg: cfg, http: srv.Client()}
	if c.isMaster() || c.leader() != "a" {
		t.Fatalf("b: master %v, leader %q", c.isMaster(), c.leader())
	}
	l := c.workerJobList(context.Background())
	if len(asked) != 1 || asked[0] != "local=1" {
		t.Fatalf("the leader was asked %q, want once with local=1", asked)
	}
	if l.Node != "b" || l.Leader != "a" || l.From != "a" || l.Note != "" || len(l.Jobs) != 1 {
		t.Fatalf("list %+v", l)
	}
	if j := l.Jobs[0]; j.Name != "sensors" || j.Status != StatusRunning || j.Attempts != 2 || j.TasksHere == nil || *j.TasksHere != 0 {
		t.Fatalf("job %+v", j)
	}
	srv.Close()
	l = c.workerJobList(context.Background())
	if l.Node != "b" || l.Leader != "a" || l.From != "b" || len(l.Jobs) != 0 ||
		!strings.Contains(l.Note, `the leader "a" (it runs the job masters) did not answer`) ||
		!strings.Contains(l.Note, "this node hosts no task of any job") {
		t.Fatalf("leader down: %+v", l)
	}
}
