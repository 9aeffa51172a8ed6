package test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/edgedio/edged/internal/testutil"
)

// A worker killed under MQTT load and failed over comes back, and its
// devices publish to it at once, before the join's handover (after the
// settle delay) gives it its source split back: the split, still away on
// another node, holds the watermark of the other splits once that node
// sees the worker back, so the readings the worker takes in meanwhile
// are read on time when its split is home. Every window of every sensor
// is exact with one result id, and a node's log says its away split
// waited for the worker (the path this test is about).
func TestClusterRestartedWorkerTakesReadingsBeforeItsSplitIsHome(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with three subprocesses")
	}
	members := startCluster(t, true)
	a, b := members[0], members[1]
	l := newClusterLoad(t, members)

	l.publish(0, 6_000)
	l.killReleasedAndFailOver(2)
	l.publish(6_000, 9_000)

	// c back: once the node running its split away sees it (the README's
	// "not": readings c takes in before that may be late), its devices
	// publish 15,000 readings to the three nodes in lock step, before the
	// join's handover gives c its split back.
	l.restart(2)
	testutil.Eventually(t, 30*time.Second, "a node logs that c's away split waits for c (the path under test)", func() bool {
		for _, m := range []*clusterMember{a, b} {
			if strings.Contains(m.lastRun(), "this split's node is back") {
				return true
			}
		}
		return false
	})
	const n = 24_000
	l.publish(9_000, n)
	l.finishChecked(n, 120*time.Second)
	for _, m := range members {
		m.failIfExited(t)
	}
}

// killReleasedAndFailOver kills node i (a worker) once completed
// checkpoints cover every reading its log took in (what none covers
// waits on its disk and is late when it returns: the README's "not"),
// and waits until the leader, node 0, placed its subtasks on the others
// and they run there (the failover done, its restore included: a node
// back before that may find its split never away).
func (l *clusterLoad) killReleasedAndFailOver(i int) {
	t := l.t
	t.Helper()
	m := l.members[i]
	client := &http.Client{Timeout: time.Second}
	next, err := m.ingestNext(client)
	if err != nil {
		t.Fatalf("GET /ingest of %s: %v", m.id, err)
	}
	testutil.Eventually(t, 60*time.Second, m.id+"'s log released what it was sent", func() bool {
		rel, err := m.released(client)
		return err == nil && rel >= next
	})
	before, err := l.members[0].status(client)
	if err != nil {
		t.Fatalf("GET /cluster of %s: %v", l.members[0].id, err)
	}
	l.kill(i)
	testutil.Eventually(t, 60*time.Second, m.id+"'s subtasks failed over", func() bool {
		s, err := l.members[0].status(client)
		return err == nil && s.keyedOn(m.id) == 0 && s.alive() == len(l.members)-1 &&
			s.FailoversTotal > before.FailoversTotal
	})
}

// ingestNext returns the next offset of node m's ingest log of the
// pipeline sensors.
func (m *clusterMember) ingestNext(client *http.Client) (uint64, error) {
	var in struct {
		Pipelines []struct {
			Pipeline string `json:"pipeline"`
			Next     uint64 `json:"next_offset"`
		} `json:"pipelines"`
	}
	if err := m.get(client, "/ingest", &in); err != nil {
		return 0, err
	}
	for _, p := range in.Pipelines {
		if p.Pipeline == "sensors" {
			return p.Next, nil
		}
	}
	return 0, fmt.Errorf("no ingest log of pipeline sensors")
}
