package stream_test

// Jobs written against the Go API as a new user writes them, from the
// README's "Writing a job", "Event time, state, timers and windows" and
// "Checkpoints, savepoints and exactly-once" and the godoc only. Each
// checks exact results against a reference computed in plain Go here,
// not with edged.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/state"
	"github.com/edgedio/edged/stream"
	"github.com/edgedio/edged/watermark"
	"github.com/jonboulle/clockwork"
)

// ev is the record of the user jobs: a key, an event time in ms and a
// value.
type ev struct {
	Key string
	TS  int64
	V   int64
}

func (e ev) String() string { return fmt.Sprintf("%s@%d=%d", e.Key, e.TS, e.V) }

// userSliceSource emits a fixed list of records from one subtask, replayable
// from its position. With a gate, it emits the records before gateAt and
// then waits until the gate is closed; with hold, it never ends (an
// unbounded source with nothing more to say).
type userSliceSource[T any] struct {
	operators.Base
	recs   []T
	pos    int
	gate   <-chan struct{}
	gateAt int
	hold   bool
	never  chan struct{}
}

func (s *userSliceSource[T]) Open(ctx *operators.Context) error {
	if ctx.Parallelism != 1 {
		return fmt.Errorf("userSliceSource runs at parallelism 1, not %d", ctx.Parallelism)
	}
	s.never = make(chan struct{})
	return nil
}

func (s *userSliceSource[T]) gated() bool {
	if s.gate == nil || s.pos < s.gateAt {
		return false
	}
	select {
	case <-s.gate:
		return false
	default:
		return true
	}
}

func (s *userSliceSource[T]) Poll(out operators.Collector[T], max int) (operators.Status, error) {
	for n := 0; n < max && s.pos < len(s.recs); n++ {
		if s.gated() {
			return operators.NothingAvailable, nil
		}
		out.Collect(s.recs[s.pos])
		s.pos++
	}
	if s.pos < len(s.recs) {
		if s.gated() {
			return operators.NothingAvailable, nil
		}
		return operators.MoreAvailable, nil
	}
	if s.hold {
		return operators.NothingAvailable, nil
	}
	return operators.EndOfInput, nil
}

func (s *userSliceSource[T]) Available() <-chan struct{} {
	if s.gated() {
		return s.gate
	}
	return s.never
}

func (s *userSliceSource[T]) SnapshotState(int64) ([]byte, error) {
	return binary.BigEndian.AppendUint64(nil, uint64(s.pos)), nil
}

func (s *userSliceSource[T]) RestoreState(states [][]byte, _ int) error {
	if len(states) != 1 || len(states[0]) != 8 {
		return fmt.Errorf("userSliceSource: restore from %d states", len(states))
	}
	s.pos = int(binary.BigEndian.Uint64(states[0]))
	return nil
}

func newUserSlice[T any](recs []T) func() operators.Source[T] {
	return func() operators.Source[T] { return &userSliceSource[T]{recs: recs} }
}

func newUserGatedSlice[T any](recs []T, gateAt int, gate <-chan struct{}) func() operators.Source[T] {
	return func() operators.Source[T] { return &userSliceSource[T]{recs: recs, gate: gate, gateAt: gateAt} }
}

// evSumAgg sums the values; it merges, for sliding windows.
type evSumAgg struct{}

func (evSumAgg) CreateAccumulator() int64  { return 0 }
func (evSumAgg) Add(e ev, acc int64) int64 { return acc + e.V }
func (evSumAgg) Result(acc int64) int64    { return acc }
func (evSumAgg) Merge(a, b int64) int64    { return a + b }
func evKey(e ev) string                    { return e.Key }
func evTime(e ev) int64                    { return e.TS }

// disorderedUserEvents returns n events of keys k0..k(keys-1) whose event times
// mostly grow but now and then jump back by up to back ms, so that some are
// late.
func disorderedUserEvents(seed int64, n, keys int, back int64) []ev {
	r := rand.New(rand.NewSource(seed))
	out := make([]ev, 0, n)
	ts := int64(1_000)
	for i := 0; i < n; i++ {
		ts += int64(r.Intn(4))
		t := ts
		if r.Intn(6) == 0 {
			t -= r.Int63n(back + 1)
		}
		out = append(out, ev{Key: "k" + strconv.Itoa(r.Intn(keys)), TS: t, V: int64(1 + r.Intn(100))})
	}
	return out
}

type userWinKey struct {
	key   string
	start int64
}

// refUserWindows is a plain-Go model of event-time windows with bounded
// out-of-orderness watermarks emitted after every event, allowed lateness
// and a late side output, as Flink defines them: a record is dropped for
// a window when window.end-1+lateness <= watermark; a window fires when
// the watermark reaches end-1, and again for every record added after
// that; a record dropped for all its windows goes to the side output.
func refUserWindows(events []ev, size, slide, outOfOrder, lateness int64) (fired []operators.WindowResult[string, int64], late []ev) {
	wm := int64(-1 << 62)
	sums := map[userWinKey]int64{}
	isFired := map[userWinKey]bool{}
	fire := func(k userWinKey) {
		fired = append(fired, operators.WindowResult[string, int64]{Key: k.key,
			Window: operators.Window{Start: k.start, End: k.start + size}, Value: sums[k]})
		isFired[k] = true
	}
	maxTS := int64(-1 << 62)
	for _, e := range events {
		last := e.TS - ((e.TS%slide)+slide)%slide
		dropped := true
		for start := last; start > e.TS-size; start -= slide {
			end := start + size
			if end-1+lateness <= wm {
				continue
			}
			dropped = false
			k := userWinKey{e.Key, start}
			sums[k] += e.V
			if end-1 <= wm {
				fire(k)
			}
		}
		if dropped {
			late = append(late, e)
		}
		if e.TS > maxTS {
			maxTS = e.TS
			if nw := maxTS - outOfOrder - 1; nw > wm {
				wm = nw
				var due []userWinKey
				for k := range sums {
					if !isFired[k] && k.start+size-1 <= wm {
						due = append(due, k)
					}
				}
				for _, k := range due {
					fire(k)
				}
				for k := range sums {
					if k.start+size-1+lateness <= wm {
						delete(sums, k)
						delete(isFired, k)
					}
				}
			}
		}
	}
	for k := range sums { // end of input: the final watermark
		if !isFired[k] {
			fire(k)
		}
	}
	return fired, late
}

func sortUserResults(rs []operators.WindowResult[string, int64]) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = fmt.Sprintf("%s %v %d", r.Key, r.Window, r.Value)
	}
	sort.Strings(out)
	return out
}

func sortUserEvents(es []ev) []string {
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = e.String()
	}
	sort.Strings(out)
	return out
}

func diffUserLines(t *testing.T, what string, got, want []string) {
	t.Helper()
	if slices.Equal(got, want) {
		return
	}
	gm := map[string]int{}
	for _, g := range got {
		gm[g]++
	}
	for _, w := range want {
		gm[w]--
	}
	var extra, missing []string
	for k, n := range gm {
		for ; n > 0; n-- {
			extra = append(extra, k)
		}
		for ; n < 0; n++ {
			missing = append(missing, k)
		}
	}
	sort.Strings(extra)
	sort.Strings(missing)
	if len(extra) > 10 {
		extra = extra[:10]
	}
	if len(missing) > 10 {
		missing = missing[:10]
	}
	t.Fatalf("%s: got %d, want %d; unexpected %q; missing %q", what, len(got), len(want), extra, missing)
}

func userCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// userWindowJob runs events through event-time windows of size and slide
// (tumbling when equal) at window parallelism 2, with the source and
// assigner at parallelism 1, and returns the results and late records.
func userWindowJob(t *testing.T, events []ev, size, slide, outOfOrder, lateness time.Duration) ([]operators.WindowResult[string, int64], []ev) {
	t.Helper()
	env := stream.NewEnvironment("user-windows", stream.WithParallelism(2), stream.WithClock(clockwork.NewFakeClock()))
	src := stream.FromSource(env, "events", newUserSlice(events)).SetParallelism(1).
		AssignTimestampsAndWatermarks("timestamps",
			watermark.ForBoundedOutOfOrderness(outOfOrder, evTime).WithPerEventEmit())
	assigner := operators.TumblingEventTimeWindows(size)
	if slide != size {
		assigner = operators.SlidingEventTimeWindows(size, slide)
	}
	lateTag := operators.NewOutputTag[ev]("late")
	res := stream.WindowAggregate(stream.Window(stream.KeyBy(src, evKey), assigner).
		AllowedLateness(lateness).SideOutputLateData(lateTag), "sum", evSumAgg{}).UID("sum")
	results := operators.NewCollectSink[operators.WindowResult[string, int64]]()
	res.To("results", func() operators.Sink[operators.WindowResult[string, int64]] { return results.Subtask() })
	lateSink := operators.NewCollectSink[ev]()
	stream.SideOutput(res, lateTag).To("late", func() operators.Sink[ev] { return lateSink.Subtask() })
	if err := env.Execute(userCtx(t)); err != nil {
		t.Fatalf("Execute: %v", err)
	}
	return results.Values(), lateSink.Values()
}

func TestUserJobTumblingWindowsWithLatenessAndLateOutput(t *testing.T) {
	events := disorderedUserEvents(1, 2000, 5, 40)
	got, gotLate := userWindowJob(t, events, 10*time.Millisecond, 10*time.Millisecond, 3*time.Millisecond, 8*time.Millisecond)
	want, wantLate := refUserWindows(events, 10, 10, 3, 8)
	if len(wantLate) == 0 || len(want) <= 200 {
		t.Fatalf("the input exercises too little: %d late, %d results", len(wantLate), len(want))
	}
	diffUserLines(t, "window results", sortUserResults(got), sortUserResults(want))
	diffUserLines(t, "late records", sortUserEvents(gotLate), sortUserEvents(wantLate))
}

func TestUserJobSlidingWindowsWithLatenessAndLateOutput(t *testing.T) {
	events := disorderedUserEvents(2, 1500, 4, 60)
	got, gotLate := userWindowJob(t, events, 20*time.Millisecond, 5*time.Millisecond, 2*time.Millisecond, 6*time.Millisecond)
	want, wantLate := refUserWindows(events, 20, 5, 2, 6)
	if len(wantLate) == 0 {
		t.Fatal("no late records: the input exercises too little")
	}
	diffUserLines(t, "window results", sortUserResults(got), sortUserResults(want))
	diffUserLines(t, "late records", sortUserEvents(gotLate), sortUserEvents(wantLate))
}

// userBucketer is a KeyedProcess with Value and Map state and both kinds of
// timers: per key it counts records (Value) and sums them per 10 ms
// bucket (Map); an event-time timer at each bucket's end emits the
// bucket's sum, and a processing-time timer one second after a key's
// first record emits its count at that time.
type userBucketer struct {
	operators.KeyedProcessBase[string, string]
	count   state.Value[int64]
	buckets state.Map[int64, int64]
}

func (b *userBucketer) Open(rt *operators.KeyedRuntime[string]) error {
	var err error
	if b.count, err = state.NewValue(rt.Backend(), rt.Keys(), state.ValueDescriptor[int64]{Name: "count"}); err != nil {
		return err
	}
	b.buckets, err = state.NewMap(rt.Backend(), rt.Keys(), state.MapDescriptor[int64, int64]{Name: "buckets"})
	return err
}

func (b *userBucketer) ProcessElement(e ev, ctx *operators.KeyedContext[string, string]) error {
	n, _ := b.count.Get()
	if n == 0 {
		ctx.Timers().RegisterProcessingTimeTimer(ctx.CurrentProcessingTime() + 1000)
	}
	b.count.Update(n + 1)
	bucket := e.TS / 10
	s, _ := b.buckets.Get(bucket)
	b.buckets.Put(bucket, s+e.V)
	ctx.Timers().RegisterEventTimeTimer(bucket*10 + 9)
	return nil
}

func (b *userBucketer) OnTimer(ts int64, ctx *operators.KeyedContext[string, string]) error {
	if ctx.TimeDomain() == operators.ProcessingTime {
		n, _ := b.count.Get()
		ctx.Emit(fmt.Sprintf("pt %s %d", ctx.CurrentKey(), n))
		return nil
	}
	s, ok := b.buckets.Get(ts / 10)
	if !ok {
		return fmt.Errorf("event-time timer %d of key %s without its bucket", ts, ctx.CurrentKey())
	}
	b.buckets.Remove(ts / 10)
	ctx.Emit(fmt.Sprintf("et %s %d %d", ctx.CurrentKey(), ts, s))
	return nil
}

// refUserBuckets models userBucketer: with watermarks maxTS-d-1 after every
// event, a bucket's timer fires when the watermark reaches its end; a
// record into a bucket whose timer fired already (late) starts the bucket
// again, whose timer, behind the watermark, fires at the next watermark.
// It returns the event-time outputs before the end of input.
func refUserBuckets(events []ev, outOfOrder int64) []string {
	wm := int64(-1 << 62)
	maxTS := wm
	type kb struct {
		key    string
		bucket int64
	}
	sums := map[kb]int64{}
	var out []string
	for _, e := range events {
		sums[kb{e.Key, e.TS / 10}] += e.V
		if e.TS > maxTS {
			maxTS = e.TS
		}
		if nw := maxTS - outOfOrder - 1; nw > wm {
			wm = nw
		}
		// The timers fire at every watermark the assigner emits; one
		// registered behind the watermark fires at the next one, which
		// comes only when the watermark advances.
		if e.TS == maxTS {
			for k, s := range sums {
				if k.bucket*10+9 <= wm {
					out = append(out, fmt.Sprintf("et %s %d %d", k.key, k.bucket*10+9, s))
					delete(sums, k)
				}
			}
		}
	}
	return out
}

func TestUserJobKeyedProcessStateAndTimers(t *testing.T) {
	events := disorderedUserEvents(3, 800, 6, 25)
	clock := clockwork.NewFakeClockAt(time.UnixMilli(1_700_000_000_000))
	env := stream.NewEnvironment("user-keyed-process", stream.WithParallelism(3), stream.WithClock(clock))
	src := stream.FromSource(env, "events", func() operators.Source[ev] {
		return &userSliceSource[ev]{recs: events, hold: true}
	}).SetParallelism(1).
		AssignTimestampsAndWatermarks("timestamps", watermark.ForBoundedOutOfOrderness(4*time.Millisecond, evTime).WithPerEventEmit())
	out := stream.KeyedProcess(stream.KeyBy(src, evKey), "buckets", func() operators.KeyedProcessFunction[string, ev, string] {
		return &userBucketer{}
	}).UID("buckets")
	sink := operators.NewCollectSink[string]()
	out.To("out", func() operators.Sink[string] { return sink.Subtask() })

	ctx, cancel := context.WithCancel(userCtx(t))
	defer cancel()
	job, err := env.ExecuteAsync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := refUserBuckets(events, 4)
	testutil.Eventually(t, 0, "the event-time outputs", func() bool { return sink.Len() >= len(want) })
	diffUserLines(t, "event-time outputs", sortUserStrings(sink.Values()), sortUserStrings(want))

	keys := map[string]int64{}
	for _, e := range events {
		keys[e.Key]++
	}
	// No processing time has passed: no processing-time timer fired.
	// One second later every key's fires, with its count then.
	clock.Advance(time.Second)
	testutil.Eventually(t, 0, "the processing-time outputs", func() bool { return sink.Len() >= len(want)+len(keys) })
	wantAll := slices.Clone(want)
	for k, n := range keys {
		wantAll = append(wantAll, fmt.Sprintf("pt %s %d", k, n))
	}
	cancel()
	if err := job.Wait(); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait after cancel: %v, want context.Canceled", err)
	}
	diffUserLines(t, "all outputs", sortUserStrings(sink.Values()), sortUserStrings(wantAll))
}

