// Package test holds end-to-end tests that run the edged binary as a
// subprocess.
package test

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgedio/edged/internal/testutil"
)

// edgedBin is the binary TestMain builds.
var edgedBin string

func TestMain(m *testing.M) {
	if os.Getenv(burnerEnv) != "" {
		os.Exit(runBurner()) // a CPU burner process started by startBurners
	}
	os.Exit(runMain(m))
}

// edgedEnv names an edged binary built beforehand (scripts/e2e.sh builds
// it once for the tests it runs one process each); TestMain builds one
// when it is not set.
const edgedEnv = "EDGED_E2E_EDGED"

func runMain(m *testing.M) int {
	if bin := os.Getenv(edgedEnv); bin != "" {
		edgedBin = bin
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "edged-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "mkdir temp:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	edgedBin = filepath.Join(dir, "edged")
	build := exec.Command("go", "build", "-o", edgedBin, "./cmd/edged")
	build.Dir = ".." // the module root
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build ./cmd/edged: %v\n%s", err, out)
		return 1
	}
	// goleak is not used: the work happens in subprocesses, and paho leaves
	// goroutines behind briefly after Disconnect.
	return m.Run()
}

// The workload: reading i is from sensor i%sensors with event time
// epoch+i ms, so each 1 s window holds 1000 readings, perSensor per
// sensor.
const (
	sensors   = 100
	total     = 200_000
	tail      = 3_000 // readings after total that only move the watermark past window 199
	windowMS  = 1000
	perSensor = windowMS / sensors
	epochMS   = int64(1_700_000_000_000) // a multiple of windowMS
	batch     = 400                      // publishes in flight at once
	conns     = 20                       // publisher connections; reading i uses i%conns (so each sensor one)
	kills     = 3
)

func sensorOf(i int) string { return fmt.Sprintf("s%03d", i%sensors) }
func windowOf(i int) int    { return i / windowMS }

type winKey struct {
	sensor string
	start  int64 // window start, ms
}

func keyOf(i int) winKey {
	return winKey{sensorOf(i), epochMS + int64(windowOf(i))*windowMS}
}

// result is a window result published to agg/<id>.
type result struct {
	MsgID       string  `json:"msg_id"`
	ID          string  `json:"id"`
	WindowStart int64   `json:"window_start"`
	WindowEnd   int64   `json:"window_end"`
	Count       int64   `json:"count"`
	First       float64 `json:"first"` // with withSessionWindows
	Last        float64 `json:"last"`
}

// collector keeps every result the subscriber received.
type collector struct {
	mu      sync.Mutex
	byMsgID map[string]string       // msg_id -> payload without msg_id
	byKey   map[winKey][]result     // every result received, in order
	bad     []string                // payloads that did not parse
	perRun  map[int]map[winKey]bool // run -> windows received during it
	run     int
	markers map[string]bool   // payloads received on a topic ending in /_marker (see drain)
	dead    map[string]string // msg_id -> dead letter received on deadletter/#
}

func newCollector() *collector {
	return &collector{byMsgID: map[string]string{}, byKey: map[winKey][]result{}, perRun: map[int]map[winKey]bool{},
		markers: map[string]bool{}, dead: map[string]string{}}
}

// received returns how many results arrived during run.
func (c *collector) received(run int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.perRun[run])
}

func (c *collector) setRun(run int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.run = run
}

