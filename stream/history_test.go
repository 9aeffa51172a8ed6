package stream_test

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/stream"
)

// completedCheckpoints returns the ids of the completed checkpoints in h.
func completedCheckpoints(h []snapshot.Stats) []snapshot.ID {
	var ids []snapshot.ID
	for _, s := range h {
		if s.Status == snapshot.Completed && s.Kind == snapshot.KindCheckpoint {
			ids = append(ids, s.Checkpoint)
		}
	}
	return ids
}

// A job's checkpoint history spans its attempts: once a failure restarted
// it, History still lists the checkpoints the earlier attempt completed.
// Before, it held the running attempt's only, so a reader that polls it
// (the daemon, once a second, for edged checkpoints and the checkpoint
// counters of /metrics) never saw what the earlier attempt completed or
// failed after its last look.
func TestHistorySpansAttempts(t *testing.T) {
	fails := new(atomic.Int64) // armed by the test
	env := stream.NewEnvironment("history")
	src := stream.FromSource(env, "generator", func() operators.Source[operators.SensorReading] {
		return operators.SensorGenerator(operators.GeneratorConfig{Count: 10_000_000, Keys: 10, Rate: 20_000})
	}).UID("generator")
	mapped := stream.Transform(src, "fail", func(out operators.Collector[operators.SensorReading]) operators.OneInput[operators.SensorReading] {
		return &failOnce{out: out, fails: fails}
	}).UID("fail")
	mapped.To("discard", func() operators.Sink[operators.SensorReading] {
		return operators.NewSinkFunc(func(operators.SensorReading) error { return nil })
	}).UID("discard")
	cfg := checkpointConfig(t, snapshot.ExactlyOnce)
	cfg.Interval = 100 * time.Millisecond
	stream.WithCheckpointing(cfg)(env)
	stream.WithRestartStrategy(&snapshot.FixedDelay{Attempts: 1})(env)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	job, err := env.ExecuteAsync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var first []snapshot.ID
	testutil.Eventually(t, testutil.DefaultTimeout, "three checkpoints completed by the first attempt", func() bool {
		first = completedCheckpoints(job.History())
		return len(first) >= 3
	})
	fails.Store(1)
	var h []snapshot.ID
	testutil.Eventually(t, testutil.DefaultTimeout, "a checkpoint completed by the second attempt", func() bool {
		h = completedCheckpoints(job.History())
		return job.Attempts() == 2 && len(h) > 0 && h[len(h)-1] > first[len(first)-1]
	})
	for _, id := range first {
		if !slices.Contains(h, id) {
			t.Fatalf("checkpoint %d, completed by the first attempt, is not in the history after the restart: %v", id, h)
		}
	}
	if !slices.IsSorted(h) {
		t.Fatalf("history not in checkpoint order: %v", h)
	}
	cancel()
	_ = job.Wait()
}