func sortUserStrings(s []string) []string {
	s = slices.Clone(s)
	sort.Strings(s)
	return s
}

// userKeyTotal is a rolling per-key count and sum.
type userKeyTotal struct {
	Key   string
	Count int64
	Sum   int64
}

type evTotalAgg struct{}

func (evTotalAgg) CreateAccumulator() userKeyTotal { return userKeyTotal{} }
func (evTotalAgg) Add(e ev, acc userKeyTotal) userKeyTotal {
	acc.Key = e.Key
	acc.Count++
	acc.Sum += e.V
	return acc
}
func (evTotalAgg) Result(acc userKeyTotal) userKeyTotal { return acc }

func refUserTotals(events []ev) map[string]userKeyTotal {
	want := map[string]userKeyTotal{}
	for _, e := range events {
		kt := want[e.Key]
		kt.Key = e.Key
		kt.Count++
		kt.Sum += e.V
		want[e.Key] = kt
	}
	return want
}

// userRollingJob builds the rolling per-key total at parallelism p, reading
// events from a source gated at gateAt.
func userRollingJob(dir string, p int, events []ev, gateAt int, gate <-chan struct{}, sink *operators.CollectSink[userKeyTotal], opts ...stream.Option) *stream.Environment {
	cfg := snapshot.DefaultConfig()
	cfg.Dir = dir
	env := stream.NewEnvironment("user-rolling", append([]stream.Option{stream.WithParallelism(p), stream.WithCheckpointing(cfg)}, opts...)...)
	src := stream.FromSource(env, "events", newUserGatedSlice(events, gateAt, gate)).SetParallelism(1).UID("events")
	totals := stream.Aggregate(stream.KeyBy(src, evKey), "totals", evTotalAgg{}).UID("totals")
	totals.To("out", func() operators.Sink[userKeyTotal] { return sink.Subtask() }).UID("out")
	return env
}

func TestUserJobRollingAggregateRescaledFromSavepoint(t *testing.T) {
	events := disorderedUserEvents(4, 3000, 50, 0)
	half := 1700
	dir := t.TempDir()
	first := operators.NewCollectSink[userKeyTotal]()
	env := userRollingJob(dir, 3, events, half, make(chan struct{}), first)
	job, err := env.ExecuteAsync(userCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 0, "the first half", func() bool { return first.Len() == half })
	sp, err := job.StopWithSavepoint(userCtx(t), "")
	if err != nil {
		t.Fatalf("StopWithSavepoint: %v", err)
	}
	if err := job.Wait(); err != nil {
		t.Fatalf("Wait after the stop: %v", err)
	}
	wantFirst := refUserTotals(events[:half])
	checkUserLast(t, "before the savepoint", first.Values(), wantFirst, half)

	want := refUserTotals(events)
	for _, p := range []int{2, 4, 3} {
		t.Run(fmt.Sprintf("p=%d", p), func(t *testing.T) {
			sink := operators.NewCollectSink[userKeyTotal]()
			open := make(chan struct{})
			close(open)
			env := userRollingJob(t.TempDir(), p, events, 0, open, sink, stream.WithSavepoint(sp, false))
			if err := env.Execute(userCtx(t)); err != nil {
				t.Fatalf("Execute from %s at parallelism %d: %v", sp, p, err)
			}
			checkUserLast(t, "after the restore", sink.Values(), want, len(events)-half)
		})
	}
}

// checkUserLast checks that n totals were emitted, that each key's
// totals grow, and that each key's last total is want's.
func checkUserLast(t *testing.T, what string, got []userKeyTotal, want map[string]userKeyTotal, n int) {
	t.Helper()
	if len(got) != n {
		t.Fatalf("%s: %d results, want one per record, %d", what, len(got), n)
	}
	last := map[string]userKeyTotal{}
	for _, g := range got {
		if l, ok := last[g.Key]; ok && g.Count <= l.Count {
			t.Fatalf("%s: key %s went from %+v to %+v", what, g.Key, l, g)
		}
		last[g.Key] = g
	}
	for k, l := range last {
		if w := want[k]; l != w {
			t.Fatalf("%s: key %s ends at %+v, want %+v", what, k, l, w)
		}
	}
}

// failOnceAt is a Map function that fails the task once, at the record at
// which trip is set.
func failOnceAt(trip *atomic.Bool, at int64) func(ev) (ev, error) {
	return func(e ev) (ev, error) {
		if e.V == at && trip.CompareAndSwap(false, true) {
			return e, errors.New("injected failure")
		}
		return e, nil
	}
}

func committedUserLines(t *testing.T, dir string) []string {
	t.Helper()
	parts, err := operators.CommittedParts(dir)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, p := range parts {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(string(b), "\n") {
			if l != "" {
				lines = append(lines, l)
			}
		}
	}
	sort.Strings(lines)
	return lines
}

// numberedEvents returns n events whose values are their indices 1..n, so that
// every output line is distinct.
func numberedEvents(n, keys int) []ev {
	out := make([]ev, n)
	for i := range out {
		out[i] = ev{Key: "k" + strconv.Itoa(i%keys), TS: int64(1000 + i), V: int64(i + 1)}
	}
	return out
}

