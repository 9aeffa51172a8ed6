package operators_test

import (
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/edgedio/edged/keygroup"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/operators/operatorstest"
	"github.com/edgedio/edged/state"
	"github.com/edgedio/edged/watermark"
)

// writeGolden rewrites the snapshots of testdata/sliding-*.json from the
// code under test instead of checking them.
var writeGolden = flag.Bool("window.write-golden", false, "rewrite testdata/sliding-*.json (snapshots of sliding window aggregates) from the current code")

// goldenSnapshot is a keyed snapshot kept in testdata: the snapshot stream
// of one subtask and its key-group offsets.
type goldenSnapshot struct {
	Offsets state.KeyGroupOffsets `json:"offsets"`
	Data    []byte                `json:"data"`
}

// goldenCase is a sliding window aggregate whose snapshot, taken in the
// middle of a stream, is kept in testdata.
type goldenCase struct {
	name                          string
	size, slide, offset, lateness int64
}

var goldenCases = []goldenCase{
	{name: "60-10", size: 60, slide: 10},
	{name: "40-15-late", size: 40, slide: 15, offset: 5, lateness: 30},
	{name: "12-4-late", size: 12, slide: 4, lateness: 9},
}

// goldenStep is one step of a golden stream: a record, or a watermark
// when rec is nil.
type goldenStep struct {
	rec *ev
	wm  int64
}

// goldenStream returns the steps of c's stream: records of five keys, out
// of order, some of them late, with watermarks.
func goldenStream(c goldenCase, n int) []goldenStep {
	rng := rand.New(rand.NewPCG(uint64(c.size*1000+c.slide), 7))
	keys := []string{"a", "b", "c", "d", "e"}
	var steps []goldenStep
	now, wm := int64(0), int64(math.MinInt64)
	for range n {
		if rng.IntN(4) == 0 {
			if w := now - rng.Int64N(c.size/2+2); w > wm {
				wm = w
				steps = append(steps, goldenStep{wm: wm})
			}
			continue
		}
		now += rng.Int64N(4)
		disorder := c.size/2 + 2
		if rng.IntN(8) == 0 {
			disorder = 2*c.size + c.lateness + 2
		}
		e := ev{Key: keys[rng.IntN(len(keys))], TS: now - rng.Int64N(disorder), V: rng.Int64N(100)}
		steps = append(steps, goldenStep{rec: &e})
	}
	return steps
}

func (c goldenCase) assigner() operators.WindowAssigner {
	return operators.SlidingEventTimeWindows(ms(c.size), ms(c.slide)).WithOffset(ms(c.offset))
}

func (c goldenCase) path(agg string) string {
	return filepath.Join("testdata", fmt.Sprintf("sliding-%s-%s.json", c.name, agg))
}

