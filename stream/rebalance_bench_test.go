package stream_test

import (
	"context"
	"io/fs"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/stream"
)

// Shape of the rebalance benchmark's job: rebalKeys keys of rebalPad
// bytes each (about 100 MB of keyed state) over rebalP subtasks.
const (
	rebalKeys = 100_000
	rebalPad  = 1000
	rebalP    = 4
	rebalRate = 40_000 // records per second from the generator
	rebalUID  = "state"
)

// padAcc is one key's state: a count and a pad that makes the state
// sizeable.
type padAcc struct {
	Count int64
	Pad   string
}

// padAgg keeps a padAcc per key and counts every record it folds in
// total (all subtasks, all jobs of a run).
type padAgg struct{ total *atomic.Int64 }

func (padAgg) CreateAccumulator() padAcc {
	return padAcc{Pad: string(make([]byte, rebalPad))}
}

func (a padAgg) Add(_ operators.SensorReading, acc padAcc) padAcc {
	a.total.Add(1)
	acc.Count++
	return acc
}

func (padAgg) Result(acc padAcc) int64 { return acc.Count }

// rebalJob is generator (paced, 1 subtask) -> key by sensor -> rolling
// aggregate with padded state (rebalP subtasks) -> discarding sink,
// chained to the aggregate.
func rebalJob(total *atomic.Int64, opts ...stream.Option) *stream.Environment {
	env := stream.NewEnvironment("rebalance", append([]stream.Option{
		stream.WithParallelism(rebalP),
		stream.WithSerializedKeyBy(true),
		stream.WithCredits(256),
		stream.WithBatchSize(64),
	}, opts...)...)
	src := stream.FromSource(env, "generator", func() operators.Source[operators.SensorReading] {
		return operators.SensorGenerator(operators.GeneratorConfig{Count: 1 << 50, Keys: rebalKeys, Rate: rebalRate})
	}).SetParallelism(1).UID("generator")
	stream.Aggregate(stream.KeyBy(src, bySensor), rebalUID, padAgg{total: total}).UID(rebalUID).
		ForEach("discard", func(int64) error { return nil }).UID("discard")
	return env
}

// rebalSample is the records folded in so far, at a moment.
type rebalSample struct {
	at    time.Time
	total int64
}

// rebalMeter samples every millisecond the records-in counter of each
// subtask of the keyed operator of the current job (the longest time it
// stood still while armed) and the records folded in by all subtasks
// (the job's throughput over time).
type rebalMeter struct {
	job   atomic.Pointer[stream.Job]
	total *atomic.Int64

	mu      sync.Mutex // guards the fields below
	samples []rebalSample
	on      bool
	val     [rebalP]int64
	at      [rebalP]time.Time
	gaps    [rebalP]time.Duration
}

func (m *rebalMeter) run(stop <-chan struct{}) {
	tk := time.NewTicker(time.Millisecond)
	defer tk.Stop()
	for {
		select {
		case <-stop:
			return
		case now := <-tk.C:
			var ms []actors.TaskMetrics
			if j := m.job.Load(); j != nil {
				ms = j.Metrics()
			}
			n := m.total.Load()
			m.mu.Lock()
			m.samples = append(m.samples, rebalSample{now, n})
			for sub := range rebalP {
				v, ok := subtaskRecordsIn(ms, rebalUID, sub)
				if ok && v != m.val[sub] {
					m.val[sub], m.at[sub] = v, now
					continue
				}
				if m.on {
					m.gaps[sub] = max(m.gaps[sub], now.Sub(m.at[sub]))
				}
			}
			m.mu.Unlock()
		}
	}
}

// subtaskRecordsIn returns the records-in counter of subtask sub of the
// chain headed by uid.
func subtaskRecordsIn(ms []actors.TaskMetrics, uid string, sub int) (int64, bool) {
	for _, t := range ms {
		if len(t.Operators) > 0 && t.Operators[0] == uid && t.Subtask == sub {
			return t.RecordsIn, true
		}
	}
	return 0, false
}

// rebalWindow is what one measured action did to the job.
type rebalWindow struct {
	gaps   [rebalP]time.Duration // each subtask's longest gap
	steady float64               // records/s in the second before the action
	worst  float64               // records/s in the worst second from the action to 1 s after its end
}