func TestUserJobFailureMidStreamExactlyOnceFileSink(t *testing.T) {
	events := numberedEvents(4000, 7)
	dir, out := t.TempDir(), t.TempDir()
	cfg := snapshot.DefaultConfig()
	cfg.Dir = dir
	cfg.Interval = 20 * time.Millisecond
	env := stream.NewEnvironment("user-failure", stream.WithParallelism(2), stream.WithCheckpointing(cfg),
		stream.WithRestartStrategy(&snapshot.FixedDelay{Attempts: 2, Delay: 0}))
	gate := make(chan struct{})
	var trip atomic.Bool
	src := stream.FromSource(env, "events", newUserGatedSlice(events, 2000, gate)).SetParallelism(1).UID("events")
	mapped := stream.Map(src.Rebalance(), "maybe-fail", failOnceAt(&trip, 3000))
	totals := stream.Aggregate(stream.KeyBy(mapped, evKey), "totals", evTotalAgg{}).UID("totals")
	totals.To("files", func() operators.Sink[userKeyTotal] {
		return operators.NewFileSink(out, func(k userKeyTotal) string { return fmt.Sprintf("%s %d %d", k.Key, k.Count, k.Sum) })
	}).UID("files")
	job, err := env.ExecuteAsync(userCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	// A checkpoint completes while the source waits at its gate; then the
	// rest flows and the map fails once, at record 3000.
	testutil.Eventually(t, 0, "a completed checkpoint", func() bool {
		for _, s := range job.History() {
			if s.Status == snapshot.Completed {
				return true
			}
		}
		return false
	})
	close(gate)
	if err := job.Wait(); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	if !trip.Load() {
		t.Fatal("the failure was never injected")
	}
	if r := job.Restores(); len(r) != 1 || r[0] == 0 {
		t.Fatalf("Restores = %v, want one restart from a checkpoint", r)
	}
	// Exactly once: the rebalance before the key-by makes the order of a
	// key's records vary, so the running sums vary, but every key's counts
	// 1..n appear once each, none twice, and the last is the key's total.
	want := refUserTotals(events)
	seen := map[string]map[int64]bool{}
	for _, l := range committedUserLines(t, out) {
		var k string
		var n, sum int64
		if _, err := fmt.Sscanf(l, "%s %d %d", &k, &n, &sum); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		if seen[k] == nil {
			seen[k] = map[int64]bool{}
		}
		if seen[k][n] {
			t.Fatalf("key %s: count %d committed twice", k, n)
		}
		seen[k][n] = true
		if w := want[k]; n == w.Count && sum != w.Sum {
			t.Fatalf("key %s: total %d, want %d", k, sum, w.Sum)
		}
	}
	for k, w := range want {
		if int64(len(seen[k])) != w.Count {
			t.Fatalf("key %s: %d totals committed, want %d", k, len(seen[k]), w.Count)
		}
		for n := int64(1); n <= w.Count; n++ {
			if !seen[k][n] {
				t.Fatalf("key %s: count %d never committed", k, n)
			}
		}
	}
}

// userWindowFileJob is a tumbling-window job over a bounded source, with
// checkpoints and the exactly-once file sink.
func userWindowFileJob(dir, out string, events []ev, gateAt int, gate <-chan struct{}) *stream.Environment {
	cfg := snapshot.DefaultConfig()
	cfg.Dir = dir
	cfg.Interval = 20 * time.Millisecond
	return windowFileJob(stream.NewEnvironment("user-window-files", stream.WithParallelism(2), stream.WithCheckpointing(cfg)),
		out, events, gateAt, gate)
}

// windowFileJob builds on env the tumbling-window job of
// userWindowFileJob: sums of 50 ms windows per key, written by the
// exactly-once file sink to out.
func windowFileJob(env *stream.Environment, out string, events []ev, gateAt int, gate <-chan struct{}) *stream.Environment {
	src := stream.FromSource(env, "events", newUserGatedSlice(events, gateAt, gate)).SetParallelism(1).UID("events").
		AssignTimestampsAndWatermarks("timestamps", watermark.ForMonotonous(evTime).WithPerEventEmit()).UID("timestamps")
	res := stream.WindowAggregate(stream.Window(stream.KeyBy(src, evKey),
		operators.TumblingEventTimeWindows(50*time.Millisecond)), "sum", evSumAgg{}).UID("sum")
	res.To("files", func() operators.Sink[operators.WindowResult[string, int64]] {
		return operators.NewFileSink(out, func(r operators.WindowResult[string, int64]) string {
			return fmt.Sprintf("%s %v %d", r.Key, r.Window, r.Value)
		})
	}).UID("files")
	return env
}

func TestUserJobBoundedInputFiresEveryWindowOnceAndCommits(t *testing.T) {
	events := numberedEvents(3000, 5)
	out := t.TempDir()
	open := make(chan struct{})
	close(open)
	env := userWindowFileJob(t.TempDir(), out, events, 0, open)
	if err := env.Execute(userCtx(t)); err != nil {
		t.Fatalf("Execute: %v", err)
	}
	want, late := refUserWindows(events, 50, 50, 0, 0)
	if len(late) != 0 {
		t.Fatalf("%d late records in monotonous input", len(late))
	}
	diffUserLines(t, "committed windows", committedUserLines(t, out), sortUserResults(want))
}

func TestUserJobCancelledThenRestartedFromRetainedCheckpoint(t *testing.T) {
	events := numberedEvents(3000, 5)
	dir, out := t.TempDir(), t.TempDir()
	ctx, cancel := context.WithCancel(userCtx(t))
	env := userWindowFileJob(dir, out, events, 1800, make(chan struct{}))
	job, err := env.ExecuteAsync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 0, "a completed checkpoint", func() bool {
		for _, s := range job.History() {
			if s.Status == snapshot.Completed {
				return true
			}
		}
		return false
	})
	cancel()
	if err := job.Wait(); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait after cancel: %v, want context.Canceled", err)
	}
	open := make(chan struct{})
	close(open)
	env = userWindowFileJob(dir, out, events, 0, open)
	if err := env.Execute(userCtx(t)); err != nil {
		t.Fatalf("Execute again: %v", err)
	}
	want, _ := refUserWindows(events, 50, 50, 0, 0)
	diffUserLines(t, "committed windows", committedUserLines(t, out), sortUserResults(want))
}

type alertRule struct {
	Key       string
	Threshold int64
}

// userAlerter buffers each keyed record until the watermark passes it, which
// happens only once the bounded rules input has ended, then emits an
// alert for each record above its key's threshold.
type userAlerter struct {
	rules state.ReadOnlyBroadcast[string, int64]
	write state.Broadcast[string, int64]
	buf   state.List[ev]
}

func (a *userAlerter) Open(rt *operators.BroadcastRuntime[string]) error {
	var err error
	if a.write, err = state.BroadcastState[string, int64](rt.Store(), "rules"); err != nil {
		return err
	}
	if a.rules, err = state.ReadOnlyBroadcastState[string, int64](rt.Store(), "rules"); err != nil {
		return err
	}
	a.buf, err = state.NewList(rt.Backend(), rt.Keys(), state.ListDescriptor[ev]{Name: "buf"})
	return err
}

func (a *userAlerter) ProcessBroadcastElement(r alertRule, _ *operators.BroadcastContext[string]) error {
	a.write.Put(r.Key, r.Threshold)
	return nil
}

func (a *userAlerter) ProcessElement(e ev, ctx *operators.KeyedContext[string, string]) error {
	a.buf.Add(e)
	ctx.Timers().RegisterEventTimeTimer(e.TS)
	return nil
}

func (a *userAlerter) OnTimer(ts int64, ctx *operators.KeyedContext[string, string]) error {
	var keep []ev
	for e := range a.buf.All() {
		if e.TS > ts {
			keep = append(keep, e)
			continue
		}
		if thr, ok := a.rules.Get(e.Key); ok && e.V > thr {
			ctx.Emit(fmt.Sprintf("alert %s %d %d>%d", e.Key, e.TS, e.V, thr))
		}
	}
	a.buf.Update(keep)
	return nil
}

func TestUserJobBroadcastRules(t *testing.T) {
	events := disorderedUserEvents(5, 1200, 6, 0)
	rules := []alertRule{{"k0", 50}, {"k1", 90}, {"k2", 10}, {"k3", 99}, {"k0", 70}, {"k9", 1}}
	env := stream.NewEnvironment("user-broadcast", stream.WithParallelism(3), stream.WithClock(clockwork.NewFakeClock()))
	src := stream.FromSource(env, "events", newUserSlice(events)).SetParallelism(1).
		AssignTimestampsAndWatermarks("timestamps", watermark.ForMonotonous(evTime).WithPerEventEmit())
	ruleStream := stream.FromSource(env, "rules", newUserSlice(rules)).SetParallelism(1)
	alerts := stream.ConnectBroadcast(stream.KeyBy(src, evKey), ruleStream, "alerts",
		func() operators.KeyedBroadcastProcessFunction[string, ev, alertRule, string] { return &userAlerter{} }).UID("alerts")
	sink := operators.NewCollectSink[string]()
	alerts.To("out", func() operators.Sink[string] { return sink.Subtask() })
	if err := env.Execute(userCtx(t)); err != nil {
		t.Fatalf("Execute: %v", err)
	}
	thr := map[string]int64{}
	for _, r := range rules {
		thr[r.Key] = r.Threshold
	}
	var want []string
	for _, e := range events {
		if th, ok := thr[e.Key]; ok && e.V > th {
			want = append(want, fmt.Sprintf("alert %s %d %d>%d", e.Key, e.TS, e.V, th))
		}
	}
	diffUserLines(t, "alerts", sortUserStrings(sink.Values()), sortUserStrings(want))
}

// ---- misuse ----

// userPlanErr builds a job with build and returns what Plan and Execute say.
func userPlanErr(t *testing.T, build func(env *stream.Environment), opts ...stream.Option) error {
	t.Helper()
	env := stream.NewEnvironment("misuse", opts...)
	build(env)
	_, perr := env.Plan()
	eerr := env.Execute(userCtx(t))
	if (perr == nil) != (eerr == nil) {
		t.Fatalf("Plan says %v, Execute says %v", perr, eerr)
	}
	return eerr
}

