package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// pipelineSpec is what a bench pipeline reads and how it is run. Every
// pipeline keys JSON readings {"sensor","t","ts"} by sensor, windows them
// in tumbling windows with count and avg of t, and publishes the results
// over MQTT.
type pipelineSpec struct {
	name      string
	broker    string // external broker URL; "" is the embedded broker
	embedded  string // node.broker: the embedded broker's address
	topic     string // subscription
	window    string // tumbling window size, e.g. "1s"
	lateness  string // max_out_of_orderness
	sinkTopic string
	// batch, when above 1, is the result sink's batch.
	batch int
	// checkpoint is "" (no checkpoints: at-least-once, plain MQTT sink)
	// or "exactly_once" (every 1 s, write-ahead MQTT sink).
	checkpoint string
	// memory, when set, is the node.memory block, as a YAML flow mapping's
	// content ("limit: off, credits: 8").
	memory string
	// parallelism, when set, is the pipeline's parallelism.
	parallelism int
	// cluster, when set, is the config's cluster block (YAML, from
	// "cluster:" on).
	cluster string
	// api, when set, is node.listen (default: a free loopback address).
	api string
}

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
	client  *http.Client
}

func newEdged(dir string, p pipelineSpec) (*edged, error) {
	api := p.api
	if api == "" {
		var err error
		if api, err = freeAddr(); err != nil {
			return nil, err
		}
	}
	d := filepath.Join(dir, p.name)
	if err := os.MkdirAll(d, 0o755); err != nil {
		return nil, err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "node:\n  data_dir: %s/data\n  listen: %s\n", d, api)
	if p.embedded != "" {
		fmt.Fprintf(&b, "  broker: %s\n", p.embedded)
	}
	if p.memory != "" {
		fmt.Fprintf(&b, "  memory: {%s}\n", p.memory)
	}
	b.WriteString(p.cluster)
	fmt.Fprintf(&b, "pipelines:\n  - name: %s\n", p.name)
	if p.parallelism > 0 {
		fmt.Fprintf(&b, "    parallelism: %d\n", p.parallelism)
	}
	b.WriteString("    source:\n      mqtt:\n")
	if p.broker != "" {
		fmt.Fprintf(&b, "        broker: %s\n        client_id: bench-%s\n        qos: 1\n", p.broker, p.name)
		if *ackDelay != 0 {
			fmt.Fprintf(&b, "        ack_delay: %s\n", *ackDelay)
		}
	}
	fmt.Fprintf(&b, `        topics: ["%s"]
        format: json
        fields:
          id: {type: string, path: $.sensor}
          temp: {type: float, path: $.t}
          ts: {type: time, path: $.ts, unit: ms}
    event_time: {field: ts, max_out_of_orderness: %s}
    key: id
    window:
      type: tumbling
      size: %s
      aggregates: [{name: count, fn: count}, {name: avg, fn: avg, field: temp}]
    sinks:
      - mqtt: {topic: "%s", qos: 1%s}
`, p.topic, p.lateness, p.window, p.sinkTopic, batchKey(p.batch))
	if p.checkpoint != "" {
		fmt.Fprintf(&b, "    checkpoint: {dir: %s/data/checkpoints, interval: 1s, mode: %s}\n", d, p.checkpoint)
	}
	cfgPath := filepath.Join(d, "edged.yaml")
	if err := os.WriteFile(cfgPath, []byte(b.String()), 0o644); err != nil {
		return nil, err
	}
	return &edged{name: p.name, cfgPath: cfgPath, logPath: filepath.Join(d, "edged.log"), api: api,
		client: &http.Client{Timeout: 2 * time.Second}}, nil
}

