package stream_test

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/stream"
)

// The windows and timers of TestWindowsAndTimersAcrossRescaleOneThreeTwo
// on the bolt backend, stopped with a savepoint at parallelism 2, resumed
// at 3, stopped again and resumed at 1: sessions, sliding windows within
// their allowed lateness, their late-data side outputs and event-time
// timers commit what the run without the stops commits.
func TestWindowsAndTimersAcrossRescaleTwoThreeOneOnBolt(t *testing.T) {
	all := rescaleRecords(100)
	cfg := checkpointConfig(t, snapshot.ExactlyOnce)
	cfg.Interval = time.Hour
	refOut := t.TempDir()
	l := newGate()
	l.allow(len(all))
	var read atomic.Int64
	if err := execute(t, windowsRescaleJob(all, l, &read, refOut, stream.WithParallelism(1), stream.WithCheckpointing(cfg))); err != nil {
		t.Fatal(err)
	}
	want := committedLines(t, refOut)
	slices.Sort(want)
	n := len(all)
	for _, stops := range [][2]int{{n / 5, n / 2}, {n / 3, n * 3 / 4}, {n / 2, n * 2 / 3}, {10, n - 5}} {
		out := t.TempDir()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		sp := ""
		for i, p := range []int{2, 3, 1} {
			l := newGate()
			var read atomic.Int64
			cfg.Dir = t.TempDir()
			opts := []stream.Option{stream.WithParallelism(p), stream.WithCheckpointing(cfg), stream.WithBoltStateBackend(t.TempDir())}
			if sp != "" {
				opts = append(opts, stream.WithSavepoint(sp, false))
			}
			job, err := windowsRescaleJob(all, l, &read, out, opts...).ExecuteAsync(ctx)
			if err != nil {
				cancel()
				t.Fatal(err)
			}
			if i == 2 {
				l.allow(n)
				if err := job.Wait(); err != nil {
					t.Fatal(err)
				}
				break
			}
			l.allow(stops[i])
			testutil.Eventually(t, 30*time.Second, fmt.Sprintf("%d records read at parallelism %d", stops[i], p), func() bool { return read.Load() >= int64(stops[i]) })
			if sp, err = job.StopWithSavepoint(ctx, ""); err != nil {
				t.Fatal(err)
			}
			if err := job.Wait(); err != nil {
				t.Fatal(err)
			}
		}
		cancel()
		got := committedLines(t, out)
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("stopped after %v records, 2 then 3, resumed at 1 (bolt):\n%s", stops, diffLines(got, want))
		}
	}
}
