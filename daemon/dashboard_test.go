package daemon_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgedio/edged/daemon"
	"github.com/edgedio/edged/internal/testutil"
)

// mqttDemo is configs/mqtt-demo.yaml on a free loopback broker port with
// its data in a temp dir.
// freeAddr returns a loopback address with a port free now, for a
// listener the node under test opens.
// freeAddr returns a loopback address for a server the test starts
// later (testutil.FreeAddr).
func freeAddr(t *testing.T) string { return testutil.FreeAddr(t) }

func mqttDemo(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile("../configs/mqtt-demo.yaml")
	if err != nil {
		t.Fatal(err)
	}
	broker := freeAddr(t)
	dir := filepath.ToSlash(t.TempDir())
	y := string(data)
	for old, new := range map[string]string{
		"data_dir: edged-data": "data_dir: " + dir,
		"127.0.0.1:1883":       broker,
		"dir: edged-data/":     "dir: " + dir + "/",
	} {
		if !strings.Contains(y, old) {
			t.Fatalf("mqtt-demo.yaml has no %q", old)
		}
		y = strings.ReplaceAll(y, old, new)
	}
	return y
}

// getJSON GETs path from the node into v and returns the status.
func getJSON(t *testing.T, n *node, path string, v any) int {
	t.Helper()
	resp, err := http.Get("http://" + n.addr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if v != nil && resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatalf("GET %s: %v in %s", path, err, b)
		}
	}
	return resp.StatusCode
}

