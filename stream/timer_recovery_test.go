package stream_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/state"
	"github.com/edgedio/edged/stream"
	"github.com/edgedio/edged/watermark"
)

// gate lets a gatedSource emit up to n records; the test raises n.
type gate struct {
	mu     sync.Mutex
	n      int
	bell   chan struct{} // closed when n is raised
	polled atomic.Bool   // set at a source's first poll
}

func newGate() *gate { return &gate{bell: make(chan struct{})} }

func (g *gate) allow(n int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.n = n
	close(g.bell)
	g.bell = make(chan struct{})
}

// state returns n and the channel closed when it is raised.
func (g *gate) state() (int, <-chan struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.n, g.bell
}

// gatedSource emits all, in order, as far as its gate lets it, counts
// what it emitted in read (when not nil), and checkpoints its position.
// One subtask.
type gatedSource[T any] struct {
	operators.Base
	all  []T
	gate *gate
	read *atomic.Int64
	next int
	wait <-chan struct{}
}

func (s *gatedSource[T]) Poll(out operators.Collector[T], limit int) (operators.Status, error) {
	s.gate.polled.Store(true)
	n, bell := s.gate.state()
	for k := 0; k < limit && s.next < len(s.all) && s.next < n; k++ {
		out.Collect(s.all[s.next])
		s.next++
		if s.read != nil {
			s.read.Store(int64(s.next))
		}
	}
	switch {
	case s.next >= len(s.all):
		return operators.EndOfInput, nil
	case s.next < n:
		return operators.MoreAvailable, nil
	}
	s.wait = bell
	return operators.NothingAvailable, nil
}

func (s *gatedSource[T]) Available() <-chan struct{} {
	if s.wait == nil {
		ch := make(chan struct{})
		close(ch)
		return ch
	}
	return s.wait
}

func (s *gatedSource[T]) SnapshotState(int64) ([]byte, error) { return positionState(s.next), nil }

func (s *gatedSource[T]) RestoreState(states [][]byte, _ int) error {
	return restorePosition(states, &s.next)
}

// countTimers counts each key's records and registers an event-time timer
// at each record's timestamp; a timer emits the count when it fires.
type countTimers struct {
	operators.KeyedProcessBase[string, string]
	count state.Value[int]
}

func (f *countTimers) Open(rt *operators.KeyedRuntime[string]) error {
	var err error
	f.count, err = state.NewValue(rt.Backend(), rt.Keys(), state.ValueDescriptor[int]{Name: "count"})
	return err
}

func (f *countTimers) ProcessElement(ts int64, ctx *operators.KeyedContext[string, string]) error {
	n, _ := f.count.Get()
	f.count.Update(n + 1)
	ctx.Timers().RegisterEventTimeTimer(ts)
	return nil
}

func (f *countTimers) OnTimer(ts int64, ctx *operators.KeyedContext[string, string]) error {
	n, _ := f.count.Get()
	ctx.Emit(fmt.Sprintf("timer %d fired at count %d", ts, n))
	return nil
}

// timerJob is a gated source (parallelism 1) of the timestamps 10 s, 5 s,
// 5 s, 20 s -> per-event watermarks, no out-of-orderness -> a map that
// fails at record failAt once (0: never), counting the records in seen
// -> one key -> countTimers (uid "timers") -> exactly-once file sink in
// out.
func timerJob(g *gate, out string, seen *atomic.Int64, failAt int64, opts ...stream.Option) *stream.Environment {
	env := stream.NewEnvironment("timer-behind", opts...)
	src := stream.FromSource(env, "ts", func() operators.Source[int64] {
		return &gatedSource[int64]{all: []int64{10_000, 5_000, 5_000, 20_000}, gate: g}
	}).SetParallelism(1).UID("ts").
		AssignTimestampsAndWatermarks("wm", watermark.ForBoundedOutOfOrderness(0, func(ts int64) int64 { return ts }).WithPerEventEmit())
	failing := stream.Map(src, "fail", func(ts int64) (int64, error) {
		if seen.Add(1) == failAt {
			return 0, fmt.Errorf("injected failure at record %d", failAt)
		}
		return ts, nil
	})
	stream.KeyedProcess(stream.KeyBy(failing, func(int64) string { return "a" }), "timers",
		func() operators.KeyedProcessFunction[string, int64, string] { return &countTimers{} }).UID("timers").
		To("out", func() operators.Sink[string] { return operators.NewFileSink(out, func(s string) string { return s }) }).UID("out")
	return env
}

