package daemon

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/edgedio/edged/pipeline"
)

// metadataPut is a PUT of a snapshot's metadata to rn with body and the
// declared length n, of the epoch rn saw.
func metadataPut(rn *replicaNode, body io.Reader, n int64) *http.Request {
	req := httptest.NewRequest(http.MethodPut, "/cluster/jobs/"+replicaJobName+"/checkpoints/1/metadata", body)
	req.SetPathValue("job", replicaJobName)
	req.SetPathValue("id", "1")
	req.Header.Set(epochHeader, strconv.FormatUint(1<<32+7, 10))
	req.ContentLength = n
	return req
}

// The bodies of the peers' requests a node reads at once share one
// budget: while a large one is being read (its sender trickles it), a
// second large one is refused with 503 at once instead of taking as much
// memory again, and taken once the first is done; a body declared over
// the endpoint's limit is refused with 413 before a byte of it is read.
// Before, every request read up to 64 MiB in parallel: six at once took a
// node (node.memory.limit 56 MiB) to 670 MB of RSS.
func TestPeerRequestBodiesShareABudget(t *testing.T) {
	rn := replicaCluster(t)["b"]
	const large = 40 << 20

	pr, pw := io.Pipe()
	first := make(chan int)
	go func() {
		w := httptest.NewRecorder()
		rn.rep.handleMetadata(w, metadataPut(rn, pr, large))
		first <- w.Code
	}()
	// The first request holds its part of the budget while it waits for
	// its body.
	if _, err := pw.Write([]byte(`{"metadata":"`)); err != nil {
		t.Fatal(err)
	}

	second := func() *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		rn.rep.handleMetadata(w, metadataPut(rn, strings.NewReader(strings.Repeat("x", 64)), large))
		return w
	}
	if w := second(); w.Code != http.StatusServiceUnavailable || !strings.Contains(w.Body.String(), "try again") {
		t.Fatalf("second large body while the first is read: %d %s, want 503", w.Code, w.Body)
	}
	// A small body still fits beside it (the master's usual metadata).
	w := httptest.NewRecorder()
	rn.rep.handleMetadata(w, metadataPut(rn, strings.NewReader(`{"metadata":""}`), 15))
	if w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), "snapshot metadata") {
		t.Fatalf("small body beside a large one: %d %s, want 400 for its metadata", w.Code, w.Body)
	}

	pw.CloseWithError(io.ErrUnexpectedEOF)
	if code := <-first; code != http.StatusBadRequest {
		t.Fatalf("first (cut short) body: %d, want 400", code)
	}
	if w := second(); w.Code != http.StatusBadRequest {
		t.Fatalf("second large body once the first is done: %d %s, want 400 for its JSON", w.Code, w.Body)
	}

	w = httptest.NewRecorder()
	rn.rep.handleMetadata(w, metadataPut(rn, strings.NewReader("{}"), 65<<20))
	if w.Code != http.StatusRequestEntityTooLarge || !strings.Contains(w.Body.String(), "too large") {
		t.Fatalf("body declared over the limit: %d %s, want 413", w.Code, w.Body)
	}
}

// The answers of a peer that the node reads whole are cut at
// maxPeerAnswer: a peer that answers a job list with more (here a 20 MiB
// string, which decoded whole before) gets an error, not the node's
// memory.
func TestPeerAnswerOverMaxPeerAnswerRefused(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"jobs":[],"x":"`)
		io.WriteString(w, strings.Repeat("x", maxPeerAnswer+4<<20))
		io.WriteString(w, `"}`)
	}))
	defer srv.Close()
	cfg := &pipeline.ClusterConfig{Node: "a", Listen: "127.0.0.1:1",
		Peers: []pipeline.PeerConfig{{ID: "b", Address: "127.0.0.1:1", API: strings.TrimPrefix(srv.URL, "http://")}}}
	p := &peerClient{cfg: cfg, http: srv.Client()}
	ctx := context.Background()
	if _, err := p.jobsOf(ctx, "b"); err == nil {
		t.Fatal("job list over maxPeerAnswer accepted")
	}
	if _, err := p.ingest(ctx, "b"); err == nil {
		t.Fatal("ingest list over maxPeerAnswer accepted")
	}
	if _, err := p.drain(ctx, "b", "a"); err == nil {
		t.Fatal("drain answer over maxPeerAnswer accepted")
	}
}
