package stream_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/cluster"
	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/stream"
)

// rebalWorkerEnv, when set (to the node's id), makes
// TestRebalanceWorkerProcess run as a worker process of
// BenchmarkRebalancePauseProcesses.
const rebalWorkerEnv = "EDGED_BENCH_REBAL_WORKER"

// procMeter samples, every millisecond, the records-in counter of each
// subtask of the keyed operator that this process runs and the records
// its subtasks folded in. While armed it keeps the times each counter
// changed; it keeps the folded totals of the last 30 s always.
type procMeter struct {
	metrics func() []actors.TaskMetrics
	total   *atomic.Int64

	mu      sync.Mutex // guards the fields below
	on      bool
	val     [rebalP]int64
	last    [rebalP]int64 // unix ns of each counter's latest change
	changes [rebalP][]int64
	samples [][2]int64 // unix ns, total
}

// meterReport is what a procMeter saw while armed.
type meterReport struct {
	Changes [rebalP][]int64 `json:"changes"`
	Samples [][2]int64      `json:"samples"`
}

func (m *procMeter) run(stop <-chan struct{}) {
	tk := time.NewTicker(time.Millisecond)
	defer tk.Stop()
	for {
		select {
		case <-stop:
			return
		case now := <-tk.C:
			ms := m.metrics()
			n, t := m.total.Load(), now.UnixNano()
			m.mu.Lock()
			m.samples = append(m.samples, [2]int64{t, n})
			if len(m.samples) > 60_000 {
				m.samples = slices.Clone(m.samples[30_000:])
			}
			for sub := range rebalP {
				if v, ok := subtaskRecordsIn(ms, rebalUID, sub); ok && v != m.val[sub] {
					m.val[sub], m.last[sub] = v, t
					if m.on {
						m.changes[sub] = append(m.changes[sub], t)
					}
				}
			}
			m.mu.Unlock()
		}
	}
}

func (m *procMeter) arm() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.on, m.changes = true, [rebalP][]int64{}
}

// latest returns the time of each counter's latest change.
func (m *procMeter) latest() [rebalP]int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.last
}

// disarm ends the armed window and returns what it saw, with the totals
// from since on.
func (m *procMeter) disarm(since int64) meterReport {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.on = false
	r := meterReport{Changes: m.changes}
	for _, s := range m.samples {
		if s[0] >= since {
			r.Samples = append(r.Samples, s)
		}
	}
	return r
}

// workerTasks returns the task metrics of every job w hosts.
func workerTasks(w *actors.Worker) []actors.TaskMetrics {
	var out []actors.TaskMetrics
	for _, j := range w.Jobs() {
		out = append(out, j.Tasks...)
	}
	return out
}

// httpFiles moves a worker process's state files to and from the job
// master's process over HTTP, as the daemon does over its REST API.
type httpFiles struct {
	master atomic.Pointer[string] // the master's HTTP address
}

func (f *httpFiles) url(path string, q url.Values) string {
	m := f.master.Load()
	if m == nil {
		return ""
	}
	return "http://" + *m + path + "?" + q.Encode()
}

func (f *httpFiles) Push(ctx context.Context, _, _ string, epoch uint64, id snapshot.ID, path string, h snapshot.Handle) error {
	file, err := os.Open(path)
	if err != nil {
		return err
	}
	defer file.Close()
	q := url.Values{"epoch": {strconv.FormatUint(epoch, 10)}, "id": {strconv.FormatUint(uint64(id), 10)}, "name": {h.File},
		"size": {strconv.FormatInt(h.Size, 10)}, "sum": {strconv.FormatUint(uint64(h.Checksum), 10)}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, f.url("/files", q), io.LimitReader(file, h.Size))
	if err != nil {
		return err
	}
	req.ContentLength = h.Size
	return doHTTP(req, nil)
}

func (f *httpFiles) Fetch(ctx context.Context, _, _ string, epoch uint64, _ snapshot.ID, h snapshot.Handle, path string) error {
	q := url.Values{"epoch": {strconv.FormatUint(epoch, 10)}, "name": {h.File}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, f.url("/restore", q), nil)
	if err != nil {
		return err
	}
	return doHTTP(req, func(body io.Reader) error { return snapshot.CopyFile(body, h, path) })
}