// runGolden writes (with -window.write-golden) or checks the golden
// snapshot of c with aggregate agg: the first 400 steps of c's stream go
// to a sliding window aggregate, whose snapshot is the golden one; the
// check restores it at parallelism 1 and 2 and compares what the restored
// operator emits for the remaining steps with the merge-all reference fed
// the whole stream.
func runGolden[A any, R comparable](t *testing.T, c goldenCase, aggName string, agg operators.AggregateFunction[ev, A, R]) {
	const maxP, cut, n = 16, 400, 800
	steps := goldenStream(c, n)
	a := c.assigner()
	build := func(out operators.Collector[operators.WindowResult[string, R]]) operators.OneInput[ev] {
		op, err := operators.NewWindowAggregate(windowName, evKey, a, ms(c.lateness), lateTag, agg, out)
		if err != nil {
			t.Fatal(err)
		}
		return op
	}
	run := func(ih *incHarness[R], steps []goldenStep) (out []operatorstest.Record[operators.WindowResult[string, R]], wm int64) {
		wm = math.MinInt64
		for _, s := range steps {
			if s.rec != nil {
				ih.process(*s.rec)
				continue
			}
			wm = s.wm
			if err := ih.watermark(wm); err != nil {
				t.Fatal(err)
			}
		}
		return ih.drain(), wm
	}
	if *writeGolden {
		ih := newIncHarness(t, build, 1, maxP, nil, operatorstest.DefaultStart)
		defer ih.close(t)
		run(ih, steps[:cut])
		if n := ih.hs[0].StateLen(windowName + "/contents/incremental"); n == 0 {
			t.Fatalf("%s: no incremental aggregate in the snapshot", c.path(aggName))
		}
		snap := ih.snapshot(t)[0]
		b, err := json.Marshal(goldenSnapshot{Offsets: snap.offsets, Data: snap.data})
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(c.path(aggName), append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	b, err := os.ReadFile(c.path(aggName))
	if err != nil {
		t.Fatal(err)
	}
	var g goldenSnapshot
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	buildRef := func(out operators.Collector[operators.WindowResult[string, R]]) operators.OneInput[ev] {
		return operators.NewMergeAllWindowAggregate(windowName, evKey, a, ms(c.lateness), lateTag, agg, out)
	}
	ref := newIncHarness(t, buildRef, 1, maxP, nil, operatorstest.DefaultStart)
	defer ref.close(t)
	_, wm := run(ref, steps[:cut])
	refLate := ref.lateRecords()
	want, _ := run(ref, steps[cut:])
	if len(want) == 0 {
		t.Fatal("the reference emitted nothing after the snapshot")
	}
	memory := func(r keygroup.Range, h *operatorstest.Harness[ev, operators.WindowResult[string, R]]) state.Backend {
		return state.NewMemoryBackend(r, h.Clock)
	}
	bolt := func(r keygroup.Range, h *operatorstest.Harness[ev, operators.WindowResult[string, R]]) state.Backend {
		b, err := state.NewBoltBackend(filepath.Join(t.TempDir(), "state.db"), r, h.Clock, state.DefaultBoltOptions())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close() })
		return b
	}
	for _, v := range []struct {
		p       int
		backend func(keygroup.Range, *operatorstest.Harness[ev, operators.WindowResult[string, R]]) state.Backend
		name    string
	}{{1, memory, "memory"}, {2, memory, "memory"}, {2, bolt, "bolt"}} {
		p := v.p
		got := newIncHarnessOn(t, build, p, maxP, []keyedSnap{{data: g.Data, offsets: g.Offsets}}, operatorstest.DefaultStart, v.backend)
		legacy := 0
		for _, h := range got.hs {
			legacy += h.StateLen(windowName + "/contents/incremental")
		}
		if legacy == 0 {
			got.close(t)
			t.Fatalf("%s: restored no incremental aggregate of the earlier layout", c.path(aggName))
		}
		if err := got.watermark(wm); err != nil {
			t.Fatal(err)
		}
		have, _ := run(got, steps[cut:])
		if !slices.Equal(have, want) {
			t.Errorf("%s at parallelism %d on %s: emitted after the restore%v\nwant%v", c.path(aggName), p, v.name, have, want)
		}
		if l, w := got.lateRecords(), ref.lateRecords()-refLate; l != w {
			t.Errorf("%s at parallelism %d on %s: %d late records after the restore, want %d", c.path(aggName), p, v.name, l, w)
		}
		if err := got.watermark(watermark.MaxWatermark); err != nil {
			t.Fatal(err)
		}
		got.drain()
		if n := got.stateLeft(); n != 0 {
			t.Errorf("%s at parallelism %d on %s: %d state entries left at the end", c.path(aggName), p, v.name, n)
		}
		got.close(t)
	}
}

