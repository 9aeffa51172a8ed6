package test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/edgedio/edged/internal/testutil"
)

// Rebalances that move source splits and drain nodes by handover, with
// real edged processes under MQTT load.

// rebalanceModes is what GET /cluster says of each rebalance: its
// trigger, outcome, mode and pauses.
type rebalanceModes struct {
	Epoch          uint64 `json:"epoch"`
	FailoversTotal int64  `json:"failovers_total"`
	Rebalances     []struct {
		Trigger string             `json:"trigger"`
		Outcome string             `json:"outcome"`
		Mode    string             `json:"mode"`
		PauseMS map[string]float64 `json:"pause_ms"`
		Error   string             `json:"error"`
	} `json:"rebalances"`
}

// A fourth node joins a three-node cluster (four configured) mid-stream
// under MQTT load, with no placement pinned: the join moves every
// subtask whose home is the new node back to it — its source split (which
// ran idle on another node meanwhile) and the subtasks downstream of it —
// by handovers in the running deployment, not by a redeployment: the
// rebalance is recorded as done by handover with the split's pause, the
// job's epoch is the same, the new node's devices publish to it once it
// owns its split, and every window of every sensor arrives exactly once
// with the exact count.
func TestClusterJoinHandsOverSourceSplit(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with four subprocesses")
	}
	maybeBurn(t)
	members := startClusterOf(t, []string{"a", "b", "c", "d"}, 3, 4)
	a, d := members[0], members[3]
	l := newPartialLoad(t, members, 3)
	client := &http.Client{Timeout: 2 * time.Second}
	waitAllAlive(t, a, 3)
	const n = 40_000
	next := 0
	l.publish(next, n/4)
	next = n / 4
	checkpointsSettled(t, a)
	var before rebalanceModes
	if err := a.get(client, "/cluster", &before); err != nil {
		t.Fatal(err)
	}
	d.start()
	l.connect(3)
	for next < n/2 && keyGroupsOn(t, a, "d") == 0 {
		l.publish(next, next+500)
		next += 500
	}
	testutil.Eventually(t, 90*time.Second, "node d owns key groups", func() bool { return keyGroupsOn(t, a, "d") > 0 })
	var after rebalanceModes
	testutil.Eventually(t, 90*time.Second, "the join rebalance ended", func() bool {
		if err := a.get(client, "/cluster", &after); err != nil {
			return false
		}
		for _, r := range after.Rebalances[len(before.Rebalances):] {
			if r.Trigger == "join" && r.Outcome != "running" {
				return true
			}
		}
		return false
	})
	moved := false
	for _, r := range after.Rebalances[len(before.Rebalances):] {
		t.Logf("rebalance: %+v", r)
		if r.Trigger != "join" {
			continue
		}
		if r.Outcome != "done" || r.Mode != "handover" {
			t.Fatalf("the join: outcome %q mode %q (%s), want done by handover", r.Outcome, r.Mode, r.Error)
		}
		for k := range r.PauseMS {
			moved = moved || strings.HasSuffix(k, "/source/3")
		}
	}
	if !moved {
		t.Fatal("the join did not move the source split of d by handover")
	}
	if after.Epoch != before.Epoch {
		t.Fatalf("the job's epoch went from %d to %d: it restarted", before.Epoch, after.Epoch)
	}
	delete(l.down, 3)
	l.publish(next, n)
	l.finishChecked(n, 120*time.Second)
	d.checkTookRecords(t, client)
}
