package test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/eclipse/paho.mqtt.golang/packets"

	"github.com/edgedio/edged/internal/mqtttest"
	"github.com/edgedio/edged/internal/testutil"
)

// What the exactly-once tests share: a workload of readings with known
// per-sensor totals, a publisher that runs beside the test and can be
// paused around a kill, CPU burner processes, a look at the node's tasks,
// the strict check of the results, and the CLI stop.
//
// Environment variables (all optional):
//
//	EDGED_E2E_SEED         repeat a run's kill and split points
//	EDGED_E2E_READINGS     readings per exactly-once test (default 100000, 60000 for QoS 2; 500000 for a long run)
//	EDGED_E2E_BURNERS      CPU burner processes beside edged (default: the number of CPUs)
//	EDGED_E2E_PARALLELISM  parallelism of the kill tests' pipelines (default 2)
//	EDGED_E2E_KEEP_LOGS    a directory to copy the edged log of a failed test to

// burnerEnv makes the test binary a CPU burner instead of running tests
// (see TestMain).
const burnerEnv = "EDGED_E2E_BURNER"

// tokenTimeout bounds the wait for one publish's acknowledgement; it
// covers a node's restart (30 s) and the devices' reconnects
// (reconnectTimeout), during which the devices' publishes wait.
const tokenTimeout = 2 * time.Minute

// envInt returns the integer in the environment variable name, or def.
func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	v, err := strconv.Atoi(s)
	if err != nil || v < 0 {
		t.Fatalf("%s=%q: want a non-negative integer", name, s)
	}
	return v
}

// seededRand returns a random source from a logged seed (EDGED_E2E_SEED
// repeats a run).
func seededRand(t *testing.T) *rand.Rand {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("EDGED_E2E_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("EDGED_E2E_SEED=%q: %v", s, err)
		}
		seed = v
	}
	t.Logf("seed %d (set EDGED_E2E_SEED to repeat)", seed)
	return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
}

// workload is n readings of sensors sensors, reading i from sensor
// i%sensors with event time epochMS+i ms, counted in tumbling windows of
// winMS ms, followed by tail readings that only move the watermark past
// the last window. Every sensor has winMS/sensors readings in each of the
// n/winMS windows.
type workload struct {
	n, sensors, winMS, tail int
	topic                   string // with %s for the sensor id
}

// newWorkload returns the workload of the exactly-once tests: 100
// sensors, 1 s windows, EDGED_E2E_READINGS readings (a multiple of 1000,
// default def).
func newWorkload(t *testing.T, def int) workload {
	t.Helper()
	n := envInt(t, "EDGED_E2E_READINGS", def) / 1000 * 1000
	if n < 20_000 {
		t.Fatalf("EDGED_E2E_READINGS must be at least 20000")
	}
	return workload{n: n, sensors: 100, winMS: 1000, tail: 3000, topic: "sensors/%s/temperature"}
}

func (w workload) sensor(i int) string { return fmt.Sprintf("s%03d", i%w.sensors) }
func (w workload) windows() int        { return w.n / w.winMS }
func (w workload) perSensor() int64    { return int64(w.winMS / w.sensors) }
func (w workload) all() int            { return w.n + w.tail }

func (w workload) windowStart(win int) int64 { return epochMS + int64(win)*int64(w.winMS) }

func (w workload) reading(i int) (topic string, payload []byte) {
	s := w.sensor(i)
	return fmt.Sprintf(w.topic, s), []byte(fmt.Sprintf(`{"sensor":%q,"t":%d.5,"ts":%d}`, s, 20+i%15, epochMS+int64(i)))
}

// loader publishes readings of a workload from its own goroutine over a
// fixed set of device connections, with at most window publishes not yet
// acknowledged. The test pauses it to kill a node between two publishes,
// so that no Publish call races the kill: every publish is either
// complete, or stored by paho and resent on reconnect (persistent
// sessions), or (clean sessions to a broker that does not die) simply
// waiting for its acknowledgement.
type loader struct {
	w       workload
	qos     byte
	window  int
	clients []paho.Client

	gate sync.Mutex // held around each Publish; the test holds it to pause the loader

	capMu     sync.Mutex    // guards capN and capRaised
	capN      int64         // the loader publishes readings below capN only
	capRaised chan struct{} // closed when capN changes

	mu      sync.Mutex // guards pending
	pending []pendingPub

	next  atomic.Int64 // index of the next reading to publish
	acked atomic.Int64 // publishes acknowledged
	done  chan struct{}
	err   error // why the loader stopped early; read after done
}

type pendingPub struct {
	i   int
	tok paho.Token
}

// startLoader publishes readings from..to-1 over clients (reading i on
// clients[i%len(clients)]) and returns at once.
func startLoader(w workload, clients []paho.Client, qos byte, from, to int) *loader {
	l := &loader{w: w, qos: qos, window: max(batch, 8*len(clients)), clients: clients, done: make(chan struct{}),
		capN: math.MaxInt64, capRaised: make(chan struct{})}
	l.next.Store(int64(from))
	go l.run(from, to)
	return l
}

