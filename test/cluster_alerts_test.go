package test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgedio/edged/internal/testutil"
)

// withAlerts makes a cluster node's pipeline fire the alerts workload's
// alerts (hot for alertForMS) and silent keys (alertSilent) instead of
// counting per window.
func withAlerts(cfg string) string {
	const window = "    window:\n      type: tumbling\n      size: 1s\n      aggregates:\n        - {name: count, fn: count}\n"
	if !strings.Contains(cfg, window) || !strings.Contains(cfg, fmt.Sprintf("max_out_of_orderness: %ds\n", alertOOOMS/1000)) {
		panic("withAlerts: unexpected config:\n" + cfg)
	}
	return strings.Replace(cfg, window, fmt.Sprintf("    alerts: [{name: hot, when: temp > 38, for: %dms}]\n    silent: {for: %dms}\n", alertForMS, alertSilent), 1)
}

// TestClusterAlertsFailover runs the alerts workload (alerts held for 2 s
// and silent keys, readings a little out of order, each sensor's readings
// dealt to the three nodes in turn) on a three-node cluster with gossip.
// A worker (or the leader, with the job masters) is SIGKILLed while the
// job processes the readings the live nodes took, its subtasks move to
// the live nodes, and it comes back and gets them back. A consumer that drops repeated msg_ids must get exactly
// the alerts a plain computation of the README's semantics gives, each
// under one msg_id.
func TestClusterAlertsFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with three subprocesses and SIGKILL")
	}
	t.Run("worker", func(t *testing.T) { clusterAlertsFailover(t, 2) })
	t.Run("leader", func(t *testing.T) { clusterAlertsFailover(t, 0) })
	t.Run("rescale", func(t *testing.T) { clusterAlertsFailover(t, -1) })
}

// clusterAlertsFailover runs TestClusterAlertsFailover, killing
// members[victim]; with victim -1 it instead stops the job with a
// savepoint through the CLI at a quarter of the readings (alerts pending,
// their records held until the watermark passes them), stops every node,
// and starts them again at parallelism 2, the leader with
// --from-savepoint.
func clusterAlertsFailover(t *testing.T, victim int) {
	rs := alertReadings()
	want := alertReference(rs)
	members := startClusterEdited(t, true, withAlerts)
	l := newClusterLoad(t, members)
	// 600 readings in flight (the default) span 3 s of the alerts'
	// event time (alertSensors readings per alertStepMS), and a node's
	// broker logs its four connections' readings in any order: a reading
	// could reach its split after one more than max_out_of_orderness
	// ahead of it on another connection, and be late (seen in CI: an
	// alert whose since was one step off, a late reading dead-lettered).
	// 120 readings span 600 ms; with the shuffle within 300 ms, less
	// than alertOOOMS.
	l.inFlight = 120
	l.payload = func(i int) (string, []byte) {
		r := rs[i]
		return "sensors/" + r.id + "/temperature", []byte(fmt.Sprintf(`{"sensor":%q,"t":%g,"ts":%d}`, r.id, r.temp, r.ts))
	}
	if victim < 0 {
		clusterAlertsRescale(t, members, l, rs)
	} else {
		clusterAlertsKill(t, members, l, rs, victim)
	}
	checkClusterAlerts(t, l, want)
}

// clusterAlertsRescale publishes rs to the cluster with a stop with
// savepoint and a resume at parallelism 2 at a quarter of them.
func clusterAlertsRescale(t *testing.T, members []*clusterMember, l *clusterLoad, rs []alertReading) {
	a := members[0]
	client := &http.Client{Timeout: time.Second}
	n := len(rs)
	l.publish(0, n/4)
	sp := cliStop(t, a.node, "sensors")
	for _, i := range []int{1, 2, 0} {
		l.stop(i)
	}
	for _, m := range members {
		setParallelism(t, m, 3, 2)
	}
	a.readyFn = a.hostsAndServes
	a.start("--from-savepoint", sp)
	delete(l.down, 0)
	l.connect(0)
	for _, i := range []int{1, 2} {
		l.restart(i)
	}
	testutil.Eventually(t, 60*time.Second, "the job runs on the three nodes", func() bool {
		return allHostTasks(client, members[1:])
	})
	a.checkRestoredFrom(t, sp)
	l.publish(n/4, n)
}

