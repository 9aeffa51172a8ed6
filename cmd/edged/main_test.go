package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/edgedio/edged/daemon"
	"github.com/edgedio/edged/pipeline"
)

func TestMain(m *testing.M) {
	shrinkActorRegistry() // as main does, before anything runs
	goleak.VerifyTestMain(m)
}

const waitLimit = 30 * time.Second

// badConfig has two problems, each to be reported with its key path.
const badConfig = `
pipelines:
  - name: bad
    source:
      generator: {count: 10}
    key: id
    window:
      type: tumbling
      size: -1s
      aggregates: [{name: c, fn: count}]
    sinks:
      - stdout: {}
      - {}
`

func writeFile(t *testing.T, name, data string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestRunBadConfigExits2(t *testing.T) {
	p := writeFile(t, "bad.yaml", badConfig)
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"run", "-c", p, "--listen", "127.0.0.1:0"}, &out, &errb)
	if code != 2 {
		t.Fatalf("exit = %d, want 2; stderr:\n%s", code, errb.String())
	}
	for _, want := range []string{"pipelines[0].window.size", "pipelines[0].sinks[1]"} {
		if !strings.Contains(errb.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, errb.String())
		}
	}
}

func TestUsageErrorsExit2(t *testing.T) {
	for _, args := range [][]string{
		nil,
		{"frobnicate"},
		{"run"},
		{"run", "-c", filepath.Join(t.TempDir(), "missing.yaml")},
		{"run", "--no-such-flag"},
		{"savepoint"},
		{"list", "extra"},
		{"list", "--timeout", "-1s"},
		{"stop", "--timeout", "0s", "job"},
		{"cluster", "status", "--timeout", "-1s"},
	} {
		var out, errb bytes.Buffer
		if code := run(context.Background(), args, &out, &errb); code != 2 {
			t.Errorf("run(%q) = %d, want 2; stderr:\n%s", args, code, errb.String())
		}
	}
}

func TestRunDemoConfig(t *testing.T) {
	data, err := os.ReadFile("../../configs/demo.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p := writeFile(t, "demo.yaml", strings.Replace(string(data), "count: 100000", "count: 500", 1))
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"run", "-c", p, "--listen", "127.0.0.1:0"}, &out, &errb); code != 0 {
		t.Fatalf("exit = %d; stderr:\n%s", code, errb.String())
	}
	if !strings.Contains(out.String(), `"window_start"`) {
		t.Errorf("stdout has no window results:\n%s", out.String())
	}
}

// run --cpuprofile writes a CPU profile of the whole run.
func TestRunCPUProfile(t *testing.T) {
	data, err := os.ReadFile("../../configs/demo.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p := writeFile(t, "demo.yaml", strings.Replace(string(data), "count: 100000", "count: 500", 1))
	prof := filepath.Join(t.TempDir(), "edged.cpu")
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"run", "-c", p, "--listen", "127.0.0.1:0", "--cpuprofile", prof}, &out, &errb); code != 0 {
		t.Fatalf("exit = %d; stderr:\n%s", code, errb.String())
	}
	b, err := os.ReadFile(prof)
	if err != nil {
		t.Fatalf("no profile: %v", err)
	}
	// A pprof profile is a gzip-compressed protocol buffer.
	if len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
		t.Fatalf("profile is not gzip-compressed pprof data (%d bytes)", len(b))
	}
}

// The client commands against a node run in the test.
func TestClientCommands(t *testing.T) {
	dir := t.TempDir()
	cfg, err := pipeline.Parse([]byte(`
pipelines:
  - name: ticking
    source:
      generator: {count: 0, rate: 200, keys: 4}
    key: id
    window: {type: tumbling, size: 1s, aggregates: [{name: count, fn: count}]}
    sinks: [{stdout: {}}]
    checkpoint: {interval: 100ms, dir: ` + filepath.Join(dir, "cp") + `}
`))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan net.Addr, 1)
	errc := make(chan error, 1)
	go func() {
		errc <- daemon.Run(ctx, cfg, daemon.Options{Listen: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler),
			Ready: func(a net.Addr) { ready <- a }})
	}()
	var addr string
	select {
	case a := <-ready:
		addr = a.String()
	case err := <-errc:
		t.Fatalf("Run: %v", err)
	case <-time.After(waitLimit):
		t.Fatal("node not ready")
	}
	defer http.DefaultTransport.(*http.Transport).CloseIdleConnections()

	cli := func(args ...string) (string, int) {
		var out, errb bytes.Buffer
		code := run(context.Background(), append(args, "--addr", addr), &out, &errb)
		return out.String() + errb.String(), code
	}
	if out, code := cli("list"); code != 0 || !strings.Contains(out, "ticking") || !strings.Contains(out, "running") {
		t.Errorf("list: %d\n%s", code, out)
	}
	sp := filepath.Join(dir, "sp")
	if out, code := cli("savepoint", "ticking", "--path", sp); code != 0 || strings.TrimSpace(out) != sp {
		t.Errorf("savepoint: %d\n%s", code, out)
	}
	if out, code := cli("checkpoints", "ticking"); code != 0 || !strings.Contains(out, sp) {
		t.Errorf("checkpoints: %d\n%s", code, out)
	}
	if out, code := cli("cancel", "nope"); code != 1 || !strings.Contains(out, "404") {
		t.Errorf("cancel unknown job: %d\n%s", code, out)
	}
	if out, code := cli("stop", "ticking"); code != 0 || !strings.Contains(out, filepath.Join(dir, "cp")) {
		t.Errorf("stop: %d\n%s", code, out)
	}
	select {
	case err := <-errc:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(waitLimit):
		t.Fatal("Run did not return after stop")
	}
}

// One real process: the built binary exits 2 on a bad config and names
// the field path on stderr.
func TestBinaryBadConfigExits2(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := filepath.Join(t.TempDir(), "edged")
	build := exec.Command("go", "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "run", "-c", writeFile(t, "bad.yaml", badConfig), "--listen", "127.0.0.1:0")
	var errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = io.Discard, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 {
		t.Fatalf("exit: %v, want status 2; stderr:\n%s", err, errb.String())
	}
	if !strings.Contains(errb.String(), "pipelines[0].window.size") {
		t.Errorf("stderr lacks the field path:\n%s", errb.String())
	}
}