// doHTTP sends req and hands a 200 answer's body to read (when set).
func doHTTP(req *http.Request, read func(io.Reader) error) error {
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("%s %s: %s: %s", req.Method, req.URL.Path, resp.Status, strings.TrimSpace(string(msg)))
	}
	if read != nil {
		return read(resp.Body)
	}
	_, err = io.Copy(io.Discard, resp.Body)
	return err
}

// TestRebalanceWorkerProcess is a worker process of
// BenchmarkRebalancePauseProcesses, which runs the test binary again with
// rebalWorkerEnv set to the node's id: the node over protoactor remote on
// loopback, hosting the tasks the job master in the benchmark's process
// places or hands over to it, with its state files in a directory of its
// own, pushed to and fetched from the master over HTTP. It prints its
// transport and HTTP addresses and serves /peer (a node's transport
// address), /master (the master's HTTP address), /deploy (a
// Worker.Deploy), /arm, /latest and /report (its procMeter), /total (the
// records it folded in), /cpu and /steps (its handover steps' durations,
// as it logs them); it stops when its standard input closes.
func TestRebalanceWorkerProcess(t *testing.T) {
	id := os.Getenv(rebalWorkerEnv)
	if id == "" {
		t.Skip("a worker process of BenchmarkRebalancePauseProcesses")
	}
	nw := cluster.NewNetwork(id, testChannelConfig(), nil)
	tr := cluster.NewRemoteTransport(cluster.DefaultRemoteConfig(), nw.Endpoint())
	if err := tr.Start(); err != nil {
		t.Fatal(err)
	}
	defer tr.Stop(context.Background(), false)
	nw.Attach(tr)
	nw.SetPeer(id, tr.Addr())
	nw.Start(20 * time.Millisecond)
	defer nw.Stop()
	var total atomic.Int64
	files := &httpFiles{}
	steps := newStepLog()
	w := actors.NewWorker(actors.WorkerConfig{Node: id, Network: nw, Dir: t.TempDir(), Files: files, Logger: slog.New(steps),
		Jobs: func(string) (*actors.Job, actors.Config, error) {
			env := rebalJob(&total, stream.WithLogger(slog.New(steps)))
			j, err := env.Graph()
			return j, env.Config(), err
		}})
	defer w.Close()
	m := &procMeter{metrics: func() []actors.TaskMetrics { return workerTasks(w) }, total: &total}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { defer close(done); m.run(stop) }()
	defer func() { close(stop); <-done }()

	reply := func(rw http.ResponseWriter, v any) { _ = json.NewEncoder(rw).Encode(v) }
	mux := http.NewServeMux()
	mux.HandleFunc("POST /peer", func(rw http.ResponseWriter, r *http.Request) {
		nw.SetPeer(r.FormValue("id"), r.FormValue("addr"))
	})
	mux.HandleFunc("POST /master", func(rw http.ResponseWriter, r *http.Request) {
		a := r.FormValue("http")
		files.master.Store(&a)
	})
	mux.HandleFunc("POST /deploy", func(rw http.ResponseWriter, r *http.Request) {
		var d actors.Deployment
		if err := json.NewDecoder(r.Body).Decode(&d); err != nil {
			http.Error(rw, err.Error(), http.StatusBadRequest)
			return
		}
		if err := w.Deploy(r.Context(), d); err != nil {
			slog.New(steps).Error("deployment refused", "job", d.Job, "epoch", d.Epoch, "err", err)
			http.Error(rw, err.Error(), http.StatusInternalServerError)
		}
	})
	mux.HandleFunc("POST /arm", func(rw http.ResponseWriter, r *http.Request) { m.arm() })
	mux.HandleFunc("GET /latest", func(rw http.ResponseWriter, r *http.Request) { reply(rw, m.latest()) })
	mux.HandleFunc("GET /report", func(rw http.ResponseWriter, r *http.Request) {
		since, _ := strconv.ParseInt(r.FormValue("since"), 10, 64)
		reply(rw, m.disarm(since))
	})
	mux.HandleFunc("GET /total", func(rw http.ResponseWriter, r *http.Request) { reply(rw, total.Load()) })
	mux.HandleFunc("GET /cpu", func(rw http.ResponseWriter, r *http.Request) { reply(rw, processCPU()) })
	mux.HandleFunc("GET /steps", func(rw http.ResponseWriter, r *http.Request) { reply(rw, steps.take()) })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	fmt.Printf("rebalworker %s %s\n", tr.Addr(), ln.Addr())
	_, _ = io.Copy(io.Discard, os.Stdin)
}

