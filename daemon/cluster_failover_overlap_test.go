package daemon

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgedio/edged/cluster"
	"github.com/edgedio/edged/internal/testutil"
)

// Script: two workers killed together, their deaths seen in one step. A
// cluster of five nodes (a leads; the job runs on all five, a majority
// outlives two). d and e are killed at the same moment and the
// membership declares both dead at once: the leader fails over once,
// placing both nodes' subtasks on a, b and c, and records one failover
// naming both, with every duration, in GET /cluster and the metrics; the
// committed window counts are exact.
func TestFailoverScriptTwoWorkersKilledOneStep(t *testing.T) {
	fc := newFailoverCluster(t, foOptions{replicas: 2, nodes: 5})
	a := fc.nodes["a"]
	epoch0 := fc.checkpointedWith("d")
	fc.kill("d")
	fc.kill("e")
	a.c.live.follow(fc.declareDead("d", "e"), a.c.executions)

	epoch1 := fc.placedWithout(epoch0, "d", "e")
	fc.checkFailovers(epoch1, "d,e")
	fc.finish("a")
	fc.checkTotals()
	fc.checkFailovers(epoch1, "d,e")
}

// Script: a worker dies while another's failover is pending. Five nodes,
// a leading. d and e are killed at the same moment, but the membership
// declares e dead first and d only later (each death is confirmed on
// its own): the leader fails over from e at once, and its redeployment,
// which still names d, cannot run. Then d is declared dead while e's
// failover is pending, and seen by:
//
//   - the leader's step (liveView.follow), once e's deployment was made;
//   - the job's own restart (its deployment on d failed), before the
//     leader's step, which then finds nothing left to do;
//   - the leader's step before e's deployment was made (the leader,
//     reaching no majority for a moment, deploys nothing meanwhile).
//
// Each failover is recorded, once, with its own detection, placement,
// restore and first-record durations: two records, e's then d's, two
// failovers in GET /cluster and in the metrics; both end when the jobs
// run again on a, b and c. The committed window counts are exact.
func TestFailoverScriptWorkerDiesDuringFailover(t *testing.T) {
	for _, tc := range []struct {
		name string
		// held keeps the leader from deploying from e's death until d's
		// was seen: it reaches no majority for that moment.
		held bool
		// second makes the membership declare d dead and the cluster
		// see it, e's failover pending.
		second func(fc *foCluster)
	}{
		{name: "seen by the leader's step", second: func(fc *foCluster) {
			a := fc.nodes["a"]
			a.c.live.follow(fc.declareDead("d"), a.c.executions)
		}},
		{name: "seen by the job's restart", second: func(fc *foCluster) {
			a := fc.nodes["a"]
			v := a.c.live
			alive := fc.declareDead("d")
			testutil.Eventually(fc.t, time.Minute, "a deployment without d", func() bool {
				v.mu.Lock()
				defer v.mu.Unlock()
				return v.deployed != nil && !slices.Contains(v.deployed, "d")
			})
			// Now the membership loop's step runs on the leader.
			v.follow(alive, a.c.executions)
		}},
		{name: "seen before the deployment", held: true, second: func(fc *foCluster) {
			a := fc.nodes["a"]
			a.c.live.follow(fc.declareDead("d"), a.c.executions)
			fc.cutOff("")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fc := newFailoverCluster(t, foOptions{replicas: 2, nodes: 5})
			a := fc.nodes["a"]
			v := a.c.live
			epoch0 := fc.checkpointedWith("d")
			fc.kill("d")
			fc.kill("e")
			if tc.held {
				fc.cutOff("a")
			}
			v.follow(fc.declareDead("e"), a.c.executions)
			if tc.held {
				v.mu.Lock()
				deployed := v.deployed
				v.mu.Unlock()
				if deployed != nil {
					t.Fatalf("e's failover deployed on %v while the leader reaches no majority", deployed)
				}
			} else {
				// e's failover deployed: on d too, still seen alive.
				testutil.Eventually(t, time.Minute, "a deployment on d", func() bool {
					v.mu.Lock()
					defer v.mu.Unlock()
					return slices.Contains(v.deployed, "d")
				})
			}
			// Its jobs cannot run while it places subtasks on d: it stays
			// pending until d's death is seen.
			if !failoverPending(a.c) || len(a.c.Status().Failovers) > 0 {
				t.Fatalf("before d's death is seen: failovers %+v; want e's pending", a.c.Status().Failovers)
			}
			tc.second(fc)

			epoch1 := fc.placedWithout(epoch0, "d", "e")
			fc.checkFailovers(epoch1, "e", "d")
			fc.finish("a")
			fc.checkTotals()
			fc.checkFailovers(epoch1, "e", "d")
		})
	}
}

