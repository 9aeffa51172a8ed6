package test

import (
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/edgedio/edged/internal/testutil"
)

// The card under a worker's node.data_dir fills up under MQTT load (c's
// data dir on a 16 MiB tmpfs, filled to its last byte; root only). The
// checkpoints fail and the job's restarts fail at c's restore, which says
// that c cannot store the copy, with its path, once per file and attempt,
// and blames none of the holders (before, each of c, a and b was logged
// as serving an unusable copy and counted in replica_errors_total). Once
// space is freed the job runs again and every window of every sensor is
// exact with one result id. (c's devices are moved to a and b before the
// fill: a full card's ingest log is tested in diskfull_test.go.)
func TestClusterWorkerCardFullRecovers(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with three subprocesses")
	}
	if os.Geteuid() != 0 {
		t.Skip("mounts a tmpfs: needs root")
	}
	var card string
	members := startClusterEdited(t, true, func(cfg string) string {
		if !strings.Contains(cfg, "\n  node: c\n") {
			return cfg
		}
		for _, line := range strings.Split(cfg, "\n") {
			if v, ok := strings.CutPrefix(line, "  data_dir: "); ok {
				card = v
			}
		}
		if err := os.MkdirAll(card, 0o755); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", card).CombinedOutput(); err != nil {
			t.Skipf("mount a tmpfs: %v: %s", err, out)
		}
		// Cleanups run last first: the nodes are killed before the card
		// is unmounted.
		t.Cleanup(func() {
			if out, err := exec.Command("umount", card).CombinedOutput(); err != nil {
				t.Errorf("umount %s: %v: %s", card, err, out)
			}
		})
		return cfg
	})
	a, c := members[0], members[2]
	l := newClusterLoad(t, members)
	waitAllAlive(t, a, 3)
	client := &http.Client{Timeout: time.Second}
	const n = 60_000
	l.publish(0, n/6)
	testutil.Eventually(t, 60*time.Second, "node c's log released all it was sent", func() bool {
		rel, err := c.released(client)
		return err == nil && rel >= n/18
	})
	l.disconnect(2)
	l.down[2] = true
	before := len(c.runLog())
	filler := fillCard(t, card)
	l.publish(n/6, n/3)
	testutil.Eventually(t, 30*time.Second, "node c says it cannot store a copy of a state file, and the leader's job error names its path", func() bool {
		return strings.Contains(c.runLog()[before:], "this node cannot store a copy of a state file") &&
			strings.Contains(a.runLog(), "this node cannot store a copy at "+card)
	})
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	full := c.runLog()[before:]
	if k := strings.Count(full, "copy of a state file unusable"); k != 0 {
		t.Errorf("node c blamed a holder %d times for its own full card", k)
	}
	var s struct {
		ReplicaErrors int64 `json:"replica_errors_total"`
	}
	if err := c.get(client, "/cluster", &s); err != nil || s.ReplicaErrors != 0 {
		t.Errorf("node c: replica_errors_total %d (%v), want 0: every holder's copy was intact", s.ReplicaErrors, err)
	}
	l.publish(n/3, n/2)
	l.connect(2)
	delete(l.down, 2)
	l.publish(n/2, n)
	l.finish(n, 120*time.Second)
	checkExact(t, l.col, workload{n: n, sensors: sensors, winMS: windowMS, tail: tail, topic: "sensors/%s/temperature"})
	for _, m := range members {
		m.failIfExited(t)
	}
}
