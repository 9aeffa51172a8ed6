package stream_test

import (
	"context"
	"maps"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/cluster"
	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/stream"
)

// gapMeter samples the records-in counters of count-sum's subtasks every
// millisecond and keeps, per subtask, the longest time its counter did
// not move while armed.
type gapMeter struct {
	job *stream.Job
	mu  sync.Mutex // guards the fields below
	on  bool
	// last change of each subtask's counter, its value, and the longest
	// gap while on.
	at   map[int]time.Time
	val  map[int]int64
	gaps map[int]time.Duration
}

func (g *gapMeter) run(stop <-chan struct{}) {
	tk := time.NewTicker(time.Millisecond)
	defer tk.Stop()
	for {
		select {
		case <-stop:
			return
		case now := <-tk.C:
			ms := g.job.Metrics()
			g.mu.Lock()
			for sub := range 2 {
				v, ok := recordsIn(ms, sub)
				if ok && v != g.val[sub] {
					g.val[sub] = v
					g.at[sub] = now
					continue
				}
				if g.on {
					g.gaps[sub] = max(g.gaps[sub], now.Sub(g.at[sub]))
				}
			}
			g.mu.Unlock()
		}
	}
}

// measure arms the meter around f and returns each subtask's longest gap.
func (g *gapMeter) measure(f func()) map[int]time.Duration {
	g.mu.Lock()
	g.on, g.gaps = true, map[int]time.Duration{}
	now := time.Now()
	for sub := range 2 {
		g.at[sub] = now
	}
	g.mu.Unlock()
	f()
	// Until the counters move again after f.
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		g.mu.Lock()
		moved := g.at[0].After(now) && g.at[1].After(now)
		g.mu.Unlock()
		if moved {
			break
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond)
	g.mu.Lock()
	defer g.mu.Unlock()
	g.on = false
	return maps.Clone(g.gaps)
}

// BenchmarkHandoverPause moves count-sum[0] between two nodes of a
// 3-node in-memory cluster while the job runs, and, in the same run,
// redeploys the whole job from a savepoint (the path a rebalance took
// before handovers). It reports the longest time each subtask's
// records-in counter stood still: the moved subtask's and the other
// one's during a handover, and the job's during a full redeploy, with
// the ratio; idle-gap-ms is the longest gap over 100 ms with nothing
// going on (the gaps between batches), for scale.
//
//	go test ./stream -run '^$' -bench BenchmarkHandoverPause -benchtime 5x
func BenchmarkHandoverPause(b *testing.B) {
	const keys = 2000
	c := memoryCluster(b, 3, 1, cluster.Faults{})
	cp := snapshot.DefaultConfig()
	cp.Dir = b.TempDir()
	cp.Interval = time.Hour
	var seen atomic.Int64
	env := handoverJob(1<<40, keys, 100_000, b.TempDir(), &seen, nil,
		stream.WithCheckpointing(cp),
		stream.WithRestartStrategy(&snapshot.FixedDelay{Attempts: 1 << 20}),
		stream.WithCredits(64),
		stream.WithCluster(c.Cluster))
	c.spread(b, env)
	nodes := []string{c.Placement[actors.TaskKey{UID: "count-sum", Subtask: 0}]}
	for _, n := range c.Nodes {
		if n.ID != nodes[0] && n.ID != c.Placement[actors.TaskKey{UID: "count-sum", Subtask: 1}] {
			nodes = append(nodes, n.ID)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	job, err := env.ExecuteAsync(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		cancel()
		_ = job.Wait()
		// Messages to the stopped tasks of the redeployed attempts went
		// to protoactor's dead letters, whose throttle goroutines end a
		// moment later.
		testutil.Eventually(b, 10*time.Second, "the dead-letter throttles ended", func() bool {
			buf := make([]byte, 1<<20)
			return !strings.Contains(string(buf[:runtime.Stack(buf, true)]), "NewDeadLetter.NewThrottle")
		})
	}()
	for seen.Load() < 50_000 {
		time.Sleep(time.Millisecond)
	}
	g := &gapMeter{job: job, at: map[int]time.Time{}, val: map[int]int64{}}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { defer close(done); g.run(stop) }()
	defer func() { close(stop); <-done }()

	var idle, moved, others, full []time.Duration
	at := 0
	b.ResetTimer()
	for b.Loop() {
		to := nodes[1-at]
		// The gaps between batches with nothing going on, for scale.
		gaps := g.measure(func() { time.Sleep(100 * time.Millisecond) })
		idle = append(idle, max(gaps[0], gaps[1]))
		gaps = g.measure(func() {
			res, err := job.Execution().Move(ctx, []actors.Move{{UID: "count-sum", Subtask: 0, To: to}})
			if err != nil {
				b.Fatal(err)
			}
			_ = res
		})
		at = 1 - at
		moved = append(moved, gaps[0])
		others = append(others, gaps[1])
		gaps = g.measure(func() {
			if _, err := job.TriggerSavepoint(ctx, ""); err != nil {
				b.Fatal(err)
			}
			old, _ := job.Execution().Runner()
			job.Execution().Redeploy("benchmark")
			for {
				r, changed := job.Execution().Runner()
				if r != nil && r != old {
					<-r.Started()
					break
				}
				<-changed
			}
		})
		full = append(full, max(gaps[0], gaps[1]))
	}
	b.StopTimer()
	med := func(ds []time.Duration) float64 {
		s := slices.Clone(ds)
		slices.Sort(s)
		return float64(s[len(s)/2].Microseconds()) / 1000
	}
	b.ReportMetric(med(idle), "idle-gap-ms")
	b.ReportMetric(med(moved), "moved-pause-ms")
	b.ReportMetric(med(others), "others-pause-ms")
	b.ReportMetric(med(full), "redeploy-pause-ms")
	if m := med(moved); m > 0 {
		b.ReportMetric(med(full)/m, "redeploy/moved")
	}
}
