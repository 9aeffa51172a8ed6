package stream_test

import (
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/stream"
	"github.com/edgedio/edged/watermark"
)

// The jobs here run late-heavy input (lateHeavyEvents) through tumbling,
// sliding and session windows with allowed lateness and a late-data side
// output, at window parallelism 3 behind one source subtask with per-event
// watermarks, and compare every committed result (on-time and late
// firings) and every late record with refWindows: a plain model of
// Flink's window semantics written from the README, not from the
// operators. With injected failures the committed output must still equal
// the model exactly.

// refSpec is the window of a reference run; times in ms.
type refSpec struct {
	kind               string // tumbling, sliding, session
	size, slide, gap   int64
	lateness, disorder int64
	assigner           operators.WindowAssigner
}

type refWin struct{ start, end int64 }

func refLine(key string, w refWin, a lateAcc) string {
	return fmt.Sprintf("%s,%d,%d,%d,%d", key, w.start, w.end, a.N, a.Sum)
}

func refFloor(t, step int64) int64 { return t - ((t%step)+step)%step }

// refWindows returns the sorted results and late records of events in
// arrival order: the watermark after each event is the largest timestamp
// so far - disorder - 1, and the final watermark ends the input. A record
// joins every window (session: the session it merges into) whose cleanup
// time (end - 1 + lateness) is after the watermark, and fires at once a
// window the watermark already passed; a record joining no window is
// late. A watermark fires the windows whose end - 1 it passes and drops
// those whose cleanup time it reaches.
func refWindows(s refSpec, events []lateEvent) (results, late []string) {
	wm := int64(math.MinInt64)
	maxTs := int64(math.MinInt64)
	state := map[string]map[refWin]*lateAcc{}
	advance := func(nw int64) {
		for k, m := range state {
			for w, a := range m {
				if w.end-1 > wm && w.end-1 <= nw {
					results = append(results, refLine(k, w, *a))
				}
				if w.end-1+s.lateness <= nw {
					delete(m, w)
				}
			}
		}
		wm = nw
	}
	for _, e := range events {
		m := state[e.Key]
		if m == nil {
			m = map[refWin]*lateAcc{}
			state[e.Key] = m
		}
		var joined []refWin
		switch s.kind {
		case "session":
			merged := refWin{e.TS, e.TS + s.gap}
			var absorbed []refWin
			for w := range m {
				if w.start <= merged.end && merged.start <= w.end {
					absorbed = append(absorbed, w)
					merged = refWin{min(merged.start, w.start), max(merged.end, w.end)}
				}
			}
			if merged.end-1+s.lateness > wm {
				a := &lateAcc{}
				for _, w := range absorbed {
					a.N += m[w].N
					a.Sum += m[w].Sum
					delete(m, w)
				}
				m[merged] = a
				joined = append(joined, merged)
			}
		default:
			slide := s.slide
			if s.kind == "tumbling" {
				slide = s.size
			}
			for st := refFloor(e.TS, slide); st > e.TS-s.size; st -= slide {
				w := refWin{st, st + s.size}
				if w.end-1+s.lateness <= wm {
					continue
				}
				if m[w] == nil {
					m[w] = &lateAcc{}
				}
				joined = append(joined, w)
			}
		}
		if len(joined) == 0 {
			late = append(late, fmt.Sprintf("%s,%d,%d", e.Key, e.TS, e.V))
		}
		for _, w := range joined {
			a := m[w]
			a.N++
			a.Sum += e.V
			if w.end-1 <= wm {
				results = append(results, refLine(e.Key, w, *a))
			}
		}
		maxTs = max(maxTs, e.TS)
		if nw := maxTs - s.disorder - 1; nw > wm {
			advance(nw)
		}
	}
	advance(math.MaxInt64)
	slices.Sort(results)
	slices.Sort(late)
	return results, late
}

type lateSumMerge struct{ lateSum }

func (lateSumMerge) Merge(a, b lateAcc) lateAcc { return lateAcc{N: a.N + b.N, Sum: a.Sum + b.Sum} }

