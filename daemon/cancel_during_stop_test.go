package daemon_test

import (
	"errors"
	"fmt"
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

// A job cancelled while its stop waits for the MQTT sink's broker (down:
// its stop savepoint completed, its results not yet published) answers
// the stop with 409 naming that savepoint and saying it is not marked
// committed, not that the job was cancelled before the savepoint
// completed: the savepoint is whole, and a job resumed from it publishes
// the results it holds again.
func TestCancelWhileTheStopWaitsForTheSinkBroker(t *testing.T) {
	dir := t.TempDir()
	src := externalBroker(t)
	down := testutil.FreeAddr(t) // nothing listens: the sinks' broker is down
	// The first pipeline reading an external broker names the node's
	// sink broker.
	cfg := `
node:
  data_dir: ` + filepath.Join(dir, "data") + `
pipelines:
  - name: other
    source:
      mqtt:
        broker: tcp://` + down + `
        topics: [other/+]
        format: json
        fields:
          id: {type: string, path: $.id}
    sinks: [{file: {dir: ` + filepath.Join(dir, "other-out") + `}}]
  - name: plant
    source:
      mqtt:
        broker: ` + src + `
        topics: [sensors/+]
        format: json
        fields:
          id: {type: string, path: $.id}
          ts: {type: time, path: $.ts, unit: ms}
    event_time: {field: ts, max_out_of_orderness: 0ms}
    key: id
    window:
      type: tumbling
      size: 1s
      aggregates: [{name: count, fn: count}]
    sinks:
      - mqtt: {topic: "agg/{id}"}
    checkpoint:
      interval: 100ms
      dir: ` + filepath.Join(dir, "cp") + "\n"
	n := startNode(t, cfg, daemon.Options{})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("node log:\n%s", n.logs.String())
		}
	})
	ctx := ctxT(t)
	testutil.Eventually(t, waitLimit, "plant subscribed", func() bool {
		return strings.Contains(n.logs.String(), `msg="mqtt subscriber subscribed" pipeline=plant`)
	})
	dev := mqttClient(t, src, "dev")
	for i := range 300 {
		tok := dev.Publish("sensors/a", 1, false, fmt.Sprintf(`{"id":"a","ts":%d}`, i*10))
		if !tok.WaitTimeout(waitLimit) || tok.Error() != nil {
			t.Fatalf("publish %d: %v", i, tok.Error())
		}
	}
	testutil.Eventually(t, waitLimit, "the sink failing to publish", func() bool {
		return strings.Contains(n.logs.String(), "publish failed; the results stay held")
	})
	stopc := make(chan error, 1)
	go func() {
		_, err := n.client.Stop(ctx, "plant", "")
		stopc <- err
	}()
	testutil.Eventually(t, waitLimit, "the stop waiting for the sink's broker", func() bool {
		return strings.Contains(n.logs.String(), "waiting for it")
	})
	if _, err := n.client.Cancel(ctx, "plant"); err != nil {
		t.Fatalf("cancel: %v", err)
	}
	err := testutil.Receive(t, waitLimit, "the stop's answer", stopc)
	var apiErr *daemon.APIError
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusConflict {
		t.Fatalf("stop cancelled while its sink waits: %v, want 409", err)
	}
	for _, want := range []string{"cancelled after its stop savepoint", "sp-", "not marked committed"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("stop cancelled while its sink waits: %q does not say %q", err, want)
		}
	}
}
