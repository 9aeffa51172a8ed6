package pipeline

import (
	"strings"
	"testing"
)

// The min and max of a window holding 0 and -0 are the same whichever
// order the readings arrive in and whichever window type folds them:
// min -0 and max 0, as math.Min and math.Max give. Before, a record was
// folded in by < and > (the first of two equal values stayed) and slices
// were merged by math.Min and math.Max, so a tumbling window gave min 0
// for 0 then -0 and -0 for -0 then 0, and a sliding window over the same
// readings -0: a replay whose readings arrive in another order (the
// decoding subtasks interleave differently in every run) could write
// another line, under another msg_id.
func TestMinMaxOfSignedZeros(t *testing.T) {
	perEventWatermarks = true
	defer func() { perEventWatermarks = false }()
	const want = `{"id":"a","window_start":100000,"window_end":110000,"mn":-0,"mx":0}`
	for _, in := range []string{"a,100,0\na,106,-0\na,300,1\n", "a,100,-0\na,106,0\na,300,1\n"} {
		for _, w := range []string{"{type: tumbling, size: 10s", "{type: sliding, size: 10s, slide: 5s"} {
			pc := csvPipeline(t, in, "    event_time: {field: ts, max_out_of_orderness: 0s}\n    key: id\n    window: "+w+
				", aggregates: [{name: mn, fn: min, field: temp}, {name: mx, fn: max, field: temp}]}\n")
			out, _ := run(t, pc)
			var got string
			for _, line := range strings.Split(out, "\n") {
				if strings.Contains(line, `"window_start":100000,`) {
					got = line
				}
			}
			if got != want {
				t.Errorf("%s} over %q: %s, want %s", w, in, got, want)
			}
		}
	}
}

// The first and last of a window's readings that share one event time (a
// device stamping in whole seconds) are the same whichever order they
// arrive in, at every window type: at parallelism above 1 the decoding
// subtasks interleave a key's readings differently in every run and in a
// replay. Among readings of equal time, first is the lowest value and
// last the highest (-0 below 0). Before, the reading that arrived first
// (last) was kept, so the same file gave another result line, under
// another msg_id, from run to run.
func TestFirstLastOfEqualTimestampsWhateverTheOrder(t *testing.T) {
	perEventWatermarks = true
	defer func() { perEventWatermarks = false }()
	const want = `{"id":"a","window_start":100000,"window_end":110000,"f":-0,"l":3}`
	for _, in := range []string{
		"a,100,1\na,100,-0\na,106,2\na,106,3\na,300,1\n",
		"a,100,-0\na,100,1\na,106,3\na,106,2\na,300,1\n",
		"a,100,0\na,100,-0\na,100,1\na,106,3\na,106,2\na,106,3\na,300,1\n",
		"a,106,3\na,100,1\na,106,2\na,100,-0\na,300,1\n",
	} {
		for _, w := range []string{"{type: tumbling, size: 10s", "{type: sliding, size: 10s, slide: 5s", "{type: session, gap: 10s"} {
			pc := csvPipeline(t, in, "    event_time: {field: ts, max_out_of_orderness: 10s}\n    key: id\n    window: "+w+
				", aggregates: [{name: f, fn: first, field: temp}, {name: l, fn: last, field: temp}]}\n")
			out, _ := run(t, pc)
			var got string
			for _, line := range strings.Split(out, "\n") {
				if strings.Contains(line, `"window_start":100000,`) {
					got = line
				}
			}
			if w == "{type: session, gap: 10s" {
				got = strings.Replace(got, `"window_end":116000`, `"window_end":110000`, 1)
			}
			if got != want {
				t.Errorf("%s} over %q: %s, want %s", w, in, got, want)
			}
		}
	}
}
