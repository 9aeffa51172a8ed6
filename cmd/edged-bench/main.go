// Command edged-bench runs the whole-process benchmarks of edged and
// prints them as Markdown tables and as one JSON line per figure.
//
// Scenarios (-scenarios, comma-separated; default all):
//
//   - external: 1,000,000 JSON readings of 1,000 sensors published as
//     fast as raw, pre-encoded MQTT publishers go (QoS 0 and QoS 1, several
//     connections) to a Mosquitto on 127.0.0.1, read by a bare paho
//     subscriber (the baseline, in a process of its own), by edged
//     at-least-once (no checkpoints) and by edged exactly-once
//     (checkpoints every 1 s, write-ahead MQTT sink), one after the other
//     in the same run; the pipeline is a 1 s tumbling count+avg per sensor
//     with results published over MQTT. For each: messages/s from the first
//     to the last message read, CPU-µs per message (utime+stime of the
//     reading process from /proc/<pid>/stat over the messages it read),
//     peak VmRSS sampled every 100 ms, loss and duplicates.
//   - embedded: edged with its embedded broker, durable QoS 1 ingestion
//     from 4 and 16 publishing connections; the baselines are the same
//     publishers against Mosquitto (not durable) and against the same
//     edged's broker on topics no pipeline reads (mochi and edged's hooks
//     without the ingest log), in the same run.
//   - memory: RSS idle, peak RSS under a sustained load with 10,000 keys,
//     during the external scenario's burst (-n readings of -sensors, -conns
//     QoS 1 connections) and during a burst of 1 MB payloads.
//   - restart: SIGKILL with 100,000 keys of state, then the time from exec
//     of the new process until the job runs, the first result and all
//     results; with -restart-batch the results go to one topic in JSON
//     arrays (sinks[].mqtt.batch).
//   - cluster: RSS of each node of a three-node cluster on 127.0.0.1
//     (gossip, the exactly-once pipeline at parallelism 3, each node's
//     devices publishing QoS 1 to its own embedded broker), idle and under
//     a sustained load; one edged running the same pipeline with the whole
//     load is the baseline.
//   - replication: the checkpoint duration of a three-node cluster holding
//     100,000 keys of window state, with cluster.replicas 1 and 2,
//     alternating in the same run; one edged holding the same state is the
//     reference.
//
// Run it with scripts/bench.sh, which builds edged and this command. Every
// process it starts is killed when it exits or is interrupted.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// epochMS is a multiple of 1 h, so windows of 1 s to 1 h start on it.
const epochMS = int64(1_699_999_200_000)

