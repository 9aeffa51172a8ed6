package stream_test

import (
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/stream"
	"github.com/edgedio/edged/watermark"
)

// lateEvent is one record of the late-heavy job: event time in ms.
type lateEvent struct {
	Key string
	TS  int64
	V   int64
}

func lateEventTime(e lateEvent) int64 { return e.TS }

const (
	lateDisorder = 200 * time.Millisecond  // watermark bound
	lateAllowed  = 500 * time.Millisecond  // allowed lateness of the windows
	lateWindow   = 1000 * time.Millisecond // tumbling window size
)

// lateHeavyEvents returns n events over keys keys, one every 10 ms of
// event time, in an arrival order drawn from seed: most arrive within the
// watermark bound, two fifths up to 3 s behind, so that many are late (some
// within the allowed lateness, some past it). It also returns how many
// arrive behind the watermark a per-event bounded out-of-orderness
// generator would have emitted by then.
func lateHeavyEvents(n, keys int, seed uint64) ([]lateEvent, int) {
	rng := rand.New(rand.NewPCG(seed, 11))
	type arrival struct {
		at int64
		e  lateEvent
	}
	as := make([]arrival, n)
	for i := range as {
		ts := int64(i) * 10
		delay := rng.Int64N(100)
		if rng.IntN(5) < 2 {
			delay = rng.Int64N(3000)
		}
		as[i] = arrival{at: ts + delay, e: lateEvent{Key: "k" + strconv.Itoa(i%keys), TS: ts, V: int64(i)}}
	}
	slices.SortStableFunc(as, func(a, b arrival) int { return cmp.Compare(a.at, b.at) })
	out := make([]lateEvent, n)
	late := 0
	maxTs := int64(-1 << 62)
	for i, a := range as {
		out[i] = a.e
		if a.e.TS <= maxTs-lateDisorder.Milliseconds()-1 {
			late++
		}
		maxTs = max(maxTs, a.e.TS)
	}
	return out, late
}

// pacedSource emits its events in order, at most rate per second of
// processing time (so that checkpoints complete while it runs), and
// checkpoints its position: a restore replays from there. One subtask.
//
// With a failer it also fails its attempts: each attempt fails after a
// number of events drawn from the failer, counted from the first
// checkpoint the attempt completed. While failures are left it holds its
// last holdLast events back, and fails at that point once a checkpoint has
// completed, so a job does not end before its failures are in.
type pacedSource struct {
	operators.Base
	all      []lateEvent
	next     int
	rate     float64
	holdLast int
	start    time.Time
	emitted  int
	wait     <-chan time.Time

	fail      *lateFailer
	completed bool // a checkpoint of this attempt completed
	after     int  // events after that to fail at
	seen      int  // events emitted since
}

func (s *pacedSource) Open(*operators.Context) error {
	s.start = time.Now()
	if s.fail != nil {
		s.after = 1 + s.fail.rng.IntN(1000)
	}
	return nil
}

func (s *pacedSource) Poll(out operators.Collector[lateEvent], limit int) (operators.Status, error) {
	end := len(s.all)
	if f := s.fail; f != nil && f.left.Load() > 0 {
		end -= s.holdLast
		if s.completed && (s.seen >= s.after || s.next >= end) {
			f.left.Add(-1)
			f.fired.Add(1)
			panic(fmt.Sprintf("injected failure %d events after the first checkpoint", s.seen))
		}
		if s.next >= end {
			s.wait = time.After(2 * time.Millisecond)
			return operators.NothingAvailable, nil
		}
	}
	due := int(time.Since(s.start).Seconds()*s.rate) - s.emitted
	for k := 0; k < min(limit, due) && s.next < end; k++ {
		out.Collect(s.all[s.next])
		s.next++
		s.emitted++
		if s.completed {
			s.seen++
		}
	}
	if s.next >= len(s.all) {
		return operators.EndOfInput, nil
	}
	if due <= limit || s.next >= end {
		s.wait = time.After(2 * time.Millisecond)
		return operators.NothingAvailable, nil
	}
	return operators.MoreAvailable, nil
}

func (s *pacedSource) Available() <-chan struct{} {
	ch := make(chan struct{})
	if s.wait == nil {
		close(ch)
		return ch
	}
	go func(w <-chan time.Time) {
		<-w
		close(ch)
	}(s.wait)
	return ch
}

func (s *pacedSource) SnapshotState(int64) ([]byte, error) { return positionState(s.next), nil }

func (s *pacedSource) RestoreState(states [][]byte, _ int) error {
	return restorePosition(states, &s.next)
}

// positionState is the state of a one-subtask test source at position
// next; restorePosition sets *next from it (none: unchanged).
func positionState(next int) []byte { return binary.AppendUvarint(nil, uint64(next)) }

func restorePosition(states [][]byte, next *int) error {
	if len(states) == 0 || len(states[0]) == 0 {
		return nil
	}
	n, k := binary.Uvarint(states[0])
	if k <= 0 {
		return fmt.Errorf("bad source state %x", states[0])
	}
	*next = int(n)
	return nil
}

func (s *pacedSource) NotifyCheckpointComplete(int64) error { s.completed = true; return nil }
func (s *pacedSource) NotifyCheckpointAborted(int64) error  { return nil }

// lateFailer says how many failures are left to inject and draws where;
// its rng is used by one source subtask at a time (attempts do not
// overlap).
type lateFailer struct {
	rng   *rand.Rand
	left  atomic.Int64
	fired atomic.Int64
}

