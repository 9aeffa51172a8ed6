package stream_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/stream"
)

// boundedWant runs the bounded exactly-once job once without checkpoints
// and returns what it committed.
func boundedWant(t *testing.T, n int64, keys int) []string {
	t.Helper()
	dir := t.TempDir()
	if err := execute(t, eoJob(n, keys, dir, nil, stream.WithParallelism(2))); err != nil {
		t.Fatal(err)
	}
	lines := committedLines(t, dir)
	if len(lines) == 0 {
		t.Fatal("the run without checkpoints committed nothing")
	}
	return lines
}

// A bounded job with frequent checkpoints and the two-phase-commit file
// sink ends cleanly under CPU contention, its committed output exactly the
// expected result: no barrier reaches a sink after its last commit.
func TestBoundedJobWithCheckpointsEndsCleanly(t *testing.T) {
	const n, keys = 20_000, 50
	want := boundedWant(t, n, keys)
	testutil.Burn(t, 2)
	for i := range 10 {
		cfg := checkpointConfig(t, snapshot.ExactlyOnce)
		cfg.TolerableFailures = 0
		got := t.TempDir()
		env := eoJob(n, keys, got, nil, stream.WithParallelism(2), stream.WithCheckpointing(cfg))
		if err := execute(t, env); err != nil {
			t.Fatalf("run %d: %v", i, err)
		}
		lines := committedLines(t, got)
		if strings.Join(lines, "\n") != strings.Join(want, "\n") {
			t.Fatalf("run %d: committed %d lines, want %d\n%s", i, len(lines), len(want), diffLines(lines, want))
		}
	}
}

var _ = context.Background
var _ = time.Second
