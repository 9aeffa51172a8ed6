package stream_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/stream"
)

// The first record an exactly-once sink holds brings the run's first
// checkpoint forward: with an interval of an hour on a clock that never
// moves, the records are published once that checkpoint completes, and
// no other checkpoint follows. On two nodes the sink runs on the node
// the job master is not on: its report crosses the transport.
func TestFirstHeldOutputIsCommittedWithoutWaitingForTheInterval(t *testing.T) {
	for _, nodes := range []int{1, 2} {
		t.Run(fmt.Sprintf("nodes=%d", nodes), func(t *testing.T) {
			cfg := snapshot.DefaultConfig()
			cfg.Dir = t.TempDir()
			cfg.Interval = time.Hour
			opts := []stream.Option{stream.WithClock(clockwork.NewFakeClock()), stream.WithCheckpointing(cfg)}
			var c *testCluster
			if nodes > 1 {
				c = overMemory(t, nodes)
				opts = append(opts, stream.WithCluster(c.Cluster))
			}
			records := []string{"a", "b", "c"}
			var mu sync.Mutex
			var published []string
			env := stream.NewEnvironment("held", opts...)
			src := stream.FromSource(env, "trickle", func() operators.Source[string] {
				return &trickleSource{records: records}
			}).UID("trickle")
			src.Rebalance().To("wal", func() operators.Sink[string] {
				return operators.NewWriteAheadSink(func(rs []string, _ func(int) string) error {
					mu.Lock()
					defer mu.Unlock()
					published = append(published, rs...)
					return nil
				}, nil)
			}).UID("wal").SetParallelism(1)
			if c != nil {
				// The master runs on the first node; the sink on the other.
				c.Placement = map[actors.TaskKey]string{
					{UID: "trickle", Subtask: 0}: c.Nodes[0].ID,
					{UID: "wal", Subtask: 0}:     c.Nodes[1].ID,
				}
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			job, err := env.ExecuteAsync(ctx)
			if err != nil {
				t.Fatal(err)
			}
			got := func() []string {
				mu.Lock()
				defer mu.Unlock()
				return slices.Sorted(slices.Values(published))
			}
			testutil.Eventually(t, testutil.DefaultTimeout, "the held records are published without the interval passing", func() bool {
				return slices.Equal(got(), records)
			})
			var chk []snapshot.ID
			testutil.Eventually(t, testutil.DefaultTimeout, "checkpoint 1 completed", func() bool {
				chk = chk[:0]
				done := false
				for _, s := range job.History() {
					chk = append(chk, s.Checkpoint)
					done = done || s.Status == snapshot.Completed
				}
				return done
			})
			if !slices.Equal(chk, []snapshot.ID{1}) {
				t.Fatalf("checkpoints %v, want [1]: only the first is brought forward", chk)
			}
			cancel()
			_ = job.Wait()
		})
	}
}
