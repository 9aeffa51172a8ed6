package stream_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/stream"
)

// corruptOp fails once, after two checkpoints completed, and first damages
// the state files of the latest one.
type corruptOp struct {
	operators.Base
	dir     string
	done    *atomic.Bool
	out     operators.Collector[operators.SensorReading]
	last    int64
	count   int
	subtask int
	broke   *atomic.Int64
}

func (o *corruptOp) Open(ctx *operators.Context) error { o.subtask = ctx.Subtask; return nil }

func (o *corruptOp) NotifyCheckpointComplete(id int64) error {
	o.count++
	o.last = id
	return nil
}
func (o *corruptOp) NotifyCheckpointAborted(int64) error { return nil }

func (o *corruptOp) Collect(r operators.SensorReading) {
	if o.subtask == 0 && o.count >= 2 && o.done.CompareAndSwap(false, true) {
		files, _ := filepath.Glob(filepath.Join(o.dir, "checkpoints", fmt.Sprintf("chk-%d", o.last), "*.state"))
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil || len(b) == 0 {
				continue
			}
			b[len(b)/2] ^= 0xff
			os.WriteFile(f, b, 0o644)
		}
		o.broke.Store(o.last)
		panic("injected failure after corrupting the latest checkpoint")
	}
	o.out.Collect(r)
}

// A damaged latest checkpoint is detected and skipped: the restart
// restores the one before, and nothing is lost.
func TestCorruptLatestCheckpointFallsBack(t *testing.T) {
	const n, keys = 600_000, 100
	cfg := checkpointConfig(t, snapshot.ExactlyOnce)
	cfg.Retain = 2
	cfg.MaxConcurrent = 1
	var done atomic.Bool
	var broke atomic.Int64
	env := stream.NewEnvironment("exactly-once", stream.WithParallelism(2),
		stream.WithCheckpointing(cfg), stream.WithRestartStrategy(&snapshot.FixedDelay{Attempts: 2}))
	// At a fixed rate, so that the job lives through several checkpoints.
	src := stream.FromSource(env, "generator", func() operators.Source[operators.SensorReading] {
		return operators.SensorGenerator(operators.GeneratorConfig{Count: n, Keys: keys, Rate: 600_000})
	}).SetParallelism(1).UID("generator")
	mapped := stream.Transform(src.Rebalance(), "corrupt", func(c operators.Collector[operators.SensorReading]) operators.OneInput[operators.SensorReading] {
		return &corruptOp{dir: cfg.Dir, done: &done, out: c, broke: &broke}
	})
	agg := stream.Aggregate(stream.KeyBy(mapped, bySensor), "count-sum", countSumAgg{}).UID("count-sum")
	last := newLastPerKey(func(c countSum) string { return c.ID }, false)
	agg.ForEach("last", last.add)
	job, err := env.ExecuteAsync(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := job.Wait(); err != nil {
		t.Fatal(err)
	}
	// The damaged checkpoint is never restored: usually the one before it
	// is; a checkpoint that completed between the damage and the failure
	// (its acknowledgements were in) is newer and intact.
	r := job.Restores()
	if len(r) != 1 || int64(r[0]) == broke.Load() {
		t.Fatalf("restored %v after damaging checkpoint %d: want one restore of another checkpoint", r, broke.Load())
	}
	t.Logf("damaged checkpoint %d, restored %d", broke.Load(), r[0])
	// The state restored from the older checkpoint is consistent with the
	// source position restored with it: every sensor ends with its exact
	// count and sum.
	for k, w := range expected(n, keys) {
		if got := last.last[k]; got != w {
			t.Fatalf("%s: got %+v, want %+v", k, got, w)
		}
	}
}