// TestSlidingWindowRestoresGoldenSnapshots restores snapshots of sliding
// window aggregates taken by an earlier version of the operator (kept in
// testdata, with its incremental aggregates in their own state) and checks
// that the restored operator emits what the merge-all reference emits for
// the rest of the stream, at parallelism 1 and 2, on the memory backend
// and on bbolt, and leaves no state behind. Rewrite the snapshots with -window.write-golden.
func TestSlidingWindowRestoresGoldenSnapshots(t *testing.T) {
	for _, c := range goldenCases {
		t.Run(c.name+"/count-sum", func(t *testing.T) {
			runGolden(t, c, "count-sum", operators.AggregateFunction[ev, cs, cs](csAgg{}))
		})
		t.Run(c.name+"/concat", func(t *testing.T) {
			runGolden(t, c, "concat", operators.AggregateFunction[ev, string, string](concatAgg{}))
		})
	}
}

// TestSlidingWindowSnapshotsHoldSlicesOnly checks that the incremental
// aggregates of sliding windows, derived from the slices, stay out of the
// keyed state (and so out of snapshots) while windows fire from them.
func TestSlidingWindowSnapshotsHoldSlicesOnly(t *testing.T) {
	h := operatorstest.New(func(out operators.Collector[result]) operators.OneInput[ev] {
		op, err := operators.NewWindowAggregate(windowName, evKey, operators.SlidingEventTimeWindows(ms(60), ms(10)), 0, "",
			operators.AggregateFunction[ev, cs, cs](csAgg{}), out)
		if err != nil {
			t.Fatal(err)
		}
		return op
	}, operatorstest.Keyed(16))
	if err := h.Open(); err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	for ts := int64(0); ts < 1000; ts += 5 {
		for _, k := range []string{"a", "b", "c"} {
			h.Process(ev{Key: k, TS: ts, V: ts}, ts)
		}
		if err := h.Watermark(ts); err != nil {
			t.Fatal(err)
		}
	}
	if inc, _ := operators.IncrementalFirings(h.Op); inc == 0 {
		t.Fatal("no result came from an incremental aggregate")
	}
	if n := h.StateLen(windowName + "/contents"); n != 3 {
		t.Errorf("%d slice sets in the state, want 3", n)
	}
	if n := h.StateLen(windowName + "/contents/incremental"); n != 0 {
		t.Errorf("%d incremental aggregates in the state, want none", n)
	}
}

// countingAgg counts and sums like csAgg and counts the calls of Merge.
type countingAgg struct {
	csAgg
	merges *int
}

func (a countingAgg) Merge(x, y cs) cs {
	*a.merges++
	return csAgg{}.Merge(x, y)
}

