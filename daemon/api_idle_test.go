package daemon_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/edgedio/edged/daemon"
)

// The REST API closes a keep-alive connection that waits for its next
// request longer than Options.IdleTimeout: a client that leaks its
// connections does not keep them open on the node for ever.
func TestAPIClosesIdleKeepAliveConnections(t *testing.T) {
	n := startNode(t, tickingConfig("plain", ""), daemon.Options{IdleTimeout: 200 * time.Millisecond})
	c, err := net.Dial("tcp", n.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "GET /jobs HTTP/1.1\r\nHost: edged\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Close {
		t.Fatalf("GET /jobs: %s, close %v; want 200 on a kept-alive connection", resp.Status, resp.Close)
	}
	// The node closes the idle connection: the read ends with EOF, well
	// before the bound on the wait.
	if err := c.SetReadDeadline(time.Now().Add(waitLimit)); err != nil {
		t.Fatal(err)
	}
	var b [1]byte
	if _, err := br.Read(b[:]); !errors.Is(err, io.EOF) {
		t.Fatalf("read on the idle connection: %v; want EOF (closed by the node)", err)
	}
}