// measure arms the meter around f, waits until every subtask processes
// again and one more second has passed, and returns the gaps and rates.
func (m *rebalMeter) measure(b *testing.B, f func()) rebalWindow {
	b.Helper()
	m.mu.Lock()
	m.on, m.gaps = true, [rebalP]time.Duration{}
	start := time.Now()
	for sub := range rebalP {
		m.at[sub] = start
	}
	m.mu.Unlock()
	f()
	end := time.Now()
	testutil.Eventually(b, time.Minute, "every subtask processes records again", func() bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		for sub := range rebalP {
			if !m.at[sub].After(end) {
				return false
			}
		}
		return true
	})
	time.Sleep(time.Second) // the recovery, in the worst-second windows
	m.mu.Lock()
	defer m.mu.Unlock()
	m.on = false
	w := rebalWindow{gaps: m.gaps, steady: m.rate(start.Add(-time.Second), start), worst: -1}
	// Every 1-second window starting from half a second before the
	// action until its end.
	for _, s := range m.samples {
		if s.at.Before(start.Add(-time.Second/2)) || s.at.After(end) {
			continue
		}
		if r := m.rate(s.at, s.at.Add(time.Second)); w.worst < 0 || r < w.worst {
			w.worst = r
		}
	}
	return w
}

// rate returns the records/s folded in between from and to, from the
// samples nearest inside that span. The caller holds m.mu.
func (m *rebalMeter) rate(from, to time.Time) float64 {
	i, _ := slices.BinarySearchFunc(m.samples, from, func(s rebalSample, t time.Time) int { return s.at.Compare(t) })
	j, _ := slices.BinarySearchFunc(m.samples, to, func(s rebalSample, t time.Time) int { return s.at.Compare(t) })
	j = min(j, len(m.samples)-1)
	if i >= j {
		return 0
	}
	a, z := m.samples[i], m.samples[j]
	return float64(z.total-a.total) / z.at.Sub(a.at).Seconds()
}