// rebalWorker is a running worker process.
type rebalWorker struct {
	id, addr, http string
}

func (p *rebalWorker) call(ctx context.Context, method, path string, body io.Reader, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, "http://"+p.http+path, body)
	if err != nil {
		return err
	}
	return doHTTP(req, func(r io.Reader) error {
		if out == nil {
			_, err := io.Copy(io.Discard, r)
			return err
		}
		return json.NewDecoder(r).Decode(out)
	})
}

func (p *rebalWorker) must(b *testing.B, method, path string, out any) {
	b.Helper()
	if err := p.call(context.Background(), method, path, nil, out); err != nil {
		b.Fatal(err)
	}
}

// startRebalWorker runs the test binary again as node id's
// TestRebalanceWorkerProcess and waits for its addresses; the process
// stops when the benchmark ends.
func startRebalWorker(b *testing.B, id string) *rebalWorker {
	p := rebalWorker{id: id}
	startTestProcess(b, "TestRebalanceWorkerProcess", rebalWorkerEnv+"="+id, "worker process "+id, "rebalworker %s %s", &p.addr, &p.http)
	return &p
}

// benchLog, when EDGED_BENCH_LOG is set, also writes what the job and its
// workers log at info and above to stderr.
var benchLog = func() slog.Handler {
	if os.Getenv("EDGED_BENCH_LOG") == "" {
		return nil
	}
	return slog.NewTextHandler(os.Stderr, nil)
}()

// stepLog keeps the durations the job master logs for the steps of its
// handovers (the "took", "prepare" and "repoint" of its "handover: ..."
// lines), by step, until taken; and, as "fetched-bytes", the bytes a
// new node logs it fetched. A slog.Handler; the handlers derived
// from it share its steps.
type stepLog struct {
	mu    *sync.Mutex // guards steps
	steps map[string]time.Duration
}

func newStepLog() *stepLog {
	return &stepLog{mu: &sync.Mutex{}, steps: map[string]time.Duration{}}
}

func (l *stepLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *stepLog) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *stepLog) WithGroup(string) slog.Handler            { return l }

func (l *stepLog) Handle(ctx context.Context, r slog.Record) error {
	if benchLog != nil && r.Level >= slog.LevelInfo {
		_ = benchLog.Handle(ctx, r)
	}
	step, ok := map[string]string{
		"handover: savepoint triggered":               "prepare",
		"handover: subtask retired":                   "retire",
		"handover: channels from the new node opened": "open",
		"handover: subtask restored":                  "restore",
		"handover: subtask moved":                     "repoint",
		"handover: state files fetched":               "fetch",
	}[r.Message]
	if !ok {
		return nil
	}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "bytes" && step == "fetch" {
			// Not a duration: the bytes fetched, kept as such.
			l.mu.Lock()
			l.steps["fetched-bytes"] = time.Duration(a.Value.Int64())
			l.mu.Unlock()
		}
		if a.Key == "took" || a.Key == "prepare" || a.Key == "repoint" {
			if d, ok := a.Value.Any().(time.Duration); ok {
				l.mu.Lock()
				l.steps[step] = d
				l.mu.Unlock()
			}
		}
		return true
	})
	return nil
}

// take returns the steps logged since the last take.
func (l *stepLog) take() map[string]time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.steps
	l.steps = map[string]time.Duration{}
	return out
}

// multiRun is the job of BenchmarkRebalancePauseProcesses and what
// measures it: the master's meter and the worker processes'.
type multiRun struct {
	local   *procMeter
	workers map[string]*rebalWorker
}

// multiWindow is what one measured action did to the job, over every
// process.
type multiWindow struct {
	gaps   [rebalP]time.Duration
	steady float64 // records/s in the second before the action
	worst  float64 // records/s in the worst second from the action to its end
}