// placedWithout waits until the job master on a runs a deployment above
// epoch, checks that it places nothing on the nodes dead, and returns
// its epoch.
func (fc *foCluster) placedWithout(epoch uint64, dead ...string) uint64 {
	fc.t.Helper()
	after, epoch1 := fc.startedPlacement("a", epoch)
	for _, id := range dead {
		if n := onNode(after, id); len(n) > 0 {
			fc.t.Fatalf("epoch %d still places %v on the dead node %s", epoch1, n, id)
		}
	}
	return epoch1
}

// checkFailovers checks the failovers the leader a recorded: exactly
// one per entry of dead (the dead nodes of each, comma-separated), in
// that order, each in epoch or later with every duration; GET /cluster
// and the metrics count as many.
func (fc *foCluster) checkFailovers(epoch uint64, dead ...string) {
	t := fc.t
	t.Helper()
	a := fc.nodes["a"]
	testutil.Eventually(t, time.Minute, "every failover done", func() bool { return !failoverPending(a.c) })
	fos := a.c.Status().Failovers
	slices.SortStableFunc(fos, func(x, y cluster.Failover) int { return x.At.Compare(y.At) })
	var got []string
	for _, f := range fos {
		got = append(got, f.DeadNode)
	}
	if !slices.Equal(got, dead) {
		t.Fatalf("failovers recorded from %q, want %q: %+v", got, dead, fos)
	}
	testutil.Eventually(t, time.Minute, "each failover's first record", func() bool {
		fos = a.c.Status().Failovers
		for _, f := range fos {
			if f.FirstRecordMS <= 0 {
				return false
			}
		}
		return true
	})
	for _, f := range fos {
		if f.Epoch < epoch || f.DetectionMS <= 0 || f.PlacementMS <= 0 || f.RestoreMS <= 0 {
			t.Fatalf("failover %+v: want epoch %d or later and every duration", f, epoch)
		}
		t.Logf("failover from %s recorded in epoch %d: detection %.1f ms, placement %.2f ms, restore %.1f ms, first record %.1f ms",
			f.DeadNode, f.Epoch, f.DetectionMS, f.PlacementMS, f.RestoreMS, f.FirstRecordMS)
	}
	api, _ := clusterAPI(t, a.c)
	s, err := api.Cluster(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if s.FailoversTotal != int64(len(dead)) || len(s.Failovers) != len(dead) {
		t.Fatalf("GET /cluster: %d failovers %+v, want %d", s.FailoversTotal, s.Failovers, len(dead))
	}
	code, body := get(t, api, "/metrics")
	if code != http.StatusOK {
		t.Fatalf("GET /metrics: %d", code)
	}
	if !strings.Contains(body, fmt.Sprintf("edged_cluster_failovers_total %d\n", len(dead))) {
		t.Fatalf("metrics, want %d failovers:\n%s", len(dead), grepLines(body, "failover"))
	}
}

// failoverPending reports whether a failover is under way on c.
func failoverPending(c *clusterNode) bool {
	return c.handbackBusy(time.Now()) == "a failover is in progress"
}
