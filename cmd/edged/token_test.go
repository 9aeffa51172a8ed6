package main

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/edgedio/edged/daemon"
	"github.com/edgedio/edged/pipeline"
)

// Against a node that requires a token, the client commands are refused
// without it and work with --token or $EDGED_TOKEN.
func TestClientToken(t *testing.T) {
	cfg, err := pipeline.Parse([]byte(`
pipelines:
  - name: ticking
    source:
      generator: {count: 0, rate: 200, keys: 4}
    sinks: [{stdout: {}}]
`))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan net.Addr, 1)
	errc := make(chan error, 1)
	go func() {
		errc <- daemon.Run(ctx, cfg, daemon.Options{Listen: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler),
			Token: "t0k", RequireToken: true, Ready: func(a net.Addr) { ready <- a }})
	}()
	defer func() {
		cancel()
		select {
		case <-errc:
		case <-time.After(waitLimit):
			t.Error("Run did not return after cancel")
		}
	}()
	var addr string
	select {
	case a := <-ready:
		addr = a.String()
	case err := <-errc:
		errc <- err
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
	t.Setenv("EDGED_TOKEN", "")
	if out, code := cli("list"); code != 1 || !strings.Contains(out, "401") {
		t.Errorf("list without token: %d\n%s", code, out)
	}
	if out, code := cli("list", "--token", "wrong"); code != 1 || !strings.Contains(out, "401") {
		t.Errorf("list with a wrong token: %d\n%s", code, out)
	}
	if out, code := cli("list", "--token", "t0k"); code != 0 || !strings.Contains(out, "ticking") {
		t.Errorf("list --token: %d\n%s", code, out)
	}
	t.Setenv("EDGED_TOKEN", "t0k")
	if out, code := cli("list"); code != 0 || !strings.Contains(out, "ticking") {
		t.Errorf("list with EDGED_TOKEN: %d\n%s", code, out)
	}
}