func (l *loader) run(from, to int) {
	defer close(l.done)
	for i := from; i < to; i++ {
		topic, p := l.w.reading(i)
		l.waitCap(i)
		l.gate.Lock()
		tok := l.clients[i%len(l.clients)].Publish(topic, l.qos, false, p)
		l.mu.Lock()
		l.pending = append(l.pending, pendingPub{i, tok})
		n := len(l.pending)
		l.mu.Unlock()
		l.next.Store(int64(i + 1))
		l.gate.Unlock()
		for ; n >= l.window; n-- {
			if l.err = l.waitOldest(); l.err != nil {
				return
			}
		}
	}
	for {
		l.mu.Lock()
		n := len(l.pending)
		l.mu.Unlock()
		if n == 0 {
			return
		}
		if l.err = l.waitOldest(); l.err != nil {
			return
		}
	}
}

func (l *loader) waitOldest() error {
	l.mu.Lock()
	p := l.pending[0]
	l.mu.Unlock()
	if !p.tok.WaitTimeout(tokenTimeout) {
		return fmt.Errorf("reading %d: not acknowledged within %v", p.i, tokenTimeout)
	}
	if err := p.tok.Error(); err != nil && (l.qos == 0 || !connectionBroke(err)) {
		return fmt.Errorf("reading %d: %w", p.i, err)
	}
	// A QoS 1/2 publish whose write met a connection the node's kill
	// broke fails its token, but paho keeps it in its store and resends
	// it when the client connects again; the exact totals at the end tell
	// whether it arrived.
	l.mu.Lock()
	l.pending = l.pending[1:]
	l.mu.Unlock()
	l.acked.Add(1)
	return nil
}

// connectionBroke reports whether err is a write on a connection the
// other end closed or reset.
func connectionBroke(err error) bool {
	return errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, net.ErrClosed)
}

// setCap lets the loader publish readings below n only (math.MaxInt64: no
// cap); a lower cap holds the loader before its next publish. A kill test
// moves the cap with the node's event time (see killInFlight), so that on
// a loaded machine the load cannot run to its end before the node has
// caught up with the kill points.
func (l *loader) setCap(n int64) {
	l.capMu.Lock()
	defer l.capMu.Unlock()
	if n != l.capN {
		l.capN = n
		close(l.capRaised)
		l.capRaised = make(chan struct{})
	}
}

// liftCap lets the loader publish the rest of its readings.
func (l *loader) liftCap() { l.setCap(math.MaxInt64) }

// capAt returns the loader's cap (math.MaxInt64: none).
func (l *loader) capAt() int64 {
	l.capMu.Lock()
	defer l.capMu.Unlock()
	return l.capN
}

// waitCap blocks until reading i is below the cap or the loader's run is
// abandoned by the test's end (the cap is lifted then).
func (l *loader) waitCap(i int) {
	for {
		l.capMu.Lock()
		n, ch := l.capN, l.capRaised
		l.capMu.Unlock()
		if int64(i) < n {
			return
		}
		<-ch
	}
}

func (l *loader) pause()  { l.gate.Lock() }
func (l *loader) resume() { l.gate.Unlock() }

// unacked counts the publishes handed to paho whose acknowledgement has
// not arrived.
func (l *loader) unacked() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, p := range l.pending {
		select {
		case <-p.tok.Done():
		default:
			n++
		}
	}
	return n
}

// wait waits until every reading is published and acknowledged to the
// broker, which nd runs or reads from.
func (l *loader) wait(t *testing.T, nd *node, timeout time.Duration) {
	t.Helper()
	select {
	case <-l.done:
	case <-time.After(timeout):
		t.Fatalf("publishing did not end within %v (next reading %d, %d acknowledged)", timeout, l.next.Load(), l.acked.Load())
	}
	if l.err != nil {
		nd.failIfExits(t, 10*time.Second)
		t.Fatalf("publishing: %v", l.err)
	}
}

// stopped reports the loader's error if it has stopped early.
func (l *loader) stopped() error {
	select {
	case <-l.done:
		return l.err
	default:
		return nil
	}
}

// devices connects n device clients to url. persistent: fixed client ids
// and clean session false, so paho keeps unacknowledged QoS 1/2 publishes
// and resends them when the client connects again (a QoS 2 publish whose
// PUBREL was sent is resent as that PUBREL: see releaseAfterPubrel). The embedded broker
// appends a connection's publishes one after the other, each waiting for
// the ingest log's fsync, so the number of devices bounds its rate.
func devices(t *testing.T, url, prefix string, n int, persistent bool) []paho.Client {
	t.Helper()
	cs := make([]paho.Client, n)
	for i := range cs {
		opts := paho.NewClientOptions().AddBroker(url).SetClientID(fmt.Sprintf("%s-%d", prefix, i)).
			SetCleanSession(!persistent).SetAutoReconnect(false).SetWriteTimeout(tokenTimeout).
			SetConnectionLostHandler(func(paho.Client, error) {})
		if persistent {
			mqtttest.ReleaseAfterPubrel(opts)
		}
		cs[i] = connect(t, opts)
	}
	return cs
}

