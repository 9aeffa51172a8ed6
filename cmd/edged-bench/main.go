// Command edged-bench runs the whole-process benchmarks of edged against a
// real Mosquitto on 127.0.0.1: MQTT pipeline throughput against a bare paho
// subscriber measured in the same run, resident memory of the daemon idle
// and under load, and restart-to-processing time after SIGKILL with 100k
// keys of state. It prints a Markdown table and the raw numbers.
//
// Run it with scripts/bench.sh, which builds edged and this command.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
)

// epochMS is a multiple of 1 h, so 10 s and 1 h windows start on it.
const epochMS = int64(1_699_999_200_000)

var (
	edgedBin    = flag.String("edged", "", "edged binary (default: edged next to this binary)")
	mosqBin     = flag.String("mosquitto", "", "mosquitto binary (default: from PATH, else /usr/sbin/mosquitto)")
	nMsgs       = flag.Int("n", 200_000, "readings published in the throughput benchmark")
	sensors     = flag.Int("sensors", 1000, "distinct sensors in the throughput benchmark")
	loadKeys    = flag.Int("load-keys", 10_000, "distinct sensors in the memory-under-load benchmark")
	loadN       = flag.Int("load-n", 200_000, "readings published in the memory-under-load benchmark")
	restartKeys = flag.Int("restart-keys", 100_000, "distinct sensors (keys of state) in the restart benchmark")
	conns       = flag.Int("conns", 20, "publisher connections")
	inflight    = flag.Int("inflight", 400, "QoS 1 publishes in flight at once (over all connections)")
	winMS       = flag.Int64("window-ms", 10_000, "tumbling window of the throughput and memory pipelines, ms")
	phases      = flag.String("phases", "throughput,memory,restart", "benchmarks to run, comma-separated")
	keep        = flag.Bool("keep", false, "keep the temporary directory (configs, logs)")
	timeout     = flag.Duration("timeout", 300*time.Second, "bound of every wait (publishing, consumption, readiness)")
)

type row struct{ bench, what, result, baseline, ratio, target string }

var (
	rows []row
	raw  []string
)

func rawf(format string, a ...any) {
	s := fmt.Sprintf(format, a...)
	raw = append(raw, s)
	fmt.Fprintln(os.Stderr, "  "+s)
}

func logf(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "[%s] %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, a...))
}

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "edged-bench:", err)
		printReport()
		os.Exit(1)
	}
	printReport()
}

