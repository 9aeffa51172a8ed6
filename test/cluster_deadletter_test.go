package test

import (
	"fmt"
	"io"
	"maps"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/edgedio/edged/internal/testutil"
)

// Malformed readings published to each node of a three-process cluster
// are dead letters of the source split on that node. The job master's
// node counts every node's in its GET /jobs (by node too) and lists them
// in GET /jobs/{name}/deadletters, each naming its node; each node's
// /metrics counts its own. Before, a worker's were counted in a job it
// threw away at each deployment: the cluster showed only the master's.
func TestClusterDeadLettersCountedOnEveryNode(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with three subprocesses")
	}
	members := startCluster(t, false)
	l := newClusterLoad(t, members)
	bad := map[string]int{"a": 1, "b": 2, "c": 3}
	for i, m := range members {
		for k := range bad[m.id] {
			p := fmt.Sprintf("not json from %s #%d", m.id, k)
			if tok := l.pubs[i][0].Publish("sensors/x/temperature", 1, false, p); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
				t.Fatalf("publish to %s: %v", m.id, tok.Error())
			}
		}
	}
	client := &http.Client{Timeout: 5 * time.Second}
	type jobInfo struct {
		Name        string           `json:"name"`
		DeadLetters int64            `json:"dead_letters"`
		ByNode      map[string]int64 `json:"dead_letters_by_node"`
	}
	var job jobInfo
	want := map[string]int64{"a": 1, "b": 2, "c": 3}
	ok := testutil.Within(30*time.Second, func() bool {
		var l struct {
			Jobs []jobInfo `json:"jobs"`
		}
		if err := members[0].get(client, "/jobs", &l); err != nil || len(l.Jobs) != 1 {
			return false
		}
		job = l.Jobs[0]
		return maps.Equal(job.ByNode, want)
	})
	if !ok || job.DeadLetters != 6 {
		t.Fatalf("GET /jobs on the master: %d dead letters, by node %v; want 6, %v", job.DeadLetters, job.ByNode, want)
	}

	var dl struct {
		Total  int64            `json:"total"`
		ByNode map[string]int64 `json:"by_node"`
		Recent []struct {
			Payload string `json:"payload"`
			Node    string `json:"node"`
		} `json:"recent"`
	}
	if err := members[0].get(client, "/jobs/sensors/deadletters", &dl); err != nil {
		t.Fatal(err)
	}
	if dl.Total != 6 || len(dl.Recent) != 6 {
		t.Fatalf("deadletters: total %d, %d recent: %+v", dl.Total, len(dl.Recent), dl)
	}
	for _, d := range dl.Recent {
		if !strings.HasPrefix(d.Payload, "not json from "+d.Node+" ") {
			t.Errorf("dead letter %q named node %q", d.Payload, d.Node)
		}
	}

	// Each node's own metric counts its own.
	for _, m := range members {
		resp, err := client.Get("http://" + m.apiAddr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		line := fmt.Sprintf(`edged_job_dead_letters_total{job="sensors"} %d`, want[m.id])
		if !strings.Contains(string(body), line) {
			t.Errorf("node %s's /metrics lacks %q", m.id, line)
		}
	}
}