var (
	edgedBin  = flag.String("edged", "", "edged binary (default: edged next to this binary)")
	mosqBin   = flag.String("mosquitto", "", "mosquitto binary (default: from PATH, else /usr/sbin/mosquitto)")
	scenarios = flag.String("scenarios", "external,embedded,memory,restart,cluster,replication", "scenarios to run, comma-separated: external, embedded, memory, restart, cluster, replication")
	quick     = flag.Bool("quick", false, "a reduced run: every count divided by 10 (unless set explicitly)")

	nMsgs      = flag.Int("n", 1_000_000, "external: readings published per subscriber and publisher QoS")
	sensors    = flag.Int("sensors", 1000, "external, embedded: distinct sensors")
	pubQoS     = flag.String("pub-qos", "0,1", "external: publisher QoS modes to run, comma-separated")
	subjects   = flag.String("subjects", "bare,alo,eo", "external: subscribers to run: bare (paho), alo (edged at-least-once), eo (edged exactly-once)")
	conns      = flag.Int("conns", 8, "external: publisher connections")
	inflight   = flag.Int("inflight", 2000, "QoS 1 publishes in flight per connection (external, memory)")
	ackDelay   = flag.Duration("ack-delay", 0, "external: the pipelines' source.mqtt.ack_delay (0: edged's default)")
	mqInflight = flag.Int("mosquitto-inflight", 1000, "Mosquitto's max_inflight_messages: QoS 1 messages it sends a subscriber before its PUBACKs (Mosquitto's own default is 20)")
	pubRate    = flag.Float64("pub-rate", 0, "external: cap on the publishers' rate over all connections, msg/s (0: as fast as they go)")
	eventRate  = flag.Int("event-rate", 100_000, "readings per second of event time (external, embedded): the 1 s windows hold this many readings")
	lateness   = flag.Duration("lateness", 2*time.Second, "max_out_of_orderness of the pipelines (publishers on several connections interleave)")

	embConns    = flag.String("embedded-conns", "4,16", "embedded: publishing connections per run, comma-separated")
	embN        = flag.Int("embedded-n", 200_000, "embedded: readings published per run")
	embInflight = flag.Int("embedded-inflight", 256, "embedded: QoS 1 publishes in flight per connection")
	embRounds   = flag.Int("embedded-rounds", 1, "embedded: runs of each connection count, one after the other (each: Mosquitto, then a fresh edged: no log before durable in odd rounds, after in even ones)")

	loadKeys = flag.Int("load-keys", 10_000, "memory: distinct sensors of the sustained load")
	loadN    = flag.Int("load-n", 300_000, "memory: readings of the sustained load")
	loadRate = flag.Float64("load-rate", 20_000, "memory: readings per second of the sustained load (event time follows)")
	bigN     = flag.Int("big-n", 200, "memory: messages of the large-payload burst")
	bigSize  = flag.Int("big-size", 1<<20, "memory: payload bytes of the large-payload burst")

	restartKeys  = flag.Int("restart-keys", 100_000, "restart: distinct sensors (keys of state)")
	restartBatch = flag.Int("restart-batch", 0, "restart: the result sink's batch (results per JSON-array message, all on one shared topic); 0: one message per result, a topic per sensor")

	settle   = flag.Duration("settle", 5*time.Second, "how long a count may stand still before what arrived is taken as all that will")
	timeout  = flag.Duration("timeout", 300*time.Second, "bound of every wait (publishing, consumption, readiness)")
	cpuProf  = flag.String("edged-cpuprofile", "", "write a CPU profile of every edged process to this directory (<pipeline>.cpu; edged run --cpuprofile)")
	gctrace  = flag.Bool("gctrace", false, "run edged with GODEBUG=gctrace=1 and report its Go heap (peak at GC start, peak live) next to the memory figures")
	keep     = flag.Bool("keep", false, "keep the temporary directory (configs, logs)")
	jsonPath = flag.String("json", "", "also write the JSON lines to this file")
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "bare-sub" {
		os.Exit(bareSubMain(os.Args[2:]))
	}
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: edged-bench [flags]   (or scripts/bench.sh [flags])\n\n")
		fmt.Fprintf(flag.CommandLine.Output(), "Whole-process benchmarks of edged against Mosquitto on 127.0.0.1 and its embedded broker.\n")
		fmt.Fprintf(flag.CommandLine.Output(), "Prints Markdown tables and one JSON line per figure. Rerun one scenario with -scenarios.\n\nflags:\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if *quick {
		set := map[string]bool{}
		flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
		for name, p := range map[string]*int{"n": nMsgs, "embedded-n": embN, "load-n": loadN, "restart-keys": restartKeys, "cluster-n": clusterN, "replication-keys": replKeys} {
			if !set[name] {
				*p /= 10
			}
		}
	}
	killChildrenOnSignal()
	err := run()
	killChildren()
	printReport()
	if err != nil {
		fmt.Fprintln(os.Stderr, "edged-bench:", err)
		os.Exit(1)
	}
}