// clusterAlertsKill publishes rs to the cluster with members[victim]
// killed mid-stream and restarted.
func clusterAlertsKill(t *testing.T, members []*clusterMember, l *clusterLoad, rs []alertReading, victim int) {
	v := members[victim]
	watcher := members[0] // a node that stays up
	if victim == 0 {
		watcher = members[1]
	}
	client := &http.Client{Timeout: time.Second}
	testutil.Eventually(t, 30*time.Second, "the leader sees every node alive", func() bool {
		s, err := members[0].status(client)
		return err == nil && s.alive() == 3 && s.keyedOn(v.id) > 0
	})
	n := len(rs)
	n1, n2, n3 := n/4, n/2, 3*n/4
	l.publish(0, n1)
	testutil.Eventually(t, 60*time.Second, "node "+v.id+"'s log released all it was sent", func() bool {
		rel, err := v.released(client)
		// The readings i%3 == victim of [0, n1).
		return err == nil && rel >= uint64((n1-victim+2)/3)
	})
	l.disconnect(victim)
	l.down[victim] = true
	l.publish(n1, n2)
	v.kill()
	t.Logf("killed node %s", v.id)
	testutil.Eventually(t, 60*time.Second, "node "+v.id+"'s subtasks run on the live nodes", func() bool {
		s, err := watcher.status(client)
		if err != nil || s.keyedOn(v.id) != 0 {
			return false
		}
		live := 0
		for _, m := range members {
			if m != v {
				live += s.keyedOn(m.id)
			}
		}
		return live > 0
	})
	l.publish(n2, n3)
	l.restart(victim)
	testutil.Eventually(t, 90*time.Second, "node "+v.id+" owns key groups again", func() bool {
		s, err := members[0].status(client)
		return err == nil && s.keyedOn(v.id) > 0
	})
	// The last readings (sensor zz, far ahead) go to every node.
	l.publish(n3, n)
}

// checkClusterAlerts checks that the consumer got exactly the alerts of
// want, each under one msg_id.
func checkClusterAlerts(t *testing.T, l *clusterLoad, want []string) {
	t.Helper()
	normal := make([]string, len(want))
	for i, w := range want {
		var obj map[string]any
		if err := json.Unmarshal([]byte(w), &obj); err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(obj)
		normal[i] = string(b)
	}
	slices.Sort(normal)
	got := func() (map[string][]string, []string) {
		l.col.mu.Lock()
		defer l.col.mu.Unlock()
		ids := map[string][]string{}
		for id, content := range l.col.byMsgID {
			ids[content] = append(ids[content], id)
		}
		return ids, slices.Clone(l.col.bad)
	}
	testutil.Within(120*time.Second, func() bool {
		ids, _ := got()
		return len(ids) >= len(normal)
	})
	ids, bad := got()
	if len(bad) > 0 {
		t.Fatalf("%d bad results, first %s", len(bad), bad[0])
	}
	var missing, extra, twice []string
	for _, w := range normal {
		if len(ids[w]) == 0 {
			missing = append(missing, w)
		}
	}
	for r, is := range ids {
		if !slices.Contains(normal, r) {
			extra = append(extra, r)
		}
		if len(is) > 1 {
			twice = append(twice, fmt.Sprintf("%s under %v", r, is))
		}
	}
	t.Logf("%d alerts in the reference, %d received", len(normal), len(ids))
	if len(missing)+len(extra)+len(twice) > 0 {
		slices.Sort(missing)
		slices.Sort(extra)
		t.Fatalf("missing %d:\n%s\nnot in the reference %d:\n%s\nunder two msg_ids %d:\n%s", len(missing), strings.Join(missing, "\n"),
			len(extra), strings.Join(extra, "\n"), len(twice), strings.Join(twice, "\n"))
	}
}