func (c *collector) handle(_ paho.Client, m paho.Message) {
	payload := append([]byte(nil), m.Payload()...)
	if strings.HasSuffix(m.Topic(), "/_marker") {
		c.mu.Lock()
		c.markers[string(payload)] = true
		c.mu.Unlock()
		return
	}
	if strings.HasPrefix(m.Topic(), "deadletter/") {
		var d struct {
			MsgID string `json:"msg_id"`
		}
		json.Unmarshal(payload, &d)
		c.mu.Lock()
		c.dead[d.MsgID] = string(payload)
		c.mu.Unlock()
		return
	}
	var r result
	var fields map[string]any
	err := json.Unmarshal(payload, &r)
	if err == nil {
		err = json.Unmarshal(payload, &fields)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil || r.MsgID == "" || r.ID == "" {
		c.bad = append(c.bad, fmt.Sprintf("%s: %s (err %v)", m.Topic(), payload, err))
		return
	}
	delete(fields, "msg_id")
	content, _ := json.Marshal(fields) // sorted keys: comparable
	if prev, ok := c.byMsgID[r.MsgID]; ok && prev != string(content) {
		c.bad = append(c.bad, fmt.Sprintf("msg_id %s with two contents: %s and %s", r.MsgID, prev, content))
	}
	c.byMsgID[r.MsgID] = string(content)
	k := winKey{r.ID, r.WindowStart}
	c.byKey[k] = append(c.byKey[k], r)
	if c.perRun[c.run] == nil {
		c.perRun[c.run] = map[winKey]bool{}
	}
	c.perRun[c.run][k] = true
}

// node is one edged subprocess and what the test needs to talk to it.
type node struct {
	t          *testing.T
	cfgPath    string
	logPath    string
	brokerAddr string
	apiAddr    string
	cmd        *exec.Cmd
	done       chan struct{} // closed when cmd has been waited for
	waitErr    error
	logFile    *os.File
	// readyFn, if set, replaces the check that GET /jobs lists one
	// running job (a cluster's worker runs no job master).
	readyFn func(client *http.Client) bool
}

// start starts edged run -c <config> with extra arguments after it and
// waits until it is ready.
func (n *node) start(extra ...string) {
	n.t.Helper()
	f, err := os.OpenFile(n.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		n.t.Fatal(err)
	}
	fmt.Fprintf(f, "===== edged run %v at %s =====\n", extra, time.Now().Format(time.RFC3339Nano))
	n.logFile = f
	// n.cmd only once started: a cleanup kills the n.cmd it finds.
	cmd := exec.Command(edgedBin, append([]string{"run", "-c", n.cfgPath}, extra...)...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		n.t.Fatalf("start edged: %v", err)
	}
	n.cmd, n.done = cmd, make(chan struct{})
	done := n.done
	go func() {
		n.waitErr = cmd.Wait()
		close(done)
	}()
	n.waitReady(30 * time.Second)
}

// waitReady waits until GET /jobs says every job is running and the broker
// accepts connections.
func (n *node) waitReady(timeout time.Duration) {
	n.t.Helper()
	client := &http.Client{Timeout: time.Second}
	exited := false
	ready := testutil.Within(timeout, func() bool {
		select {
		case <-n.done:
			exited = true
			return true
		default:
		}
		return n.ready(client)
	})
	switch {
	case exited:
		n.t.Fatalf("edged exited while starting: %v\n%s", n.waitErr, n.logTail())
	case !ready:
		n.t.Fatalf("edged not ready after %v\n%s", timeout, n.logTail())
	}
}

func (n *node) ready(client *http.Client) bool {
	if n.readyFn != nil {
		return n.readyFn(client)
	}
	resp, err := client.Get("http://" + n.apiAddr + "/jobs")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var l struct {
		Jobs []struct {
			Name   string `json:"name"`
			Status string `json:"status"`
		} `json:"jobs"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&l) != nil {
		return false
	}
	if len(l.Jobs) == 0 {
		return false
	}
	for _, j := range l.Jobs {
		if j.Status != "running" {
			return false
		}
	}
	c, err := net.DialTimeout("tcp", n.brokerAddr, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// kill SIGKILLs edged and waits for it to be gone.
func (n *node) kill() {
	n.t.Helper()
	if err := n.cmd.Process.Kill(); err != nil {
		n.t.Fatalf("kill: %v", err)
	}
	select {
	case <-n.done:
	case <-time.After(10 * time.Second):
		n.t.Fatal("edged did not die after SIGKILL")
	}
	n.logFile.Close()
}

// terminate sends SIGTERM and returns the exit code.
func (n *node) terminate(timeout time.Duration) int {
	n.t.Helper()
	if err := n.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		n.t.Fatalf("sigterm: %v", err)
	}
	select {
	case <-n.done:
	case <-time.After(timeout):
		_ = n.cmd.Process.Kill()
		<-n.done
		n.t.Fatalf("edged did not exit within %v of SIGTERM\n%s", timeout, n.logTail())
	}
	n.logFile.Close()
	return n.cmd.ProcessState.ExitCode()
}

func (n *node) logTail() string { return n.logTailN(6000) }

func (n *node) logTailN(max int) string {
	b, _ := os.ReadFile(n.logPath)
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return string(b)
}

// freeAddr returns a loopback address for a server the test starts
// later (testutil.FreeAddr).
func freeAddr(t *testing.T) string { return testutil.FreeAddr(t) }

func connect(t *testing.T, opts *paho.ClientOptions) paho.Client {
	t.Helper()
	c := paho.NewClient(opts)
	tok := c.Connect()
	if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("connect %s: %v", opts.ClientID, tok.Error())
	}
	return c
}

// subscribe connects the result subscriber (a persistent session with a
// fixed client id; the session lives in the embedded broker, so it is
// gone after each kill and the subscription is made again).
func subscribe(t *testing.T, url string, col *collector) paho.Client {
	t.Helper()
	opts := paho.NewClientOptions().AddBroker(url).SetClientID("e2e-results").
		SetCleanSession(false).SetAutoReconnect(false).SetOrderMatters(false).
		SetDefaultPublishHandler(col.handle)
	c := connect(t, opts)
	tok := c.Subscribe("agg/#", 1, col.handle)
	if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	return c
}

// publishers connects conns device connections: the broker handles one
// connection's publishes one after the other, each waiting for the ingest
// log's fsync, so parallel connections let the log group its commits.
func publishers(t *testing.T, url string) []paho.Client {
	t.Helper()
	cs := make([]paho.Client, conns)
	for i := range cs {
		opts := paho.NewClientOptions().AddBroker(url).SetClientID(fmt.Sprintf("e2e-devices-%d", i)).
			SetCleanSession(true).SetAutoReconnect(false).SetWriteTimeout(5 * time.Second)
		cs[i] = connect(t, opts)
	}
	return cs
}

func disconnectAll(cs []paho.Client, quiesce uint) {
	for _, c := range cs {
		c.Disconnect(quiesce)
	}
}

func payloadOf(i int) (topic string, payload []byte) {
	s := sensorOf(i)
	return "sensors/" + s + "/temperature",
		[]byte(fmt.Sprintf(`{"sensor":%q,"t":%d.5,"ts":%d}`, s, 20+i%15, epochMS+int64(i)))
}

// sensorsPipeline is the e2e pipeline (1 s tumbling count per sensor,
// exactly-once to MQTT, checkpoints in data) at parallelism p, restarted
// attempts times.
func sensorsPipeline(data string, p, attempts int, delay string) string {
	return fmt.Sprintf(`pipelines:
  - name: sensors
    parallelism: %[2]d
    source:
      mqtt:
        topics: [sensors/+/temperature]
        qos: 1
        format: json
        fields:
          id: {type: string, path: $.sensor}
          temp: {type: float, path: $.t}
          ts: {type: time, path: $.ts, unit: ms}
    event_time:
      field: ts
      max_out_of_orderness: 1s
    key: id
    window:
      type: tumbling
      size: 1s
      aggregates:
        - {name: count, fn: count}
    sinks:
      - mqtt: {topic: "agg/{id}", qos: 1}
    checkpoint:
      dir: %[1]s/checkpoints
      interval: 200ms
      mode: exactly_once
    restart:
      strategy: fixed_delay
      attempts: %[3]d
      delay: %[4]s
`, data, p, attempts, delay)
}

// writeConfig writes the config of a single node running the e2e
// pipeline.
func writeConfig(t *testing.T, dir, brokerAddr, apiAddr string) string {
	t.Helper()
	data := filepath.Join(dir, "data")
	cfg := fmt.Sprintf(`node:
  data_dir: %[1]s
  broker: %[2]s
  listen: %[3]s
`, data, brokerAddr, apiAddr) + sensorsPipeline(data, 1, 3, "100ms")
	p := filepath.Join(dir, "edged.yaml")
	if err := os.WriteFile(p, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestKillRestartExactCounts publishes 200,000 readings to a node,
// SIGKILLs it three times while publishing and restarts it with the same
// config each time, and checks the window results the node publishes.
func TestKillRestartExactCounts(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with a subprocess and 200,000 messages")
	}
	killAt := killPoints(t, total, kills)

	dir := t.TempDir()
	n := &node{t: t, brokerAddr: freeAddr(t), apiAddr: freeAddr(t), logPath: filepath.Join(dir, "edged.log")}
	n.cfgPath = writeConfig(t, dir, n.brokerAddr, n.apiAddr)
	url := "tcp://" + n.brokerAddr
	t.Cleanup(func() {
		if n.cmd != nil {
			select {
			case <-n.done:
			default:
				_ = n.cmd.Process.Kill()
				<-n.done
			}
		}
		if t.Failed() {
			t.Logf("edged log tail:\n%s", n.logTail())
		}
	})

	start := time.Now()
	n.start()
	col := newCollector()
	run := 0
	col.setRun(run)
	sub := subscribe(t, url, col)
	pubs := publishers(t, url)
	defer func() {
		sub.Disconnect(100)
		disconnectAll(pubs, 100)
	}()

	// failedAttempts counts, per window, publishes whose outcome is
	// unknown (no PUBACK): each may have been appended to the ingest log
	// before the node died, so the reading may be counted twice.
	failedAttempts := map[winKey]int64{}
	var resent int
	// lastRestartMax is the highest reading index sent before the last
	// restart: windows from its window on can only fire in the last run.
	lastRestartMax := -1

	restart := func(sentMax int) {
		run++
		n.start()
		col.setRun(run)
		sub.Disconnect(0)
		sub = subscribe(t, url, col)
		lastRestartMax = sentMax
	}
	reconnectPublisher := func() {
		disconnectAll(pubs, 0)
		pubs = publishers(t, url)
	}

	nextKill := 0
	all := total + tail
	for next := 0; next < all; next += batch {
		end := min(next+batch, all)
		toks := make([]paho.Token, end-next)
		for i := next; i < end; i++ {
			topic, p := payloadOf(i)
			toks[i-next] = pubs[i%conns].Publish(topic, 1, false, p)
		}
		killed := false
		if nextKill < len(killAt) && killAt[nextKill] < end {
			// Kill with this batch in flight: some of it is in the
			// ingest log, some is not, some PUBACKs are lost.
			nextKill++
			killed = true
			n.kill()
			t.Logf("killed edged at reading %d after %v", end, time.Since(start).Round(time.Millisecond))
		}
		var failed []int
		for j, tok := range toks {
			if !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
				failed = append(failed, next+j)
			}
		}
		if killed {
			restart(end - 1)
		}
		// Resend every reading without a PUBACK until it gets one.
		for attempt := 0; len(failed) > 0; attempt++ {
			if attempt == 10 {
				t.Fatalf("readings %v never acknowledged", failed)
			}
			for _, i := range failed {
				failedAttempts[keyOf(i)]++
			}
			resent += len(failed)
			reconnectPublisher()
			var again []int
			for _, i := range failed {
				topic, p := payloadOf(i)
				if tok := pubs[i%conns].Publish(topic, 1, false, p); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
					again = append(again, i)
				}
			}
			failed = again
		}
	}
	t.Logf("published %d readings (+%d resent) in %v, %d runs", all, resent, time.Since(start).Round(time.Millisecond), run+1)

	// (c) Every window from the one holding the last reading sent before
	// the last restart up to the last full window of the 200,000 fires in
	// the last run, while the subscriber is connected: wait for all of
	// them.
	firstFinal := windowOf(lastRestartMax)
	lastFinal := windowOf(total - 1)
	var want []winKey
	for w := firstFinal; w <= lastFinal; w++ {
		for s := 0; s < sensors; s++ {
			want = append(want, keyOf(w*windowMS+s))
		}
	}
	missing := 0
	if !testutil.Within(60*time.Second, func() bool {
		col.mu.Lock()
		defer col.mu.Unlock()
		missing = 0
		for _, k := range want {
			if !col.perRun[run][k] {
				missing++
			}
		}
		return missing == 0
	}) {
		t.Fatalf("after 60s, %d of %d results of windows %d..%d (last run) still missing", missing, len(want), firstFinal, lastFinal)
	}
	t.Logf("all %d results of windows %d..%d arrived in the last run, %v after start", len(want), firstFinal, lastFinal, time.Since(start).Round(time.Millisecond))

	// 5. A graceful stop: SIGTERM, stop with savepoint, exit 0.
	sub.Disconnect(100)
	disconnectAll(pubs, 100)
	if code := n.terminate(60 * time.Second); code != 0 {
		t.Errorf("edged exited %d after SIGTERM, want 0\n%s", code, n.logTail())
	}

	col.mu.Lock()
	defer col.mu.Unlock()
	// (a) one content per msg_id (and nothing unparsable).
	for i, b := range col.bad {
		if i == 20 {
			t.Errorf("... %d more", len(col.bad)-20)
			break
		}
		t.Errorf("bad result: %s", b)
	}
	// (b) every result received has the count that was published for its
	// window: exactly perSensor, or up to perSensor+failedAttempts when
	// some reading of the window may have reached the ingest log twice.
	var exact, loose, wrong, dupDelivery, multiID, over int
	var wrongs []string
	for k, rs := range col.byKey {
		lo, hi := int64(perSensor), int64(perSensor)+failedAttempts[k]
		ids := map[string]bool{}
		for _, r := range rs {
			ids[r.MsgID] = true
			switch {
			case r.Count < lo || r.Count > hi:
				wrong++
				wrongs = append(wrongs, fmt.Sprintf("%s window %d: count %d, want %d..%d (msg_id %s)",
					k.sensor, (k.start-epochMS)/windowMS, r.Count, lo, hi, r.MsgID))
			case lo == hi:
				exact++
			default:
				loose++
				if r.Count > lo {
					over++
				}
			}
		}
		dupDelivery += len(rs) - len(ids)
		if len(ids) > 1 {
			multiID++
		}
	}
	sort.Strings(wrongs)
	for i, w := range wrongs {
		if i == 30 {
			t.Errorf("... %d more wrong counts", len(wrongs)-30)
			break
		}
		t.Errorf("wrong count: %s", w)
	}
	// (c) exact totals over the last run's windows.
	var gotFinal, wantFinal int64
	for _, k := range want {
		rs := col.byKey[k]
		gotFinal += rs[len(rs)-1].Count
		wantFinal += perSensor
	}
	var slack int64
	for _, k := range want {
		slack += failedAttempts[k]
	}
	if gotFinal < wantFinal || gotFinal > wantFinal+slack {
		t.Errorf("last run: windows %d..%d hold %d readings, want %d (+%d possible duplicates)", firstFinal, lastFinal, gotFinal, wantFinal, slack)
	}
	windowsWithDups := 0
	for _, v := range failedAttempts {
		if v > 0 {
			windowsWithDups++
		}
	}
	t.Logf("results: %d windows received of %d, %d exact counts, %d within duplicate allowance (%d of them above %d: ingest duplicates), %d wrong; %d redelivered msg_ids; %d windows with several msg_ids; %d windows may hold duplicates",
		len(col.byKey), (total/windowMS)*sensors, exact, loose, over, perSensor, wrong, dupDelivery, multiID, windowsWithDups)
	for r := 0; r <= run; r++ {
		lo, hi := -1, -1
		for k := range col.perRun[r] {
			w := int((k.start - epochMS) / windowMS)
			if lo < 0 || w < lo {
				lo = w
			}
			hi = max(hi, w)
		}
		t.Logf("run %d: results of %d (sensor, window) pairs received, windows %d..%d", r, len(col.perRun[r]), lo, hi)
	}
	if multiID > 0 {
		t.Errorf("%d windows were published under several msg_ids: a consumer dropping duplicate msg_ids would count them twice (a restarted node must resume from its latest checkpoint)", multiID)
	}
	for _, line := range strings.Split(n.logTailN(1<<30), "\n") {
		if strings.Contains(line, "ingest log opened") || strings.Contains(line, "restoring") || strings.Contains(line, "job started") ||
			strings.Contains(line, "savepoint taken") || strings.Contains(line, "level=ERROR") {
			t.Logf("edged: %s", line)
		}
	}
	t.Logf("total %v", time.Since(start).Round(time.Millisecond))
}

// killPoints returns count reading indexes in [10%, 95%) of n, at least
// min(15,000, a spacing that leaves room for them all) apart, in order,
// drawn from a logged seed (EDGED_E2E_SEED repeats a run).
func killPoints(t *testing.T, n, count int) []int {
	t.Helper()
	rng := seededRand(t)
	gap := min(15_000, n*85/100/(2*count))
	var killAt []int
	for len(killAt) < count {
		k := n/10 + rng.IntN(n*85/100)
		ok := true
		for _, o := range killAt {
			if k-o < gap && o-k < gap {
				ok = false
			}
		}
		if ok {
			killAt = append(killAt, k)
		}
	}
	sort.Ints(killAt)
	t.Logf("kill points (reading index): %v", killAt)
	return killAt
}