func wantUserErrNaming(t *testing.T, err error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want one naming %q", parts)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Fatalf("error %q does not name %q", err, p)
		}
	}
}

func TestUserMisuseNilFunctionsAreRefused(t *testing.T) {
	src := func(env *stream.Environment) *stream.Stream[ev] {
		return stream.FromSource(env, "events", newUserSlice(numberedEvents(10, 2)))
	}
	sinkTo := func(s *stream.Stream[string]) {
		s.To("out", func() operators.Sink[string] { return operators.NewSinkFunc(func(string) error { return nil }) })
	}
	cases := map[string]func(env *stream.Environment){
		"filter": func(env *stream.Environment) {
			src(env).Filter("filter", nil).ForEach("out", func(ev) error { return nil })
		},
		"foreach": func(env *stream.Environment) { src(env).ForEach("foreach", nil) },
		"flatmap": func(env *stream.Environment) {
			sinkTo(stream.FlatMap[ev, string](src(env), "flatmap", nil))
		},
		"keyedprocess": func(env *stream.Environment) {
			sinkTo(stream.KeyedProcess[ev, string, string](stream.KeyBy(src(env), evKey), "keyedprocess", nil).UID("kp"))
		},
		"process": func(env *stream.Environment) {
			sinkTo(stream.Process[ev, string](src(env), "process", nil))
		},
		"aggregate": func(env *stream.Environment) {
			stream.Aggregate[ev, string, int64, int64](stream.KeyBy(src(env), evKey), "aggregate", nil).UID("agg").
				ForEach("out", func(int64) error { return nil })
		},
		"reduce": func(env *stream.Environment) {
			stream.KeyBy(src(env), evKey).Reduce("reduce", nil).UID("r").ForEach("out", func(ev) error { return nil })
		},
		"windowaggregate": func(env *stream.Environment) {
			w := stream.Window(stream.KeyBy(src(env), evKey), operators.TumblingEventTimeWindows(time.Second))
			stream.WindowAggregate[ev, string, int64, int64](w, "windowaggregate", nil).UID("w").
				ForEach("out", func(operators.WindowResult[string, int64]) error { return nil })
		},
		"windowreduce": func(env *stream.Environment) {
			w := stream.Window(stream.KeyBy(src(env), evKey), operators.TumblingEventTimeWindows(time.Second))
			w.Reduce("windowreduce", nil).UID("w").ForEach("out", func(operators.WindowResult[string, ev]) error { return nil })
		},
		"windowprocess": func(env *stream.Environment) {
			w := stream.Window(stream.KeyBy(src(env), evKey), operators.TumblingEventTimeWindows(time.Second))
			sinkTo(stream.WindowProcess[ev, string, string](w, "windowprocess", nil).UID("w"))
		},
		"broadcast": func(env *stream.Environment) {
			rules := stream.FromSource(env, "rules", newUserSlice([]alertRule{{"k0", 1}}))
			sinkTo(stream.ConnectBroadcast[ev, string, alertRule, string](stream.KeyBy(src(env), evKey), rules, "broadcast", nil).UID("b"))
		},
		"timestamps": func(env *stream.Environment) {
			src(env).AssignTimestampsAndWatermarks("timestamps", watermark.ForMonotonous[ev](nil)).
				ForEach("out", func(ev) error { return nil })
		},
	}
	for name, build := range cases {
		t.Run(name, func(t *testing.T) {
			wantUserErrNaming(t, userPlanErr(t, build), `"`+name+`"`)
		})
	}
}

func TestUserMisuseReusedUIDIsRefused(t *testing.T) {
	err := userPlanErr(t, func(env *stream.Environment) {
		s := stream.FromSource(env, "events", newUserSlice(numberedEvents(10, 2))).UID("x")
		stream.Aggregate(stream.KeyBy(s, evKey), "totals", evTotalAgg{}).UID("x").
			ForEach("out", func(userKeyTotal) error { return nil })
	})
	wantUserErrNaming(t, err, `"x"`)
}

type userAnyKey struct{ X any }

func TestUserMisuseKeyWithoutEncodingIsRefused(t *testing.T) {
	err := userPlanErr(t, func(env *stream.Environment) {
		s := stream.FromSource(env, "events", newUserSlice(numberedEvents(10, 2)))
		stream.Aggregate(stream.KeyBy(s, func(e ev) userAnyKey { return userAnyKey{e.Key} }), "totals", evTotalAgg{}).UID("t").
			ForEach("out", func(userKeyTotal) error { return nil })
	})
	wantUserErrNaming(t, err, "key")
}

func TestUserMisuseParallelismOutOfRange(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    int
	}{{"above max", 129}, {"zero", 0}, {"negative", -1}} {
		t.Run(tc.name, func(t *testing.T) {
			err := userPlanErr(t, func(env *stream.Environment) {
				s := stream.FromSource(env, "events", newUserSlice(numberedEvents(10, 2))).SetParallelism(1)
				stream.Aggregate(stream.KeyBy(s, evKey), "totals", evTotalAgg{}).UID("t").SetParallelism(tc.p).
					ForEach("out", func(userKeyTotal) error { return nil })
			})
			wantUserErrNaming(t, err, `"totals"`)
		})
	}
}

func TestUserMisuseSinkErrorAndSourcePanicFailTheJob(t *testing.T) {
	t.Run("sink error", func(t *testing.T) {
		env := stream.NewEnvironment("misuse", stream.WithParallelism(2))
		stream.FromSource(env, "events", newUserSlice(numberedEvents(1000, 3))).SetParallelism(1).Rebalance().
			ForEach("bad-sink", func(e ev) error {
				if e.V == 500 {
					return errors.New("disk full")
				}
				return nil
			})
		err := env.Execute(userCtx(t))
		var te *actors.TaskError
		if !errors.As(err, &te) || te.Operator != "bad-sink" {
			t.Fatalf("Execute: %v, want a TaskError of bad-sink", err)
		}
		wantUserErrNaming(t, err, "bad-sink", "disk full")
	})
	t.Run("source panic", func(t *testing.T) {
		env := stream.NewEnvironment("misuse", stream.WithParallelism(2))
		stream.FromSource(env, "panicky", func() operators.Source[ev] { return panicEvSource{} }).
			ForEach("out", func(ev) error { return nil })
		err := env.Execute(userCtx(t))
		var te *actors.TaskError
		if !errors.As(err, &te) || te.Operator != "panicky" || !te.Panic {
			t.Fatalf("Execute: %v, want a panic TaskError of panicky", err)
		}
		wantUserErrNaming(t, err, "panicky", "boom")
	})
}

type panicEvSource struct{ operators.Base }

func (panicEvSource) Poll(operators.Collector[ev], int) (operators.Status, error) { panic("boom") }
func (panicEvSource) Available() <-chan struct{}                                  { return nil }

