package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/edgedio/edged/cluster"
	"github.com/edgedio/edged/internal/testutil"
)

// queuedCluster is a fakeCluster whose drains wait, as a drain queued
// behind the rebalance gate does, until the caller gives up; asked gets
// each drained node once the node has the request.
type queuedCluster struct {
	*fakeCluster
	asked chan string
}

func (q *queuedCluster) Drain(ctx context.Context, node string) error {
	q.asked <- node
	<-ctx.Done()
	return ctx.Err()
}

// A drain the command stops waiting for (its --timeout ends, or it is
// interrupted) exits 1 and says that the drain was asked and is still
// queued or in progress on the node, and how to see its outcome; not a
// bare "context deadline exceeded".
func TestClusterDrainTimeoutSaysTheDrainIsQueued(t *testing.T) {
	q := &queuedCluster{fakeCluster: &fakeCluster{status: clusterOfThree()}, asked: make(chan string, 2)}
	addr := startClusterNode(t, q)
	t.Setenv("EDGED_TOKEN", "t0k")

	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"cluster", "drain", "n2", "--timeout", "500ms", "--addr", addr}, &out, &errb)
	if node := testutil.Receive(t, 0, "the drain asked of the node", q.asked); node != "n2" {
		t.Fatalf("drain of %q asked", node)
	}
	t.Logf("stderr: %s", errb.String())
	for _, want := range []string{"edged cluster drain: no answer within --timeout 500ms; the drain of n2 was asked and is still queued or in progress on the node",
		"edged cluster status", "context deadline exceeded"} {
		if code != exitFailure || !strings.Contains(errb.String(), want) {
			t.Fatalf("exit %d, stderr %q, want it to say %q", code, errb.String(), want)
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errb.Reset()
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"cluster", "drain", "n2", "--addr", addr}, &out, &errb)
	}()
	testutil.Receive(t, 0, "the drain asked of the node", q.asked)
	cancel()
	code = testutil.Receive(t, 0, "the command's exit", done)
	if want := "edged cluster drain: interrupted before the node answered; the drain of n2 was asked and is still queued or in progress on the node"; code != exitFailure || !strings.Contains(errb.String(), want) {
		t.Fatalf("exit %d, stderr %q, want it to say %q", code, errb.String(), want)
	}
}

// The usages document the cluster commands' --timeout.
func TestClusterUsageDocumentsTimeout(t *testing.T) {
	for _, u := range []string{usage, clusterUsage} {
		for _, cmd := range []string{"status", "drain", "undrain", "rebalance"} {
			found := false
			for _, line := range strings.Split(u, "\n") {
				if strings.HasPrefix(line, "  edged cluster "+cmd+" ") && strings.Contains(line, "[--timeout d]") {
					found = true
				}
			}
			if !found {
				t.Errorf("the usage names no --timeout for edged cluster %s:\n%s", cmd, u)
			}
		}
		if !strings.Contains(u, "stays\nqueued or in progress on the node") {
			t.Errorf("the usage does not say what a --timeout leaves behind:\n%s", u)
		}
	}
}

// A rebalance that moved nothing prints its note.
func TestRebalanceSummaryPrintsTheNote(t *testing.T) {
	r := &cluster.Rebalance{Outcome: cluster.RebalanceDone, PauseMS: map[string]float64{}, Note: "every job runs on that placement already: nothing moved, nothing restarted"}
	if got, want := rebalanceSummary(r), ": done, 0 key groups moved, 0 B shipped (every job runs on that placement already: nothing moved, nothing restarted)"; got != want {
		t.Fatalf("summary %q, want %q", got, want)
	}
}