var loadBefore string

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
	want := map[string]bool{}
	for _, s := range strings.Split(*scenarios, ",") {
		s = strings.TrimSpace(s)
		switch s {
		case "external", "embedded", "memory", "restart", "cluster", "replication":
			want[s] = true
		case "":
		default:
			return fmt.Errorf("-scenarios: unknown scenario %q", s)
		}
	}
	dir, err := os.MkdirTemp("", "edged-bench-")
	if err != nil {
		return err
	}
	tmpDir.Store(&dir)
	if *keep {
		logf("temporary directory %s kept", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	loadBefore = loadavg()
	mq, err := startMosquitto(dir)
	if err != nil {
		return err
	}
	defer mq.stop()
	logf("mosquitto on %s; load average %s", mq.addr, loadBefore)

	if want["external"] {
		if err := benchExternal(dir, mq); err != nil {
			return fmt.Errorf("external: %w", err)
		}
	}
	if want["embedded"] {
		if err := benchEmbedded(dir, mq); err != nil {
			return fmt.Errorf("embedded: %w", err)
		}
	}
	if want["memory"] {
		if err := benchMemory(dir, mq); err != nil {
			return fmt.Errorf("memory: %w", err)
		}
	}
	if want["restart"] {
		if err := benchRestart(dir, mq); err != nil {
			return fmt.Errorf("restart: %w", err)
		}
	}
	if want["cluster"] {
		if err := benchCluster(dir); err != nil {
			return fmt.Errorf("cluster: %w", err)
		}
	}
	if want["replication"] {
		if err := benchReplication(dir); err != nil {
			return fmt.Errorf("replication: %w", err)
		}
	}
	return nil
}

func logf(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "[%s] %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, a...))
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// ---------------------------------------------------------------- report

// figure is one measured figure: a row of a table and a JSON line.
type figure struct {
	Scenario   string   `json:"scenario"`
	Figure     string   `json:"figure"`
	Subject    string   `json:"subject,omitempty"`
	Value      float64  `json:"value"`
	Unit       string   `json:"unit"`
	Baseline   *float64 `json:"baseline,omitempty"`
	BaselineOf string   `json:"baseline_of,omitempty"`
	Ratio      *float64 `json:"ratio,omitempty"`
	Target     string   `json:"target,omitempty"`
	Met        *bool    `json:"met,omitempty"`
	What       string   `json:"what"`
}

var (
	figures []figure
	notes   = map[string][]string{}
	order   []string
)

func addFigure(f figure) {
	if f.Baseline != nil && *f.Baseline != 0 && f.Ratio == nil {
		r := f.Value / *f.Baseline
		f.Ratio = &r
	}
	if _, ok := notes[f.Scenario]; !ok {
		notes[f.Scenario] = nil
		order = append(order, f.Scenario)
	}
	figures = append(figures, f)
	b, _ := json.Marshal(f)
	fmt.Fprintf(os.Stderr, "  %s\n", b)
}

func note(scenario, format string, a ...any) {
	if _, ok := notes[scenario]; !ok {
		order = append(order, scenario)
	}
	s := fmt.Sprintf(format, a...)
	notes[scenario] = append(notes[scenario], s)
	fmt.Fprintf(os.Stderr, "  %s\n", s)
}

func ptr[T any](v T) *T { return &v }

func fmtValue(v float64, unit string) string {
	switch unit {
	case "msg/s":
		return commas(int64(math.Round(v))) + " msg/s"
	case "µs/msg":
		return fmt.Sprintf("%.2f CPU-µs/msg", v)
	case "MB":
		return fmt.Sprintf("%.1f MB", v)
	case "s":
		return round(time.Duration(v * float64(time.Second)))
	case "messages", "readings", "results":
		return commas(int64(v)) + " " + unit
	}
	return strconv.FormatFloat(v, 'f', -1, 64) + " " + unit
}

func commas(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

func round(d time.Duration) string {
	if d < time.Second {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(10 * time.Millisecond).String()
}

var titles = map[string]string{
	"external":    "MQTT pipeline at the broker's ceiling (external Mosquitto)",
	"embedded":    "Embedded broker: durable QoS 1 ingestion",
	"memory":      "Memory (peak VmRSS sampled every 100 ms)",
	"restart":     "Restart after SIGKILL",
	"cluster":     "A cluster of three edged processes: RSS of each node (peak VmRSS sampled every 100 ms)",
	"replication": "A cluster of three edged processes: checkpoint duration with cluster.replicas 1 and 2",
}

func printReport() {
	fmt.Printf("\n## Whole process (`cmd/edged-bench`)\n\n")
	fmt.Printf("Rerun: `%s` (flags: `scripts/bench.sh -h`)\n\n", strings.Join(append([]string{"scripts/bench.sh"}, userArgs()...), " "))
	host, _ := os.Hostname()
	fmt.Printf("Date: %s; %s, %s/%s, %d CPUs, %s; load average before %s, after %s.\n",
		time.Now().UTC().Format("2006-01-02 15:04 MST"), host, runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version(), loadBefore, loadavg())
	for _, sc := range order {
		fmt.Printf("\n### %s\n\n", titles[sc])
		fmt.Println("| figure | what | result | baseline (same run) | ratio | target |")
		fmt.Println("|---|---|---|---|---|---|")
		for _, f := range figures {
			if f.Scenario != sc {
				continue
			}
			name := f.Figure
			if f.Subject != "" {
				name += " — " + f.Subject
			}
			base, ratio, target := "—", "—", "—"
			if f.Baseline != nil {
				base = fmtValue(*f.Baseline, f.Unit)
				if f.BaselineOf != "" {
					base = f.BaselineOf + ": " + base
				}
			}
			if f.Ratio != nil {
				ratio = fmt.Sprintf("%.2f", *f.Ratio)
			}
			if f.Target != "" {
				target = f.Target
				if f.Met != nil {
					if *f.Met {
						target += " (met)"
					} else {
						target += " — **not met**"
					}
				}
			}
			fmt.Printf("| %s | %s | %s | %s | %s | %s |\n", name, f.What, fmtValue(f.Value, f.Unit), base, ratio, target)
		}
		if len(notes[sc]) > 0 {
			fmt.Println()
			for _, n := range notes[sc] {
				fmt.Println("- " + n)
			}
		}
	}
	fmt.Println("\nOne JSON line per figure:\n\n```jsonl")
	var out strings.Builder
	for _, f := range figures {
		b, _ := json.Marshal(f)
		out.Write(b)
		out.WriteByte('\n')
	}
	fmt.Print(out.String())
	fmt.Println("```")
	if *jsonPath != "" {
		if err := os.WriteFile(*jsonPath, []byte(out.String()), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "edged-bench: -json:", err)
		}
	}
}

// userArgs is the command line without the -edged flag scripts/bench.sh
// adds.
func userArgs() []string {
	var out []string
	args := os.Args[1:]
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "-edged" || a == "--edged":
			i++
		case strings.HasPrefix(a, "-edged=") || strings.HasPrefix(a, "--edged="):
		default:
			out = append(out, a)
		}
	}
	return out
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
	forgetChild(m.cmd)
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
	// A queue per client large enough that a subscriber behind the
	// publishers loses nothing (QoS 0 messages to a connected client are
	// dropped only past max_queued_messages).
	q := max(2_000_000, 2*(*nMsgs+*loadN))
	body := fmt.Sprintf("listener %s 127.0.0.1\nallow_anonymous true\npersistence false\nmax_inflight_messages %d\nmax_queued_messages %d\n", port, *mqInflight, q)
	if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
		return nil, err
	}
	logFile, err := os.Create(filepath.Join(dir, "mosquitto.log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "-c", conf)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := startChild(cmd); err != nil {
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

// ---------------------------------------------------------------- readings

// reading returns the i-th reading of a load: sensor i%keys under
// root/<sensor>, event time ts(i).
func reading(root, prefix string, keys, width int, ts func(i int) int64) func(i int) (string, []byte) {
	return func(i int) (string, []byte) {
		s := fmt.Sprintf("%s%0*d", prefix, width, i%keys)
		return root + "/" + s, fmt.Appendf(nil, `{"sensor":%q,"t":%d.5,"ts":%d}`, s, 20+i%15, ts(i))
	}
}

// windowEnd is the end of the last 1 s... window holding event time ts.
func windowEnd(ts, win int64) int64 { return epochMS + ((ts-epochMS)/win+1)*win }

func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		v, err := strconv.Atoi(f)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}