func TestUserMisuseSavepointIntoChangedGraph(t *testing.T) {
	events := numberedEvents(200, 4)
	dir := t.TempDir()
	first := operators.NewCollectSink[userKeyTotal]()
	env := userRollingJob(dir, 2, events, 100, make(chan struct{}), first)
	job, err := env.ExecuteAsync(userCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 0, "the first half", func() bool { return first.Len() == 100 })
	sp, err := job.StopWithSavepoint(userCtx(t), "")
	if err != nil {
		t.Fatal(err)
	}
	if err := job.Wait(); err != nil {
		t.Fatal(err)
	}

	// The aggregate is gone: refused, naming it, unless allowNonRestored.
	changed := func(allow bool, sink *operators.CollectSink[ev]) *stream.Environment {
		cfg := snapshot.DefaultConfig()
		cfg.Dir = t.TempDir()
		env := stream.NewEnvironment("user-rolling", stream.WithParallelism(2), stream.WithCheckpointing(cfg),
			stream.WithSavepoint(sp, allow))
		open := make(chan struct{})
		close(open)
		src := stream.FromSource(env, "events", newUserGatedSlice(events, 0, open)).SetParallelism(1).UID("events")
		src.To("out2", func() operators.Sink[ev] { return sink.Subtask() }).UID("out2")
		return env
	}
	err = changed(false, operators.NewCollectSink[ev]()).Execute(userCtx(t))
	wantUserErrNaming(t, err, `"totals"`)
	sink := operators.NewCollectSink[ev]()
	if err := changed(true, sink).Execute(userCtx(t)); err != nil {
		t.Fatalf("with allowNonRestored: %v", err)
	}
	if got := sink.Len(); got != 100 {
		t.Fatalf("with allowNonRestored the source went on with %d records, want 100", got)
	}

	// The aggregate keeps its uid but its state type changed: refused at
	// once, naming it, though a restart strategy would try again.
	cfg := snapshot.DefaultConfig()
	cfg.Dir = t.TempDir()
	env = stream.NewEnvironment("user-rolling", stream.WithParallelism(2), stream.WithCheckpointing(cfg),
		stream.WithSavepoint(sp, false), stream.WithRestartStrategy(&snapshot.FixedDelay{Attempts: 5}))
	open := make(chan struct{})
	close(open)
	src := stream.FromSource(env, "events", newUserGatedSlice(events, 0, open)).SetParallelism(1).UID("events")
	stream.Aggregate(stream.KeyBy(src, evKey), "totals", evSumAgg{}).UID("totals").
		To("out", func() operators.Sink[int64] { return operators.NewSinkFunc(func(int64) error { return nil }) }).UID("out")
	err = env.Execute(userCtx(t))
	wantUserErrNaming(t, err, "totals")
	if !errors.Is(err, state.ErrIncompatibleState) {
		t.Fatalf("restore into another state type: %v, want ErrIncompatibleState", err)
	}
}

// TestUserJobLateDataAcrossFailure runs the tumbling windows with allowed
// lateness and the late-data side output through a failure after a
// checkpoint: with exactly-once file sinks the committed results and late
// records are those of the run without the failure.
func TestUserJobLateDataAcrossFailure(t *testing.T) {
	events := disorderedUserEvents(6, 3000, 5, 40)
	for i := range events {
		events[i].V = int64(i + 1) // distinct, for the failure's trigger
	}
	dir, out, lateOut := t.TempDir(), t.TempDir(), t.TempDir()
	cfg := snapshot.DefaultConfig()
	cfg.Dir = dir
	cfg.Interval = 20 * time.Millisecond
	env := stream.NewEnvironment("user-late-failure", stream.WithParallelism(2), stream.WithCheckpointing(cfg),
		stream.WithRestartStrategy(&snapshot.FixedDelay{Attempts: 1}))
	gate := make(chan struct{})
	var trip atomic.Bool
	src := stream.FromSource(env, "events", newUserGatedSlice(events, 1500, gate)).SetParallelism(1).UID("events").
		AssignTimestampsAndWatermarks("timestamps",
			watermark.ForBoundedOutOfOrderness(3*time.Millisecond, evTime).WithPerEventEmit()).UID("timestamps")
	// At the source's parallelism: a rebalance to two subtasks would give
	// the window two inputs whose records interleave at random, and which
	// records are late would vary from run to run.
	mapped := stream.Map(src, "maybe-fail", failOnceAt(&trip, 2500)).SetParallelism(1)
	lateTag := operators.NewOutputTag[ev]("late")
	res := stream.WindowAggregate(stream.Window(stream.KeyBy(mapped, evKey), operators.TumblingEventTimeWindows(10*time.Millisecond)).
		AllowedLateness(8*time.Millisecond).SideOutputLateData(lateTag), "sum", evSumAgg{}).UID("sum")
	res.To("results", func() operators.Sink[operators.WindowResult[string, int64]] {
		return operators.NewFileSink(out, func(r operators.WindowResult[string, int64]) string {
			return fmt.Sprintf("%s %v %d", r.Key, r.Window, r.Value)
		})
	}).UID("results")
	stream.SideOutput(res, lateTag).To("late", func() operators.Sink[ev] {
		return operators.NewFileSink(lateOut, ev.String)
	}).UID("late")
	job, err := env.ExecuteAsync(userCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 0, "a completed checkpoint", func() bool {
		for _, s := range job.History() {
			if s.Status == snapshot.Completed {
				return true
			}
		}
		return false
	})
	close(gate)
	if err := job.Wait(); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	if !trip.Load() || len(job.Restores()) != 1 {
		t.Fatalf("failure injected %v, restores %v: want one restart", trip.Load(), job.Restores())
	}
	want, wantLate := refUserWindows(events, 10, 10, 3, 8)
	diffUserLines(t, "committed results", committedUserLines(t, out), sortUserResults(want))
	diffUserLines(t, "committed late records", committedUserLines(t, lateOut), sortUserEvents(wantLate))
}

// TestUserJobKeyedProcessTimersAcrossSavepoint stops the KeyedProcess job
// with a savepoint while its timers are pending and restores it at
// another parallelism: the event-time outputs are those of a run without
// the stop, and the processing-time timers registered before the stop
// fire after the restore when the clock reaches them.
func TestUserJobKeyedProcessTimersAcrossSavepoint(t *testing.T) {
	events := disorderedUserEvents(7, 900, 6, 25)
	half := 400
	build := func(p int, clock clockwork.Clock, gate <-chan struct{}, sink *operators.CollectSink[string], opts ...stream.Option) *stream.Environment {
		cfg := snapshot.DefaultConfig()
		cfg.Dir = t.TempDir()
		env := stream.NewEnvironment("user-keyed-process", append([]stream.Option{stream.WithParallelism(p),
			stream.WithClock(clock), stream.WithCheckpointing(cfg)}, opts...)...)
		src := stream.FromSource(env, "events", func() operators.Source[ev] {
			return &userSliceSource[ev]{recs: events, gate: gate, gateAt: half, hold: true}
		}).SetParallelism(1).UID("events").
			AssignTimestampsAndWatermarks("timestamps", watermark.ForBoundedOutOfOrderness(4*time.Millisecond, evTime).WithPerEventEmit()).UID("timestamps")
		out := stream.KeyedProcess(stream.KeyBy(src, evKey), "buckets", func() operators.KeyedProcessFunction[string, ev, string] {
			return &userBucketer{}
		}).UID("buckets")
		out.To("out", func() operators.Sink[string] { return sink.Subtask() }).UID("out")
		return env
	}
	clock := clockwork.NewFakeClockAt(time.UnixMilli(1_700_000_000_000))
	first := operators.NewCollectSink[string]()
	job, err := build(3, clock, make(chan struct{}), first).ExecuteAsync(userCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	wantFirst := refUserBuckets(events[:half], 4)
	testutil.Eventually(t, 0, "the first half's outputs", func() bool { return first.Len() >= len(wantFirst) })
	sp, err := job.StopWithSavepoint(userCtx(t), "")
	if err != nil {
		t.Fatal(err)
	}
	if err := job.Wait(); err != nil {
		t.Fatal(err)
	}
	diffUserLines(t, "first half", sortUserStrings(first.Values()), sortUserStrings(wantFirst))

	open := make(chan struct{})
	close(open)
	second := operators.NewCollectSink[string]()
	ctx, cancel := context.WithCancel(userCtx(t))
	defer cancel()
	job, err = build(2, clock, open, second, stream.WithSavepoint(sp, false)).ExecuteAsync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	all := refUserBuckets(events, 4)
	wantSecond := all[len(wantFirst):]
	testutil.Eventually(t, 0, "the second half's outputs", func() bool { return second.Len() >= len(wantSecond) })
	keys := map[string]int64{}
	for _, e := range events {
		keys[e.Key]++
	}
	clock.Advance(time.Second)
	for k, n := range keys {
		wantSecond = append(wantSecond, fmt.Sprintf("pt %s %d", k, n))
	}
	testutil.Eventually(t, 0, "the processing-time outputs", func() bool { return second.Len() >= len(wantSecond) })
	cancel()
	if err := job.Wait(); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait after cancel: %v", err)
	}
	diffUserLines(t, "second half", sortUserStrings(second.Values()), sortUserStrings(wantSecond))
}