// reconnectTimeout bounds connecting a client again after a node's
// restart: on a loaded machine a hundred devices resuming their sessions
// at once wait seconds for their CONNACKs.
const reconnectTimeout = 60 * time.Second

// connectAgain connects c again once its old connection is gone (paho
// resumes its session: unacknowledged publishes are resent) and reports
// whether it connected within timeout and the broker's session-present
// flag. It waits for each attempt's outcome, however long it takes, and
// only then tries again: a second Connect while the first is still
// connecting fails at once, and would keep failing once the first has
// connected.
func connectAgain(c paho.Client, timeout time.Duration) (ok, present bool) {
	var tok paho.Token
	ok = testutil.Within(timeout, func() bool {
		if tok == nil {
			tok = c.Connect()
		}
		select {
		case <-tok.Done():
		default:
			return false
		}
		if tok.Error() != nil {
			tok = nil // the broker is not accepting yet: try again
			return false
		}
		present = tok.(*paho.ConnectToken).SessionPresent()
		return true
	})
	return ok, present
}

// reconnect connects c again (see connectAgain) and returns the broker's
// session-present flag.
func reconnect(t *testing.T, c paho.Client, what string) bool {
	t.Helper()
	ok, present := connectAgain(c, reconnectTimeout)
	if !ok {
		t.Fatalf("%s could not connect again within %v", what, reconnectTimeout)
	}
	return present
}

// reconnectAll connects every client of cs again, in parallel (see
// connectAgain), and returns how many found their session on the broker.
func reconnectAll(t *testing.T, cs []paho.Client, what string) int {
	t.Helper()
	var present, failed atomic.Int64
	var wg sync.WaitGroup
	for _, c := range cs {
		wg.Go(func() {
			ok, p := connectAgain(c, reconnectTimeout)
			switch {
			case !ok:
				failed.Add(1)
			case p:
				present.Add(1)
			}
		})
	}
	wg.Wait()
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d of %d %s could not connect again within %v", n, len(cs), what, reconnectTimeout)
	}
	return int(present.Load())
}

// burners are CPU burner processes (the test binary in burner mode) that
// compete with edged for the CPUs.
type burners struct {
	cmds  []*exec.Cmd
	done  []chan struct{}
	start time.Time
}

// startBurners starts EDGED_E2E_BURNERS burner processes (default one per
// CPU), stopped when the test ends. Each exits by itself when its stdin
// closes (the test process died) or after 15 minutes.
func startBurners(t *testing.T) *burners {
	t.Helper()
	n := envInt(t, "EDGED_E2E_BURNERS", runtime.NumCPU())
	b := &burners{start: time.Now()}
	var stdins []io.Closer
	for i := 0; i < n; i++ {
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), burnerEnv+"=1", "GOMAXPROCS=1")
		in, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatalf("start burner: %v", err)
		}
		done := make(chan struct{})
		go func() {
			cmd.Wait()
			close(done)
		}()
		b.cmds = append(b.cmds, cmd)
		b.done = append(b.done, done)
		stdins = append(stdins, in)
	}
	t.Cleanup(func() {
		for i, in := range stdins {
			in.Close()
			select {
			case <-b.done[i]:
			case <-time.After(5 * time.Second):
				b.cmds[i].Process.Kill()
				<-b.done[i]
			}
		}
	})
	t.Logf("%d CPU burner processes beside edged (EDGED_E2E_BURNERS)", n)
	return b
}

// check fails the test if a burner is no longer running: the contention
// the test claims must be there.
func (b *burners) check(t *testing.T) {
	t.Helper()
	for i, d := range b.done {
		select {
		case <-d:
			t.Fatalf("CPU burner %d exited early: %v", i, b.cmds[i].ProcessState)
		default:
		}
	}
}

// report logs the CPU time the burners used and fails the test if they
// used less than a twentieth of a CPU over its duration: then they were not
// competing with edged.
func (b *burners) report(t *testing.T) {
	t.Helper()
	if len(b.cmds) == 0 {
		t.Logf("no CPU burners (EDGED_E2E_BURNERS=0)")
		return
	}
	b.check(t)
	var cpu time.Duration
	for _, c := range b.cmds {
		d, err := procCPU(c.Process.Pid)
		if err != nil {
			t.Logf("burner CPU time unknown: %v", err)
			return
		}
		cpu += d
	}
	wall := time.Since(b.start)
	t.Logf("CPU burners used %v of CPU in %v", cpu.Round(time.Millisecond), wall.Round(time.Millisecond))
	if cpu < wall/20 {
		t.Errorf("CPU burners used only %v of CPU in %v: edged was not under contention", cpu, wall)
	}
}

// procCPU returns the user and system CPU time of process pid from
// /proc/<pid>/stat (in USER_HZ = 100 ticks per second).
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no ')'", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	// After the command: state is field 3, utime 14, stime 15.
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: utime %q stime %q", pid, f[11], f[12])
	}
	return time.Duration(ut+st) * 10 * time.Millisecond, nil
}

