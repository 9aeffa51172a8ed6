package daemon_test

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgedio/edged/daemon"
	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/mqtt"
)

// A node whose pipeline (no restart section, parallelism 2, the
// write-ahead MQTT sink) is fed readings with keys that make invalid
// result topics and event times at the int64 extremes among good ones:
// the job keeps running on its first attempt, the bad readings are dead
// letters counted in /metrics, and the node restarted resumes the job
// from its snapshot and runs on.
func TestNodeBadRecordsAreDeadLetters(t *testing.T) {
	url := externalBroker(t)
	var mu sync.Mutex
	results, dead := map[string]string{}, map[string]string{} // msg_id -> payload
	sub := mqttClient(t, url, "reader")
	if tok := sub.Subscribe("#", 1, func(_ paho.Client, m paho.Message) {
		id, _ := mqtt.ParseMsgID(m.Payload())
		mu.Lock()
		defer mu.Unlock()
		switch {
		case strings.HasPrefix(m.Topic(), "agg/"):
			results[id] = string(m.Payload())
		case strings.HasPrefix(m.Topic(), "deadletter/"):
			dead[id] = string(m.Payload())
		}
	}); !tok.WaitTimeout(waitLimit) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	counts := func() (int, int) {
		mu.Lock()
		defer mu.Unlock()
		return len(results), len(dead)
	}
	dev := mqttClient(t, url, "device")
	send := func(payload string) {
		t.Helper()
		if tok := dev.Publish("sensors/x/temperature", 1, false, payload); !tok.WaitTimeout(waitLimit) || tok.Error() != nil {
			t.Fatalf("publish: %v", tok.Error())
		}
	}
	const sensors = 3
	good := func(from, to int64) {
		for s := from; s < to; s++ {
			for k := range sensors {
				send(fmt.Sprintf(`{"sensor":"g%d","t":20,"ts":%d}`, k, s*1000))
			}
		}
	}

	dir := t.TempDir()
	yml := fmt.Sprintf(`
node:
  data_dir: %s
pipelines:
  - name: bad
    parallelism: 2
    source:
      mqtt:
        broker: %s
        topics: [sensors/+/temperature]
        format: json
        fields:
          id: {type: string, path: $.sensor}
          temp: {type: float, path: $.t}
          ts: {type: time, path: $.ts, unit: ms}
    event_time: {field: ts, max_out_of_orderness: 1ms}
    key: id
    window:
      type: tumbling
      size: 1s
      aggregates: [{name: n, fn: count}]
    sinks:
      - mqtt: {topic: "agg/{id}"}
    checkpoint: {dir: %s, interval: 20ms}
`, filepath.Join(dir, "data"), url, filepath.Join(dir, "cp"))
	n := startNode(t, yml, daemon.Options{})
	bad := []string{
		`{"sensor":"#","t":1,"ts":1000}`,
		`{"sensor":"a+b","t":1,"ts":1000}`,
		"{\"sensor\":\"\xff\",\"t\":1,\"ts\":1000}",
		`{"sensor":"x\u0000y","t":1,"ts":1000}`,
		fmt.Sprintf(`{"sensor":"g0","t":1,"ts":%d}`, int64(math.MinInt64)),
		fmt.Sprintf(`{"sensor":"g0","t":1,"ts":%d}`, int64(math.MaxInt64)),
	}
	// The node subscribes in the background.
	subscribed := func(n *node) {
		testutil.Eventually(t, waitLimit, "the node subscribed", func() bool {
			return strings.Contains(n.logs.String(), "mqtt subscriber subscribed")
		})
	}
	subscribed(n)
	good(0, 1)
	for _, p := range bad {
		send(p)
	}
	good(1, 4) // closes the windows of seconds 0 and 1
	testutil.Eventually(t, waitLimit, "results and dead letters", func() bool {
		r, d := counts()
		return r >= 2*sensors && d >= len(bad)
	})
	ctx := ctxT(t)
	jobs, err := n.client.Jobs(ctx)
	if err != nil || len(jobs) != 1 || jobs[0].Status != daemon.StatusRunning || jobs[0].Attempts != 1 || jobs[0].DeadLetters != int64(len(bad)) {
		t.Fatalf("jobs = %+v, %v; want bad running on attempt 1 with %d dead letters", jobs, err, len(bad))
	}
	if m := metric(t, n.addr, `edged_job_dead_letters_total{job="bad"}`); m != fmt.Sprint(len(bad)) {
		t.Fatalf("edged_job_dead_letters_total = %q, want %d", m, len(bad))
	}

	// Restart the node: it resumes the job from its snapshot.
	n.cancel()
	if err := n.wait(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
	n2 := startNode(t, yml, daemon.Options{})
	subscribed(n2)
	good(4, 6)
	testutil.Eventually(t, waitLimit, "results after the restart", func() bool {
		r, _ := counts()
		return r >= 4*sensors
	})
	jobs, err = n2.client.Jobs(ctx)
	if err != nil || len(jobs) != 1 || jobs[0].Status != daemon.StatusRunning || jobs[0].Attempts != 1 {
		t.Fatalf("after the restart: jobs = %+v, %v", jobs, err)
	}
	if !strings.Contains(n2.logs.String(), "resuming from the latest snapshot") {
		t.Errorf("the restarted node did not resume:\n%s", n2.logs.String())
	}
	mu.Lock()
	defer mu.Unlock()
	for id, p := range results {
		var r struct {
			ID string `json:"id"`
			N  int64  `json:"n"`
		}
		if err := json.Unmarshal([]byte(p), &r); err != nil || !strings.HasPrefix(r.ID, "g") || r.N != 1 {
			t.Errorf("result %s = %s (%v), want one good reading per window", id, p, err)
		}
	}
}

// metric returns the value of the sample named series on the node's
// /metrics.
func metric(t *testing.T, addr, series string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			return v
		}
	}
	return ""
}
