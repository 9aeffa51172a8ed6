package daemon_test

import (
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/edgedio/edged/daemon"
	"github.com/edgedio/edged/internal/testutil"
)

// A node applies node.memory while it runs (the soft limit, the GC
// percentage, batches and credits of its jobs) and puts the runtime's
// settings back when it ends.
func TestRunAppliesNodeMemory(t *testing.T) {
	// The environment would win over node.memory.
	t.Setenv("GOMEMLIMIT", "")
	t.Setenv("GOGC", "")
	prevLimit := debug.SetMemoryLimit(-1)
	prevGC := debug.SetGCPercent(-1)
	debug.SetGCPercent(prevGC)
	n := startNode(t, `
node:
  memory: {limit: 100MiB, gc_percent: 80, batch_size: 7, credits: 3}
pipelines:
  - name: p
    source: {generator: {rate: 200}}
    sinks: [{stdout: {}}]
`, daemon.Options{})
	if got := debug.SetMemoryLimit(-1); got != 100<<20 {
		t.Errorf("memory limit while running = %d, want %d", got, 100<<20)
	}
	gc := debug.SetGCPercent(-1)
	debug.SetGCPercent(gc)
	if gc != 80 {
		t.Errorf("GC percent while running = %d, want 80", gc)
	}
	testutil.Eventually(t, 10*time.Second, "rows from the job", func() bool { return strings.Count(n.out.String(), "\n") >= 20 })
	if l := n.logs.String(); !strings.Contains(l, "batch_size=7 credits=3") {
		t.Errorf("no memory settings logged with batch_size=7 credits=3:\n%s", l)
	}
	n.cancel()
	if err := n.wait(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if got := debug.SetMemoryLimit(-1); got != prevLimit {
		t.Errorf("memory limit after Run = %d, want %d again", got, prevLimit)
	}
	gc = debug.SetGCPercent(-1)
	debug.SetGCPercent(gc)
	if gc != prevGC {
		t.Errorf("GC percent after Run = %d, want %d again", gc, prevGC)
	}
}
