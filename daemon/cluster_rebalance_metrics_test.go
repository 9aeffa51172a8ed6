package daemon

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/edgedio/edged/cluster"
)

// talliedCluster serves a fixed status and the rebalance counts of a job
// masters' node: testClusterNode has no transport, so its own Status is
// not served.
type talliedCluster struct {
	*fakeCluster
	c *clusterNode
}

func (t talliedCluster) rebalances() *rebalanceTally { return t.c.rebalances() }

// scrapeRebalances returns the lines of GET /metrics about the rebalances
// by mode and their pauses.
func scrapeRebalances(t *testing.T, p cluster.StatusProvider) string {
	t.Helper()
	api, _ := clusterAPI(t, p)
	code, body := get(t, api, "/metrics")
	if code != http.StatusOK {
		t.Fatalf("GET /metrics: %d", code)
	}
	var out []string
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, "edged_cluster_rebalances_by_mode_total") || strings.HasPrefix(l, "edged_cluster_rebalance_pause_seconds") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n") + "\n"
}

// Every rebalance the job masters' node records is counted by trigger,
// mode and outcome (the history keeps only the latest ten), and each
// moved subtask's pause goes into a histogram by mode: a handover's
// pauses apart from a redeployment's.
func TestRebalanceMetricsByMode(t *testing.T) {
	c := testClusterNode(t, map[string]int{"a": 2, "c": 2})
	// A refused drain, recorded by the drain path itself.
	if err := c.Drain(context.Background(), "b"); !errors.Is(err, cluster.ErrOverCapacity) {
		t.Fatalf("drain: %v", err)
	}
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for range 11 {
		c.recordRebalance(cluster.Rebalance{At: at, Trigger: cluster.TriggerJoin, Mode: cluster.RebalanceHandover, Outcome: cluster.RebalanceDone,
			PauseMS: map[string]float64{"j1/window/0": 12, "j2/window/0": 30}})
	}
	c.recordRebalance(cluster.Rebalance{At: at, Trigger: cluster.TriggerManual, Mode: cluster.RebalanceHandover, Outcome: cluster.RebalanceFellBack,
		PauseMS: map[string]float64{}})
	c.recordRebalance(cluster.Rebalance{At: at, Trigger: cluster.TriggerDrain, Mode: cluster.RebalanceRedeploy, Outcome: cluster.RebalanceDone,
		PauseMS: map[string]float64{"j1/window/1": 1500}})
	got := scrapeRebalances(t, talliedCluster{fakeCluster: &fakeCluster{status: threeNodes()}, c: c})
	for _, want := range []string{
		`edged_cluster_rebalances_by_mode_total{mode="none",outcome="refused",trigger="drain"} 1`,
		`edged_cluster_rebalances_by_mode_total{mode="handover",outcome="done",trigger="join"} 11`,
		`edged_cluster_rebalances_by_mode_total{mode="handover",outcome="fell-back",trigger="manual"} 1`,
		`edged_cluster_rebalances_by_mode_total{mode="redeploy",outcome="done",trigger="drain"} 1`,
		`edged_cluster_rebalance_pause_seconds_bucket{mode="handover",le="0.01"} 0`,
		`edged_cluster_rebalance_pause_seconds_bucket{mode="handover",le="0.025"} 11`,
		`edged_cluster_rebalance_pause_seconds_bucket{mode="handover",le="0.05"} 22`,
		`edged_cluster_rebalance_pause_seconds_count{mode="handover"} 22`,
		`edged_cluster_rebalance_pause_seconds_bucket{mode="redeploy",le="1"} 0`,
		`edged_cluster_rebalance_pause_seconds_bucket{mode="redeploy",le="2.5"} 1`,
		`edged_cluster_rebalance_pause_seconds_count{mode="redeploy"} 1`,
	} {
		if !strings.Contains(got, want+"\n") {
			t.Errorf("metrics lack %q", want)
		}
	}
	// 11 × (12 + 30) ms, give or take the float sum's last digits.
	if !strings.Contains(got, `edged_cluster_rebalance_pause_seconds_sum{mode="handover"} 0.46`) {
		t.Errorf("the handover pauses' sum is not 0.462 s")
	}
	if t.Failed() {
		t.Logf("scraped:\n%s", got)
	}
	// A provider that does not count (a cluster of another kind) exports
	// neither.
	if got := scrapeRebalances(t, &fakeCluster{status: threeNodes()}); strings.TrimSpace(got) != "" {
		t.Fatalf("a provider without counts exported:\n%s", got)
	}
}
