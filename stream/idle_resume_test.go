package stream_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/stream"
	"github.com/edgedio/edged/watermark"
)

// Two sources with WithIdleness(1s) feed one tumbling window. Both fall
// silent, b behind a: once their assigners say they are idle the window
// takes the largest of their watermarks and fires what a's records
// closed. b then resumes: its record behind that watermark goes to the
// late-data side output, its record ahead of it joins its window, and a,
// resuming after it, holds nothing back.
func TestIdleSourceResumes(t *testing.T) {
	clock := clockwork.NewFakeClock()
	var aRecs []keyedTime
	for ts := int64(0); ts < 100; ts += 5 {
		aRecs = append(aRecs, keyedTime{K: "k", TS: ts})
	}
	aRecs = append(aRecs, keyedTime{K: "k", TS: 120})
	bRecs := []keyedTime{{K: "k", TS: 0}, {K: "k", TS: 2}, {K: "k", TS: 50}, {K: "k", TS: 96}}
	la, lb := newGate(), newGate()
	var readA, readB atomic.Int64
	var mu sync.Mutex
	var got []string
	add := func(s string) error {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, s)
		return nil
	}
	results := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(got)
	}
	env := stream.NewEnvironment("idle-resume", stream.WithParallelism(1), stream.WithClock(clock))
	strategy := watermark.ForBoundedOutOfOrderness(0, func(e keyedTime) int64 { return e.TS }).WithPerEventEmit().WithIdleness(time.Second)
	a := stream.FromSource(env, "a", func() operators.Source[keyedTime] { return &gatedSource[keyedTime]{all: aRecs, gate: la, read: &readA} }).UID("a").
		AssignTimestampsAndWatermarks("a-time", strategy).UID("a-time")
	b := stream.FromSource(env, "b", func() operators.Source[keyedTime] { return &gatedSource[keyedTime]{all: bRecs, gate: lb, read: &readB} }).UID("b").
		AssignTimestampsAndWatermarks("b-time", strategy).UID("b-time")
	late := operators.NewOutputTag[keyedTime]("late")
	w := stream.Window(stream.KeyBy(a.Union(b), func(e keyedTime) string { return e.K }), operators.TumblingEventTimeWindows(10*time.Millisecond)).SideOutputLateData(late)
	res := stream.WindowAggregate(w, "count", countKeyedTime{}).UID("count")
	res.ForEach("results", func(r operators.WindowResult[string, int64]) error {
		return add(fmt.Sprintf("%v %d", r.Window, r.Value))
	})
	stream.SideOutput(res, late).ForEach("late", func(e keyedTime) error { return add(fmt.Sprintf("late %d", e.TS)) })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	job, err := env.ExecuteAsync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	la.allow(20) // 0..95
	lb.allow(2)  // 0, 2
	testutil.Eventually(t, 30*time.Second, "the first records read", func() bool { return readA.Load() == 20 && readB.Load() == 2 })
	if r := results(); len(r) != 0 {
		t.Fatalf("windows fired while b held the watermark at 1: %v", r)
	}
	if !testutil.Within(30*time.Second, func() bool {
		clock.Advance(watermark.DefaultInterval)
		return slices.Contains(results(), "[80,90) 2")
	}) {
		t.Fatalf("the windows a closed did not fire once both sources were idle: %v", results())
	}
	lb.allow(4) // 50 (late), 96
	testutil.Eventually(t, 30*time.Second, "b resumed", func() bool { return readB.Load() == 4 })
	la.allow(len(aRecs)) // 120
	if err := job.Wait(); err != nil {
		t.Fatal(err)
	}
	r := results()
	slices.Sort(r)
	want := []string{"[0,10) 4", "[10,20) 2", "[120,130) 1", "[20,30) 2", "[30,40) 2", "[40,50) 2", "[50,60) 2", "[60,70) 2", "[70,80) 2", "[80,90) 2", "[90,100) 3", "late 50"}
	if !slices.Equal(r, want) {
		t.Fatalf("results %v\nwant %v", r, want)
	}
}
