package test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgedio/edged/internal/testutil"
)

// What the config-evolution tests share: a node whose config the test
// rewrites between runs, a device publishing readings with known event
// times, and the results read back from the file sinks.

// evo is one node directory whose config the test rewrites between runs.
type evo struct {
	t      *testing.T
	dir    string
	broker string
	api    string
	nd     *node
	dev    paho.Client
}

func newEvo(t *testing.T) *evo {
	t.Helper()
	return &evo{t: t, dir: t.TempDir(), broker: freeAddr(t), api: freeAddr(t)}
}

// config writes the node config: the node header and the pipelines given
// as YAML (each pipeline indented by two spaces under pipelines:).
func (e *evo) config(pipelines string) {
	e.t.Helper()
	cfg := fmt.Sprintf("node:\n  data_dir: %s\n  broker: %s\n  listen: %s\npipelines:\n%s",
		filepath.Join(e.dir, "data"), e.broker, e.api, pipelines)
	if err := os.WriteFile(filepath.Join(e.dir, "edged.yaml"), []byte(cfg), 0o644); err != nil {
		e.t.Fatal(err)
	}
}

// start runs the node on the config, waiting until jobs jobs run.
func (e *evo) start(jobs int, extra ...string) {
	e.t.Helper()
	e.nd = &node{t: e.t, cfgPath: filepath.Join(e.dir, "edged.yaml"), logPath: filepath.Join(e.dir, "edged.log"),
		brokerAddr: e.broker, apiAddr: e.api}
	e.nd.readyFn = func(c *http.Client) bool { return e.running(c) >= jobs }
	cleanupNode(e.t, e.nd)
	e.nd.start(extra...)
	e.dev = connect(e.t, paho.NewClientOptions().AddBroker("tcp://"+e.broker).
		SetClientID("evolve-device").SetCleanSession(true).SetAutoReconnect(false))
}

// running returns how many of the node's jobs run.
func (e *evo) running(c *http.Client) int {
	l, err := e.jobs(c)
	if err != nil {
		return -1
	}
	n := 0
	for _, j := range l {
		if j.Status == "running" {
			n++
		}
	}
	return n
}

type evoJob struct {
	Name        string `json:"name"`
	Status      string `json:"status"`
	Attempts    int    `json:"attempts"`
	LastFailure string `json:"last_failure"`
	Error       string `json:"error"`
}

func (e *evo) jobs(c *http.Client) ([]evoJob, error) {
	resp, err := c.Get("http://" + e.api + "/jobs")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var l struct {
		Jobs []evoJob `json:"jobs"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&l); err != nil {
		return nil, err
	}
	return l.Jobs, nil
}

// publish sends readings from..to-1: reading i is from sensor s<i%4>
// with event time epochMS + i*step ms and temperature i%50.
func (e *evo) publish(from, to int, step int64) {
	e.t.Helper()
	var toks []paho.Token
	for i := from; i < to; i++ {
		s := fmt.Sprintf("s%d", i%4)
		p := fmt.Sprintf(`{"sensor":%q,"room":"r%d","t":%d,"ts":%d}`, s, i%2, i%50, epochMS+int64(i)*step)
		toks = append(toks, e.dev.Publish("sensors/"+s+"/temperature", 1, false, p))
	}
	for _, tok := range toks {
		if !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
			e.t.Fatalf("publish: %v", tok.Error())
		}
	}
}

// evoResults returns the results committed under dir, decoded.
func evoResults(t *testing.T, dir string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range committedLines(t, dir) {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("%s: %q: %v", dir, l, err)
		}
		out = append(out, m)
	}
	return out
}

// evoPipe is one pipeline of an evolution test's config.
type evoPipe struct {
	name, key, size, aggs, sinks, extra, filter string
	parallelism                                 int
	interval                                    string
}

func (p evoPipe) yaml(e *evo) string {
	if p.key == "" {
		p.key = "id"
	}
	if p.size == "" {
		p.size = "1s"
	}
	if p.aggs == "" {
		p.aggs = "[{name: n, fn: count}, {name: total, fn: sum, field: temp}]"
	}
	if p.parallelism == 0 {
		p.parallelism = 1
	}
	if p.interval == "" {
		p.interval = "200ms"
	}
	file := fmt.Sprintf("{file: {dir: %s}}", filepath.Join(e.dir, "out-"+p.name))
	mq := "{mqtt: {topic: \"agg/{id}\"}}"
	switch p.sinks {
	case "SINKBASE":
		p.sinks = "[" + mq + "]"
	case "SINKFRONT":
		p.sinks = "[" + file + ", " + mq + "]"
	case "SINKBEHIND":
		p.sinks = "[" + mq + ", " + file + "]"
	}
	if p.sinks == "" {
		p.sinks = fmt.Sprintf("[{file: {dir: %s}}]", filepath.Join(e.dir, "out-"+p.name))
	}
	f := ""
	if p.filter != "" {
		f = "    filter: " + p.filter + "\n"
	}
	return fmt.Sprintf(`  - name: %s
    parallelism: %d
    source:
      mqtt:
        topics: [sensors/+/temperature]
        format: json
        fields:
          id: {type: string, path: $.sensor}
          room: {type: string, path: $.room}
          temp: {type: float, path: $.t}
          ts: {type: time, path: $.ts, unit: ms}
    event_time: {field: ts, max_out_of_orderness: 100ms}
    key: %s
%s    window:
      type: tumbling
      size: %s
      aggregates: %s
%s    sinks: %s
    checkpoint: {dir: %s, interval: %s, mode: exactly_once}
    restart: {strategy: fixed_delay, attempts: 2, delay: 100ms}
`, p.name, p.parallelism, p.key, f, p.size, p.aggs, p.extra, p.sinks, filepath.Join(e.dir, "data", "checkpoints", p.name), p.interval)
}

// A pipeline whose checkpoint.dir was changed starts without a snapshot
// and reads its ingest log from its first record, the records a
// completed checkpoint read before included, so their results are
// committed a second time (here: every window of the first run appears
// twice in the file sink). The node says so when it starts, naming the
// offsets; before, only the old store's "owned by no configured
// pipeline" warning hinted at it, not that the log would be read again.
func TestMovedCheckpointDirWarnsThatTheLogIsReadAgain(t *testing.T) {
	e := newEvo(t)
	p := evoPipe{name: "p"}
	e.config(p.yaml(e))
	e.start(1)
	e.publish(0, 2500, 1)
	out := filepath.Join(e.dir, "out-p", "windows")
	testutil.Eventually(t, 30*time.Second, "the windows of the first run committed", func() bool {
		return len(evoResults(t, out)) == 8
	})
	if code := e.nd.terminate(30 * time.Second); code != 0 {
		t.Fatalf("node exited %d after SIGTERM", code)
	}
	e.dev.Disconnect(0)
	const warning = "pipeline starts without a snapshot, but a completed checkpoint already read its ingest log"
	if strings.Contains(e.nd.runLog(), warning) {
		t.Fatalf("the first start warned: %s", e.nd.runLog())
	}

	e.config(strings.Replace(p.yaml(e), "checkpoints/p,", "checkpoints/p-moved,", 1))
	e.start(1)
	e.publish(2500, 3500, 1)
	testutil.Eventually(t, 30*time.Second, "the windows of the first run committed again", func() bool {
		return len(evoResults(t, out)) >= 16
	})
	log := e.nd.runLog()
	if !strings.Contains(log, warning) || !strings.Contains(log, "checkpointed_offset=") {
		t.Fatalf("the node did not warn that the log is read again:\n%s", log)
	}
}
