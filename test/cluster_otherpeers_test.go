package test

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

// Node c of a three-node cluster with gossip is started with a config
// whose cluster.peers leaves node b out: the pipelines are the same, but
// c counts a cluster of two and builds an MQTT source of two splits.
// The leader places nothing on c and says why, naming c; the job runs on
// a and b in its first attempt (before, every deployment was refused by
// c, actors.ErrPlanMismatch, and the job restarted every 200 ms without
// ever running), and the windows of the readings a and b take in are
// exact.
func TestClusterMemberWithOtherPeersGetsNoSubtasks(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with three subprocesses")
	}
	memberOfOtherConfigGetsNoSubtasks(t, func(cfg string) string {
		var out []string
		for _, line := range strings.Split(cfg, "\n") {
			if !strings.Contains(line, "{id: b,") {
				out = append(out, line)
			}
		}
		return strings.Join(out, "\n")
	})
}

// Node c of a three-node cluster with gossip is started with
// cluster.channels.credits 8, the others with the default (128): a
// receiver holds its sender to its own credits, so c would fail every
// channel from a and b (cluster.ErrCreditExceeded, the job restarting
// over and over). The leader places nothing on c and says why, naming c,
// and the job runs on a and b in its first attempt with exact windows.
func TestClusterMemberWithOtherCreditsGetsNoSubtasks(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with three subprocesses")
	}
	memberOfOtherConfigGetsNoSubtasks(t, func(cfg string) string {
		return strings.Replace(cfg, "\n  node: c\n", "\n  node: c\n  channels: {credits: 8}\n", 1)
	})
}

// memberOfOtherConfigGetsNoSubtasks starts a three-node cluster with
// gossip whose node c's config is passed through edit, and checks that
// the leader warns about c, places nothing on it, and runs the job on a
// and b without a restart, with exact windows.
func memberOfOtherConfigGetsNoSubtasks(t *testing.T, edit func(cfg string) string) {
	t.Helper()
	members := startClusterHosting(t, true, func(cfg string) string {
		if !strings.Contains(cfg, "\n  node: c\n") {
			return cfg
		}
		return edit(cfg)
	}, "b")
	l := newClusterLoad(t, members)
	a, c := members[0], members[2]
	client := &http.Client{Timeout: time.Second}
	eventually := whileRunning(t, members)
	eventually(30*time.Second, "the leader warns that c names other nodes", func() bool {
		return strings.Contains(a.runLog(), "names other cluster nodes")
	})
	log := a.runLog()
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, "names other cluster nodes") {
			if !strings.Contains(line, "member=c") {
				t.Fatalf("the warning does not name c: %s", line)
			}
			t.Logf("a: %s", line)
		}
	}
	s, err := a.status(client)
	if err != nil {
		t.Fatal(err)
	}
	if s.keyedOn("c") != 0 || s.keyedOn("a") == 0 || s.keyedOn("b") == 0 {
		t.Fatalf("keyed subtasks on a %d, b %d, c %d: want none on c, some on a and b", s.keyedOn("a"), s.keyedOn("b"), s.keyedOn("c"))
	}
	// The devices of c go to a and b (l.down: c's broker takes nothing).
	l.disconnect(2)
	l.down[2] = true
	const n = 15_000
	l.publish(0, n)
	l.finish(n, 90*time.Second)
	if jobs, err := c.hosted(client); err != nil || hostedTasks(jobs) != 0 {
		t.Fatalf("node c hosts %v (%v)", jobs, err)
	}
	if k := strings.Count(a.runLog(), "job failed; restarting"); k != 0 {
		t.Fatalf("the job failed %d times on the leader:\n%s", k, a.logTail())
	}
}
