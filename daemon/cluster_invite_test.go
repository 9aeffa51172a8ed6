package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/pipeline"
	"github.com/edgedio/edged/snapshot"
)

// A node that refuses a deployment because it follows a newer job master
// (ErrStaleMaster, 409) answers an invitation that wraps
// actors.ErrNotPlaced: the old master's attempt waits as without a
// majority, without using up its restart strategy, until it yields; so
// does one that cannot take a deployment now (503: it lost the majority
// or shuts down). Any other refusal (a plan mismatch, say) stays a
// failure.
func TestInviteRefusedByAStaleMasterIsNotPlaced(t *testing.T) {
	refusal := make(chan error, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		err := <-refusal
		status := http.StatusConflict
		if errors.Is(err, actors.ErrEvicted) {
			status = http.StatusServiceUnavailable
		}
		clusterError(w, status, err)
	}))
	defer srv.Close()
	cfg := &pipeline.ClusterConfig{Node: "a", Listen: "127.0.0.1:1",
		Peers: []pipeline.PeerConfig{{ID: "b", Address: "127.0.0.1:1", API: strings.TrimPrefix(srv.URL, "http://")}}}
	p := &peerClient{cfg: cfg, http: srv.Client()}

	refusal <- fmt.Errorf("%w: deployment of job %q in epoch 1 by %q, the node saw epoch 9", ErrStaleMaster, "j", "a")
	if err := p.invite(context.Background(), "b", actors.Deployment{Job: "j", Epoch: 1, Mode: snapshot.ExactlyOnce}); !errors.Is(err, actors.ErrNotPlaced) {
		t.Fatalf("invite refused by a node that saw a newer epoch: %v, want it to wrap actors.ErrNotPlaced", err)
	}
	refusal <- fmt.Errorf("%w: job %q", actors.ErrEvicted, "j")
	if err := p.invite(context.Background(), "b", actors.Deployment{Job: "j", Epoch: 1, Mode: snapshot.ExactlyOnce}); !errors.Is(err, actors.ErrNotPlaced) {
		t.Fatalf("invite refused by a node that lost the majority (503): %v, want it to wrap actors.ErrNotPlaced", err)
	}
	refusal <- fmt.Errorf("%w: fingerprints differ", actors.ErrPlanMismatch)
	err := p.invite(context.Background(), "b", actors.Deployment{Job: "j", Epoch: 1, Mode: snapshot.ExactlyOnce})
	if err == nil || errors.Is(err, actors.ErrNotPlaced) {
		t.Fatalf("invite refused for a plan mismatch: %v, want a failure, not ErrNotPlaced", err)
	}
}

// A peer call refused because the peer's budget for request bodies was
// taken (503, ErrBodiesBusy) is sent again, whole, until the peer takes
// it; one whose context ends meanwhile returns the refusal.
func TestPeerCallRefusedForBusyBodiesIsSentAgain(t *testing.T) {
	var mu sync.Mutex
	busy := 2
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		got = append(got, string(b))
		if busy != 0 {
			busy--
			clusterError(w, http.StatusServiceUnavailable, fmt.Errorf("%w: a body of %d bytes", ErrBodiesBusy, len(b)))
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{})
	}))
	defer srv.Close()
	cfg := &pipeline.ClusterConfig{Node: "a", Listen: "127.0.0.1:1",
		Peers: []pipeline.PeerConfig{{ID: "b", Address: "127.0.0.1:1", API: strings.TrimPrefix(srv.URL, "http://")}}}
	p := &peerClient{cfg: cfg, http: srv.Client()}

	d := actors.Deployment{Job: "j", Epoch: 1, Mode: snapshot.ExactlyOnce}
	if err := p.invite(context.Background(), "b", d); err != nil {
		t.Fatalf("invite refused twice for busy bodies, then taken: %v", err)
	}
	want, _ := json.Marshal(d)
	mu.Lock()
	if len(got) != 3 || got[0] != string(want) || got[1] != string(want) || got[2] != string(want) {
		t.Fatalf("bodies received: %q, want three times %q", got, want)
	}
	busy = -1 // busy for good
	mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	err := p.invite(ctx, "b", d)
	var ae *APIError
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusServiceUnavailable || !errors.Is(err, actors.ErrNotPlaced) {
		t.Fatalf("invite refused for busy bodies until its deadline: %v, want the 503 wrapping actors.ErrNotPlaced", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) < 5 {
		t.Fatalf("a call refused for busy bodies was sent %d more times before its deadline, want it sent again", len(got)-3)
	}
}

// A call refused for busy bodies whose context ends while the next try is
// on its way returns the refusal, not the context's error: the caller
// learns that the peer refused it (actors.ErrNotPlaced).
func TestPeerCallRefusedThenCutByItsContextReturnsTheRefusal(t *testing.T) {
	var tries atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		if tries.Add(1) == 1 {
			clusterError(w, http.StatusServiceUnavailable, fmt.Errorf("%w: a body of 1 bytes", ErrBodiesBusy))
			return
		}
		<-r.Context().Done() // the next try hangs until the caller gives up
	}))
	defer srv.Close()
	cfg := &pipeline.ClusterConfig{Node: "a", Listen: "127.0.0.1:1",
		Peers: []pipeline.PeerConfig{{ID: "b", Address: "127.0.0.1:1", API: strings.TrimPrefix(srv.URL, "http://")}}}
	p := &peerClient{cfg: cfg, http: srv.Client()}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- p.invite(ctx, "b", actors.Deployment{Job: "j", Epoch: 1, Mode: snapshot.ExactlyOnce}) }()
	testutil.Eventually(t, 10*time.Second, "the second try to reach the peer", func() bool { return tries.Load() == 2 })
	cancel()
	err := testutil.Receive(t, 10*time.Second, "the invite to return", done)
	var ae *APIError
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusServiceUnavailable || !errors.Is(err, actors.ErrNotPlaced) {
		t.Fatalf("invite refused, then cut by its context on the next try: %v, want the 503 wrapping actors.ErrNotPlaced", err)
	}
}
