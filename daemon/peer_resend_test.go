package daemon

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/edgedio/edged/pipeline"
)

// A peer refuses a body its budget cannot take before it reads any of
// it (peerBodies.decode), while the sender's transport may still be
// writing that body when the 503 comes back. A call sent again sends its
// whole body from its own reader: the peer decodes what was sent, and no
// two requests read one reader at once.
func TestPeerCallSentAgainWhileTheRefusedBodyIsStillBeingWritten(t *testing.T) {
	payload := map[string]string{"v": strings.Repeat("x", 4<<20)}
	bodies := newPeerBodies(1 << 20)
	var mu sync.Mutex
	busy := 3
	var got []int
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		refuse := busy > 0
		busy--
		mu.Unlock()
		b := bodies
		if !refuse {
			b = newPeerBodies(64 << 20)
		}
		var v map[string]string
		if status, err := b.decode(r, 64<<20, &v); err != nil {
			clusterError(w, status, err)
			return
		}
		mu.Lock()
		got = append(got, len(v["v"]))
		mu.Unlock()
		writeJSON(w, http.StatusOK, map[string]any{})
	}))
	defer srv.Close()
	cfg := &pipeline.ClusterConfig{Node: "a", Listen: "127.0.0.1:1",
		Peers: []pipeline.PeerConfig{{ID: "b", Address: "127.0.0.1:1", API: strings.TrimPrefix(srv.URL, "http://")}}}
	p := &peerClient{cfg: cfg, http: srv.Client()}

	body := []byte(`{"v":"` + payload["v"] + `"}`)
	resp, err := p.do(context.Background(), http.MethodPut, "b", "/x", bytes.NewReader(body), http.Header{"Content-Type": {"application/json"}})
	if err != nil {
		t.Fatalf("a call refused 3 times for busy bodies, then taken: %v", err)
	}
	resp.Body.Close()
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 1 || got[0] != len(payload["v"]) {
		t.Fatalf("the peer decoded %v, want one body of %d bytes", got, len(payload["v"]))
	}
}
