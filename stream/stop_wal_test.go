package stream_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/cluster"
	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/keygroup"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/stream"
	"github.com/edgedio/edged/watermark"
)

// walRateJob is walJob over a generator limited to rate records per
// second (0: no limit), counting the results that reach the sink in
// emitted.
func walRateJob(n int64, keys int, rate float64, p *published, emitted *atomic.Int64, opts ...stream.Option) *stream.Environment {
	env := stream.NewEnvironment("wal-stop", opts...)
	src := stream.FromSource(env, "generator", func() operators.Source[operators.SensorReading] {
		return operators.SensorGenerator(operators.GeneratorConfig{Count: n, Keys: keys, Rate: rate})
	}).SetParallelism(1).UID("generator").
		AssignTimestampsAndWatermarks("timestamps", watermark.ForMonotonous(eventTime))
	w := stream.Window(stream.KeyBy(src, bySensor), operators.TumblingEventTimeWindows(10*time.Second))
	res := stream.WindowAggregate(w, "count-sum", countSumWin{}).UID("count-sum")
	res = stream.Map(res, "count", func(r operators.WindowResult[string, countSum]) (operators.WindowResult[string, countSum], error) {
		emitted.Add(1)
		return r, nil
	}).UID("count")
	res.To("publish", func() operators.Sink[operators.WindowResult[string, countSum]] {
		return p.sink()
	}).UID("publish")
	return env
}

// walResults returns, sorted, the ids a walRateJob of n readings of keys
// sensors publishes when it runs uninterrupted.
func walResults(t *testing.T, n int64, keys int) []string {
	t.Helper()
	var ref published
	if err := execute(t, walRateJob(n, keys, 0, &ref, new(atomic.Int64), stream.WithParallelism(2),
		stream.WithCheckpointing(checkpointConfig(t, snapshot.ExactlyOnce)))); err != nil {
		t.Fatal(err)
	}
	want, _ := ref.take()
	slices.Sort(want)
	return want
}

// stopHolding runs env, a walRateJob publishing to p and counting in
// emitted, until results were published and 300 more reached the sink
// (held for the savepoint), then stops it with a savepoint and returns
// the savepoint's path.
func stopHolding(t *testing.T, name string, env *stream.Environment, p *published, emitted *atomic.Int64) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	job := runHolding(t, ctx, env, p, emitted)
	sp, err := job.StopWithSavepoint(ctx, "")
	if err != nil {
		t.Fatalf("%s: stop: %v", name, err)
	}
	if err := job.Wait(); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return sp
}

// runHolding starts env, a walRateJob publishing to p and counting in
// emitted, and returns it once results were published and 300 more
// reached the sink (held for the next checkpoint).
func runHolding(t *testing.T, ctx context.Context, env *stream.Environment, p *published, emitted *atomic.Int64) *stream.Job {
	t.Helper()
	job, err := env.ExecuteAsync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	waitHolding(t, p, emitted)
	return job
}

// waitHolding waits until results were published to p and 300 more
// reached the sink (counted in emitted), held for the next checkpoint.
func waitHolding(t *testing.T, p *published, emitted *atomic.Int64) {
	t.Helper()
	testutil.Eventually(t, testutil.DefaultTimeout, "results published", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.ids) > 0
	})
	held := emitted.Load() + 300
	testutil.Eventually(t, testutil.DefaultTimeout, "results held", func() bool { return emitted.Load() >= held })
}

// A job whose results go to a write-ahead sink (the MQTT sink's kind),
// stopped with a savepoint midway and resumed from it, at the same and at
// other parallelisms, publishes every result exactly once over both runs:
// the savepoint is marked committed once every sink published what it
// held, and the resumed run's sinks publish none of that again. Without
// the mark (removed here, as a process that died before writing it leaves
// the savepoint) the resumed run publishes the savepoint's held results
// again, under the same ids; before the mark that was every resume.
func TestStopWithSavepointWriteAheadPublishesOnce(t *testing.T) {
	const n, keys = 40_000, 50
	want := walResults(t, n, keys)
	testutil.Burn(t, 2)
	midway, repeated := 0, 0
	for i, p2 := range []int{2, 3, 1, 2, 3, 1} {
		unmarked := i >= 3
		name := fmt.Sprintf("run %d (resumed at parallelism %d, mark removed %v)", i, p2, unmarked)
		cfg := checkpointConfig(t, snapshot.ExactlyOnce)
		// The run's first checkpoint (brought forward by the first
		// result) is its only one: the savepoint holds every result since.
		cfg.Interval = time.Hour
		var p published
		emitted := new(atomic.Int64)
		sp := stopHolding(t, name, walRateJob(n, keys, 10_000, &p, emitted, stream.WithParallelism(2), stream.WithCheckpointing(cfg)), &p, emitted)
		md, err := snapshot.Load(sp)
		if err != nil {
			t.Fatal(err)
		}
		if !md.Committed {
			t.Fatalf("%s: the stop-with-savepoint %s is not marked committed", name, sp)
		}
		if unmarked {
			if err := os.Remove(filepath.Join(sp, snapshot.CommittedFile)); err != nil {
				t.Fatal(err)
			}
		}
		first, _ := p.take()
		if len(first) < len(want) {
			midway++
		}
		if err := execute(t, walRateJob(n, keys, 0, &p, new(atomic.Int64), stream.WithParallelism(p2), stream.WithCheckpointing(cfg),
			stream.WithSavepoint(sp, false))); err != nil {
			t.Fatalf("%s: resume: %v", name, err)
		}
		second, _ := p.take()
		got := slices.Sorted(slices.Values(append(first, second...)))
		seen := map[string]int{}
		for _, id := range got {
			seen[id]++
		}
		if !slices.Equal(slices.Compact(slices.Clone(got)), want) {
			t.Fatalf("%s: published %d distinct results, want the %d of an uninterrupted run", name, len(slices.Compact(slices.Clone(got))), len(want))
		}
		dups := len(got) - len(want)
		t.Logf("%s: first %d, second %d, want %d", name, len(first), len(second), len(want))
		switch {
		case !unmarked && dups > 0:
			t.Fatalf("%s: %d results published twice across the stop and the resume", name, dups)
		case unmarked && dups > 0:
			repeated++
		}
	}
	if midway == 0 {
		t.Fatal("no stop came before the end of the input")
	}
	if repeated == 0 {
		t.Fatal("no savepoint without the mark held results to publish again: the check of the mark was not reached")
	}
}