// A broadcast stream of another Environment is refused, naming the
// operator: its edge went into the other job, whose source then failed
// with a panic (integer divide by zero), while this job ran without its
// broadcast input.
func TestUserMisuseBroadcastFromAnotherEnvironment(t *testing.T) {
	e1 := stream.NewEnvironment("a")
	e2 := stream.NewEnvironment("b")
	events := stream.FromSource(e1, "events", newUserSlice(numberedEvents(5, 1)))
	rules := stream.FromSource(e2, "rules", newUserSlice([]alertRule{{"k0", 1}}))
	stream.ConnectBroadcast(stream.KeyBy(events, evKey), rules, "alerts",
		func() operators.KeyedBroadcastProcessFunction[string, ev, alertRule, string] { return &userAlerter{} }).UID("alerts").
		ForEach("out", func(string) error { return nil })
	if _, err := e1.Plan(); err == nil || !strings.Contains(err.Error(), `"alerts"`) ||
		!strings.Contains(err.Error(), "another environment") {
		t.Fatalf("Plan: %v, want the broadcast stream from another environment refused", err)
	}
	rules.ForEach("rules-out", func(alertRule) error { return nil })
	if err := e2.Execute(userCtx(t)); err != nil {
		t.Fatalf("the other environment's job: %v", err)
	}
}

// Bad window settings and a bad timestamp strategy name the operator.
func TestUserMisuseWindowAndStrategyErrorsNameTheOperator(t *testing.T) {
	keyed := func(env *stream.Environment) *stream.KeyedStream[ev, string] {
		return stream.KeyBy(stream.FromSource(env, "events", newUserSlice(numberedEvents(5, 1))), evKey)
	}
	discard := func(operators.WindowResult[string, int64]) error { return nil }
	cases := map[string]struct {
		build func(env *stream.Environment)
		want  string
	}{
		"size": {func(env *stream.Environment) {
			stream.WindowAggregate(stream.Window(keyed(env), operators.TumblingEventTimeWindows(0)), "w", evSumAgg{}).UID("w").ForEach("out", discard)
		}, "window.size (0ms) must be at least 1ms"},
		"lateness": {func(env *stream.Environment) {
			w := stream.Window(keyed(env), operators.TumblingEventTimeWindows(time.Second)).AllowedLateness(-time.Second)
			stream.WindowAggregate(w, "w", evSumAgg{}).UID("w").ForEach("out", discard)
		}, "window.allowed_lateness (-1s) must not be negative"},
		"merge": {func(env *stream.Environment) {
			w := stream.Window(keyed(env), operators.SlidingEventTimeWindows(time.Second, time.Millisecond))
			stream.WindowAggregate(w, "w", evTotalAgg{}).UID("w").ForEach("out", func(operators.WindowResult[string, userKeyTotal]) error { return nil })
		}, "needs a Merge(a, b) method"},
		"strategy": {func(env *stream.Environment) {
			stream.FromSource(env, "events", newUserSlice(numberedEvents(5, 1))).
				AssignTimestampsAndWatermarks("w", watermark.ForMonotonous[ev](nil)).ForEach("out", func(ev) error { return nil })
		}, "timestamp must be set"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			err := userPlanErr(t, tc.build)
			wantUserErrNaming(t, err, `stream: operator "w": `, tc.want)
			if n := strings.Count(err.Error(), tc.want); n != 1 {
				t.Fatalf("%q reported %d times: %v", tc.want, n, err)
			}
		})
	}
}

// A source with nothing to emit whose Available channel is nil would
// never be polled again: the job fails, naming the source, instead of
// waiting for ever.
func TestUserMisuseNilAvailableFailsTheJob(t *testing.T) {
	env := stream.NewEnvironment("misuse")
	stream.FromSource(env, "quiet", func() operators.Source[ev] { return nilAvailableSource{} }).
		ForEach("out", func(ev) error { return nil })
	err := env.Execute(userCtx(t))
	var te *actors.TaskError
	if !errors.As(err, &te) || te.Operator != "quiet" || !errors.Is(err, actors.ErrNilAvailable) {
		t.Fatalf("Execute: %v, want a TaskError of quiet wrapping ErrNilAvailable", err)
	}
}

type nilAvailableSource struct{ operators.Base }

func (nilAvailableSource) Poll(operators.Collector[ev], int) (operators.Status, error) {
	return operators.NothingAvailable, nil
}
func (nilAvailableSource) Available() <-chan struct{} { return nil }

// TestUserJobSessionWindows runs event-time session windows over input
// whose disorder stays within the out-of-orderness, so no record is late:
// every key's sessions are its runs of timestamps at most the gap apart,
// each fired once with its sum.
func TestUserJobSessionWindows(t *testing.T) {
	r := rand.New(rand.NewSource(8))
	var events []ev
	ts := int64(1000)
	for i := 0; i < 1500; i++ {
		ts += int64(r.Intn(3))
		events = append(events, ev{Key: "k" + strconv.Itoa(r.Intn(4)), TS: ts - int64(r.Intn(3)), V: int64(i + 1)})
	}
	const gap = 6
	env := stream.NewEnvironment("user-sessions", stream.WithParallelism(2), stream.WithClock(clockwork.NewFakeClock()))
	src := stream.FromSource(env, "events", newUserSlice(events)).SetParallelism(1).
		AssignTimestampsAndWatermarks("timestamps", watermark.ForBoundedOutOfOrderness(3*time.Millisecond, evTime).WithPerEventEmit())
	res := stream.WindowAggregate(stream.Window(stream.KeyBy(src, evKey), operators.EventTimeSessionWindows(gap*time.Millisecond)),
		"sessions", evSumAgg{}).UID("sessions")
	sink := operators.NewCollectSink[operators.WindowResult[string, int64]]()
	res.To("out", func() operators.Sink[operators.WindowResult[string, int64]] { return sink.Subtask() })
	if err := env.Execute(userCtx(t)); err != nil {
		t.Fatalf("Execute: %v", err)
	}
	perKey := map[string][]ev{}
	for _, e := range events {
		perKey[e.Key] = append(perKey[e.Key], e)
	}
	var want []operators.WindowResult[string, int64]
	for k, es := range perKey {
		sort.SliceStable(es, func(i, j int) bool { return es[i].TS < es[j].TS })
		cur := operators.WindowResult[string, int64]{Key: k, Window: operators.Window{Start: es[0].TS, End: es[0].TS + gap}}
		for _, e := range es {
			if e.TS > cur.Window.End { // touching sessions merge, as in Flink

				want = append(want, cur)
				cur = operators.WindowResult[string, int64]{Key: k, Window: operators.Window{Start: e.TS, End: e.TS + gap}}
			}
			cur.Value += e.V
			cur.Window.End = max(cur.Window.End, e.TS+gap)
		}
		want = append(want, cur)
	}
	if len(want) < 50 {
		t.Fatalf("only %d sessions: the input exercises too little", len(want))
	}
	diffUserLines(t, "sessions", sortUserResults(sink.Values()), sortUserResults(want))
}