// measure arms every process's meter around f, waits until every
// subtask processes again and one more second has passed, and returns
// each subtask's longest gap (its counter standing still, wherever it
// ran) and the job's rates.
func (mr *multiRun) measure(b *testing.B, f func()) multiWindow {
	b.Helper()
	mr.local.arm()
	for _, w := range mr.workers {
		w.must(b, http.MethodPost, "/arm", nil)
	}
	start := time.Now()
	f()
	end := time.Now()
	testutil.Eventually(b, time.Minute, "every subtask processes records again", func() bool {
		var last [rebalP]int64
		all := [][rebalP]int64{mr.local.latest()}
		for _, w := range mr.workers {
			var l [rebalP]int64
			w.must(b, http.MethodGet, "/latest", &l)
			all = append(all, l)
		}
		for _, l := range all {
			for sub := range rebalP {
				last[sub] = max(last[sub], l[sub])
			}
		}
		for sub := range rebalP {
			if last[sub] <= end.UnixNano() {
				return false
			}
		}
		return true
	})
	time.Sleep(time.Second) // the recovery, in the worst-second windows
	stop := time.Now()
	since := start.Add(-2 * time.Second).UnixNano()
	reports := []meterReport{mr.local.disarm(since)}
	for _, w := range mr.workers {
		var r meterReport
		w.must(b, http.MethodGet, "/report?since="+strconv.FormatInt(since, 10), &r)
		reports = append(reports, r)
	}
	var win multiWindow
	for sub := range rebalP {
		var ts []int64
		for _, r := range reports {
			ts = append(ts, r.Changes[sub]...)
		}
		slices.Sort(ts)
		prev := start.UnixNano()
		for _, t := range append(ts, stop.UnixNano()) {
			win.gaps[sub] = max(win.gaps[sub], time.Duration(t-prev))
			prev = t
		}
	}
	rate := func(from, to int64) float64 {
		var n int64
		for _, r := range reports {
			at := func(t int64) int64 {
				i, _ := slices.BinarySearchFunc(r.Samples, t, func(s [2]int64, t int64) int { return int(max(-1, min(1, s[0]-t))) })
				return r.Samples[min(i, len(r.Samples)-1)][1]
			}
			if len(r.Samples) > 0 {
				n += at(to) - at(from)
			}
		}
		return float64(n) / time.Duration(to-from).Seconds()
	}
	s := start.UnixNano()
	win.steady = rate(s-int64(time.Second), s)
	win.worst = -1
	for _, smp := range reports[0].Samples {
		if smp[0] < s-int64(time.Second/2) || smp[0] > end.UnixNano() {
			continue
		}
		if r := rate(smp[0], smp[0]+int64(time.Second)); win.worst < 0 || r < win.worst {
			win.worst = r
		}
	}
	return win
}

// stateFiles is what the job master's process serves the worker
// processes: the state files they push and those they restore
// (actors.Execution's).
type stateFiles interface {
	ReceiveFile(epoch uint64, id snapshot.ID, name string, size int64, checksum uint32, body io.Reader) error
	OpenRestoreFile(epoch uint64, name string) (*os.File, snapshot.Handle, error)
}

// procFiles serves, over HTTP, the state files of the job the master's
// process runs now (PUT /files, GET /restore), as the daemon serves its
// jobs'.
//
// A job invites the worker processes while it starts, before the call
// that starts it returns: a worker restoring a savepoint fetches its
// files at once. A request that comes while a job starts waits for it
// (mu): served by the attempt before, or by none, it was refused, the
// worker's deployment failed, and the job restarted from a savepoint
// never ran.
type procFiles struct {
	mu  sync.RWMutex // held while a job starts; guards cur
	cur stateFiles
	// entered, when set, is called as a request reaches a handler.
	entered func()
}

// start starts a job with run, which returns its execution, and serves
// its files from then on; the requests that come meanwhile wait for it.
func (f *procFiles) start(run func() stateFiles) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cur = run()
}

// job returns the execution whose files are served, nil before the first
// start; while a job starts, it waits for it.
func (f *procFiles) job() stateFiles {
	if f.entered != nil {
		f.entered()
	}
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.cur
}

