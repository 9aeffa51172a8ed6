package daemon_test

import (
	"errors"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/edgedio/edged/daemon"
	"github.com/edgedio/edged/internal/testutil"
)

// gateWriter blocks every Write until open is closed, and counts the
// writes that wait.
type gateWriter struct {
	open    chan struct{}
	waiting atomic.Int32
	once    sync.Once
}

func (g *gateWriter) Write(p []byte) (int, error) {
	g.waiting.Add(1)
	<-g.open
	return len(p), nil
}

func (g *gateWriter) release() { g.once.Do(func() { close(g.open) }) }

// A job cancelled while a stop-with-savepoint of it is in progress
// answers the stop with 409 (the job is not running: it was cancelled
// before the savepoint completed), not 500 with the runtime's
// "context canceled", and the cancel with the job cancelled.
func TestCancelDuringStopWithSavepointIsAConflict(t *testing.T) {
	dir := t.TempDir()
	gw := &gateWriter{open: make(chan struct{})}
	t.Cleanup(gw.release)
	n := startNode(t, tickingConfig("ticking", filepath.Join(dir, "cp")), daemon.Options{Stdout: gw})
	ctx := ctxT(t)
	// The stdout sink waits in a write: no barrier passes it, so a
	// savepoint stays in progress until the gate opens.
	testutil.Eventually(t, waitLimit, "the stdout sink waits in a write", func() bool { return gw.waiting.Load() > 0 })

	stopc := make(chan error, 1)
	go func() {
		_, err := n.client.Stop(ctx, "ticking", "")
		stopc <- err
	}()
	testutil.Eventually(t, waitLimit, "the stop savepoint is in progress", func() bool {
		cps, err := n.client.Checkpoints(ctx, "ticking")
		if err != nil {
			return false
		}
		for _, c := range cps {
			if c.Kind == "savepoint" && c.Stop && c.Status == "in_progress" {
				return true
			}
		}
		return false
	})

	type cancelled struct {
		s   daemon.Status
		err error
	}
	cancelc := make(chan cancelled, 1)
	go func() {
		s, err := n.client.Cancel(ctx, "ticking")
		cancelc <- cancelled{s, err}
	}()
	err := testutil.Receive(t, waitLimit, "the stop's answer", stopc)
	gw.release()
	var apiErr *daemon.APIError
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusConflict || !strings.Contains(err.Error(), "cancelled") {
		t.Errorf("stop during a cancel: %v, want 409 saying the job was cancelled", err)
	}
	c := testutil.Receive(t, waitLimit, "the cancel's answer", cancelc)
	if c.err != nil || c.s != daemon.StatusCancelled {
		t.Errorf("cancel = %q, %v; want cancelled", c.s, c.err)
	}
}