// userOpenWriter writes keyed state in Open, where no key is current.
type userOpenWriter struct {
	operators.KeyedProcessBase[string, int64]
	count state.Value[int64]
}

func (f *userOpenWriter) Open(rt *operators.KeyedRuntime[string]) error {
	var err error
	if f.count, err = state.NewValue(rt.Backend(), rt.Keys(), state.ValueDescriptor[int64]{Name: "count"}); err != nil {
		return err
	}
	f.count.Update(0)
	return nil
}

func (f *userOpenWriter) ProcessElement(_ ev, ctx *operators.KeyedContext[string, int64]) error {
	c, _ := f.count.Get()
	f.count.Update(c + 1)
	ctx.Emit(c + 1)
	return nil
}

// Keyed state used in Open fails the job at every parallelism; at
// parallelism 1 (and in subtask 0, which owns key group 0) it used to
// write the state of key "" and run on.
func TestUserMisuseKeyedStateInOpenFailsTheJob(t *testing.T) {
	for _, p := range []int{1, 3} {
		t.Run(fmt.Sprintf("p=%d", p), func(t *testing.T) {
			env := stream.NewEnvironment("misuse", stream.WithParallelism(p))
			s := stream.FromSource(env, "events", newUserSlice(numberedEvents(100, 5))).SetParallelism(1)
			stream.KeyedProcess(stream.KeyBy(s, evKey), "counts", func() operators.KeyedProcessFunction[string, ev, int64] {
				return &userOpenWriter{}
			}).UID("counts").ForEach("out", func(int64) error { return nil })
			err := env.Execute(userCtx(t))
			var te *actors.TaskError
			if !errors.As(err, &te) || te.Operator != "counts" || !errors.Is(err, state.ErrNoCurrentKey) {
				t.Fatalf("Execute: %v, want a TaskError of counts wrapping state.ErrNoCurrentKey", err)
			}
			wantUserErrNaming(t, err, `"count"`, "not in Open")
		})
	}
}

// userRuleCounter counts, in keyed state, the rules it was sent: a
// broadcast record has no key, so the count has none to belong to.
type userRuleCounter struct {
	rules      state.Value[int64]
	broadcasts *atomic.Int64
}

func (f *userRuleCounter) Open(rt *operators.BroadcastRuntime[string]) error {
	var err error
	f.rules, err = state.NewValue(rt.Backend(), rt.Keys(), state.ValueDescriptor[int64]{Name: "rules"})
	return err
}

func (f *userRuleCounter) ProcessElement(_ ev, ctx *operators.KeyedContext[string, string]) error {
	n, _ := f.rules.Get()
	ctx.Emit(fmt.Sprintf("%s %d", ctx.CurrentKey(), n))
	return nil
}

func (f *userRuleCounter) ProcessBroadcastElement(alertRule, *operators.BroadcastContext[string]) error {
	f.broadcasts.Add(1)
	n, _ := f.rules.Get()
	f.rules.Update(n + 1)
	return nil
}

func (f *userRuleCounter) OnTimer(int64, *operators.KeyedContext[string, string]) error { return nil }

// Keyed state used in ProcessBroadcastElement fails the job, whether a
// keyed record came before the broadcast one or not; it used to read and
// write the state of the keyed record processed last (or of key "" in
// subtask 0 before any), and the job ran on.
func TestUserMisuseKeyedStateInProcessBroadcastElementFailsTheJob(t *testing.T) {
	for _, first := range []string{"keyed", "broadcast"} {
		t.Run(first+" first", func(t *testing.T) {
			env := stream.NewEnvironment("misuse", stream.WithParallelism(1))
			gate := make(chan struct{})
			events := &userSliceSource[ev]{recs: numberedEvents(20, 3)}
			rules := &userSliceSource[alertRule]{recs: []alertRule{{"k0", 1}}}
			// The source that goes second waits until the first has sent
			// its records through the operator.
			if first == "keyed" {
				rules.gate, rules.gateAt = gate, 0
			} else {
				events.gate, events.gateAt = gate, 0
			}
			src := stream.FromSource(env, "events", func() operators.Source[ev] { return events })
			ruleStream := stream.FromSource(env, "rules", func() operators.Source[alertRule] { return rules })
			var seen, broadcasts atomic.Int64
			stream.ConnectBroadcast(stream.KeyBy(src, evKey), ruleStream, "counter",
				func() operators.KeyedBroadcastProcessFunction[string, ev, alertRule, string] {
					return &userRuleCounter{broadcasts: &broadcasts}
				}).UID("counter").
				ForEach("out", func(string) error {
					seen.Add(1)
					return nil
				})
			job, err := env.ExecuteAsync(userCtx(t))
			if err != nil {
				t.Fatal(err)
			}
			if first == "keyed" {
				testutil.Eventually(t, 0, "the keyed records through", func() bool { return seen.Load() == 20 })
			} else {
				testutil.Eventually(t, 0, "the broadcast record through", func() bool { return broadcasts.Load() == 1 })
			}
			close(gate)
			err = job.Wait()
			var te *actors.TaskError
			if !errors.As(err, &te) || te.Operator != "counter" || !errors.Is(err, state.ErrNoCurrentKey) {
				t.Fatalf("Execute: %v, want a TaskError of counter wrapping state.ErrNoCurrentKey", err)
			}
			wantUserErrNaming(t, err, `"rules"`, "ProcessBroadcastElement")
		})
	}
}

// userMovedWindowJob is userWindowFileJob with savepoints only, so that
// every result before a stop is in the stop's own transaction, at
// parallelism p.
func userMovedWindowJob(dir, out string, p int, events []ev, gateAt int, gate <-chan struct{}, opts ...stream.Option) *stream.Environment {
	cfg := snapshot.DefaultConfig()
	cfg.Dir = dir
	env := stream.NewEnvironment("user-moved", append([]stream.Option{stream.WithParallelism(p), stream.WithCheckpointing(cfg)}, opts...)...)
	return windowFileJob(env, out, events, gateAt, gate)
}

// A job stopped with a savepoint resumes from it with its file sink
// writing to another, empty directory (the job moved to another device,
// or its output to another disk), at the same parallelism or another:
// the parts the stop committed stay where they were, and the resumed job
// writes exactly the rest. Before, the restore committed the stop's parts
// again, did not find them in the new directory, and every start failed
// with "file sink: commit part-…: neither pending nor committed".
func TestUserJobStoppedResumesWithTheFileSinkElsewhere(t *testing.T) {
	events := numberedEvents(3000, 5)
	first := t.TempDir()
	env := userMovedWindowJob(t.TempDir(), first, 2, events, 1500, make(chan struct{}))
	job, err := env.ExecuteAsync(userCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 0, "results before the gate", func() bool {
		parts, _ := os.ReadDir(first)
		return len(parts) > 0
	})
	sp, err := job.StopWithSavepoint(userCtx(t), "")
	if err != nil {
		t.Fatalf("StopWithSavepoint: %v", err)
	}
	if err := job.Wait(); err != nil {
		t.Fatalf("Wait after the stop: %v", err)
	}
	before := committedUserLines(t, first)
	if len(before) == 0 {
		t.Fatal("the stop committed nothing")
	}
	want, _ := refUserWindows(events, 50, 50, 0, 0)
	for _, p := range []int{2, 3} {
		t.Run(fmt.Sprintf("p=%d", p), func(t *testing.T) {
			moved := t.TempDir()
			open := make(chan struct{})
			close(open)
			env := userMovedWindowJob(t.TempDir(), moved, p, events, 0, open, stream.WithSavepoint(sp, false))
			if err := env.Execute(userCtx(t)); err != nil {
				t.Fatalf("Execute from %s with the sink in another directory: %v", sp, err)
			}
			diffUserLines(t, "results before the stop and after it", sortUserStrings(append(committedUserLines(t, moved), before...)), sortUserResults(want))
		})
	}
}