// A timer registered at or behind the watermark fires when the next
// watermark arrives, after the records before it, and a restore does not
// change that: the restored watermark is given back to the operators
// without firing the timers still queued. The job (records at 10 s, 5 s,
// 5 s, 20 s of one key, per-event watermarks, no out-of-orderness) takes a
// savepoint after the second record, whose timer at 5 s is then queued
// behind the watermark (10 s), and fails at the third; restored from the
// savepoint, it commits what the run without the failure commits.
func TestTimerBehindWatermarkSameAfterRestore(t *testing.T) {
	run := func(t *testing.T, failAt int64) []string {
		out := t.TempDir()
		cfg := checkpointConfig(t, snapshot.ExactlyOnce)
		cfg.Interval = time.Hour // only the savepoint
		var seen atomic.Int64
		g := newGate()
		env := timerJob(g, out, &seen, failAt, stream.WithParallelism(1), stream.WithCheckpointing(cfg),
			stream.WithRestartStrategy(&snapshot.FixedDelay{Attempts: 1}))
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		job, err := env.ExecuteAsync(ctx)
		if err != nil {
			t.Fatal(err)
		}
		g.allow(2)
		testutil.Eventually(t, 30*time.Second, "the first two records processed", func() bool { return seen.Load() >= 2 })
		if _, err := job.TriggerSavepoint(ctx, ""); err != nil {
			t.Fatalf("savepoint: %v", err)
		}
		g.allow(4)
		if err := job.Wait(); err != nil {
			t.Fatal(err)
		}
		if restores := job.Restores(); failAt > 0 && len(restores) != 1 {
			t.Fatalf("restores %v: want one, from the savepoint", restores)
		}
		lines := committedLines(t, out)
		slices.Sort(lines)
		return lines
	}
	want := run(t, 0)
	if exp := []string{"timer 10000 fired at count 4", "timer 20000 fired at count 4", "timer 5000 fired at count 4"}; !slices.Equal(want, exp) {
		t.Fatalf("failure-free run: %q, want %q", want, exp)
	}
	if got := run(t, 3); !slices.Equal(got, want) {
		t.Fatalf("after the restore:\n%s\nwant the failure-free run's:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// The same through a user's stop and start at another parallelism: the
// job stopped with a savepoint after the second record (its timer at 5 s
// queued behind the watermark) and started again from it with the keyed
// process at parallelism 2 commits what the run without the stop commits.
func TestTimerBehindWatermarkSameAfterRescale(t *testing.T) {
	out := t.TempDir()
	cfg := checkpointConfig(t, snapshot.ExactlyOnce)
	cfg.Interval = time.Hour
	var seen atomic.Int64
	g := newGate()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	job, err := timerJob(g, out, &seen, 0, stream.WithParallelism(1), stream.WithCheckpointing(cfg)).ExecuteAsync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	g.allow(2)
	testutil.Eventually(t, 30*time.Second, "the first two records processed", func() bool { return seen.Load() >= 2 })
	sp, err := job.StopWithSavepoint(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := job.Wait(); err != nil {
		t.Fatal(err)
	}
	g = newGate()
	g.allow(4)
	if err := execute(t, timerJob(g, out, &seen, 0, stream.WithParallelism(2), stream.WithCheckpointing(cfg), stream.WithSavepoint(sp, false))); err != nil {
		t.Fatal(err)
	}
	lines := committedLines(t, out)
	slices.Sort(lines)
	if want := []string{"timer 10000 fired at count 4", "timer 20000 fired at count 4", "timer 5000 fired at count 4"}; !slices.Equal(lines, want) {
		t.Fatalf("after the stop and the start at parallelism 2:\n%s\nwant:\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
}