// TestSlidingWindowMergesPerResult checks that a sliding window's result
// costs a few merges whatever the number of slices in a window: one record
// per slice, windows of 10 and of 600 slices sliding by one.
func TestSlidingWindowMergesPerResult(t *testing.T) {
	for _, slices := range []int64{10, 600} {
		merges := 0
		h := operatorstest.New(func(out operators.Collector[result]) operators.OneInput[ev] {
			op, err := operators.NewWindowAggregate(windowName, evKey, operators.SlidingEventTimeWindows(ms(slices), ms(1)), 0, "",
				operators.AggregateFunction[ev, cs, cs](countingAgg{merges: &merges}), out)
			if err != nil {
				t.Fatal(err)
			}
			return op
		}, operatorstest.Keyed(16))
		if err := h.Open(); err != nil {
			t.Fatal(err)
		}
		const n = 6000
		for ts := range int64(n) {
			h.Process(ev{Key: "a", TS: ts, V: 1}, ts)
			if err := h.Watermark(ts); err != nil {
				t.Fatal(err)
			}
		}
		results := len(h.Drain())
		if results != n {
			t.Fatalf("%d slices: %d results, want %d", slices, results, n)
		}
		if per := float64(merges) / float64(results); per > 3 {
			t.Errorf("%d slices per window: %.2f merges per result, want at most 3", slices, per)
		} else {
			t.Logf("%d slices per window: %.2f merges per result", slices, per)
		}
		if err := h.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// A window operator restored behind the watermark its state was written
// at (at another parallelism a subtask takes the smallest watermark of
// the old subtasks whose key groups it takes over) holds windows that
// fired before the snapshot, kept for their allowed lateness, and whose
// timers are gone. A record for such a window is on time after the
// restore: the window fires again with it when the watermark passes its
// end again, as it does for session windows. Before, the record joined
// the window's slice and no timer fired it: it was in no result and not
// in the late-data side output. The old subtask's watermark is 100; the
// restored one 50.
func TestWindowRestoredBehindItsStateFiresAgain(t *testing.T) {
	const maxP = 16
	for _, c := range []struct {
		a      operators.WindowAssigner
		before []ev
		after  ev
		want   []result
	}{
		{
			a:      operators.TumblingEventTimeWindows(ms(10)),
			before: []ev{{Key: "k", TS: 75, V: 1}},
			after:  ev{Key: "k", TS: 76, V: 10},
			want:   []result{{Key: "k", Window: operators.Window{Start: 70, End: 80}, Value: cs{2, 11}}},
		},
		{
			// A new slice whose first window fired before the snapshot.
			a:      operators.SlidingEventTimeWindows(ms(20), ms(10)),
			before: []ev{{Key: "k", TS: 75, V: 1}},
			after:  ev{Key: "k", TS: 82, V: 100},
			want: []result{
				{Key: "k", Window: operators.Window{Start: 70, End: 90}, Value: cs{2, 101}},
				{Key: "k", Window: operators.Window{Start: 80, End: 100}, Value: cs{1, 100}},
			},
		},
	} {
		for _, how := range []windowBuild{viaAggregate, viaProcess} {
			build := func(out operators.Collector[result]) operators.OneInput[ev] {
				if how == viaProcess {
					fn := operators.ProcessWindowFunc[string, ev, result](func(key string, w operators.Window, elems []ev, out operators.Collector[result]) error {
						out.Collect(result{Key: key, Window: w, Value: foldEvs(cs{}, elems)})
						return nil
					})
					op, err := operators.NewWindowProcess(windowName, evKey, c.a, ms(30), lateTag, operators.ProcessWindowFunction[string, ev, result](fn), out)
					if err != nil {
						t.Fatal(err)
					}
					return op
				}
				op, err := operators.NewWindowAggregate(windowName, evKey, c.a, ms(30), lateTag, operators.AggregateFunction[ev, cs, cs](csAgg{}), out)
				if err != nil {
					t.Fatal(err)
				}
				return op
			}
			ih := newIncHarness(t, build, 1, maxP, nil, operatorstest.DefaultStart)
			for _, e := range c.before {
				ih.process(e)
			}
			if err := ih.watermark(100); err != nil {
				t.Fatal(err)
			}
			ih.drain()
			snaps := ih.snapshot(t)
			ih.close(t)
			for _, p := range []int{1, 2} {
				stateWM := int64(100)
				restored := newIncHarnessOn(t, build, p, maxP, snaps, operatorstest.DefaultStart,
					func(r keygroup.Range, h *operatorstest.Harness[ev, result]) state.Backend {
						h.Ctx.RestoredStateWatermark = &stateWM
						return state.NewMemoryBackend(r, h.Clock)
					})
				for _, h := range restored.hs {
					if err := h.Op.(operators.WatermarkRestorer).RestoreWatermark(50); err != nil {
						t.Fatal(err)
					}
				}
				restored.process(c.after)
				if err := restored.watermark(watermark.MaxWatermark); err != nil {
					t.Fatal(err)
				}
				var got []result
				for _, r := range restored.drain() {
					got = append(got, r.Value)
				}
				if !slices.Equal(got, c.want) || restored.lateRecords() != 0 {
					t.Errorf("%s (%s) restored at parallelism %d behind its state: emitted %v and %d late records, want %v and none",
						c.a, how, p, got, restored.lateRecords(), c.want)
				}
				restored.close(t)
			}
		}
	}
}