// lateJob is paced source (failing as fail says) -> per-event bounded
// out-of-orderness watermarks -> key by -> 1 s tumbling sum with allowed lateness and a
// late-data side output -> two exactly-once file sinks (results, late
// records).
func lateJob(events []lateEvent, out, lateOut string, fail *lateFailer, opts ...stream.Option) *stream.Environment {
	env := stream.NewEnvironment("late-heavy", append([]stream.Option{stream.WithParallelism(2)}, opts...)...)
	src := stream.FromSource(env, "events", func() operators.Source[lateEvent] {
		return &pacedSource{all: events, rate: 20_000, holdLast: len(events) / 10, fail: fail}
	}).SetParallelism(1).UID("events").
		AssignTimestampsAndWatermarks("timestamps",
			watermark.ForBoundedOutOfOrderness(lateDisorder, lateEventTime).WithPerEventEmit())
	tag := operators.NewOutputTag[lateEvent]("late")
	w := stream.Window(stream.KeyBy(src, func(e lateEvent) string { return e.Key }), operators.TumblingEventTimeWindows(lateWindow)).
		AllowedLateness(lateAllowed).SideOutputLateData(tag)
	res := stream.WindowAggregate(w, "sum", lateSum{}).UID("sum")
	res.To("results", func() operators.Sink[operators.WindowResult[string, lateAcc]] {
		return operators.NewFileSink(out, func(r operators.WindowResult[string, lateAcc]) string {
			return fmt.Sprintf("%s,%d,%d,%d", r.Key, r.Window.Start, r.Value.N, r.Value.Sum)
		})
	}).UID("results")
	stream.SideOutput(res, tag).To("late", func() operators.Sink[lateEvent] {
		return operators.NewFileSink(lateOut, func(e lateEvent) string {
			return fmt.Sprintf("%s,%d,%d", e.Key, e.TS, e.V)
		})
	}).UID("late")
	return env
}

type lateAcc struct{ N, Sum int64 }

type lateSum struct{}

func (lateSum) CreateAccumulator() lateAcc         { return lateAcc{} }
func (lateSum) Add(e lateEvent, a lateAcc) lateAcc { return lateAcc{N: a.N + 1, Sum: a.Sum + e.V} }
func (lateSum) Result(a lateAcc) lateAcc           { return a }

// lateSeed is the seed of TestLateDataSameAfterRecovery: LATE_SEED, or
// drawn and printed.
func lateSeed(t *testing.T) uint64 {
	if s := os.Getenv("LATE_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("LATE_SEED=%q: %v", s, err)
		}
		return v
	}
	return rand.Uint64()
}

// A late-heavy event-time job (two fifths of the records up to 3 s behind a
// 200 ms watermark bound: late within the allowed lateness, or past it to
// the side output) fails at random records and restarts from its
// checkpoints; its committed results and late records equal the
// failure-free run exactly, because every task's watermark, idle status
// and watermark-generator state are restored with the checkpoint.
func TestLateDataSameAfterRecovery(t *testing.T) {
	testutil.Burn(t, 1)
	seed := lateSeed(t)
	t.Logf("seed %d (rerun with LATE_SEED=%d)", seed, seed)
	events, late := lateHeavyEvents(20_000, 8, seed)
	if late < len(events)/10 {
		t.Fatalf("only %d of %d events late", late, len(events))
	}

	wantOut, wantLate := t.TempDir(), t.TempDir()
	if err := execute(t, lateJob(events, wantOut, wantLate, nil)); err != nil {
		t.Fatal(err)
	}
	wantLines, wantLateLines := committedLines(t, wantOut), committedLines(t, wantLate)
	// 8 keys x 200 windows fire once each; late records within the
	// allowed lateness fire their window again.
	if len(wantLateLines) == 0 || len(wantLines) <= 8*200 {
		t.Fatalf("failure-free run: %d results, %d late records: the job does not reach refires and the side output", len(wantLines), len(wantLateLines))
	}

	fail := &lateFailer{rng: rand.New(rand.NewPCG(seed, 13))}
	fail.left.Store(lateFailures)
	gotOut, gotLate := t.TempDir(), t.TempDir()
	cfg := checkpointConfig(t, snapshot.ExactlyOnce)
	cfg.Interval = 20 * time.Millisecond
	var logs testutil.Buffer
	env := lateJob(events, gotOut, gotLate, fail,
		stream.WithCheckpointing(cfg),
		stream.WithLogger(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))),
		stream.WithRestartStrategy(&snapshot.FixedDelay{Attempts: 2 * int(lateFailures)}))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	job, err := env.ExecuteAsync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := job.Wait(); err != nil {
		t.Fatalf("%v\nwarnings:\n%s", err, logs.String())
	}
	fired := int(fail.fired.Load())
	if fired != int(lateFailures) || len(job.Restores()) != fired {
		t.Errorf("%d failures, restores %v: want %d failures, each followed by a restore\nwarnings:\n%s", fired, job.Restores(), lateFailures, logs.String())
	}
	t.Logf("%d failures; restored checkpoints %v; %d results, %d late records", fired, job.Restores(), len(wantLines), len(wantLateLines))
	if got := committedLines(t, gotOut); strings.Join(got, "\n") != strings.Join(wantLines, "\n") {
		t.Errorf("results differ from the failure-free run (seed %d): %d lines vs %d\n%s", seed, len(got), len(wantLines), diffLines(got, wantLines))
	}
	if got := committedLines(t, gotLate); strings.Join(got, "\n") != strings.Join(wantLateLines, "\n") {
		t.Errorf("late side output differs from the failure-free run (seed %d): %d lines vs %d\n%s", seed, len(got), len(wantLateLines), diffLines(got, wantLateLines))
	}
}

var lateFailures int64 = 8
