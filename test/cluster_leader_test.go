package test

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/edgedio/edged/internal/testutil"
)

// leaderStatus is what the leader tests read of GET /cluster.
type leaderStatus struct {
	clusterStatus
	Leader    string `json:"leader"`
	Takeovers []struct {
		DeadNode      string  `json:"dead_node"`
		DetectionMS   float64 `json:"detection_ms"`
		RestoreMS     float64 `json:"restore_ms"`
		FirstRecordMS float64 `json:"first_record_ms"`
	} `json:"failovers"`
	Replicas []struct {
		Checkpoint int64 `json:"checkpoint"`
		Files      []struct {
			File  string   `json:"file"`
			Nodes []string `json:"nodes"`
		} `json:"files"`
	} `json:"replicas"`
}

func (m *clusterMember) leaderStatus(client *http.Client) (leaderStatus, error) {
	var s leaderStatus
	err := m.get(client, "/cluster", &s)
	return s, err
}

// jobMasters returns how many jobs node m runs the job master of.
func (m *clusterMember) jobMasters(client *http.Client) (int, error) {
	resp, err := client.Get("http://" + m.apiAddr + "/jobs")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var l struct {
		Jobs []struct {
			Status string `json:"status"`
		} `json:"jobs"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&l); err != nil {
		return 0, err
	}
	n := 0
	for _, j := range l.Jobs {
		if j.Status == "running" {
			n++
		}
	}
	return n, nil
}

// The leader of a three-node cluster with gossip membership (node a, the
// job masters' node) is SIGKILLed under MQTT load. Node b, the lowest
// live node, takes over: it restores the job from the checkpoint whose
// metadata and files the cluster replicated (a's own state files
// included), places a's subtasks on b and c, and deploys in a newer
// epoch. Every window stays exact, no result id twice. Node a then comes
// back: it follows b (leadership stays where it is), never runs a job
// master, gets its subtasks back by b's rebalance, and the windows after
// are exact too.
func TestClusterLeaderKilledExactTotals(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with three subprocesses and SIGKILL")
	}
	members := startCluster(t, true)
	l := newClusterLoad(t, members)
	a, b, c := members[0], members[1], members[2]
	client := &http.Client{Timeout: time.Second}
	testutil.Eventually(t, 30*time.Second, "the leader sees every node alive", func() bool {
		s, err := a.leaderStatus(client)
		if err != nil {
			return false
		}
		alive := 0
		for _, m := range s.Members {
			if m.State == "alive" {
				alive++
			}
		}
		return alive == 3 && s.Leader == "a" && s.keyedOn("a") > 0
	})

	const n1, n2, n3 = 15_000, 30_000, 45_000
	l.publish(0, n1)
	// Everything node a acknowledged is covered by completed checkpoints
	// before the kill: the takeover must not need a's disk.
	testutil.Eventually(t, 60*time.Second, "node a's log released all it was sent", func() bool {
		rel, err := a.released(client)
		return err == nil && rel >= n1/3
	})
	// Every live node holds the metadata of the retained checkpoints,
	// each file on its writer and its replicas.
	for _, m := range []*clusterMember{b, c} {
		testutil.Eventually(t, 30*time.Second, "node "+m.id+" lists the replicas of the checkpoints", func() bool {
			s, err := m.leaderStatus(client)
			if err != nil || len(s.Replicas) == 0 || len(s.Replicas[0].Files) == 0 {
				return false
			}
			for _, f := range s.Replicas[0].Files {
				if len(f.Nodes) < 3 {
					return false
				}
			}
			return true
		})
	}
	epochBefore := func() uint64 {
		s, err := b.leaderStatus(client)
		if err != nil {
			t.Fatal(err)
		}
		return s.Epoch
	}()
	l.kill(0)
	start := time.Now()
	testutil.Eventually(t, 60*time.Second, "node b took over and placed a's subtasks on b and c", func() bool {
		s, err := b.leaderStatus(client)
		return err == nil && s.Leader == "b" && s.keyedOn("a") == 0 && s.keyedOn("b")+s.keyedOn("c") > 0 && s.Epoch > epochBefore
	})
	t.Logf("takeover after %v", time.Since(start).Round(time.Millisecond))
	if n, err := c.jobMasters(client); err != nil || n != 0 {
		t.Fatalf("node c runs %d job masters (%v), want none", n, err)
	}
	l.publish(n1, n2)
	l.publish(n2, n2+2*tail)
	windows := n2 / windowMS
	if !testutil.Within(90*time.Second, func() bool { return countWindows(l.col, windows) >= windows*sensors }) {
		t.Fatalf("%d of %d window results after the takeover", countWindows(l.col, windows), windows*sensors)
	}
	checkExactWindows(t, l.col, windows)

	// Node a comes back as a worker of b's job masters.
	a.readyFn = func(client *http.Client) bool {
		_, err := a.hosted(client)
		return err == nil && brokerUp(a.brokerAddr)
	}
	l.restart(0)
	testutil.Eventually(t, 60*time.Second, "node a follows b and owns key groups again", func() bool {
		s, err := b.leaderStatus(client)
		if err != nil || s.Leader != "b" || s.keyedOn("a") == 0 {
			return false
		}
		sa, err := a.leaderStatus(client)
		return err == nil && sa.Leader == "b"
	})
	if n, err := a.jobMasters(client); err != nil || n != 0 {
		t.Fatalf("node a runs %d job masters (%v) while b leads", n, err)
	}
	l.publish(n2+2*tail, n3)
	l.finish(n3, 120*time.Second)
	if n, err := a.jobMasters(client); err != nil || n != 0 {
		t.Fatalf("node a runs %d job masters (%v) while b leads", n, err)
	}
	// The takeover's durations are measured: a's last answer to b's
	// probes until b saw it dead, and b restored the job and took records
	// in again.
	testutil.Eventually(t, 30*time.Second, "b's takeover has its detection, restore and first record timed", func() bool {
		s, err := b.leaderStatus(client)
		if err != nil {
			return false
		}
		for _, f := range s.Takeovers {
			if f.DeadNode == "a" && f.DetectionMS > 0 && f.RestoreMS > 0 && f.FirstRecordMS > 0 {
				t.Logf("takeover: %+v", f)
				return true
			}
		}
		return false
	})
}