func (e *edged) start() error {
	f, err := os.OpenFile(e.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(f, "===== edged run at %s =====\n", time.Now().Format(time.RFC3339Nano))
	e.logFile = f
	args := []string{"run", "-c", e.cfgPath}
	if *cpuProf != "" {
		args = append(args, "--cpuprofile", filepath.Join(*cpuProf, e.name+".cpu"))
	}
	e.cmd = exec.Command(*edgedBin, args...)
	e.cmd.Stdout, e.cmd.Stderr = f, f
	if *gctrace {
		e.cmd.Env = append(os.Environ(), "GODEBUG=gctrace=1")
	}
	e.started = time.Now()
	if err := startChild(e.cmd); err != nil {
		return fmt.Errorf("start edged: %w", err)
	}
	e.done = make(chan struct{})
	cmd, done := e.cmd, e.done
	go func() {
		e.waitErr = cmd.Wait()
		forgetChild(cmd)
		close(done)
	}()
	return nil
}

func (e *edged) pid() int { return e.cmd.Process.Pid }

func (e *edged) alive() bool {
	select {
	case <-e.done:
		return false
	default:
		return true
	}
}

// waitRunning polls GET /jobs every 5 ms until the job is running and
// returns the time since exec.
func (e *edged) waitRunning(limit time.Duration) (time.Duration, error) {
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
		if getJSON(e.client, "http://"+e.api+"/jobs", &l) == nil {
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

// ingested is the next offset of the pipeline's ingest log: how many
// messages edged has read and logged since its log was created.
func (e *edged) ingested() (int64, error) {
	l, err := e.ingestLog()
	return l.NextOffset, err
}

// ingestLog is the pipeline's ingest log in GET /ingest.
type ingestLog struct {
	Pipeline   string `json:"pipeline"`
	NextOffset int64  `json:"next_offset"`
	Fsyncs     int64  `json:"fsyncs"`
}

// ingestLog reads the pipeline's ingest log from GET /ingest.
func (e *edged) ingestLog() (ingestLog, error) {
	var l struct {
		Pipelines []ingestLog `json:"pipelines"`
	}
	if err := getJSON(e.client, "http://"+e.api+"/ingest", &l); err != nil {
		return ingestLog{}, err
	}
	for _, p := range l.Pipelines {
		if p.Pipeline == e.name {
			return p, nil
		}
	}
	return ingestLog{}, fmt.Errorf("no ingest log of %q", e.name)
}

// deadLetters is how many records the job sent to its dead-letter output
// (GET /jobs): readings later than the watermark allows among them.
func (e *edged) deadLetters() (int64, error) {
	var l struct {
		Jobs []struct {
			Name        string `json:"name"`
			DeadLetters int64  `json:"dead_letters"`
		} `json:"jobs"`
	}
	if err := getJSON(e.client, "http://"+e.api+"/jobs", &l); err != nil {
		return 0, err
	}
	for _, j := range l.Jobs {
		if j.Name == e.name {
			return j.DeadLetters, nil
		}
	}
	return 0, fmt.Errorf("no job %q", e.name)
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

func (e *edged) checkpoints() ([]checkpointInfo, error) {
	var l struct {
		Checkpoints []checkpointInfo `json:"checkpoints"`
	}
	err := getJSON(e.client, "http://"+e.api+"/jobs/"+e.name+"/checkpoints", &l)
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

// stop sends SIGINT (a savepoint is taken) and waits a bounded time.
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

// readTracker polls edged's ingest log every 20 ms and records when the
// first and the last of n messages were read (logged).
type readTracker struct {
	first, last time.Time
	count       int64
}

// trackReads polls until n messages past base are logged, or until the
// count has not moved for settle once pubDone is closed, or the deadline.
func trackReads(e *edged, base, n int64, pubDone <-chan struct{}, settle time.Duration, deadline time.Time) (readTracker, error) {
	var t readTracker
	lastMove := time.Now()
	published := false
	for {
		off, err := e.ingested()
		now := time.Now()
		if err == nil {
			c := off - base
			if c > t.count {
				if t.count == 0 {
					t.first = now
				}
				t.count, t.last, lastMove = c, now, now
			}
		}
		if t.count >= n {
			return t, nil
		}
		if !published {
			select {
			case <-pubDone:
				published = true
				lastMove = now
			default:
			}
		}
		if published && now.Sub(lastMove) > settle {
			return t, nil
		}
		if !e.alive() {
			return t, fmt.Errorf("edged exited: %v\n%s", e.waitErr, e.logTail())
		}
		if now.After(deadline) {
			return t, fmt.Errorf("edged read %d of %d by its deadline\n%s", t.count, n, e.logTail())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var gcLine = regexp.MustCompile(`^gc \d+ @.* (\d+)->(\d+)->(\d+) MB, (\d+) MB goal, (\d+) MB stacks`)

// heapStats reads the gctrace lines edged wrote to its log since the
// given byte offset (with -gctrace): the largest heap at the start of a
// GC, the largest live heap after one, and the largest stacks, in MB.
func (e *edged) heapStats(from int64) (peakHeap, peakLive, peakStacks int, gcs int) {
	f, err := os.Open(e.logPath)
	if err != nil {
		return
	}
	defer f.Close()
	f.Seek(from, 0)
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		m := gcLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		start, _ := strconv.Atoi(m[1])
		live, _ := strconv.Atoi(m[3])
		stacks, _ := strconv.Atoi(m[5])
		peakHeap, peakLive, peakStacks = max(peakHeap, start), max(peakLive, live), max(peakStacks, stacks)
		gcs++
	}
	return
}

// logSize is the current size of edged's log, to read gctrace lines from.
func (e *edged) logSize() int64 {
	fi, err := os.Stat(e.logPath)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// heapNote describes the Go heap of edged since the log offset from, when
// -gctrace is on.
func (e *edged) heapNote(scenario, what string, from int64) {
	if !*gctrace {
		return
	}
	h, l, st, n := e.heapStats(from)
	note(scenario, "%s: Go heap (gctrace, %d GCs): peak %d MB at a GC start, peak live %d MB after a GC, stacks up to %d MB; the rest of the RSS is the runtime, code, and memory not yet returned to the OS.", what, n, h, l, st)
}

// batchKey returns the MQTT sink's batch key for n results per message
// (after a comma), or "" for one message per result.
func batchKey(n int) string {
	if n <= 1 {
		return ""
	}
	return fmt.Sprintf(", batch: %d", n)
}