func (f *procFiles) handler() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("PUT /files", func(rw http.ResponseWriter, r *http.Request) {
		epoch, _ := strconv.ParseUint(r.FormValue("epoch"), 10, 64)
		id, _ := strconv.ParseUint(r.FormValue("id"), 10, 64)
		size, _ := strconv.ParseInt(r.FormValue("size"), 10, 64)
		sum, _ := strconv.ParseUint(r.FormValue("sum"), 10, 32)
		j := f.job()
		if j == nil {
			http.Error(rw, "no job", http.StatusNotFound)
			return
		}
		if err := j.ReceiveFile(epoch, snapshot.ID(id), r.FormValue("name"), size, uint32(sum), r.Body); err != nil {
			http.Error(rw, err.Error(), http.StatusInternalServerError)
		}
	})
	mux.HandleFunc("GET /restore", func(rw http.ResponseWriter, r *http.Request) {
		epoch, _ := strconv.ParseUint(r.FormValue("epoch"), 10, 64)
		j := f.job()
		if j == nil {
			http.Error(rw, "no job", http.StatusNotFound)
			return
		}
		file, h, err := j.OpenRestoreFile(epoch, r.FormValue("name"))
		if err != nil {
			http.Error(rw, err.Error(), http.StatusInternalServerError)
			return
		}
		defer file.Close()
		rw.Header().Set("Content-Length", strconv.FormatInt(h.Size, 10))
		_, _ = io.Copy(rw, io.LimitReader(file, h.Size))
	})
	return mux
}

