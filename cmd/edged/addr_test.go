package main

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// fakeNode answers /jobs with one job named name.
func fakeNode(t *testing.T, name string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/jobs" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"jobs":[{"name":"` + name + `","status":"running"}]}`))
	}))
	t.Cleanup(func() {
		srv.Close()
		http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	})
	return strings.TrimPrefix(srv.URL, "http://")
}

// The client commands find the node: --addr, else the -c config's
// node.listen, else EDGED_ADDR, else the default.
func TestClientAddrPrecedence(t *testing.T) {
	flagNode, cfgNode, envNode := fakeNode(t, "via-flag"), fakeNode(t, "via-config"), fakeNode(t, "via-env")
	cfg := writeFile(t, "node.yaml", "node:\n  listen: "+cfgNode+"\n"+`
pipelines:
  - name: p
    source: {generator: {count: 1}}
    sinks: [{stdout: {}}]
`)
	list := func(args ...string) string {
		t.Helper()
		var out, errb bytes.Buffer
		if code := run(context.Background(), append([]string{"list"}, args...), &out, &errb); code != 0 {
			t.Fatalf("list %q: exit %d\n%s", args, code, errb.String())
		}
		return out.String()
	}
	t.Setenv(addrEnv, envNode)
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--addr", flagNode, "-c", cfg}, "via-flag"},
		{[]string{"-c", cfg}, "via-config"},
		{[]string{"--config", cfg}, "via-config"},
		{nil, "via-env"},
	} {
		if out := list(tt.args...); !strings.Contains(out, tt.want) {
			t.Errorf("list %q reached the wrong node:\n%s\nwant %s", tt.args, out, tt.want)
		}
	}
}

func TestClientAddrFromWildcardListen(t *testing.T) {
	for listen, want := range map[string]string{
		"0.0.0.0:9000":   "127.0.0.1:9000",
		":9000":          "127.0.0.1:9000",
		"[::]:9000":      "[::1]:9000",
		"10.0.0.7:9000":  "10.0.0.7:9000",
		"localhost:9000": "localhost:9000",
	} {
		if got := dialAddr(listen); got != want {
			t.Errorf("dialAddr(%q) = %q, want %q", listen, got, want)
		}
	}
}

func TestClientBadConfigExits2(t *testing.T) {
	var out, errb bytes.Buffer
	p := writeFile(t, "bad.yaml", "node:\n  listen: nohost:notaport:1\n"+badConfig)
	if code := run(context.Background(), []string{"list", "-c", p}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "node.listen") {
		t.Errorf("exit %d, want 2 naming node.listen; stderr:\n%s", code, errb.String())
	}
}

// node.broker that is not host:port used to fail at start (exit 1)
// without a key path.
func TestRunBadBrokerExits2(t *testing.T) {
	p := writeFile(t, "broker.yaml", "node:\n  broker: nohost:notaport:1\n"+`
pipelines:
  - name: p
    source: {generator: {count: 1}}
    sinks: [{mqtt: {topic: "out/{id}"}}]
`)
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"run", "-c", p, "--listen", "127.0.0.1:0"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "node.broker") {
		t.Errorf("exit %d, want 2 naming node.broker; stderr:\n%s", code, errb.String())
	}
}

// edged list shows a restarting job's last failure in its ERROR column.
func TestListShowsTheLastFailureOfARestartingJob(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"jobs":[{"name":"p","status":"restarting","attempts":2,"last_failure":"sink: disk\nfull"}]}`))
	}))
	t.Cleanup(srv.Close)
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"list", "--addr", strings.TrimPrefix(srv.URL, "http://")}, &out, &errb); code != 0 {
		t.Fatalf("list: exit %d\n%s", code, errb.String())
	}
	if !strings.Contains(out.String(), "restarting") || !strings.Contains(out.String(), "last failure: sink: disk full") {
		t.Fatalf("list:\n%s", out.String())
	}
}

// A user who gives the config as an argument (`edged run config.yaml`)
// or an empty --from-savepoint is told how to give it, with exit 2, and
// no node starts.
func TestRunConfigWithoutFlagOrEmptySavepointExits2(t *testing.T) {
	p := writeFile(t, "p.yaml", `
pipelines:
  - name: p
    source: {generator: {count: 1}}
    sinks: [{stdout: {}}]
`)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"run", p}, "edged run -c " + p},
		{[]string{"run", "-c", p, "--from-savepoint", "", "--listen", "127.0.0.1:0"}, "--from-savepoint: a savepoint directory is required"},
	} {
		var out, errb bytes.Buffer
		if code := run(context.Background(), tc.args, &out, &errb); code != 2 || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%q: exit %d, want 2 with %q; stderr:\n%s", tc.args, code, tc.want, errb.String())
		}
	}
}

// An address without its port, or with a port that is not a number, is
// refused before anything is dialled: "127.0.0.1" was asked as
// http://127.0.0.1, on port 80, and the error named that address.
func TestClientAddrWithoutPortExits2(t *testing.T) {
	for _, tt := range []struct {
		args []string
		env  string
	}{
		{args: []string{"list", "--addr", "127.0.0.1"}},
		{args: []string{"checkpoints", "p", "--addr", "localhost:api"}},
		{args: []string{"stop", "p", "--addr", "127.0.0.1:70000"}},
		{args: []string{"cluster", "status", "--addr", "127.0.0.1"}},
		{args: []string{"list"}, env: "127.0.0.1"},
	} {
		t.Setenv(addrEnv, tt.env)
		var out, errb bytes.Buffer
		code := run(context.Background(), tt.args, &out, &errb)
		if code != 2 || !strings.Contains(errb.String(), "must be host:port") {
			t.Errorf("%q (%s=%q): exit %d, want 2 naming host:port\n%s", tt.args, addrEnv, tt.env, code, errb.String())
		}
		if strings.Contains(errb.String(), "dial tcp") {
			t.Errorf("%q was dialled:\n%s", tt.args, errb.String())
		}
	}
	// A URL is still taken as it is.
	node := fakeNode(t, "via-url")
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"list", "--addr", "http://" + node}, &out, &errb); code != 0 || !strings.Contains(out.String(), "via-url") {
		t.Errorf("list --addr http://%s: exit %d\n%s%s", node, code, out.String(), errb.String())
	}
}

// TestRunBadListenFlagExits2: --listen is checked as node.listen is, before
// the node starts, with exit 2 naming the flag; before, a port that is not
// a number started the pipelines and failed only at the bind, with exit 1.
func TestRunBadListenFlagExits2(t *testing.T) {
	p := writeFile(t, "node.yaml", `
pipelines:
  - name: p
    source: {generator: {count: 1}}
    sinks: [{mqtt: {topic: "out/{id}"}}]
`)
	for _, c := range []struct{ listen, want string }{
		{"127.0.0.1:api", "numeric port"},
		{"127.0.0.1", "must be host:port"},
		{"127.0.0.1:70000", "[0, 65535]"},
		{"127.0.0.1:1883", "the embedded broker's default address"},
	} {
		var out, errb bytes.Buffer
		code := run(context.Background(), []string{"run", "-c", p, "--listen", c.listen}, &out, &errb)
		if code != 2 || !strings.Contains(errb.String(), "--listen") || !strings.Contains(errb.String(), c.want) {
			t.Errorf("--listen %s: exit %d, want 2 naming --listen and %q; stderr:\n%s", c.listen, code, c.want, errb.String())
		}
	}
}