// refJob is pacedSource (one subtask, failing as fail says) -> per-event
// bounded out-of-orderness watermarks -> key by -> the windows of s at
// parallelism 3 -> exactly-once file sinks of the results and late records.
func refJob(s refSpec, events []lateEvent, out, lateOut string, fail *lateFailer, opts ...stream.Option) *stream.Environment {
	env := stream.NewEnvironment("window-reference", append([]stream.Option{stream.WithParallelism(3)}, opts...)...)
	src := stream.FromSource(env, "events", func() operators.Source[lateEvent] {
		return &pacedSource{all: events, rate: 20_000, holdLast: len(events) / 10, fail: fail}
	}).SetParallelism(1).UID("events").
		AssignTimestampsAndWatermarks("timestamps",
			watermark.ForBoundedOutOfOrderness(time.Duration(s.disorder)*time.Millisecond, lateEventTime).WithPerEventEmit())
	tag := operators.NewOutputTag[lateEvent]("late")
	w := stream.Window(stream.KeyBy(src, func(e lateEvent) string { return e.Key }), s.assigner).
		AllowedLateness(time.Duration(s.lateness) * time.Millisecond).SideOutputLateData(tag)
	res := stream.WindowAggregate(w, "windows", lateSumMerge{}).UID("windows")
	res.To("results", func() operators.Sink[operators.WindowResult[string, lateAcc]] {
		return operators.NewFileSink(out, func(r operators.WindowResult[string, lateAcc]) string {
			return refLine(r.Key, refWin{r.Window.Start, r.Window.End}, r.Value)
		})
	}).UID("results")
	stream.SideOutput(res, tag).To("late", func() operators.Sink[lateEvent] {
		return operators.NewFileSink(lateOut, func(e lateEvent) string {
			return fmt.Sprintf("%s,%d,%d", e.Key, e.TS, e.V)
		})
	}).UID("late")
	return env
}

// Late-heavy input through tumbling, sliding and session windows with
// allowed lateness, failing at random records and restarting from its
// checkpoints: every committed result (each on-time firing and each firing
// by a record within the lateness) and every late record equals the
// reference model's, exactly once.
func TestWindowsWithLatenessMatchReferenceUnderFailures(t *testing.T) {
	testutil.Burn(t, 1)
	seed := lateSeed(t)
	t.Logf("seed %d (rerun with LATE_SEED=%d)", seed, seed)
	events, _ := lateHeavyEvents(6_000, 6, seed)
	// Sessions need silences: drop stretches of each key's events.
	var sparse []lateEvent
	for _, e := range events {
		if (e.TS/700)%3 != int64(e.Key[1]-'0')%3 {
			sparse = append(sparse, e)
		}
	}
	specs := []refSpec{
		{kind: "tumbling", size: 1000, lateness: 500, disorder: 200, assigner: operators.TumblingEventTimeWindows(time.Second)},
		{kind: "sliding", size: 1000, slide: 300, lateness: 700, disorder: 200, assigner: operators.SlidingEventTimeWindows(time.Second, 300*time.Millisecond)},
		{kind: "session", gap: 150, lateness: 400, disorder: 200, assigner: operators.EventTimeSessionWindows(150 * time.Millisecond)},
	}
	for _, s := range specs {
		t.Run(s.kind, func(t *testing.T) {
			in := events
			if s.kind == "session" {
				in = sparse
			}
			wantRes, wantLate := refWindows(s, in)
			refires := 0
			for i := range wantRes {
				if i > 0 && strings.Join(strings.Split(wantRes[i], ",")[:3], ",") == strings.Join(strings.Split(wantRes[i-1], ",")[:3], ",") {
					refires++
				}
			}
			if len(wantLate) == 0 || refires == 0 {
				t.Fatalf("the reference has %d late records and %d refires: the input does not reach them", len(wantLate), refires)
			}
			fail := &lateFailer{rng: rand.New(rand.NewPCG(seed, 17))}
			fail.left.Store(3)
			out, lateOut := t.TempDir(), t.TempDir()
			cfg := checkpointConfig(t, snapshot.ExactlyOnce)
			cfg.Interval = 20 * time.Millisecond
			var logs testutil.Buffer
			if err := execute(t, refJob(s, in, out, lateOut, fail,
				stream.WithCheckpointing(cfg),
				stream.WithLogger(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))),
				stream.WithRestartStrategy(&snapshot.FixedDelay{Attempts: 6}))); err != nil {
				t.Fatalf("%v\nwarnings:\n%s", err, logs.String())
			}
			if fired := fail.fired.Load(); fired != 3 {
				t.Errorf("%d failures injected, want 3", fired)
			}
			t.Logf("%d results (%d fired again by records within the lateness), %d late records", len(wantRes), refires, len(wantLate))
			if got := committedLines(t, out); !slices.Equal(got, wantRes) {
				t.Errorf("results differ from the reference (seed %d): %d lines vs %d\n%s", seed, len(got), len(wantRes), diffLines(got, wantRes))
			}
			if got := committedLines(t, lateOut); !slices.Equal(got, wantLate) {
				t.Errorf("late records differ from the reference (seed %d): %d lines vs %d\n%s", seed, len(got), len(wantLate), diffLines(got, wantLate))
			}
		})
	}
}