// A write-ahead sink that publishes in the background (the MQTT sink's
// kind), whose broker refuses every publish from the moment the job is
// stopped with a savepoint: the stop must not count as committed, since
// the results held for the savepoint never went out. It fails (the
// sink's wait for its publish reports the refusal), the savepoint is not
// marked, and the job resumed from its latest snapshot with the broker
// back publishes every result. Were the savepoint marked as soon as the
// sinks were told of its completion, the resumed run would publish
// nothing it held: those results would be lost.
func TestStopWithSavepointBackgroundPublishCommitsFirst(t *testing.T) {
	const n, keys = 40_000, 50
	want := walResults(t, n, keys)
	cfg := checkpointConfig(t, snapshot.ExactlyOnce)
	cfg.Interval = time.Hour
	p := &published{background: true}
	emitted := new(atomic.Int64)
	env := walRateJob(n, keys, 10_000, p, emitted, stream.WithParallelism(2), stream.WithCheckpointing(cfg))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	job := runHolding(t, ctx, env, p, emitted)
	p.setDown(true)
	sp, serr := job.StopWithSavepoint(ctx, "")
	werr := job.Wait()
	if serr == nil {
		md, err := snapshot.Load(sp)
		if err != nil {
			t.Fatal(err)
		}
		if md.Committed {
			t.Fatalf("the stop-with-savepoint %s returned and is marked committed while the broker refused every publish of the results it held (job: %v)", sp, werr)
		}
	}
	if werr == nil || !strings.Contains(werr.Error(), "broker down") {
		t.Fatalf("job after a stop whose publish was refused: %v, want the refusal", werr)
	}
	first, _ := p.take()
	if len(first) >= len(want) {
		t.Fatal("the input ended before the stop")
	}
	p.setDown(false)
	md, err := actors.ResumePoint(cfg.Dir, "wal-stop", keygroup.DefaultMaxParallelism, false, true, nil)
	if err != nil || md == nil {
		t.Fatalf("resume point: %v %v", md, err)
	}
	if err := execute(t, walRateJob(n, keys, 0, p, new(atomic.Int64), stream.WithParallelism(2), stream.WithCheckpointing(cfg),
		stream.WithSavepoint(md.Dir, false))); err != nil {
		t.Fatalf("resume: %v", err)
	}
	second, _ := p.take()
	got := slices.Compact(slices.Sorted(slices.Values(append(first, second...))))
	if !slices.Equal(got, want) {
		t.Fatalf("published %d distinct results over the stop (%d) and the resume (%d); want the %d of an uninterrupted run",
			len(got), len(first), len(second), len(want))
	}
}

// The same across nodes: a job on 2 nodes, its write-ahead sink subtasks
// on both, stopped with a savepoint and resumed on 3 nodes at parallelism
// 3, publishes every result once over both runs: the mark on the job
// master's savepoint travels with the deployment to the hosts of the
// other nodes.
func TestMultiNodeStopWithSavepointWriteAheadPublishesOnce(t *testing.T) {
	const n, keys = 40_000, 50
	want := walResults(t, n, keys)
	cfg := checkpointConfig(t, snapshot.ExactlyOnce)
	cfg.Interval = time.Hour
	var p published
	emitted := new(atomic.Int64)
	two := memoryCluster(t, 2, 1, cluster.Faults{})
	env := walRateJob(n, keys, 10_000, &p, emitted, stream.WithParallelism(2), stream.WithCheckpointing(cfg), stream.WithCluster(two.Cluster))
	two.spread(t, env)
	sp := stopHolding(t, "on 2 nodes", env, &p, emitted)
	first, _ := p.take()
	if len(first) >= len(want) {
		t.Fatal("the input ended before the stop")
	}
	three := memoryCluster(t, 3, 1, cluster.Faults{})
	resumed := walRateJob(n, keys, 0, &p, new(atomic.Int64), stream.WithParallelism(3), stream.WithCheckpointing(cfg),
		stream.WithSavepoint(sp, false), stream.WithCluster(three.Cluster))
	three.spread(t, resumed)
	if err := execute(t, resumed); err != nil {
		t.Fatal(err)
	}
	second, _ := p.take()
	got := slices.Sorted(slices.Values(append(first, second...)))
	if !slices.Equal(got, want) {
		t.Fatalf("published %d results over the stop and the resume on other nodes (%d before the stop), want the %d of an uninterrupted run once each",
			len(got), len(first), len(want))
	}
}
