package daemon

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/edgedio/edged/cluster"
	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/snapshot"
)

// fakePeer serves a worker's GET /ingest (from ingest, given how many
// times it was asked before) and POST /cluster/leave, and counts both.
type fakePeer struct {
	asked, left atomic.Int32
}

func (p *fakePeer) serve(t *testing.T, node string, ingest func(n int32) IngestList) string {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /ingest", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, ingest(p.asked.Add(1)-1))
	})
	mux.HandleFunc("POST /cluster/leave", func(w http.ResponseWriter, r *http.Request) {
		p.left.Add(1)
		writeJSON(w, http.StatusOK, map[string]any{"node": node, "left": true})
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// A drain (a worker's SIGTERM asks for one) of a node that is in no
// running deployment — it hosts no subtask — has nothing to hand over:
// it neither waits for the node's ingest logs, which no running split
// reads and so no checkpoint releases (before, it waited out the 30 s
// bound: a worker with no subtasks took 30 s to stop), nor takes a
// savepoint; it is recorded as done with a note and the node is asked
// to leave at once, the job running on untouched. A drain of a node that
// does host subtasks still waits for the ingest log its split reads, and
// only for that one: a log of another pipeline of the node's, which
// nothing releases, does not hold it.
func TestDrainOfANodeInNoDeploymentDoesNotWait(t *testing.T) {
	testutil.Burn(t, 1)
	want := hoReference(t, hoN, hoKeys)
	h := startHoCluster(t, newHoShape(hoN, hoKeys, hoRate, t.TempDir()), hoOptions{})
	// c is drained when the job starts, so it hosts none of its
	// subtasks; it is undrained here without a rebalance, as a node that
	// restarted and was not moved in yet.
	h.c.live.mu.Lock()
	delete(h.c.live.drained, "c")
	h.c.live.mu.Unlock()
	var b, c fakePeer
	h.c.cfg.Peers[1].API = c.serve(t, "c", func(int32) IngestList {
		// Never released: no running split reads it.
		return IngestList{Pipelines: []IngestInfo{{Pipeline: "moved", NextOffset: 500, ReleasedOffset: 0}}}
	})
	h.c.cfg.Peers[0].API = b.serve(t, "b", func(n int32) IngestList {
		l := IngestList{Pipelines: []IngestInfo{
			{Pipeline: "moved", NextOffset: 700, ReleasedOffset: 600},
			// Another pipeline of b's: nothing of the masters reads it.
			{Pipeline: "other", NextOffset: 50, ReleasedOffset: 0},
		}}
		if n > 0 {
			l.Pipelines[0].ReleasedOffset = 700
		}
		return l
	})
	r0 := h.runner(t)
	if nodes := r0.Nodes(); slices.Contains(nodes, "c") || !slices.Contains(nodes, "b") {
		t.Fatalf("deployment %v, want b in it and c not", nodes)
	}
	drain := func(node string) cluster.Rebalance {
		t.Helper()
		return h.rebalanceThroughGate(t, "the drain of "+node, func() error { return h.c.Drain(context.Background(), node) })
	}

	rec := drain("c")
	if rec.Outcome != cluster.RebalanceDone || rec.Note != nothingHosted || rec.Mode != "" || rec.MovedKeyGroups != 0 {
		t.Fatalf("drain of c: %+v, want done with the note %q", rec, nothingHosted)
	}
	if n := c.asked.Load(); n != 0 {
		t.Fatalf("the drain of c read its ingest logs %d times: it waited for logs nothing reads", n)
	}
	if c.left.Load() != 1 {
		t.Fatalf("c was asked to leave %d times", c.left.Load())
	}
	if r, _ := h.job.Execution().Runner(); r != r0 || h.job.Attempts() != 1 {
		t.Fatalf("the job restarted: %d attempts", h.job.Attempts())
	}
	for _, s := range r0.History() {
		if s.Kind == snapshot.KindSavepoint {
			t.Fatalf("the drain of c took savepoint %d", s.Checkpoint)
		}
	}

	rec = drain("b")
	if rec.Outcome != cluster.RebalanceDone || rec.Mode != cluster.RebalanceHandover {
		t.Fatalf("drain of b: %+v, want done by handover", rec)
	}
	// Asked twice: when the drain started, and once more, when the log
	// of "moved" was released up to where it was; "other" never is.
	if n := b.asked.Load(); n != 2 {
		t.Fatalf("the drain of b read its ingest logs %d times, want 2 (until the job's log was covered)", n)
	}
	if b.left.Load() != 1 {
		t.Fatalf("b was asked to leave %d times", b.left.Load())
	}
	h.finish(t, want)
}
