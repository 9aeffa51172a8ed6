package daemon_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/edgedio/edged/daemon"
)

// GET /jobs/{name}/operators shows every task with its live counters, and
// /metrics exports them.
func TestOperatorsAndTaskMetrics(t *testing.T) {
	n := startNode(t, tickingConfig("ticking", ""), daemon.Options{})
	get := func(path string) []byte {
		t.Helper()
		resp, err := http.Get("http://" + n.addr + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d %v %s", path, resp.StatusCode, err, b)
		}
		return b
	}
	deadline := time.Now().Add(waitLimit)
	for {
		var l daemon.OperatorList
		if err := json.Unmarshal(get("/jobs/ticking/operators"), &l); err != nil {
			t.Fatal(err)
		}
		var in, out int64
		for _, task := range l.Tasks {
			in += task.RecordsIn
			out += task.RecordsOut
			if len(task.Operators) == 0 || task.Parallelism < 1 {
				t.Fatalf("task %+v", task)
			}
		}
		if len(l.Tasks) >= 2 && in > 0 && out > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("operators: %+v", l)
		}
		time.Sleep(10 * time.Millisecond)
	}
	m := string(get("/metrics"))
	for _, want := range []string{"edged_task_records_in_total{", "edged_task_records_out_total{", "edged_task_backpressure_seconds_total{", "edged_task_queued_messages{"} {
		if !strings.Contains(m, want) {
			t.Fatalf("/metrics lacks %s", want)
		}
	}
	resp, err := http.Get("http://" + n.addr + "/jobs/nope/operators")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("unknown job: %d", resp.StatusCode)
	}
}