// runBurner is the test binary in burner mode: it keeps one CPU busy
// until its stdin closes or 15 minutes pass.
func runBurner() int {
	stop := make(chan struct{})
	go func() {
		io.Copy(io.Discard, os.Stdin)
		close(stop)
	}()
	deadline := time.After(15 * time.Minute)
	x := uint64(1)
	for {
		select {
		case <-stop:
			return 0
		case <-deadline:
			return 0
		default:
		}
		for j := 0; j < 1<<16; j++ {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
		}
		if x == 0 { // never: keeps the loop from being optimised away
			fmt.Println(x)
		}
	}
}

// taskInfo is one task of GET /jobs/{name}/operators.
type taskInfo struct {
	Chain       string   `json:"chain"`
	Operators   []string `json:"operators"`
	Subtask     int      `json:"subtask"`
	Parallelism int      `json:"parallelism"`
	RecordsIn   int64    `json:"records_in"`
	RecordsOut  int64    `json:"records_out"`
	Watermark   *int64   `json:"watermark_ms"` // nil before the task's first watermark
}

// tasks returns the tasks of job on the running node.
func (n *node) tasks(job string) ([]taskInfo, error) {
	client := &http.Client{Timeout: 2 * time.Second}
	resp, err := client.Get("http://" + n.apiAddr + "/jobs/" + job + "/operators")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /jobs/%s/operators: %s", job, resp.Status)
	}
	var l struct {
		Tasks []taskInfo `json:"tasks"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&l); err != nil {
		return nil, err
	}
	return l.Tasks, nil
}

// sourceOut returns the records the job's source task has sent on in the
// node's current run.
func (n *node) sourceOut(job string) (int64, bool) {
	ts, err := n.tasks(job)
	if err != nil {
		return 0, false
	}
	for _, ti := range ts {
		if slices.Contains(ti.Operators, job+"/source") {
			return ti.RecordsOut, true
		}
	}
	return 0, false
}

// jobProgress is how far a job has read, from GET /jobs/{name}/operators.
type jobProgress struct {
	sourceOut int64 // records the source task sent on in the node's current run
	eventTime int64 // the window operator's watermark (least over its subtasks), ms
}

// progress returns how far the job on the running node has read; false
// while the node does not answer or has not listed the job's source and
// a watermark for every subtask of its window operator (as after a
// restart, until the restored job runs and its event time moves). The
// watermark is the one measure of the node's reading that holds across
// restarts: a restored job resumes at its checkpoint's watermark, while
// its records counters start again from 0.
func (n *node) progress(job string) (jobProgress, bool) {
	ts, err := n.tasks(job)
	if err != nil {
		return jobProgress{}, false
	}
	p := jobProgress{eventTime: math.MaxInt64}
	var source, window bool
	for _, ti := range ts {
		if slices.Contains(ti.Operators, job+"/source") {
			p.sourceOut += ti.RecordsOut
			source = true
		}
		if slices.Contains(ti.Operators, job+"/window") {
			if ti.Watermark == nil {
				return jobProgress{}, false
			}
			p.eventTime = min(p.eventTime, *ti.Watermark)
			window = true
		}
	}
	return p, source && window
}

// checkParallelism fails the test unless GET /jobs/{job}/operators shows
// the task holding operator op (e.g. "<job>/window") as want subtasks
// 0..want-1, each reporting parallelism want.
func (n *node) checkParallelism(t *testing.T, job, op string, want int) {
	t.Helper()
	var ts []taskInfo
	var err error
	// The job's tasks are listed once its runner has built them.
	testutil.Eventually(t, 30*time.Second, "the tasks of "+op+" in GET /jobs/"+job+"/operators", func() bool {
		ts, err = n.tasks(job)
		return err == nil && slices.ContainsFunc(ts, func(ti taskInfo) bool { return slices.Contains(ti.Operators, op) })
	})
	var subtasks []int
	for _, ti := range ts {
		if !slices.Contains(ti.Operators, op) {
			continue
		}
		if ti.Parallelism != want {
			t.Fatalf("task %q subtask %d reports parallelism %d, want %d", ti.Chain, ti.Subtask, ti.Parallelism, want)
		}
		subtasks = append(subtasks, ti.Subtask)
	}
	slices.Sort(subtasks)
	if len(subtasks) != want || subtasks[want-1] != want-1 {
		t.Fatalf("operator %s runs as subtasks %v, want 0..%d", op, subtasks, want-1)
	}
	t.Logf("GET /jobs/%s/operators: %s runs in %d subtasks", job, op, want)
}

// failIfExited fails the test if the node has exited by itself.
func (n *node) failIfExited(t *testing.T) { n.failIfExits(t, 0) }

// failIfExits fails the test if the node exits by itself within d: when
// something it serves broke, it may be on its way out.
func (n *node) failIfExits(t *testing.T, d time.Duration) {
	t.Helper()
	exited := false
	if d <= 0 {
		select {
		case <-n.done:
			exited = true
		default:
		}
	} else {
		select {
		case <-n.done:
			exited = true
		case <-time.After(d):
		}
	}
	if exited {
		t.Fatalf("edged exited by itself (%v); the errors of its current run:\n%s", n.waitErr, n.runErrors())
	}
}

// runErrors returns the WARN and ERROR lines of the node's current run,
// at most 30.
func (n *node) runErrors() string {
	var out []string
	for _, line := range strings.Split(n.runLog(), "\n") {
		if strings.Contains(line, "level=ERROR") || (strings.Contains(line, "level=WARN") && !strings.Contains(line, "component=mochi")) {
			out = append(out, line)
		}
	}
	if len(out) > 30 {
		out = append(out[:30], fmt.Sprintf("... %d more", len(out)-30))
	}
	return strings.Join(out, "\n")
}

// runLog returns the node's log since its latest start.
func (n *node) runLog() string {
	b, _ := os.ReadFile(n.logPath)
	s := string(b)
	if i := strings.LastIndex(s, "===== edged run"); i >= 0 {
		s = s[i:]
	}
	return s
}

// checkRestoredFrom fails the test unless the node's current run logged
// that its job started from the snapshot at path.
func (n *node) checkRestoredFrom(t *testing.T, path string) {
	t.Helper()
	for _, line := range strings.Split(n.runLog(), "\n") {
		if strings.Contains(line, "restored_from="+path) || strings.Contains(line, `restored_from="`+path+`"`) {
			t.Logf("edged: %s", line)
			return
		}
	}
	t.Fatalf("the node did not log restored_from=%s in its current run:\n%s", path, n.runLog())
}

// cleanupNode kills n at the end of the test if it still runs, and logs
// the tail of its log if the test failed.
func cleanupNode(t *testing.T, n *node) {
	t.Cleanup(func() {
		if n.cmd != nil && n.done != nil {
			select {
			case <-n.done:
			default:
				_ = n.cmd.Process.Kill()
				<-n.done
			}
		}
		if !t.Failed() {
			return
		}
		t.Logf("edged log tail:\n%s", n.logTailN(12000))
		if d := os.Getenv("EDGED_E2E_KEEP_LOGS"); d != "" {
			// Named by the test and the time of its end: with -count the
			// failed runs keep a log each.
			dst := filepath.Join(d, fmt.Sprintf("%s-%s.edged.log", strings.ReplaceAll(t.Name(), "/", "_"), time.Now().UTC().Format("20060102T150405.000")))
			if b, err := os.ReadFile(n.logPath); err == nil && os.MkdirAll(d, 0o755) == nil && os.WriteFile(dst, b, 0o644) == nil {
				t.Logf("edged log kept in %s", dst)
			}
		}
	})
}

// cliStop runs `edged stop <job> --addr <node's api>` and returns the
// savepoint path it printed, after checking that it is a directory.
func cliStop(t *testing.T, nd *node, job string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	stop := exec.CommandContext(ctx, edgedBin, "stop", job, "--addr", nd.apiAddr)
	stop.Stdout, stop.Stderr = &stdout, &stderr
	start := time.Now()
	if err := stop.Run(); err != nil {
		nd.failIfExits(t, 10*time.Second)
		t.Fatalf("edged stop %s: %v (context: %v)\nstdout: %s\nstderr: %s", job, err, ctx.Err(), stdout.String(), stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	p := strings.TrimSpace(lines[len(lines)-1])
	if p == "" {
		t.Fatalf("edged stop printed no savepoint path (stderr %q)", stderr.String())
	}
	if fi, err := os.Stat(p); err != nil || !fi.IsDir() {
		t.Fatalf("savepoint path %q printed by edged stop: stat %v", p, err)
	}
	t.Logf("edged stop %s exited 0 after %v: savepoint %s", job, time.Since(start).Round(time.Millisecond), p)
	return p
}

// waitExit waits for the node to exit by itself and returns its exit
// code.
func (n *node) waitExit(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-n.done:
	case <-time.After(timeout):
		t.Fatalf("node did not exit within %v", timeout)
	}
	n.logFile.Close()
	return n.cmd.ProcessState.ExitCode()
}

// drain publishes a marker to topic (which col's subscription matches)
// through the broker at url and waits until col has received it: the
// broker queues a subscriber's messages in order, so everything it had
// queued for col before the marker has then been delivered. It replaces
// waiting for a while for late duplicates.
func drain(t *testing.T, url, topic string, col *collector) {
	t.Helper()
	marker := strconv.FormatInt(time.Now().UnixNano(), 10)
	c := connect(t, paho.NewClientOptions().AddBroker(url).SetClientID("e2e-drain-"+marker).SetAutoReconnect(false))
	defer c.Disconnect(100)
	if tok := c.Publish(topic, 1, false, marker); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("publish marker: %v", tok.Error())
	}
	testutil.Eventually(t, 30*time.Second, "the marker behind the results", func() bool {
		col.mu.Lock()
		defer col.mu.Unlock()
		return col.markers[marker]
	})
}

// waitResults waits until col holds a result for every (sensor, window)
// of w, and logs when they had all arrived; checkExact reports those that
// did not.
func waitResults(t *testing.T, col *collector, w workload, timeout time.Duration) {
	t.Helper()
	start := time.Now()
	missing := 0
	if testutil.Within(timeout, func() bool {
		col.mu.Lock()
		defer col.mu.Unlock()
		missing = 0
		for win := 0; win < w.windows(); win++ {
			for s := 0; s < w.sensors; s++ {
				if len(col.byKey[winKey{w.sensor(s), w.windowStart(win)}]) == 0 {
					missing++
				}
			}
		}
		return missing == 0
	}) {
		t.Logf("every window's result had arrived %v after the last reading was acknowledged", time.Since(start).Round(time.Millisecond))
		return
	}
	t.Errorf("%v after the last reading was acknowledged, %d of %d window results still missing", timeout, missing, w.windows()*w.sensors)
}

// checkExact checks the results col received for w as a consumer that
// drops repeated msg_ids sees them: every (sensor, window) present under
// exactly one msg_id, with exactly the readings published for it (none
// lost, none counted twice), so every sensor's total is exact.
func checkExact(t *testing.T, col *collector, w workload) {
	t.Helper()
	col.mu.Lock()
	defer col.mu.Unlock()
	var errs []string
	for _, b := range col.bad {
		errs = append(errs, "bad result: "+b)
	}
	want := w.perSensor()
	totals := map[string]int64{}
	var missing, multiID, over, under, redelivered, results int
	for win := 0; win < w.windows(); win++ {
		for s := 0; s < w.sensors; s++ {
			k := winKey{w.sensor(s), w.windowStart(win)}
			rs := col.byKey[k]
			results += len(rs)
			if len(rs) == 0 {
				missing++
				errs = append(errs, fmt.Sprintf("%s window %d: no result", k.sensor, win))
				continue
			}
			ids := map[string]int64{}
			for _, r := range rs {
				ids[r.MsgID] = r.Count
			}
			redelivered += len(rs) - len(ids)
			if len(ids) > 1 {
				multiID++
				errs = append(errs, fmt.Sprintf("%s window %d: %d msg_ids %v (a consumer dropping repeated ids counts it %d times)", k.sensor, win, len(ids), ids, len(ids)))
			}
			for id, c := range ids {
				totals[k.sensor] += c
				switch {
				case c > want:
					over++
					errs = append(errs, fmt.Sprintf("%s window %d: count %d, want %d: readings counted twice (msg_id %s)", k.sensor, win, c, want, id))
				case c < want:
					under++
					errs = append(errs, fmt.Sprintf("%s window %d: count %d, want %d: readings lost (msg_id %s)", k.sensor, win, c, want, id))
				}
			}
		}
	}
	var wrongTotals int
	for s := 0; s < w.sensors; s++ {
		id := w.sensor(s)
		if totals[id] != int64(w.n/w.sensors) {
			wrongTotals++
			errs = append(errs, fmt.Sprintf("sensor %s: total %d, want %d", id, totals[id], w.n/w.sensors))
		}
	}
	t.Logf("results: %d received for %d (sensor, window) pairs, %d of them repeats of a msg_id already received", results, w.windows()*w.sensors, redelivered)
	if len(errs) == 0 {
		t.Logf("every sensor's total is exactly %d over windows 0..%d, one msg_id per window", w.n/w.sensors, w.windows()-1)
		return
	}
	slices.Sort(errs)
	for i, e := range errs {
		if i == 30 {
			t.Errorf("... %d more", len(errs)-30)
			break
		}
		t.Error(e)
	}
	t.Errorf("%d windows missing, %d under several msg_ids, %d counted over, %d under; %d of %d sensors with a wrong total; %d unparsable results",
		missing, multiID, over, under, wrongTotals, w.sensors, len(col.bad))
}

// maxOutOfOrderMS is the bounded out-of-orderness of the exactly-once
// tests' event time: their watermark trails the newest reading read by
// maxOutOfOrderMS+1 readings (one reading per ms).
const maxOutOfOrderMS = 1000

// exactConfig is what writeExactConfig puts in a node config.
type exactConfig struct {
	job         string
	api         string
	broker      string // embedded broker address; "" when external is set
	external    string // tcp:// URL of an external broker to read from
	clientID    string // the external subscription's client id
	qos         int    // the source's QoS
	parallelism int
	interval    string // the checkpoint interval; "" is 200ms
}

// writeExactConfig writes dir/edged.yaml: the pipeline job reads the
// workload's topics, counts each sensor's readings in 1 s event-time
// windows and publishes them to agg/<sensor> through the write-ahead MQTT
// sink, with exactly-once checkpoints every 200 ms (or c.interval) under
// dir/data.
func writeExactConfig(t *testing.T, dir string, c exactConfig) string {
	t.Helper()
	if c.interval == "" {
		c.interval = "200ms"
	}
	data := filepath.Join(dir, "data")
	var node, src string
	if c.external != "" {
		node = fmt.Sprintf("  data_dir: %s\n  listen: %s\n", data, c.api)
		src = fmt.Sprintf("        broker: %s\n        client_id: %s\n", c.external, c.clientID)
	} else {
		node = fmt.Sprintf("  data_dir: %s\n  broker: %s\n  listen: %s\n", data, c.broker, c.api)
	}
	cfg := fmt.Sprintf(`node:
%[1]spipelines:
  - name: %[2]s
    parallelism: %[3]d
    source:
      mqtt:
%[4]s        topics: [sensors/+/temperature]
        qos: %[5]d
        format: json
        fields:
          id: {type: string, path: $.sensor}
          temp: {type: float, path: $.t}
          ts: {type: time, path: $.ts, unit: ms}
    event_time: {field: ts, max_out_of_orderness: %[7]dms}
    key: id
    window:
      type: tumbling
      size: 1s
      aggregates: [{name: count, fn: count}]
    sinks:
      - mqtt: {topic: "agg/{id}", qos: 1}
    checkpoint: {dir: %[6]s/checkpoints, interval: %[8]s, mode: exactly_once}
    restart: {strategy: fixed_delay, attempts: 3, delay: 100ms}
`, node, c.job, c.parallelism, src, c.qos, data, maxOutOfOrderMS, c.interval)
	p := filepath.Join(dir, "edged.yaml")
	if err := os.WriteFile(p, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// inFlight is what the test saw just before a kill.
type inFlight struct {
	reading   int   // next reading the loader was to publish
	unacked   int   // publishes without acknowledgement
	nodeAt    int   // the reading whose event time is the job's watermark
	sourceOut int64 // records the source had sent on in this run
	results   int   // results received in this run
}

// lockStepLead is how many readings past the job's event time (its
// watermark) l may publish. Once the node has read every reading below
// the loader's cap c, each subtask's newest timestamp is at least that of
// reading c-1 less what the source's last batch (512 records at most)
// gave only to the other subtask, so the watermark is at least reading
// c-1-512-maxOutOfOrderMS-1: a lead of maxOutOfOrderMS+2+4*l.window (at
// least 1600 more) always raises the cap again, and the loader cannot
// wait for a node that has nothing left to read.
func lockStepLead(l *loader) int64 {
	return maxOutOfOrderMS + 2 + 4*int64(l.window)
}

// killStall bounds how long killInFlight waits while neither the node's
// event time nor the loader moves: a node restoring its job on a loaded
// machine reads nothing for a while (up to 20 s seen under a load of 25
// on 2 CPUs).
const killStall = 2 * time.Minute

// killInFlight holds the loader in lock step with the node — it may
// publish only readings less than lockStepLead past the job's event time,
// so on a loaded machine the load cannot run ahead of the node to its end
// — and waits until the loader has passed reading k, the node is reading
// (its event time advanced between two looks), results arrived in this
// run and publishes are unacknowledged; then it pauses the loader and
// SIGKILLs the node. The loader stays paused and capped: the caller
// resumes it, the next call moves the cap on in lock step, and the test
// lifts it (liftCap) after its last kill. It fails the test if neither
// the node's event time nor the loader moves for killStall.
func killInFlight(t *testing.T, nd *node, job string, l *loader, col *collector, run, k int) inFlight {
	t.Helper()
	lead := lockStepLead(l)
	if l.capAt() == math.MaxInt64 {
		// No event time yet (a new node): as if the node were at reading 0.
		l.setCap(l.next.Load() + lead)
	}
	killed := false
	defer func() {
		if !killed {
			// The test is failing: let the loader end.
			l.liftCap()
		}
	}()
	var (
		seen     inFlight
		p        jobProgress
		lastET   = int64(math.MinInt64)
		lastNext = l.next.Load()
		moved    = time.Now()
		attempts int // kills given up because nothing was in flight
	)
	look := func() inFlight {
		return inFlight{reading: int(l.next.Load()), unacked: l.unacked(), nodeAt: int(p.eventTime - epochMS),
			sourceOut: p.sourceOut, results: col.received(run)}
	}
	ok := testutil.Within(10*time.Minute, func() bool {
		nd.failIfExited(t)
		if err := l.stopped(); err != nil {
			t.Fatalf("publishing stopped: %v", err)
		}
		var read, advanced bool
		p, read = nd.progress(job)
		if read {
			l.setCap(p.eventTime - epochMS + lead)
			advanced = lastET != math.MinInt64 && p.eventTime > lastET
			lastET = p.eventTime
		}
		if next := l.next.Load(); advanced || next != lastNext {
			lastNext, moved = next, time.Now()
		}
		if time.Since(moved) > killStall {
			t.Fatalf("kill point %d not reached: neither the node's event time nor the loader moved for %v (next reading %d, loader cap %d, %d acknowledged, %d unacknowledged; event time at reading %d (known: %v), source sent on %d records and %d results arrived in this run; %d kills given up with nothing in flight)",
				k, killStall, l.next.Load(), l.capAt(), l.acked.Load(), l.unacked(), lastET-epochMS, lastET != math.MinInt64, p.sourceOut, col.received(run), attempts)
		}
		if !advanced || l.next.Load() <= int64(k) || col.received(run) == 0 {
			return false
		}
		l.pause()
		if seen = look(); seen.unacked > 0 {
			return true
		}
		// Nothing in flight (the loader waited for the node, or the
		// broker had just acknowledged all): let a loader window go past
		// the cap and pause again as soon as some of it is in flight.
		// The next look puts the cap back in lock step.
		attempts++
		l.setCap(l.next.Load() + int64(l.window))
		l.resume()
		if !testutil.Within(2*time.Second, func() bool { return l.unacked() > 0 }) {
			return false
		}
		l.pause()
		if seen = look(); seen.unacked > 0 {
			return true
		}
		l.resume()
		return false
	})
	if !ok {
		t.Fatalf("kill point %d not reached within 10m: next reading %d, %d acknowledged, %d unacknowledged, event time at reading %d, source sent on %d records and %d results arrived in this run",
			k, l.next.Load(), l.acked.Load(), l.unacked(), lastET-epochMS, p.sourceOut, col.received(run))
	}
	nd.kill()
	killed = true
	return seen
}

// A QoS 2 device with a persistent session whose connection drops after
// it sent the PUBREL (no PUBCOMP) must resend the PUBREL when it connects
// again, never the PUBLISH: the broker released the packet id at the
// PUBREL and would take the PUBLISH for a new message. A scripted broker
// on a raw socket drops the connection at that point.
func TestDeviceResendsPubrelNotPublish(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type result struct {
		pk  packets.ControlPacket
		err error
	}
	resent := make(chan result, 1)
	go func() {
		fail := func(err error) { resent <- result{err: err} }
		expect := func(conn net.Conn, want byte) (packets.ControlPacket, error) {
			pk, err := packets.ReadPacket(conn)
			if err == nil && packetType(pk) != want {
				err = fmt.Errorf("got %s, want packet type %d", pk, want)
			}
			return pk, err
		}
		accept := func(present bool) (net.Conn, error) {
			conn, err := ln.Accept()
			if err != nil {
				return nil, err
			}
			if _, err := expect(conn, packets.Connect); err != nil {
				return nil, err
			}
			ack := packets.NewControlPacket(packets.Connack).(*packets.ConnackPacket)
			ack.SessionPresent = present
			return conn, ack.Write(conn)
		}
		conn, err := accept(false)
		if err != nil {
			fail(err)
			return
		}
		pk, err := expect(conn, packets.Publish)
		if err != nil {
			fail(err)
			return
		}
		rec := packets.NewControlPacket(packets.Pubrec).(*packets.PubrecPacket)
		rec.MessageID = pk.Details().MessageID
		if err := rec.Write(conn); err != nil {
			fail(err)
			return
		}
		if _, err := expect(conn, packets.Pubrel); err != nil {
			fail(err)
			return
		}
		conn.Close() // the broker dies before its PUBCOMP
		conn, err = accept(true)
		if err != nil {
			fail(err)
			return
		}
		defer conn.Close()
		pk, err = packets.ReadPacket(conn)
		resent <- result{pk: pk, err: err}
		if err == nil && packetType(pk) == packets.Pubrel {
			comp := packets.NewControlPacket(packets.Pubcomp).(*packets.PubcompPacket)
			comp.MessageID = pk.Details().MessageID
			comp.Write(conn)
			packets.ReadPacket(conn) // until the client disconnects
		}
	}()

	opts := paho.NewClientOptions().AddBroker("tcp://" + ln.Addr().String()).SetClientID("qos2-pubrel").
		SetCleanSession(false).SetAutoReconnect(false).SetKeepAlive(time.Hour).
		SetConnectionLostHandler(func(paho.Client, error) {})
	mqtttest.ReleaseAfterPubrel(opts)
	c := connect(t, opts)
	defer c.Disconnect(100)
	tok := c.Publish("sensors/s000", 2, false, "reading")
	testutil.Eventually(t, 10*time.Second, "the connection to drop after the PUBREL", func() bool { return !c.IsConnectionOpen() })
	if !reconnect(t, c, "the device") {
		t.Fatal("the scripted broker's session-present flag was lost")
	}
	var r result
	select {
	case r = <-resent:
	case <-time.After(10 * time.Second):
		t.Fatal("the device sent nothing after connecting again")
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	if packetType(r.pk) != packets.Pubrel {
		t.Fatalf("after the reconnect the device sent %s, want the PUBREL (the broker released the packet id at the first PUBREL)", r.pk)
	}
	if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("publish not completed by the PUBCOMP: %v", tok.Error())
	}
}

// packetType returns pk's MQTT control packet type.
func packetType(pk packets.ControlPacket) byte {
	switch pk.(type) {
	case *packets.ConnectPacket:
		return packets.Connect
	case *packets.PublishPacket:
		return packets.Publish
	case *packets.PubrelPacket:
		return packets.Pubrel
	default:
		return 0
	}
}
