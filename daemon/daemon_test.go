package daemon_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgedio/edged/daemon"
	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/pipeline"
)

const waitLimit = 30 * time.Second

// node is a daemon.Run running in the background of a test.
type node struct {
	addr   string
	out    *testutil.Buffer
	logs   *testutil.Buffer
	cancel context.CancelFunc
	errc   chan error
	client *daemon.Client
}

// startNode runs cfgYAML in a daemon on a free loopback port. The test
// fails if Run has not returned waitLimit after the test ends.
func startNode(t *testing.T, cfgYAML string, opts daemon.Options) *node {
	t.Helper()
	cfg, err := pipeline.Parse([]byte(cfgYAML))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	n := &node{out: &testutil.Buffer{}, logs: &testutil.Buffer{}, errc: make(chan error, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	ready := make(chan net.Addr, 1)
	opts.Listen = "127.0.0.1:0"
	if opts.Stdout == nil {
		opts.Stdout = n.out
	}
	opts.Logger = slog.New(slog.NewTextHandler(n.logs, nil))
	opts.PollInterval = 50 * time.Millisecond
	opts.Ready = func(a net.Addr) { ready <- a }
	go func() { n.errc <- daemon.Run(ctx, cfg, opts) }()
	hc := &http.Client{Transport: &http.Transport{}, Timeout: waitLimit}
	t.Cleanup(func() {
		cancel()
		select {
		case <-n.errc:
		case <-time.After(waitLimit):
			t.Errorf("Run did not return %v after cancel", waitLimit)
		}
		hc.CloseIdleConnections()
	})
	select {
	case a := <-ready:
		n.addr = a.String()
	case err := <-n.errc:
		n.errc <- err
		t.Fatalf("Run returned before ready: %v", err)
	case <-time.After(waitLimit):
		t.Fatal("daemon not ready")
	}
	n.client = &daemon.Client{Addr: n.addr, HTTP: hc}
	return n
}

// wait waits for Run to return and returns its error.
func (n *node) wait(t *testing.T) error {
	t.Helper()
	select {
	case err := <-n.errc:
		n.errc <- err // for the cleanup
		return err
	case <-time.After(waitLimit):
		t.Fatalf("Run did not return within %v", waitLimit)
		return nil
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	t.Cleanup(cancel)
	return ctx
}

func TestRunDemoToCompletion(t *testing.T) {
	data, err := os.ReadFile("../configs/demo.yaml")
	if err != nil {
		t.Fatal(err)
	}
	yml := strings.Replace(string(data), "count: 100000", "count: 2000", 1)
	if yml == string(data) {
		t.Fatal("demo.yaml has no `count: 100000` to shrink")
	}
	n := startNode(t, yml, daemon.Options{})
	if err := n.wait(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
	// 10 sensors, one reading per sensor and second, 10 s windows: every
	// record lands in exactly one window result.
	var total int64
	lines := strings.Split(strings.TrimSpace(n.out.String()), "\n")
	for _, l := range lines {
		var w struct {
			ID    string `json:"id"`
			Count *int64 `json:"count"`
		}
		if err := json.Unmarshal([]byte(l), &w); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		if w.Count != nil {
			total += *w.Count
		}
	}
	if total != 2000 {
		t.Errorf("window counts sum to %d over %d lines, want 2000", total, len(lines))
	}
	logs := n.logs.String()
	for _, want := range []string{`msg="job started" job=demo`, `msg="job finished" job=demo status=finished`} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs lack %q:\n%s", want, logs)
		}
	}
}

// tickingConfig is an unbounded, rate-limited pipeline with checkpoints
// in dir (none when dir is "").
func tickingConfig(name, dir string) string {
	cfg := `
pipelines:
  - name: ` + name + `
    source:
      generator: {count: 0, rate: 200, keys: 4}
    key: id
    window:
      type: tumbling
      size: 1s
      aggregates: [{name: count, fn: count}]
    sinks:
      - stdout: {}
`
	if dir != "" {
		cfg += `    checkpoint:
      interval: 100ms
      dir: ` + dir + "\n"
	}
	return cfg
}

func TestAPISavepointCheckpointsMetricsStop(t *testing.T) {
	dir := t.TempDir()
	n := startNode(t, tickingConfig("ticking", filepath.Join(dir, "cp")), daemon.Options{})
	ctx := ctxT(t)

	// Attempts is 0 until the job's first attempt starts, a moment after
	// the node is up.
	var jobs []daemon.JobInfo
	testutil.Eventually(t, testutil.DefaultTimeout, "the job's first attempt", func() bool {
		var err error
		if jobs, err = n.client.Jobs(ctx); err != nil {
			t.Fatal(err)
		}
		return len(jobs) != 1 || jobs[0].Attempts != 0
	})
	if len(jobs) != 1 || jobs[0].Name != "ticking" || jobs[0].Status != daemon.StatusRunning || jobs[0].Attempts != 1 || !jobs[0].Checkpointing {
		t.Fatalf("jobs = %+v", jobs)
	}

	spDir := filepath.Join(dir, "my-savepoint")
	p, err := n.client.Savepoint(ctx, "ticking", spDir)
	if err != nil {
		t.Fatalf("Savepoint: %v", err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("savepoint %q: %v", p, err)
	}
	// A second savepoint to the same path is refused with a conflict that
	// says why; the first stays.
	var exists *daemon.APIError
	if _, err := n.client.Savepoint(ctx, "ticking", spDir); !errors.As(err, &exists) || exists.StatusCode != http.StatusConflict ||
		!strings.Contains(err.Error(), "already exists") {
		t.Fatalf("savepoint to an existing path: %v, want 409 saying it already exists", err)
	}

	cps, err := n.client.Checkpoints(ctx, "ticking")
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, c := range cps {
		if c.Kind == "savepoint" && c.Path == p {
			found = true
			if c.Status != "completed" || c.TriggerTime.IsZero() || c.SizeBytes <= 0 || c.Tasks == 0 {
				t.Errorf("savepoint entry = %+v", c)
			}
		}
	}
	if !found {
		t.Errorf("checkpoints lack savepoint %q: %+v", p, cps)
	}

	resp, err := n.client.HTTP.Get("http://" + n.addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`edged_job_up{job="ticking"} 1`,
		`edged_job_attempts_total{job="ticking"} 1`,
		`edged_job_checkpoints_completed_total{job="ticking"}`,
		`edged_job_last_checkpoint_size_bytes{job="ticking"}`,
		`edged_job_last_checkpoint_duration_seconds{job="ticking"}`,
		`go_goroutines`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q", want)
		}
	}

	var apiErr *daemon.APIError
	if _, err := n.client.Checkpoints(ctx, "nope"); !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound {
		t.Errorf("checkpoints of unknown job: %v, want 404", err)
	}

	stopped, err := n.client.Stop(ctx, "ticking", "")
	if err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if _, err := os.Stat(stopped); err != nil {
		t.Fatalf("stop savepoint %q: %v", stopped, err)
	}
	if err := n.wait(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if logs := n.logs.String(); !strings.Contains(logs, "savepoint="+stopped) {
		t.Errorf("logs lack the stop savepoint path %q:\n%s", stopped, logs)
	}
}

// Cancelling Run's context stops a checkpointed job with a savepoint and
// cancels one without; Run returns nil. A new node resumes from the
// savepoint.
func TestShutdownStopsWithSavepoint(t *testing.T) {
	dir := t.TempDir()
	cfg := tickingConfig("with-cp", filepath.Join(dir, "cp")) +
		strings.TrimPrefix(tickingConfig("without-cp", ""), "\npipelines:\n")
	n := startNode(t, cfg, daemon.Options{})
	ctx := ctxT(t)

	var apiErr *daemon.APIError
	if _, err := n.client.Savepoint(ctx, "without-cp", ""); !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusConflict {
		t.Errorf("savepoint without checkpointing: %v, want 409", err)
	}

	n.cancel()
	if err := n.wait(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
	logs := n.logs.String()
	if !strings.Contains(logs, `msg="job stopped with savepoint" job=with-cp`) {
		t.Fatalf("logs lack the shutdown savepoint:\n%s", logs)
	}
	if !strings.Contains(logs, `msg="job finished" job=without-cp status=cancelled`) {
		t.Errorf("logs lack the cancelled job:\n%s", logs)
	}
	sps, err := filepath.Glob(filepath.Join(dir, "cp", "savepoints", "*"))
	if err != nil || len(sps) != 1 {
		t.Fatalf("savepoints = %v, %v; want one", sps, err)
	}

	resumed := startNode(t, tickingConfig("with-cp", filepath.Join(dir, "cp2")), daemon.Options{Savepoint: sps[0]})
	jobs, err := resumed.client.Jobs(ctx)
	if err != nil || len(jobs) != 1 || jobs[0].Status != daemon.StatusRunning {
		t.Fatalf("resumed jobs = %+v, %v", jobs, err)
	}
	if _, err := resumed.client.Stop(ctx, "with-cp", ""); err != nil {
		t.Fatalf("Stop resumed: %v", err)
	}
	if err := resumed.wait(t); err != nil {
		t.Fatalf("resumed Run: %v", err)
	}
}

func TestCancelJob(t *testing.T) {
	n := startNode(t, tickingConfig("plain", ""), daemon.Options{})
	ctx := ctxT(t)
	s, err := n.client.Cancel(ctx, "plain")
	if err != nil {
		t.Fatal(err)
	}
	if s != daemon.StatusCancelled {
		t.Errorf("status = %q, want cancelled", s)
	}
	if err := n.wait(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// A cancel of a job that no longer runs names the job, as a stop or a
// savepoint of it does: it answered only "daemon: job is not running".
func TestCancelJobNotRunningNamesIt(t *testing.T) {
	cfg := tickingConfig("first", "") + strings.TrimPrefix(tickingConfig("second", ""), "\npipelines:\n")
	n := startNode(t, cfg, daemon.Options{})
	ctx := ctxT(t)
	if _, err := n.client.Cancel(ctx, "first"); err != nil {
		t.Fatal(err)
	}
	_, err := n.client.Cancel(ctx, "first")
	var ae *daemon.APIError
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusConflict || ae.Msg != daemon.ErrNotRunning.Error()+`: "first"` {
		t.Errorf("second cancel = %v, want 409 %s: \"first\"", err, daemon.ErrNotRunning)
	}
	if _, err := n.client.Cancel(ctx, "second"); err != nil {
		t.Fatal(err)
	}
	if err := n.wait(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
}

func TestRunRejectsEmptyConfig(t *testing.T) {
	if err := daemon.Run(context.Background(), &pipeline.Config{}, daemon.Options{}); !errors.Is(err, daemon.ErrNoPipelines) {
		t.Errorf("Run = %v, want ErrNoPipelines", err)
	}
}

// A job waiting out its restart delay after a failure does not hold the
// node's shutdown until it runs again: Run returns at once, the job
// counted cancelled (its latest checkpoint is where it goes on from).
func TestShutdownDuringRestartDelay(t *testing.T) {
	dir := t.TempDir()
	notADir := filepath.Join(dir, "file")
	if err := os.WriteFile(notADir, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// The file sink cannot open its directory: every attempt fails.
	cfg := strings.Replace(tickingConfig("failing", filepath.Join(dir, "cp")), "      - stdout: {}\n",
		"      - file: {dir: "+filepath.Join(notADir, "out")+"}\n", 1) +
		"    restart: {strategy: fixed_delay, attempts: 3, delay: 1h}\n"
	n := startNode(t, cfg, daemon.Options{})
	testutil.Eventually(t, 0, "the job failed and waits to restart", func() bool {
		return strings.Contains(n.logs.String(), `msg="job failed; restarting"`)
	})
	n.cancel()
	// The delay is an hour: wait's bound is far shorter.
	if err := n.wait(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if logs := n.logs.String(); !strings.Contains(logs, `msg="job finished" job=failing status=cancelled`) {
		t.Errorf("logs lack the job cancelled while it waited to restart:\n%s", logs)
	}
}
