package stream_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/stream"
)

// keyCount is a key and a count.
type keyCount struct {
	K string
	N int64
}

// lineFileLines reads every line of the line-file sink's part files in
// dir and counts each.
func lineFileLines(t *testing.T, dir string) map[string]int {
	t.Helper()
	parts, err := filepath.Glob(filepath.Join(dir, "part-*"))
	if err != nil {
		t.Fatal(err)
	}
	lines := map[string]int{}
	for _, p := range parts {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		for l := range strings.SplitSeq(strings.TrimSuffix(string(b), "\n"), "\n") {
			if l != "" {
				lines[l]++
			}
		}
	}
	return lines
}

// The line-file sink is at-least-once across restarts: a job that fails
// after checkpoints completed and restarts from one keeps in its part
// files every line written before the failure, and the replay adds the
// lines after the restored checkpoint. Before, each restarted attempt
// truncated its subtask's part file at Open, so the lines of the records
// before the restored checkpoint, which the replay does not emit again,
// were gone (thousands of the 20,000 results in no part file).
func TestLineFileSinkKeepsItsLinesAcrossRestarts(t *testing.T) {
	const n, keys = 20_000, 100
	all := make([]operators.SensorReading, n)
	for i := range all {
		all[i] = operators.SensorReading{ID: fmt.Sprintf("sensor_%d", i%keys), Timestamp: int64(i)}
	}
	dir := t.TempDir()
	fail := newFailer(1)
	g := newGate()
	var read atomic.Int64
	env := stream.NewEnvironment("line-file",
		stream.WithParallelism(2),
		stream.WithCheckpointing(checkpointConfig(t, snapshot.ExactlyOnce)),
		stream.WithRestartStrategy(&snapshot.FixedDelay{Attempts: 3}))
	src := stream.FromSource(env, "readings", func() operators.Source[operators.SensorReading] {
		return &gatedSource[operators.SensorReading]{all: all, gate: g, read: &read}
	}).SetParallelism(1).UID("readings")
	mapped := stream.Transform(src.Rebalance(), "maybe-fail", func(out operators.Collector[operators.SensorReading]) operators.OneInput[operators.SensorReading] {
		return &failOp{f: fail, out: out}
	})
	counts := stream.Map(mapped, "one", func(r operators.SensorReading) (keyCount, error) { return keyCount{K: r.ID, N: 1}, nil })
	stream.KeyBy(counts, func(x keyCount) string { return x.K }).
		Reduce("count", func(acc, v keyCount) (keyCount, error) { return keyCount{K: acc.K, N: acc.N + v.N}, nil }).UID("count").
		To("lines", func() operators.Sink[keyCount] {
			return operators.NewLineFileSink(dir, func(x keyCount) string { return fmt.Sprintf("%s %d", x.K, x.N) })
		}).UID("lines")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	job, err := env.ExecuteAsync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Half the input, then checkpoints that cover it; the rest of the
	// input fails the job once.
	g.allow(n / 2)
	testutil.Eventually(t, 30*time.Second, "half the input read", func() bool { return read.Load() >= n/2 })
	testutil.Eventually(t, 30*time.Second, "three checkpoints after it", func() bool {
		done := 0
		for _, s := range job.History() {
			if s.Status == snapshot.Completed {
				done++
			}
		}
		return done >= 3
	})
	g.allow(n)
	if err := job.Wait(); err != nil {
		t.Fatal(err)
	}
	if fail.fired.Load() != 1 || len(job.Restores()) != 1 || job.Restores()[0] == 0 {
		t.Fatalf("%d failures, restores %v: want one failure and a restore of a checkpoint", fail.fired.Load(), job.Restores())
	}
	lines := lineFileLines(t, dir)
	missing := 0
	for k := range keys {
		for c := 1; c <= n/keys; c++ {
			if lines[fmt.Sprintf("sensor_%d %d", k, c)] == 0 {
				missing++
			}
		}
	}
	if missing > 0 {
		t.Errorf("after a restore of checkpoint %d, %d of %d results are in no part file", job.Restores()[0], missing, n)
	}
	// The flush at the barrier keeps no state: the sink is in no
	// checkpoint (a job resumed without it needs no allowNonRestored).
	checked := 0
	for _, s := range job.History() {
		if _, err := os.Stat(s.Path); s.Status != snapshot.Completed || err != nil {
			continue // failed, or pruned since
		}
		md, err := snapshot.Load(s.Path)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := md.Operator("lines"); ok {
			t.Fatalf("checkpoint %d holds the line-file sink", s.Checkpoint)
		}
		if _, ok := md.Operator("count"); !ok {
			t.Fatalf("checkpoint %d lacks the reduce's state", s.Checkpoint)
		}
		checked++
	}
	if checked == 0 {
		t.Fatal("no completed checkpoint in the history")
	}
}