func run() error {
	if *edgedBin == "" {
		self, err := os.Executable()
		if err != nil {
			return err
		}
		*edgedBin = filepath.Join(filepath.Dir(self), "edged")
	}
	if _, err := os.Stat(*edgedBin); err != nil {
		return fmt.Errorf("edged binary: %w", err)
	}
	dir, err := os.MkdirTemp("", "edged-bench-")
	if err != nil {
		return err
	}
	if *keep {
		logf("temporary directory %s kept", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	mq, err := startMosquitto(dir)
	if err != nil {
		return err
	}
	defer mq.stop()
	logf("mosquitto on %s", mq.addr)

	want := map[string]bool{}
	for _, p := range strings.Split(*phases, ",") {
		want[strings.TrimSpace(p)] = true
	}
	if want["throughput"] {
		if err := benchThroughput(dir, mq.url()); err != nil {
			return fmt.Errorf("throughput: %w", err)
		}
	}
	if want["memory"] {
		if err := benchMemory(dir, mq.url()); err != nil {
			return fmt.Errorf("memory: %w", err)
		}
	}
	if want["restart"] {
		if err := benchRestart(dir, mq.url()); err != nil {
			return fmt.Errorf("restart: %w", err)
		}
	}
	return nil
}

func printReport() {
	fmt.Printf("\n## Whole process (`cmd/edged-bench`)\n\n")
	fmt.Printf("Rerun: `scripts/bench.sh` (flags: `scripts/bench.sh -h`)\n\n")
	fmt.Printf("Date: %s; %s/%s, %d CPUs, GOMAXPROCS=%d, %s; Mosquitto on 127.0.0.1.\n\n",
		time.Now().UTC().Format("2006-01-02"), runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version())
	fmt.Println("| benchmark | what | result | baseline (same run) | ratio | target |")
	fmt.Println("|---|---|---|---|---|---|")
	for _, r := range rows {
		fmt.Printf("| %s | %s | %s | %s | %s | %s |\n", r.bench, r.what, r.result, r.baseline, r.ratio, r.target)
	}
	fmt.Println("\nRaw numbers:\n\n```")
	for _, s := range raw {
		fmt.Println(s)
	}
	fmt.Println("```")
}

// ---------------------------------------------------------------- mosquitto

type mosquitto struct {
	addr string
	cmd  *exec.Cmd
}

func (m *mosquitto) url() string { return "tcp://" + m.addr }

func (m *mosquitto) stop() {
	m.cmd.Process.Kill()
	m.cmd.Wait()
}

func startMosquitto(dir string) (*mosquitto, error) {
	bin := *mosqBin
	if bin == "" {
		var err error
		if bin, err = exec.LookPath("mosquitto"); err != nil {
			bin = "/usr/sbin/mosquitto"
		}
	}
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	_, port, _ := net.SplitHostPort(addr)
	conf := filepath.Join(dir, "mosquitto.conf")
	// As in test/mosquitto_test.go, with a larger queue per persistent
	// session so that a consumer behind the publishers loses nothing.
	body := fmt.Sprintf("listener %s 127.0.0.1\nallow_anonymous true\npersistence false\nmax_inflight_messages 1000\nmax_queued_messages 2000000\n", port)
	if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
		return nil, err
	}
	logFile, err := os.Create(filepath.Join(dir, "mosquitto.log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "-c", conf)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start mosquitto: %w", err)
	}
	m := &mosquitto{addr: addr, cmd: cmd}
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return m, nil
		}
		if time.Now().After(deadline) {
			m.stop()
			return nil, fmt.Errorf("mosquitto not listening on %s: %v", addr, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// ---------------------------------------------------------------- edged

type edged struct {
	name    string // the pipeline
	cfgPath string
	logPath string
	api     string
	cmd     *exec.Cmd
	done    chan struct{}
	waitErr error
	logFile *os.File
	started time.Time
}

// pipelineConfig writes a config with one pipeline reading topic from the
// external broker: per-sensor tumbling count, MQTT sink to the same broker,
// exactly-once checkpoints every second.
func newEdged(dir, name, brokerURL, topic, window, sinkTopic string) (*edged, error) {
	api, err := freeAddr()
	if err != nil {
		return nil, err
	}
	d := filepath.Join(dir, name)
	if err := os.MkdirAll(d, 0o755); err != nil {
		return nil, err
	}
	cfg := fmt.Sprintf(`node:
  data_dir: %[1]s/data
  listen: %[2]s
pipelines:
  - name: %[3]s
    source:
      mqtt:
        broker: %[4]s
        client_id: bench-%[3]s
        topics: [%[5]s]
        qos: 1
        format: json
        fields:
          id: {type: string, path: $.sensor}
          temp: {type: float, path: $.t}
          ts: {type: time, path: $.ts, unit: ms}
    event_time: {field: ts, max_out_of_orderness: 1s}
    key: id
    window:
      type: tumbling
      size: %[6]s
      aggregates: [{name: count, fn: count}]
    sinks:
      - mqtt: {topic: "%[7]s", qos: 1}
    checkpoint: {dir: %[1]s/data/checkpoints, interval: 1s, mode: exactly_once}
`, d, api, name, brokerURL, topic, window, sinkTopic)
	cfgPath := filepath.Join(d, "edged.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		return nil, err
	}
	return &edged{name: name, cfgPath: cfgPath, logPath: filepath.Join(d, "edged.log"), api: api}, nil
}

func (e *edged) start() error {
	f, err := os.OpenFile(e.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(f, "===== edged run at %s =====\n", time.Now().Format(time.RFC3339Nano))
	e.logFile = f
	e.cmd = exec.Command(*edgedBin, "run", "-c", e.cfgPath)
	e.cmd.Stdout, e.cmd.Stderr = f, f
	e.started = time.Now()
	if err := e.cmd.Start(); err != nil {
		return fmt.Errorf("start edged: %w", err)
	}
	e.done = make(chan struct{})
	cmd, done := e.cmd, e.done
	go func() {
		e.waitErr = cmd.Wait()
		close(done)
	}()
	return nil
}

func (e *edged) alive() bool {
	select {
	case <-e.done:
		return false
	default:
		return true
	}
}

// waitRunning polls GET /jobs every 5 ms until the job is running.
func (e *edged) waitRunning(limit time.Duration) (time.Duration, error) {
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(limit)
	for {
		if !e.alive() {
			return 0, fmt.Errorf("edged exited while starting: %v\n%s", e.waitErr, e.logTail())
		}
		var l struct {
			Jobs []struct {
				Name   string `json:"name"`
				Status string `json:"status"`
			} `json:"jobs"`
		}
		if getJSON(client, "http://"+e.api+"/jobs", &l) == nil {
			for _, j := range l.Jobs {
				if j.Name == e.name && j.Status == "running" {
					return time.Since(e.started), nil
				}
			}
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("edged not running after %v\n%s", limit, e.logTail())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

type checkpointInfo struct {
	ID          uint64    `json:"id"`
	Kind        string    `json:"kind"`
	Status      string    `json:"status"`
	TriggerTime time.Time `json:"trigger_time"`
	DurationMS  float64   `json:"duration_ms"`
	SizeBytes   int64     `json:"size_bytes"`
	AlignmentMS float64   `json:"alignment_ms"`
}

func (e *edged) checkpoints(client *http.Client) ([]checkpointInfo, error) {
	var l struct {
		Checkpoints []checkpointInfo `json:"checkpoints"`
	}
	err := getJSON(client, "http://"+e.api+"/jobs/"+e.name+"/checkpoints", &l)
	return l.Checkpoints, err
}

func (e *edged) kill() error {
	if err := e.cmd.Process.Kill(); err != nil {
		return err
	}
	select {
	case <-e.done:
	case <-time.After(10 * time.Second):
		return fmt.Errorf("edged did not die after SIGKILL")
	}
	e.logFile.Close()
	return nil
}

// stop sends SIGTERM (a savepoint is taken) and waits a bounded time.
func (e *edged) stop() {
	if e.cmd == nil || !e.alive() {
		return
	}
	e.cmd.Process.Signal(os.Interrupt)
	select {
	case <-e.done:
	case <-time.After(30 * time.Second):
		e.cmd.Process.Kill()
		<-e.done
	}
	e.logFile.Close()
}

func (e *edged) rssKB() (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", e.cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "VmRSS:") {
			f := strings.Fields(line)
			if len(f) >= 2 {
				return strconv.ParseInt(f[1], 10, 64)
			}
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", e.cmd.Process.Pid)
}

func (e *edged) logTail() string {
	b, _ := os.ReadFile(e.logPath)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

func getJSON(client *http.Client, url string, v any) error {
	resp, err := client.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// ---------------------------------------------------------------- MQTT clients

func connect(opts *paho.ClientOptions) (paho.Client, error) {
	c := paho.NewClient(opts)
	tok := c.Connect()
	if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		return nil, fmt.Errorf("connect %s: %v", opts.ClientID, tok.Error())
	}
	return c, nil
}

func publishers(url, prefix string) ([]paho.Client, error) {
	cs := make([]paho.Client, *conns)
	for i := range cs {
		opts := paho.NewClientOptions().AddBroker(url).SetClientID(fmt.Sprintf("%s-%d", prefix, i)).
			SetCleanSession(true).SetAutoReconnect(false).SetWriteTimeout(5 * time.Second)
		c, err := connect(opts)
		if err != nil {
			disconnectAll(cs[:i])
			return nil, err
		}
		cs[i] = c
	}
	return cs, nil
}

func disconnectAll(cs []paho.Client) {
	for _, c := range cs {
		if c != nil {
			c.Disconnect(100)
		}
	}
}

// publish sends readings [from, to) with QoS 1, reading i on connection
// i%len(pubs), waiting for the PUBACKs of every *inflight publishes. It is
// bounded by count and by the deadline.
func publish(pubs []paho.Client, from, to int, payload func(i int) (string, []byte), deadline time.Time) error {
	toks := make([]paho.Token, 0, *inflight)
	flush := func() error {
		for _, tok := range toks {
			if !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
				return fmt.Errorf("publish: %v", tok.Error())
			}
		}
		toks = toks[:0]
		if time.Now().After(deadline) {
			return fmt.Errorf("publishing past its deadline")
		}
		return nil
	}
	for i := from; i < to; i++ {
		topic, p := payload(i)
		toks = append(toks, pubs[i%len(pubs)].Publish(topic, 1, false, p))
		if len(toks) == cap(toks) {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	return flush()
}

func reading(prefix, topicRoot string, keys int, width int, ts func(i int) int64) func(i int) (string, []byte) {
	return func(i int) (string, []byte) {
		s := fmt.Sprintf("%s%0*d", prefix, width, i%keys)
		return topicRoot + "/" + s + "/temperature",
			[]byte(fmt.Sprintf(`{"sensor":%q,"t":%d.5,"ts":%d}`, s, 20+i%15, ts(i)))
	}
}

// results keeps the latest count of every (sensor, window) result.
type results struct {
	mu       sync.Mutex
	last     map[string]int64 // id|window_start -> count
	byWindow map[int64]int64  // window_start -> sum of the latest counts
	msgs     int64
	first    time.Time
	bad      int
}

func newResults() *results {
	return &results{last: map[string]int64{}, byWindow: map[int64]int64{}}
}

func (r *results) handle(_ paho.Client, m paho.Message) {
	var v struct {
		ID          string `json:"id"`
		WindowStart int64  `json:"window_start"`
		Count       int64  `json:"count"`
	}
	err := json.Unmarshal(m.Payload(), &v)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.msgs == 0 {
		r.first = time.Now()
	}
	r.msgs++
	if err != nil || v.ID == "" {
		r.bad++
		return
	}
	k := v.ID + "|" + strconv.FormatInt(v.WindowStart, 10)
	r.byWindow[v.WindowStart] += v.Count - r.last[k]
	r.last[k] = v.Count
}

// sumBefore is the sum of the latest counts of windows starting before end.
func (r *results) sumBefore(end int64) int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	var s int64
	for w, c := range r.byWindow {
		if w < end {
			s += c
		}
	}
	return s
}

func subscribeResults(url, id, topic string, r *results) (paho.Client, error) {
	opts := paho.NewClientOptions().AddBroker(url).SetClientID(id).SetCleanSession(true).
		SetOrderMatters(false).SetDefaultPublishHandler(r.handle)
	c, err := connect(opts)
	if err != nil {
		return nil, err
	}
	if tok := c.Subscribe(topic, 1, r.handle); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		c.Disconnect(100)
		return nil, fmt.Errorf("subscribe %s: %v", topic, tok.Error())
	}
	return c, nil
}

// waitSum waits until the results of windows starting before end sum to n.
func waitSum(r *results, end, n int64, e *edged, limit time.Duration) (time.Time, error) {
	deadline := time.Now().Add(limit)
	for {
		if s := r.sumBefore(end); s >= n {
			return time.Now(), nil
		}
		if !e.alive() {
			return time.Time{}, fmt.Errorf("edged exited: %v\n%s", e.waitErr, e.logTail())
		}
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("results sum to %d of %d after %v\n%s", r.sumBefore(end), n, limit, e.logTail())
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// ---------------------------------------------------------------- 1. throughput

func benchThroughput(dir, url string) error {
	n, keys, win := *nMsgs, *sensors, *winMS
	ts := func(i int) int64 { return epochMS + int64(i) } // 1 ms per reading
	payload := reading("m", "plant", keys, 4, ts)
	_, sample := payload(1)
	rawf("throughput: n=%d sensors=%d payload=%d bytes (e.g. %s) conns=%d inflight=%d window=%dms", n, keys, len(sample), sample, *conns, *inflight, win)

	// Baseline: a bare paho subscriber, QoS 1, persistent session.
	var count atomic.Int64
	var firstNS, lastNS atomic.Int64
	handler := func(_ paho.Client, m paho.Message) {
		now := time.Now().UnixNano()
		if count.Add(1) == 1 {
			firstNS.Store(now)
		}
		lastNS.Store(now)
	}
	opts := paho.NewClientOptions().AddBroker(url).SetClientID("bench-bare").SetCleanSession(false).
		SetOrderMatters(false).SetDefaultPublishHandler(handler)
	bare, err := connect(opts)
	if err != nil {
		return err
	}
	if tok := bare.Subscribe("plant/+/temperature", 1, handler); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		return fmt.Errorf("subscribe: %v", tok.Error())
	}
	pubs, err := publishers(url, "bench-dev")
	if err != nil {
		return err
	}
	defer disconnectAll(pubs)
	logf("baseline: publishing %d readings to a bare paho subscriber", n)
	pubStart := time.Now()
	if err := publish(pubs, 0, n, payload, time.Now().Add(*timeout)); err != nil {
		return err
	}
	pubDur := time.Since(pubStart)
	deadline := time.Now().Add(*timeout)
	for count.Load() < int64(n) && time.Now().Before(deadline) {
		time.Sleep(2 * time.Millisecond)
	}
	got := count.Load()
	if tok := bare.Unsubscribe("plant/+/temperature"); !tok.WaitTimeout(10 * time.Second) {
		logf("unsubscribe timed out")
	}
	bare.Disconnect(100)
	if got < int64(n) {
		return fmt.Errorf("bare subscriber received %d of %d", got, n)
	}
	bareDur := time.Duration(lastNS.Load() - firstNS.Load())
	bareFromPub := time.Duration(lastNS.Load() - pubStart.UnixNano())
	bareRate := float64(n) / bareDur.Seconds()
	rawf("baseline bare paho: received %d; first->last received %v = %.0f msg/s; first publish->last received %v = %.0f msg/s; publishing took %v = %.0f msg/s",
		got, bareDur, bareRate, bareFromPub, float64(n)/bareFromPub.Seconds(), pubDur, float64(n)/pubDur.Seconds())

	// Engine: edged reading the same topic from the same broker.
	e, err := newEdged(dir, "throughput", url, "plant/+/temperature", fmt.Sprintf("%dms", win), "totals/{id}")
	if err != nil {
		return err
	}
	res := newResults()
	sub, err := subscribeResults(url, "bench-totals", "totals/#", res)
	if err != nil {
		return err
	}
	defer sub.Disconnect(100)
	if err := e.start(); err != nil {
		return err
	}
	defer e.stop()
	ready, err := e.waitRunning(*timeout)
	if err != nil {
		return err
	}
	rawf("edged (throughput config) running %v after exec", ready)
	// Idle memory: after start, no traffic, 3 s.
	time.Sleep(3 * time.Second)
	idle, err := e.rssKB()
	if err != nil {
		return err
	}
	rawf("edged idle VmRSS 3 s after running, no traffic: %d kB", idle)
	rows = append(rows, row{"RSS idle", "edged running the throughput pipeline (external Mosquitto, exactly-once checkpoints every 1 s), 3 s after start, no traffic; `VmRSS`", fmt.Sprintf("%.1f MB", float64(idle)/1024), "—", "—", "≤ 30 MB"})

	// Peak RSS while this phase runs, sampled every 100 ms.
	var peak atomic.Int64
	stopSample := make(chan struct{})
	var sampled sync.WaitGroup
	sampled.Add(1)
	go func() {
		defer sampled.Done()
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			if kb, err := e.rssKB(); err == nil && kb > peak.Load() {
				peak.Store(kb)
			}
			select {
			case <-stopSample:
				return
			case <-t.C:
			}
		}
	}()

	// The readings, then a tail of one reading per sensor in a window two
	// windows after the last one: it moves the watermark past the last
	// window, whose results then show all n consumed.
	lastEnd := epochMS + (int64(n)+win-1)/win*win
	tailTS := lastEnd + 2*win
	tail := keys
	all := func(i int) (string, []byte) {
		if i < n {
			return payload(i)
		}
		return reading("m", "plant", keys, 4, func(int) int64 { return tailTS })(i)
	}
	logf("engine: publishing %d readings + %d tail readings to edged", n, tail)
	start := time.Now()
	if err := publish(pubs, 0, n+tail, all, time.Now().Add(*timeout)); err != nil {
		close(stopSample)
		sampled.Wait()
		return fmt.Errorf("%w\n%s", err, e.logTail())
	}
	enginePub := time.Since(start)
	doneAt, err := waitSum(res, lastEnd, int64(n), e, *timeout)
	close(stopSample)
	sampled.Wait()
	if err != nil {
		return err
	}
	engDur := doneAt.Sub(start)
	engRate := float64(n) / engDur.Seconds()
	ratio := engRate / bareRate
	rawf("engine edged: publishing %d+%d took %v = %.0f msg/s; first publish -> window results sum to %d: %v = %.0f msg/s; result messages %d (bad %d); peak VmRSS %d kB",
		n, tail, enginePub, float64(n+tail)/enginePub.Seconds(), n, engDur, engRate, res.msgs, res.bad, peak.Load())
	rawf("ratio engine/bare = %.3f", ratio)
	rows = append(rows, row{"MQTT pipeline throughput",
		fmt.Sprintf("%d JSON readings (%d B) of %d sensors, QoS 1, %d connections, %d in flight → Mosquitto → edged (exactly-once checkpoints every 1 s, 10 s tumbling count per sensor, MQTT sink); first publish until the window results sum to %d", n, len(sample), keys, *conns, *inflight, n),
		fmt.Sprintf("%.0f msg/s", engRate),
		fmt.Sprintf("bare paho subscriber (QoS 1, persistent session), first to last received: %.0f msg/s", bareRate),
		fmt.Sprintf("**%.2f**", ratio), "≥ 0.8"})
	return nil
}

// ---------------------------------------------------------------- 2. memory under load

func benchMemory(dir, url string) error {
	n, keys, win := *loadN, *loadKeys, *winMS
	ts := func(i int) int64 { return epochMS + int64(i) }
	payload := reading("k", "load", keys, 5, ts)
	rawf("memory under load: n=%d keys=%d window=%dms", n, keys, win)
	e, err := newEdged(dir, "memory", url, "load/+/temperature", fmt.Sprintf("%dms", win), "ltotals/{id}")
	if err != nil {
		return err
	}
	res := newResults()
	sub, err := subscribeResults(url, "bench-ltotals", "ltotals/#", res)
	if err != nil {
		return err
	}
	defer sub.Disconnect(100)
	if err := e.start(); err != nil {
		return err
	}
	defer e.stop()
	if _, err := e.waitRunning(*timeout); err != nil {
		return err
	}
	time.Sleep(3 * time.Second)
	idle, _ := e.rssKB()
	rawf("memory pipeline idle VmRSS (3 s, no traffic): %d kB", idle)
	pubs, err := publishers(url, "bench-load")
	if err != nil {
		return err
	}
	defer disconnectAll(pubs)

	var peakPub, peakAll, samples atomic.Int64
	var publishing atomic.Bool
	publishing.Store(true)
	stopSample := make(chan struct{})
	var sampled sync.WaitGroup
	sampled.Add(1)
	go func() {
		defer sampled.Done()
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			if kb, err := e.rssKB(); err == nil {
				samples.Add(1)
				if publishing.Load() && kb > peakPub.Load() {
					peakPub.Store(kb)
				}
				if kb > peakAll.Load() {
					peakAll.Store(kb)
				}
			}
			select {
			case <-stopSample:
				return
			case <-t.C:
			}
		}
	}()
	lastEnd := epochMS + (int64(n)+win-1)/win*win
	tailTS := lastEnd + 2*win
	all := func(i int) (string, []byte) {
		if i < n {
			return payload(i)
		}
		return reading("k", "load", keys, 5, func(int) int64 { return tailTS })(i)
	}
	start := time.Now()
	err = publish(pubs, 0, n+keys, all, time.Now().Add(*timeout))
	pubDur := time.Since(start)
	publishing.Store(false)
	var doneAt time.Time
	if err == nil {
		doneAt, err = waitSum(res, lastEnd, int64(n), e, *timeout)
	}
	close(stopSample)
	sampled.Wait()
	if err != nil {
		return err
	}
	after, _ := e.rssKB()
	rawf("memory under load: published %d+%d in %v; all consumed after %v; peak VmRSS while publishing %d kB, peak until consumed %d kB (%d samples every 100 ms); VmRSS after %d kB",
		n, keys, pubDur, doneAt.Sub(start), peakPub.Load(), peakAll.Load(), samples.Load(), after)
	rows = append(rows, row{"RSS under load",
		fmt.Sprintf("%d readings of %d sensors published with QoS 1 (%d keys in the window state), 10 s tumbling count; peak `VmRSS` sampled every 100 ms while publishing (peak until all consumed: %.1f MB)", n+keys, keys, keys, float64(peakAll.Load())/1024),
		fmt.Sprintf("%.1f MB", float64(peakPub.Load())/1024),
		fmt.Sprintf("same process idle: %.1f MB", float64(idle)/1024), "—", "≤ 80 MB"})
	return nil
}

// ---------------------------------------------------------------- 3. restart

func benchRestart(dir, url string) error {
	keys := *restartKeys
	const hour = int64(3_600_000)
	// One reading per sensor, 1 ms apart, all in the first hour window.
	ts := func(i int) int64 { return epochMS + int64(i)%hour }
	payload := reading("r", "rst", keys, 6, ts)
	rawf("restart: keys=%d window=1h checkpoints every 1 s", keys)
	e, err := newEdged(dir, "restart", url, "rst/+/temperature", "1h", "rtotals/{id}")
	if err != nil {
		return err
	}
	if err := e.start(); err != nil {
		return err
	}
	defer e.stop()
	if _, err := e.waitRunning(*timeout); err != nil {
		return err
	}
	pubs, err := publishers(url, "bench-rst")
	if err != nil {
		return err
	}
	defer disconnectAll(pubs)
	start := time.Now()
	if err := publish(pubs, 0, keys, payload, time.Now().Add(*timeout)); err != nil {
		return err
	}
	pubEnd := time.Now()
	logf("restart: published %d readings in %v; waiting for the checkpoint size to settle", keys, pubEnd.Sub(start))

	// Wait for two consecutive completed checkpoints triggered after the
	// last PUBACK with the same size: the state then holds every key.
	client := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(*timeout)
	var chk checkpointInfo
	for {
		cps, err := e.checkpoints(client)
		if err == nil {
			var after []checkpointInfo
			for _, c := range cps {
				if c.Status == "completed" && c.TriggerTime.After(pubEnd) {
					after = append(after, c)
				}
			}
			if l := len(after); l >= 2 && after[l-1].SizeBytes == after[l-2].SizeBytes && after[l-1].SizeBytes > 0 {
				chk = after[l-1]
				break
			}
		}
		if !e.alive() {
			return fmt.Errorf("edged exited: %v\n%s", e.waitErr, e.logTail())
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no settled checkpoint after %v (%v)\n%s", *timeout, err, e.logTail())
		}
		time.Sleep(50 * time.Millisecond)
	}
	rssBefore, _ := e.rssKB()
	rawf("checkpoint %d completed: %d bytes, %.1f ms, alignment %.2f ms; VmRSS before kill %d kB", chk.ID, chk.SizeBytes, chk.DurationMS, chk.AlignmentMS, rssBefore)

	res := newResults()
	sub, err := subscribeResults(url, "bench-rtotals", "rtotals/#", res)
	if err != nil {
		return err
	}
	defer sub.Disconnect(100)

	if err := e.kill(); err != nil {
		return err
	}
	logf("restart: SIGKILLed edged, restarting")
	if err := e.start(); err != nil {
		return err
	}
	restart := e.started
	running, err := e.waitRunning(*timeout)
	if err != nil {
		return err
	}
	// A new reading in the next hour moves the watermark past the window
	// holding the 100k restored keys: it fires, and its results (published
	// when the next checkpoint completes) show the restored state.
	newTopic, newPayload := reading("r", "rst", keys, 6, func(int) int64 { return epochMS + hour + 2000 })(0)
	tok := pubs[0].Publish(newTopic, 1, false, newPayload)
	if !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		return fmt.Errorf("publish after restart: %v", tok.Error())
	}
	acked := time.Since(restart)
	// First completed checkpoint after the restart, and the results.
	var firstChk time.Duration
	var firstRes time.Duration
	var allRes time.Duration
	var chkAfter checkpointInfo
	deadline = time.Now().Add(*timeout)
	for allRes == 0 {
		if firstChk == 0 {
			if cps, err := e.checkpoints(client); err == nil {
				for _, c := range cps {
					if c.Status == "completed" && c.Kind == "checkpoint" && c.TriggerTime.After(restart) {
						firstChk = time.Since(restart)
						chkAfter = c
						break
					}
				}
			}
		}
		res.mu.Lock()
		msgs := res.msgs
		first := res.first
		res.mu.Unlock()
		if msgs > 0 && firstRes == 0 {
			firstRes = first.Sub(restart)
		}
		if res.sumBefore(epochMS+hour) >= int64(keys) {
			allRes = time.Since(restart)
		}
		if !e.alive() {
			return fmt.Errorf("edged exited: %v\n%s", e.waitErr, e.logTail())
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after restart: %d results summing to %d of %d after %v\n%s", msgs, res.sumBefore(epochMS+hour), keys, *timeout, e.logTail())
		}
		time.Sleep(2 * time.Millisecond)
	}
	if firstChk == 0 {
		if cps, err := e.checkpoints(client); err == nil {
			for _, c := range cps {
				if c.Status == "completed" && c.TriggerTime.After(restart) {
					firstChk = time.Since(restart)
					chkAfter = c
					break
				}
			}
		}
	}
	rawf("after SIGKILL: exec -> job running %v; new reading PUBACKed %v; first result %v; first completed checkpoint %v (id %d, %d bytes); all %d window results (counts sum %d) %v",
		running, acked, firstRes, firstChk, chkAfter.ID, chkAfter.SizeBytes, keys, res.sumBefore(epochMS+hour), allRes)
	rows = append(rows, row{"Restart after SIGKILL",
		fmt.Sprintf("%d keys in a 1 h tumbling count window, checkpoints every 1 s; SIGKILL after a completed checkpoint of %.1f MB, restart; time from exec of the new process", keys, float64(chk.SizeBytes)/1e6),
		fmt.Sprintf("job running: %s; first result of the window closed by a reading published after the restart: %s; all %d results: %s",
			round(running), round(firstRes), keys, round(allRes)),
		"—", "—", "report"})
	return nil
}

func round(d time.Duration) string {
	if d < time.Second {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(10 * time.Millisecond).String()
}