// The endpoints the dashboard reads, on the MQTT demo: the job graph with
// chains and partitioners, the ingest log, the broker's clients, dead
// letters; and the dashboard itself at /.
func TestDashboardEndpoints(t *testing.T) {
	n := startNode(t, mqttDemo(t), daemon.Options{})

	var g daemon.JobGraph
	// 409 between attempts: the job may still be starting its first one.
	var c int
	if !testutil.Within(10*time.Second, func() bool {
		c = getJSON(t, n, "/jobs/sensors/graph", &g)
		return c == http.StatusOK
	}) {
		t.Fatalf("graph: %d", c)
	}
	if g.Job != "sensors" || len(g.Chains) < 2 || len(g.Edges) < 1 {
		t.Fatalf("graph %+v", g)
	}
	var sources, sinks, keyBy int
	for i, c := range g.Chains {
		if c.ID != i || c.Name == "" || len(c.Operators) == 0 || c.Parallelism < 1 {
			t.Errorf("chain %+v", c)
		}
		if c.Source {
			sources++
		}
		if c.Sink {
			sinks++
		}
	}
	for _, e := range g.Edges {
		if e.From < 0 || e.From >= len(g.Chains) || e.To < 0 || e.To >= len(g.Chains) || e.From == e.To {
			t.Errorf("edge %+v", e)
		}
		if e.Partitioner == "key-by" {
			keyBy++
		}
	}
	if sources != 1 || sinks < 1 || keyBy < 1 {
		t.Errorf("graph has %d sources, %d sinks, %d key-by edges: %+v", sources, sinks, keyBy, g)
	}

	testutil.Eventually(t, waitLimit, "tasks run, the ingest log fills and the simulator is a broker client", func() bool {
		var il daemon.IngestList
		var ol daemon.OperatorList
		if getJSON(t, n, "/jobs/sensors/operators", &ol); len(ol.Tasks) == 0 {
			return false
		}
		var bc daemon.BrokerClients
		getJSON(t, n, "/ingest", &il)
		getJSON(t, n, "/broker/clients", &bc)
		return len(il.Pipelines) == 1 && il.Pipelines[0].Pipeline == "sensors" && il.Pipelines[0].Appends > 0 && il.Pipelines[0].Fsyncs > 0 &&
			il.Pipelines[0].NextOffset >= il.Pipelines[0].ReleasedOffset && il.Pipelines[0].DiskBytes > 0 &&
			bc.Embedded && bc.Address != "" && len(bc.Clients) >= 1
	})
	// The chains are those the task metrics name.
	var ops daemon.OperatorList
	getJSON(t, n, "/jobs/sensors/operators", &ops)
	names := map[string]bool{}
	for _, c := range g.Chains {
		names[c.Name] = true
	}
	for _, task := range ops.Tasks {
		if !names[task.Chain] {
			t.Errorf("task chain %q not in the graph", task.Chain)
		}
	}
	// The raw shapes the UI reads.
	for path, keys := range map[string][]string{
		"/ingest":                    {`"pipelines":[{"pipeline":"sensors"`, `"disk_bytes":`, `"appends":`, `"released_offset":`, `"lag_records":`},
		"/broker/clients":            {`"embedded":true`, `"clients":[{"id":`, `"remote":`},
		"/jobs/sensors/graph":        {`"chains":[{"id":0`, `"operators":[`, `"partitioner":"key-by"`},
		"/jobs/sensors/deadletters":  {`"job":"sensors"`, `"total":0`, `"recent":[]`},
		"/jobs/sensors/checkpoints":  {`"checkpoints":[`},
		"/jobs/sensors/operators":    {`"tasks":[{"chain":`},
		"/jobs":                      {`"jobs":[{"name":"sensors"`},
		"/":                          {"<!doctype html>", `src="app.js"`},
		"/app.js":                    {"/jobs/${encodeURIComponent(state.job)}/graph"},
		"/jobs/nope/graph":           {`"error":"daemon: unknown job \"nope\""`},
		"/jobs/nope/deadletters?n=2": {`"error":`},
		// A bad n is refused, not read as the default.
		"/jobs/sensors/deadletters?n=-1":                   {`"error":"n (\"-1\") must be a whole number`},
		"/jobs/sensors/deadletters?n=abc":                  {`"error":"n (\"abc\")`},
		"/jobs/sensors/deadletters?n=99999999999999999999": {`"error":`},
	} {
		resp, err := http.Get("http://" + n.addr + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, k := range keys {
			if !strings.Contains(string(b), k) {
				t.Errorf("GET %s: %d lacks %s in %.400s", path, resp.StatusCode, k, b)
			}
		}
		if strings.Contains(path, "nope") != (resp.StatusCode == http.StatusNotFound) {
			t.Errorf("GET %s: %d", path, resp.StatusCode)
		}
		if bad := strings.Contains(path, "sensors/deadletters?n="); bad != (resp.StatusCode == http.StatusBadRequest) {
			t.Errorf("GET %s: %d", path, resp.StatusCode)
		}
	}
}

// With the token required (as on a non-loopback listener), a real request
// without it is refused, and the client, the bearer header and the cookie
// set by /?token= get through.
func TestTokenRequiredOnTheWire(t *testing.T) {
	n := startNode(t, tickingConfig("ticking", ""), daemon.Options{RequireToken: true, Token: "s3cret"})
	for _, path := range []string{"/jobs", "/", "/metrics", "/jobs/ticking/graph", "/ingest"} {
		if c := getJSON(t, n, path, nil); c != http.StatusUnauthorized {
			t.Errorf("GET %s without token: %d, want 401", path, c)
		}
	}
	resp, err := http.Post("http://"+n.addr+"/jobs/ticking/cancel", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("POST cancel without token: %d", resp.StatusCode)
	}
	if _, err := n.client.Jobs(ctxT(t)); err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("client without token: %v", err)
	}
	c := *n.client
	c.Token = "s3cret"
	jobs, err := c.Jobs(ctxT(t))
	if err != nil || len(jobs) != 1 || jobs[0].Status != daemon.StatusRunning {
		t.Fatalf("client with token: %v %+v", jobs, err)
	}
	// The browser's way: /?token= sets a cookie and redirects to /.
	jar := &cookieJar{}
	hc := &http.Client{Jar: jar, Timeout: waitLimit, Transport: &http.Transport{}}
	defer hc.CloseIdleConnections()
	resp, err = hc.Get("http://" + n.addr + "/?token=s3cret")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "<!doctype html>") || resp.Request.URL.RawQuery != "" {
		t.Fatalf("/?token=: %d at %s: %.200s", resp.StatusCode, resp.Request.URL, b)
	}
	resp, err = hc.Get("http://" + n.addr + "/jobs")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /jobs with the cookie: %d", resp.StatusCode)
	}
	if !strings.Contains(n.logs.String(), `msg="api requires a token"`) {
		t.Errorf("logs do not say a token is required:\n%s", n.logs)
	}
}

// cookieJar keeps the cookies of one host.
type cookieJar struct{ c []*http.Cookie }

func (j *cookieJar) SetCookies(_ *url.URL, c []*http.Cookie) { j.c = append(j.c, c...) }
func (j *cookieJar) Cookies(*url.URL) []*http.Cookie         { return j.c }

// Without node.token, a node that requires one generates it and logs it
// with the dashboard's link; the logged token opens the API.
func TestGeneratedTokenLogged(t *testing.T) {
	n := startNode(t, tickingConfig("ticking", ""), daemon.Options{RequireToken: true})
	logs := n.logs.String()
	i := strings.Index(logs, " token=")
	if i < 0 || !strings.Contains(logs, "level=WARN") || !strings.Contains(logs, "/?token=") {
		t.Fatalf("no generated token logged:\n%s", logs)
	}
	tok := strings.Fields(logs[i+len(" token="):])[0]
	if len(tok) != 32 {
		t.Fatalf("logged token %q", tok)
	}
	if c := getJSON(t, n, "/jobs", nil); c != http.StatusUnauthorized {
		t.Fatalf("GET /jobs without token: %d", c)
	}
	c := *n.client
	c.Token = tok
	if _, err := c.Jobs(ctxT(t)); err != nil {
		t.Fatalf("client with the logged token: %v", err)
	}
}
