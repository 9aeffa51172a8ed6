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
// A worker is SIGKILLed while the job processes the readings the live
// nodes took, its subtasks move to the live nodes, and it comes back and
// gets them back. A consumer that drops repeated msg_ids must get exactly
// the alerts a plain computation of the README's semantics gives, each
// under one msg_id.
func TestClusterAlertsFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with three subprocesses and SIGKILL")
	}
	rs := alertReadings()
	want := alertReference(rs)
	members := startClusterEdited(t, true, withAlerts)
	l := newClusterLoad(t, members)
	l.payload = func(i int) (string, []byte) {
		r := rs[i]
		return "sensors/" + r.id + "/temperature", []byte(fmt.Sprintf(`{"sensor":%q,"t":%g,"ts":%d}`, r.id, r.temp, r.ts))
	}
	a, c := members[0], members[2]
	client := &http.Client{Timeout: time.Second}
	testutil.Eventually(t, 30*time.Second, "the master sees every node alive", func() bool {
		s, err := a.status(client)
		return err == nil && s.alive() == 3 && s.keyedOn("c") > 0
	})
	n := len(rs)
	n1, n2, n3 := n/4, n/2, 3*n/4
	l.publish(0, n1)
	testutil.Eventually(t, 60*time.Second, "node c's log released all it was sent", func() bool {
		rel, err := c.released(client)
		return err == nil && rel >= uint64(n1/3)
	})
	l.disconnect(2)
	l.down[2] = true
	l.publish(n1, n2)
	c.kill()
	t.Logf("killed node c")
	testutil.Eventually(t, 60*time.Second, "the master moved node c's subtasks to live nodes", func() bool {
		s, err := a.status(client)
		return err == nil && s.FailoversTotal >= 1 && s.keyedOn("c") == 0 && s.keyedOn("a")+s.keyedOn("b") > 0
	})
	l.publish(n2, n3)
	l.restart(2)
	testutil.Eventually(t, 90*time.Second, "node c owns key groups again", func() bool {
		s, err := a.status(client)
		return err == nil && s.keyedOn("c") > 0
	})
	// The last readings (sensor zz, far ahead) go to every node.
	l.publish(n3, n)

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