// dirMB returns the size of the files under path in MB.
func dirMB(path string) float64 {
	var n int64
	_ = filepath.WalkDir(path, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return float64(n) / 1e6
}

// BenchmarkRebalancePause moves one subtask of a job with about 100 MB of
// keyed state (100,000 keys of 1 KB over 4 subtasks) between the nodes of
// a 3-node cluster in this process joined by protoactor remote over
// loopback, while a paced generator feeds it 40,000 records/s; in the
// same run it stops the whole job with a savepoint and starts it again
// from that savepoint on nodes up already (what a rebalance by full
// restart does). It reports, as medians over the iterations:
//
//   - moved-pause-ms: how long the moved subtask's records-in counter
//     stood still during the move (move-api-pause-ms: the pause the
//     handover itself reports, MoveResult.Moved[0].Pause);
//   - others-pause-ms: the longest such gap among the three subtasks
//     that stay put, against idle-gap-ms, the longest gap over 1 s with
//     nothing going on, and savepoint-gap-ms, their longest gap during a
//     savepoint with no move (what any checkpoint of that state costs
//     them);
//   - move-worst-second: the job's records/s in its worst second from the
//     move to 1 s after it, as a fraction of the second before it;
//   - restart-pause-ms, restart-worst-second: the same for the stop with
//     savepoint and restart (the pause is the longest of the 4
//     subtasks', restart-min-pause-ms the shortest);
//   - restart/moved: restart-pause-ms over moved-pause-ms;
//   - savepoint-MB: the size of the move's savepoint.
//
// Only as a benchmark:
//
//	go test ./stream -run '^$' -bench BenchmarkRebalancePause -benchtime 3x
func BenchmarkRebalancePause(b *testing.B) {
	var total atomic.Int64
	runCtx, cancelRun := context.WithCancel(context.Background())
	defer cancelRun()
	start := func(c *testCluster, savepoint string) *stream.Job {
		cp := snapshot.DefaultConfig()
		cp.Dir = b.TempDir()
		cp.Interval = time.Hour
		opts := []stream.Option{stream.WithCheckpointing(cp), stream.WithCluster(c.Cluster)}
		if savepoint != "" {
			opts = append(opts, stream.WithSavepoint(savepoint, false))
		}
		env := rebalJob(&total, opts...)
		c.spread(b, env)
		job, err := env.ExecuteAsync(runCtx)
		if err != nil {
			b.Fatal(err)
		}
		return job
	}
	m := &rebalMeter{total: &total}
	m.job.Store(start(remoteCluster(b, 3), ""))
	defer func() {
		cancelRun()
		_ = m.job.Load().Wait()
		testutil.Eventually(b, 10*time.Second, "the dead-letter throttles ended", func() bool {
			buf := make([]byte, 1<<20)
			return !strings.Contains(string(buf[:runtime.Stack(buf, true)]), "NewDeadLetter.NewThrottle")
		})
	}()
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { defer close(done); m.run(stop) }()
	defer func() { close(stop); <-done }()
	// Every key has its state, twice over.
	testutil.Eventually(b, 2*time.Minute, "every key folded in twice", func() bool { return total.Load() >= 2*rebalKeys })

	var idle, spGap, moved, movedAPI, others, moveWorst, restart, restartMin, restartWorst, spMB []float64
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	ctx := context.Background()
	for b.Loop() {
		idleW := m.measure(b, func() { time.Sleep(time.Second) })
		idle = append(idle, ms(slices.Max(idleW.gaps[:])))

		job := m.job.Load()
		spW := m.measure(b, func() {
			if _, err := job.TriggerSavepoint(ctx, ""); err != nil {
				b.Fatal(err)
			}
		})
		spGap = append(spGap, ms(slices.Max(spW.gaps[1:])))
		r, _ := job.Execution().Runner()
		from := r.NodeOf(rebalUID, 0)
		to := ""
		for _, n := range []string{"node-0", "node-1", "node-2"} {
			if n != from && n != r.NodeOf(rebalUID, 1) {
				to = n
			}
		}
		var res actors.MoveResult
		mw := m.measure(b, func() {
			var err error
			res, err = job.Execution().Move(ctx, []actors.Move{{UID: rebalUID, Subtask: 0, To: to}})
			if err != nil {
				b.Fatal(err)
			}
		})
		if job.Attempts() != 1 {
			b.Fatalf("the job restarted during the move: %d attempts", job.Attempts())
		}
		if got := r.NodeOf(rebalUID, 0); got != to || len(res.Moved) != 1 {
			b.Fatalf("%s[0] runs on %q after its move to %q: %+v", rebalUID, got, to, res)
		}
		moved = append(moved, ms(mw.gaps[0]))
		movedAPI = append(movedAPI, ms(res.Moved[0].Pause))
		others = append(others, ms(slices.Max(mw.gaps[1:])))
		moveWorst = append(moveWorst, mw.worst/mw.steady)
		spMB = append(spMB, dirMB(res.Path))

		// The nodes of the restarted job are up before the stop, as a
		// cluster's are.
		next := remoteCluster(b, 3)
		w := m.measure(b, func() {
			sctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			path, err := job.StopWithSavepoint(sctx, "")
			if err != nil {
				b.Fatal(err)
			}
			if err := job.Wait(); err != nil {
				b.Fatal(err)
			}
			j := start(next, path)
			m.job.Store(j)
			testutil.Eventually(b, time.Minute, "the restarted job runs", func() bool {
				r, _ := j.Execution().Runner()
				if r == nil {
					return false
				}
				select {
				case <-r.Started():
					return true
				default:
					return false
				}
			})
		})
		restart = append(restart, ms(slices.Max(w.gaps[:])))
		restartMin = append(restartMin, ms(slices.Min(w.gaps[:])))
		restartWorst = append(restartWorst, w.worst/w.steady)
		b.Logf("move %s->%s: moved %v (reported %v), others %v, worst second %.0f of %.0f rec/s; savepoint %.1f MB; restart: pause %v..%v, worst second %.0f of %.0f rec/s",
			from, to, mw.gaps[0], res.Moved[0].Pause, slices.Max(mw.gaps[1:]), mw.worst, mw.steady, spMB[len(spMB)-1],
			slices.Min(w.gaps[:]), slices.Max(w.gaps[:]), w.worst, w.steady)
	}
	b.StopTimer()
	reportPauses(b, pauseFigures{idle: idle, moved: moved, movedAPI: movedAPI, others: others, moveWorst: moveWorst,
		restart: restart, restartMin: restartMin, restartWorst: restartWorst, spMB: spMB, spGap: spGap})
}

// pauseFigures are a rebalance benchmark's figures, one per iteration.
type pauseFigures struct {
	idle, moved, movedAPI, others, moveWorst []float64
	restart, restartMin, restartWorst, spMB  []float64
	// spGap: the longest gap of the subtasks that stay put during a
	// savepoint with no move (what any checkpoint costs them).
	spGap []float64
}

// median returns the median of xs.
func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// reportPauses reports the medians of f.
func reportPauses(b *testing.B, f pauseFigures) {
	b.ReportMetric(median(f.idle), "idle-gap-ms")
	b.ReportMetric(median(f.moved), "moved-pause-ms")
	b.ReportMetric(median(f.movedAPI), "move-api-pause-ms")
	b.ReportMetric(median(f.others), "others-pause-ms")
	if len(f.spGap) > 0 {
		b.ReportMetric(median(f.spGap), "savepoint-gap-ms")
	}
	b.ReportMetric(median(f.moveWorst), "move-worst-second")
	b.ReportMetric(median(f.restart), "restart-pause-ms")
	b.ReportMetric(median(f.restartMin), "restart-min-pause-ms")
	b.ReportMetric(median(f.restartWorst), "restart-worst-second")
	if x := median(f.moved); x > 0 {
		b.ReportMetric(median(f.restart)/x, "restart/moved")
	}
	b.ReportMetric(median(f.spMB), "savepoint-MB")
}
