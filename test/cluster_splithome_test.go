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
	a, b, c := members[0], members[1], members[2]
	l := newClusterLoad(t, members)
	client := &http.Client{Timeout: time.Second}

	l.publish(0, 6_000)
	// Every reading c acknowledged is covered by a completed checkpoint
	// before it dies: what is not waits on its disk and is late when it
	// returns (the README's "not").
	next, err := c.ingestNext(client)
	if err != nil {
		t.Fatalf("GET /ingest of c: %v", err)
	}
	testutil.Eventually(t, 60*time.Second, "c's log released what it was sent", func() bool {
		rel, err := c.released(client)
		return err == nil && rel >= next
	})
	l.kill(2)
	testutil.Eventually(t, 60*time.Second, "c's subtasks failed over", func() bool {
		s, err := a.status(client)
		return err == nil && s.keyedOn("c") == 0 && s.alive() == 2
	})
	l.publish(6_000, 9_000)

	// c back: its devices publish at once, 15,000 readings to the three
	// nodes in lock step.
	l.restart(2)
	const n = 24_000
	l.publish(9_000, n)
	l.finishChecked(n, 120*time.Second)
	waited := false
	for _, m := range []*clusterMember{a, b} {
		if strings.Contains(m.lastRun(), "this split's node is back") {
			waited = true
		}
	}
	if !waited {
		t.Fatalf("no node logged that c's away split waited for c: the test missed its path\n%s\n%s",
			clusterLines(a.logTail()), clusterLines(b.logTail()))
	}
	for _, m := range members {
		m.failIfExited(t)
	}
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