// BenchmarkRebalancePauseProcesses is BenchmarkRebalancePause with the
// nodes in separate OS processes: the job master and the generator in
// the benchmark's process (node-0), node-1 and node-2 in worker
// processes (this test binary run again), over protoactor remote on
// 127.0.0.1, with the state files moved over HTTP as the daemon moves
// them. The keyed operator (100,000 keys of 1 KB, about 100 MB of state,
// over 4 subtasks) runs with subtask 0 on node-1, 1 on node-2, 2 on
// node-0 and 3 on node-1; each iteration hands subtask 0 over from
// node-1 to node-2 (process to process) while a paced generator feeds
// 40,000 records/s, then, in the same run, stops the whole job with a
// savepoint and starts it again from it in the same processes (a
// rebalance by full restart), which puts subtask 0 back on node-1. It
// reports, as medians over the iterations, the metrics of
// BenchmarkRebalancePause, each subtask's gaps measured in whichever
// process ran it:
//
//   - moved-pause-ms (move-api-pause-ms: the pause the handover
//     reports), others-pause-ms, idle-gap-ms;
//   - move-worst-second, restart-worst-second: the job's records/s in
//     its worst second from the action to its end, as a fraction of the
//     second before it (the throughput dip);
//   - restart-pause-ms, restart-min-pause-ms; restart/moved;
//   - savepoint-MB, move-savepoint-ms: the move's savepoint's size and
//     duration (the moved subtask waits for it to complete);
//   - move-prepare-ms, move-retire-ms, move-open-ms, move-restore-ms,
//     move-repoint-ms: the handover's steps as the job master logs them
//     (every node told of the handover and its savepoint triggered; the
//     old node retiring the subtask; the channels from the new node
//     opened; the new node fetching and restoring the subtask's state,
//     of which move-fetch-ms, as the new node logs it, is the fetch of
//     its state files from the job master's process, and move-fetched-MB
//     what it fetched; its inputs re-pointed);
//   - move-window-cpu-s, restart-window-cpu-s: the CPU time of the three
//     processes over each measured window (the action, until every
//     subtask processes again, and one more second).
//
// Only as a benchmark:
//
//	go test ./stream -run '^$' -bench BenchmarkRebalancePauseProcesses -benchtime 3x
func BenchmarkRebalancePauseProcesses(b *testing.B) {
	ws := map[string]*rebalWorker{"node-1": startRebalWorker(b, "node-1"), "node-2": startRebalWorker(b, "node-2")}
	nw := cluster.NewNetwork("node-0", testChannelConfig(), nil)
	tr := cluster.NewRemoteTransport(cluster.DefaultRemoteConfig(), nw.Endpoint())
	if err := tr.Start(); err != nil {
		b.Fatal(err)
	}
	nw.Attach(tr)
	nw.SetPeer("node-0", tr.Addr())
	nw.Start(20 * time.Millisecond)
	b.Cleanup(func() {
		nw.Stop()
		tr.Stop(context.Background(), false)
	})

	// The master's files endpoints serve the current job.
	var cur atomic.Pointer[stream.Job]
	files := &procFiles{}
	mux := files.handler()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(ln) }()
	b.Cleanup(func() { srv.Close() })
	for id, w := range ws {
		nw.SetPeer(id, w.addr)
		for pid, p := range ws {
			w.must(b, http.MethodPost, "/peer?"+url.Values{"id": {pid}, "addr": {p.addr}}.Encode(), nil)
		}
		w.must(b, http.MethodPost, "/peer?"+url.Values{"id": {"node-0"}, "addr": {tr.Addr()}}.Encode(), nil)
		w.must(b, http.MethodPost, "/master?"+url.Values{"http": {ln.Addr().String()}}.Encode(), nil)
	}

	var total atomic.Int64 // what this process's subtasks folded in
	runCtx, cancelRun := context.WithCancel(context.Background())
	defer cancelRun()
	var epochs uint64
	steps := newStepLog()
	start := func(savepoint string) *stream.Job {
		epochs++
		c := &actors.Cluster{
			Nodes:          []actors.Node{{ID: "node-0", Network: nw}, {ID: "node-1"}, {ID: "node-2"}},
			ControlTimeout: 30 * time.Second,
			EpochBase:      epochs << 20,
			Placement: map[actors.TaskKey]string{
				{UID: "generator", Subtask: 0}: "node-0",
				{UID: rebalUID, Subtask: 0}:    "node-1",
				{UID: rebalUID, Subtask: 1}:    "node-2",
				{UID: rebalUID, Subtask: 2}:    "node-0",
				{UID: rebalUID, Subtask: 3}:    "node-1",
			},
			Invite: func(ctx context.Context, node string, d actors.Deployment) error {
				body, err := json.Marshal(d)
				if err != nil {
					return err
				}
				return ws[node].call(ctx, http.MethodPost, "/deploy", bytes.NewReader(body), nil)
			},
		}
		cp := snapshot.DefaultConfig()
		cp.Dir = b.TempDir()
		cp.Interval = time.Hour
		opts := []stream.Option{stream.WithCheckpointing(cp), stream.WithCluster(c), stream.WithLogger(slog.New(steps))}
		if savepoint != "" {
			opts = append(opts, stream.WithSavepoint(savepoint, false))
		}
		var job *stream.Job
		files.start(func() stateFiles {
			var err error
			if job, err = rebalJob(&total, opts...).ExecuteAsync(runCtx); err != nil {
				b.Fatal(err)
			}
			return job.Execution()
		})
		cur.Store(job)
		return job
	}
	mr := &multiRun{workers: ws, local: &procMeter{total: &total, metrics: func() []actors.TaskMetrics {
		if j := cur.Load(); j != nil {
			return j.Metrics()
		}
		return nil
	}}}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { defer close(done); mr.local.run(stop) }()
	defer func() { close(stop); <-done }()
	start("")
	defer func() {
		cancelRun()
		_ = cur.Load().Wait()
		testutil.Eventually(b, 10*time.Second, "the dead-letter throttles ended", func() bool {
			buf := make([]byte, 1<<20)
			return !strings.Contains(string(buf[:runtime.Stack(buf, true)]), "NewDeadLetter.NewThrottle")
		})
	}()
	folded := func() int64 {
		n := total.Load()
		for _, w := range ws {
			var x int64
			w.must(b, http.MethodGet, "/total", &x)
			n += x
		}
		return n
	}
	cpu := func() time.Duration {
		d := processCPU()
		for _, w := range ws {
			var x time.Duration
			w.must(b, http.MethodGet, "/cpu", &x)
			d += x
		}
		return d
	}
	// Every key has its state, twice over.
	testutil.Eventually(b, 3*time.Minute, "every key folded in twice", func() bool { return folded() >= 2*rebalKeys })

	var idle, moved, movedAPI, others, moveWorst, restart, restartMin, restartWorst, spMB, spMS, moveCPU, restartCPU []float64
	stepMS := map[string][]float64{}
	var fetchedMB []float64
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	ctx := context.Background()
	for b.Loop() {
		idleW := mr.measure(b, func() { time.Sleep(time.Second) })
		idle = append(idle, ms(slices.Max(idleW.gaps[:])))

		job := cur.Load()
		r, _ := job.Execution().Runner()
		if from := r.NodeOf(rebalUID, 0); from != "node-1" {
			b.Fatalf("%s[0] runs on %q, want node-1", rebalUID, from)
		}
		var res actors.MoveResult
		steps.take()
		for _, w := range ws {
			w.must(b, http.MethodGet, "/steps", nil)
		}
		c0 := cpu()
		mw := mr.measure(b, func() {
			var err error
			res, err = job.Execution().Move(ctx, []actors.Move{{UID: rebalUID, Subtask: 0, To: "node-2"}})
			if err != nil {
				b.Fatal(err)
			}
		})
		moveCPU = append(moveCPU, (cpu() - c0).Seconds())
		if job.Attempts() != 1 {
			b.Fatalf("the job restarted during the move: %d attempts", job.Attempts())
		}
		if got := r.NodeOf(rebalUID, 0); got != "node-2" || len(res.Moved) != 1 {
			b.Fatalf("%s[0] runs on %q after its move to node-2: %+v", rebalUID, got, res)
		}
		moved = append(moved, ms(mw.gaps[0]))
		movedAPI = append(movedAPI, ms(res.Moved[0].Pause))
		others = append(others, ms(slices.Max(mw.gaps[1:])))
		moveWorst = append(moveWorst, mw.worst/mw.steady)
		spMB = append(spMB, dirMB(res.Path))
		for _, s := range r.History() {
			if s.Checkpoint == res.Savepoint {
				spMS = append(spMS, ms(s.Duration))
			}
		}
		took := steps.take()
		for _, w := range ws {
			var st map[string]time.Duration
			w.must(b, http.MethodGet, "/steps", &st)
			for step, d := range st {
				took[step] = d
			}
		}
		if n, ok := took["fetched-bytes"]; ok {
			fetchedMB = append(fetchedMB, float64(n)/1e6)
			delete(took, "fetched-bytes")
		}
		for step, d := range took {
			stepMS[step] = append(stepMS[step], ms(d))
		}

		c0 = cpu()
		w := mr.measure(b, func() {
			sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			defer cancel()
			path, err := job.StopWithSavepoint(sctx, "")
			if err != nil {
				b.Fatal(err)
			}
			if err := job.Wait(); err != nil {
				b.Fatal(err)
			}
			j := start(path)
			testutil.Eventually(b, 2*time.Minute, "the restarted job runs", func() bool {
				select {
				case <-j.Done():
					b.Fatalf("the job restarted from savepoint %s ended: %v", path, j.Wait())
				default:
				}
				r, _ := j.Execution().Runner()
				if r == nil {
					return false
				}
				select {
				case <-r.Started():
					return true
				default:
					return false
				}
			})
		})
		restartCPU = append(restartCPU, (cpu() - c0).Seconds())
		restart = append(restart, ms(slices.Max(w.gaps[:])))
		restartMin = append(restartMin, ms(slices.Min(w.gaps[:])))
		restartWorst = append(restartWorst, w.worst/w.steady)
		b.Logf("move node-1->node-2: savepoint %v, steps %v", time.Duration(spMS[len(spMS)-1]*float64(time.Millisecond)), took)
		b.Logf("move node-1->node-2: moved %v (reported %v), others %v, worst second %.0f of %.0f rec/s; savepoint %.1f MB; restart: pause %v..%v, worst second %.0f of %.0f rec/s",
			mw.gaps[0], res.Moved[0].Pause, slices.Max(mw.gaps[1:]), mw.worst, mw.steady, spMB[len(spMB)-1],
			slices.Min(w.gaps[:]), slices.Max(w.gaps[:]), w.worst, w.steady)
	}
	b.StopTimer()
	reportPauses(b, pauseFigures{idle: idle, moved: moved, movedAPI: movedAPI, others: others, moveWorst: moveWorst,
		restart: restart, restartMin: restartMin, restartWorst: restartWorst, spMB: spMB})
	if len(spMS) > 0 {
		b.ReportMetric(median(spMS), "move-savepoint-ms")
	}
	for step, xs := range stepMS {
		b.ReportMetric(median(xs), "move-"+step+"-ms")
	}
	if len(fetchedMB) > 0 {
		b.ReportMetric(median(fetchedMB), "move-fetched-MB")
	}
	b.ReportMetric(median(moveCPU), "move-window-cpu-s")
	b.ReportMetric(median(restartCPU), "restart-window-cpu-s")
}
