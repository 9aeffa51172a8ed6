package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/pipeline"
	"github.com/edgedio/edged/snapshot"
)

// A node that refuses a deployment because it follows a newer job master
// (ErrStaleMaster, 409) answers an invitation that wraps
// actors.ErrNotPlaced: the old master's attempt waits as without a
// majority, without using up its restart strategy, until it yields. Any
// other refusal (a plan mismatch, say) stays a failure.
func TestInviteRefusedByAStaleMasterIsNotPlaced(t *testing.T) {
	refusal := make(chan error, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		clusterError(w, http.StatusConflict, <-refusal)
	}))
	defer srv.Close()
	cfg := &pipeline.ClusterConfig{Node: "a", Listen: "127.0.0.1:1",
		Peers: []pipeline.PeerConfig{{ID: "b", Address: "127.0.0.1:1", API: strings.TrimPrefix(srv.URL, "http://")}}}
	p := &peerClient{cfg: cfg, http: srv.Client()}

	refusal <- fmt.Errorf("%w: deployment of job %q in epoch 1 by %q, the node saw epoch 9", ErrStaleMaster, "j", "a")
	if err := p.invite(context.Background(), "b", actors.Deployment{Job: "j", Epoch: 1, Mode: snapshot.ExactlyOnce}); !errors.Is(err, actors.ErrNotPlaced) {
		t.Fatalf("invite refused by a node that saw a newer epoch: %v, want it to wrap actors.ErrNotPlaced", err)
	}
	refusal <- fmt.Errorf("%w: fingerprints differ", actors.ErrPlanMismatch)
	err := p.invite(context.Background(), "b", actors.Deployment{Job: "j", Epoch: 1, Mode: snapshot.ExactlyOnce})
	if err == nil || errors.Is(err, actors.ErrNotPlaced) {
		t.Fatalf("invite refused for a plan mismatch: %v, want a failure, not ErrNotPlaced", err)
	}
}
