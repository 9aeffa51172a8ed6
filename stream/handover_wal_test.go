package stream_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/cluster"
	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/stream"
)

// The lines a write-ahead sink logs as it is restored from a snapshot
// that holds results: not published again (the snapshot is committed),
// or published again.
const (
	walRestoredCommitted = "restored from a snapshot every sink committed; the results it held are not published again"
	walPublishedAgain    = "publishing again the results the restored checkpoint held"
	// What a retired subtask logs when its sinks did not deliver what
	// the handover's savepoint holds.
	walRetireGaveUp = "the handed-over subtask's sinks did not deliver what its savepoint holds"
)

// A keyed subtask whose chain ends in a write-ahead sink (the MQTT sink's
// kind) is handed over to another node while its sink holds results for
// the handover's savepoint (checkpoints are an hour apart: it holds every
// result since the first one). The old instance publishes them when the
// savepoint completes, and the new instance, restored from the savepoint
// as committed, publishes none of them again: every result goes out once,
// whether the sink publishes in the background or not, and whether the
// nodes run in the job master's process or in others (the retire's answer
// and the mark cross the control channels). Before, the new instance
// restored the savepoint as not committed and published what its sink
// held again, under the same ids. When the broker refuses the old
// instance's publish during the retire, or stalls it longer than the
// retire waits (half the control timeout), the new instance publishes
// those results again: none is lost.
func TestHandoverPublishesTheMovedSinksResultsOnce(t *testing.T) {
	const n, keys = 40_000, 50
	want := walResults(t, n, keys)
	// With workers, count-sum[0] moves from a worker to the master's node
	// (the retire crosses the control channels), or from the master's
	// node to a worker (the adopt does, with the mark).
	type broker int
	const (
		up broker = iota
		down
		stalled
	)
	for _, tc := range []struct {
		workers, toWorker, background bool
		atRetire                      broker
	}{
		{false, false, false, up},
		{false, false, true, up},
		{true, false, false, up},
		{true, false, true, up},
		{true, true, false, up},
		{true, true, true, up},
		{false, false, true, down},
		{true, false, true, down},
		{true, true, true, down},
		{false, false, true, stalled},
		{true, true, true, stalled},
	} {
		name := fmt.Sprintf("workers=%v/to_worker=%v/background=%v/broker_at_retire=%v", tc.workers, tc.toWorker, tc.background,
			[]string{"up", "down", "stalled"}[tc.atRetire])
		t.Run(name, func(t *testing.T) {
			// Each case's generator is paced (10,000 readings a second, 4 s
			// a run) and its nodes are its own: the cases run side by side.
			t.Parallel()
			p := &published{background: tc.background}
			// A stalled publish ends once the retire stopped waiting for it
			// (as a publish to a hung broker times out).
			var stall atomic.Bool
			var stalls atomic.Int64
			logs := &testutil.Buffer{}
			p.gate = func() {
				if stall.Load() {
					stalls.Add(1)
					testutil.Within(testutil.DefaultTimeout, func() bool { return strings.Contains(logs.String(), walRetireGaveUp) })
				}
			}
			cfg := checkpointConfig(t, snapshot.ExactlyOnce)
			cfg.Interval = time.Hour
			c := memoryCluster(t, 3, 1, cluster.Faults{})
			c.ControlTimeout = 4 * time.Second
			// The broker refuses or stalls from before the move (the
			// handover's savepoint is the only checkpoint meanwhile) until
			// the new instance is restored.
			c.HandoverHook = func(step actors.HandoverStep, _ string) error {
				if step == actors.HandoverRestore {
					p.setDown(false)
					stall.Store(false)
				}
				return nil
			}
			emitted := new(atomic.Int64)
			build := func() *stream.Environment {
				return walRateJob(n, keys, 10_000, p, emitted, stream.WithParallelism(2), stream.WithCheckpointing(cfg),
					stream.WithCluster(c.Cluster), stream.WithLogger(slog.New(slog.NewTextHandler(logs, nil))))
			}
			files := &masterFiles{}
			if tc.workers {
				workerCluster(t, c, files, build)
			}
			env := build()
			c.spread(t, env)
			from, to := "node-1", "node-0"
			if tc.toWorker {
				from, to = to, from
			}
			c.Placement[actors.TaskKey{UID: "count-sum", Subtask: 0}] = from
			c.Placement[actors.TaskKey{UID: "count-sum", Subtask: 1}] = "node-2"
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			job, err := env.ExecuteAsync(ctx)
			if err != nil {
				t.Fatal(err)
			}
			files.job.Store(job)
			waitHolding(t, p, emitted)
			switch tc.atRetire {
			case down:
				p.setDown(true)
			case stalled:
				stall.Store(true)
			}
			res, err := job.Execution().Move(ctx, []actors.Move{{UID: "count-sum", Subtask: 0, To: to}})
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Moved) != 1 || res.Moved[0].From != from || res.Moved[0].To != to {
				t.Fatalf("moved %+v, want count-sum[0] from %s to %s", res.Moved, from, to)
			}
			if err := job.Wait(); err != nil {
				t.Fatal(err)
			}
			if job.Attempts() != 1 {
				t.Fatalf("%d attempts: the job restarted", job.Attempts())
			}
			ids, _ := p.take()
			got := slices.Sorted(slices.Values(ids))
			distinct := slices.Compact(slices.Clone(got))
			if !slices.Equal(distinct, want) {
				t.Fatalf("published %d distinct results, want the %d of an uninterrupted run", len(distinct), len(want))
			}
			if tc.atRetire == up && len(got) != len(want) {
				t.Fatalf("%d results published twice over the handover", len(got)-len(want))
			}
			restoredLine := walRestoredCommitted
			if tc.atRetire != up {
				restoredLine = walPublishedAgain
				if !strings.Contains(logs.String(), walRetireGaveUp) {
					t.Fatalf("the old node did not log %q", walRetireGaveUp)
				}
			}
			if tc.atRetire == stalled && stalls.Load() == 0 {
				t.Fatal("no publish stalled during the retire")
			}
			var lines []string
			for _, l := range strings.Split(logs.String(), "\n") {
				if strings.Contains(l, restoredLine) && strings.Contains(l, "publish") {
					lines = append(lines, l)
				}
			}
			if len(lines) != 1 {
				t.Fatalf("%d lines %q of the new instance's sink, want 1: the sink held no results at the handover, or the restore did not see them (logs:\n%s)",
					len(lines), restoredLine, logs.String())
			}
			t.Logf("%s; %d results, %d published", lines[0], len(want), len(got))
		})
	}
}
