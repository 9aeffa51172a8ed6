package pipeline

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/operators/operatorstest"
	"github.com/edgedio/edged/stream"
)

// aheadNow is the node's clock in the max_ahead tests.
var aheadNow = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// One reading from a device whose clock says year 2999, and one a year
// ahead, are dead letters with a reason naming max_ahead, counted; they
// do not move the watermark, so the correct readings after them are not
// late: every window holds its readings.
func TestEventTimeFarAheadIsDeadLetter(t *testing.T) {
	now := aheadNow.Unix()
	far := time.Date(2999, 1, 1, 0, 0, 0, 0, time.UTC).Unix()
	yearAhead := aheadNow.AddDate(1, 0, 0).Unix()
	var in strings.Builder
	for i := range 30 {
		ts := now - 60 + int64(i) // a minute ago, second by second
		fmt.Fprintf(&in, "s1,%d,20\n", ts)
		switch i {
		case 5:
			fmt.Fprintf(&in, "s2,%d,21\n", far)
		case 12:
			fmt.Fprintf(&in, "s2,%d,22\n", yearAhead)
		}
	}
	path := filepath.Join(t.TempDir(), "in.csv")
	if err := os.WriteFile(path, []byte(in.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	perEventWatermarks = true
	defer func() { perEventWatermarks = false }()
	pc := parsePipeline(t, `
pipelines:
  - name: ahead
    source:
      file:
        path: `+path+`
        format: csv
        fields: {id: string, ts: {type: time, unit: s}, temp: float}
    event_time: {field: ts, max_out_of_orderness: 0s}
    key: id
    window:
      type: tumbling
      size: 10s
      aggregates: [{name: n, fn: count}]
    sinks: [{stdout: {}}]
`)
	out, job := runWithClock(t, pc, clockwork.NewFakeClockAt(aheadNow))
	if job.DeadLetters() != 2 {
		t.Fatalf("dead letters = %d, want 2 (the readings ahead of the clock)\n%s", job.DeadLetters(), out)
	}
	for i, d := range job.RecentDeadLetters() {
		if !strings.Contains(d.Err, ErrEventTimeAhead.Error()) || !strings.Contains(d.Err, "more than event_time.max_ahead (1h0m0s)") ||
			!strings.Contains(d.Payload, `"s2"`) {
			t.Errorf("dead letter %d: %+v", i, d)
		}
	}
	if d := job.RecentDeadLetters()[0]; !strings.Contains(d.Err, "(2999-01-01T00:00:00Z) is ") ||
		!strings.Contains(d.Err, "ahead of the clock") || strings.Contains(d.Err, "2026-03-01") {
		t.Errorf("dead letter of the year-2999 reading: %q", d.Err)
	}
	// Every reading of s1 is in a window: 30 in all, none late.
	var total int64
	for line := range strings.Lines(out) {
		var n int64
		if _, err := fmt.Sscanf(line, `{"id":"s1","window_start":%d,"window_end":%d,"n":%d}`, new(int64), new(int64), &n); err == nil {
			total += n
		}
		if strings.Contains(line, `"s2"`) && !strings.HasPrefix(line, DeadLetterPrefix) {
			t.Errorf("a reading ahead of the clock reached a window: %s", line)
		}
	}
	if total != 30 {
		t.Fatalf("s1's windows count %d readings, want 30\n%s", total, out)
	}
}

// runWithClock runs pc as run does, on an environment whose
// processing-time clock is clock.
func runWithClock(t *testing.T, pc PipelineConfig, clock clockwork.Clock) (string, *Job) {
	t.Helper()
	return run(t, pc, stream.WithClock(clock))
}

// The bound is max_ahead past the clock when the record is prepared: a
// record exactly max_ahead ahead is taken, one a millisecond further is a
// dead letter, and a record refused is taken once the clock has moved on.
func TestPrepareMaxAheadFollowsTheClock(t *testing.T) {
	pc := parsePipeline(t, `
pipelines:
  - name: p
    source:
      mqtt:
        topics: [sensors/#]
        format: json
        fields:
          id: {type: string, path: $.sensor}
          ts: {type: time, path: $.ts, unit: ms}
    event_time: {field: ts, max_ahead: 10m}
    sinks: [{stdout: {}}]
`)
	b := &builder{cfg: &pc, pl: pc.plan, c: &counters{}, dead: operators.NewOutputTag[DeadLetter]("dead-letter")}
	h := operatorstest.New(func(out operators.Collector[Row]) operators.OneInput[string] {
		return operators.NewProcess[string, Row](&prepareFn[string]{b: b, decode: pc.plan.json.Decode, raw: func(s string) string { return s }}, out)
	}, operatorstest.StartAt(aheadNow), operatorstest.SideOutput[DeadLetter]("dead-letter"))
	if err := h.Open(); err != nil {
		t.Fatal(err)
	}
	msg := func(ts int64) string { return fmt.Sprintf(`{"sensor":"s","ts":%d}`, ts) }
	now := aheadNow.UnixMilli()
	bound := now + (10 * time.Minute).Milliseconds()
	for _, ts := range []int64{now - 1000, now, bound, bound + 1, bound} {
		h.Process(msg(ts), operators.NoTimestamp)
	}
	if err := h.AdvanceProcessingTime(time.Millisecond); err != nil {
		t.Fatal(err)
	}
	h.Process(msg(bound+1), operators.NoTimestamp)
	h.Process(msg(bound+2), operators.NoTimestamp)

	var taken []int64
	for _, r := range h.Out {
		taken = append(taken, r.Value.Int(pc.plan.ts.Slot))
	}
	if want := []int64{now - 1000, now, bound, bound, bound + 1}; fmt.Sprint(taken) != fmt.Sprint(want) {
		t.Errorf("taken %v, want %v", taken, want)
	}
	dead := h.Side["dead-letter"]
	if len(dead) != 2 || b.c.dead.Load() != 2 {
		t.Fatalf("%d dead letters (%d counted), want 2: %+v", len(dead), b.c.dead.Load(), dead)
	}
	want := []string{
		fmt.Sprintf("%v: ts = %d ms (2026-03-01T12:10:00.001Z) is more than event_time.max_ahead (10m0s) ahead of the clock", ErrEventTimeAhead, bound+1),
		fmt.Sprintf("%v: ts = %d ms (2026-03-01T12:10:00.002Z) is more than event_time.max_ahead (10m0s) ahead of the clock", ErrEventTimeAhead, bound+2),
	}
	for i, d := range dead {
		if got := d.Value.(DeadLetter).Err; got != want[i] {
			t.Errorf("dead letter %d: %q\nwant %q", i, got, want[i])
		}
	}
	// The same reading taken again later (a replay after a restore) is the
	// same dead letter, so its msg_id is the same too.
	h.Process(msg(bound+time.Hour.Milliseconds()), operators.NoTimestamp)
	if err := h.AdvanceProcessingTime(time.Minute); err != nil {
		t.Fatal(err)
	}
	h.Process(msg(bound+time.Hour.Milliseconds()), operators.NoTimestamp)
	if dead = h.Side["dead-letter"]; len(dead) != 4 || dead[3].Value.(DeadLetter) != dead[2].Value.(DeadLetter) {
		t.Errorf("a reading taken again a minute later: %d dead letters, the last two %+v", len(dead), dead[len(dead)-2:])
	}
}

// event_time.max_ahead: absent is 1h for file and MQTT sources and no
// bound for the generator; 0s is no bound; a negative or unparsable
// value is a config error naming the key.
func TestMaxAheadConfig(t *testing.T) {
	src := map[string]string{
		"generator": "generator: {count: 10}",
		"file":      "file: {path: in.csv, format: csv, fields: {id: string, ts: {type: time, unit: s}, temp: float}}",
	}
	yaml := func(source, maxAhead string) string {
		et := "{field: ts}"
		if maxAhead != "" {
			et = "{field: ts, max_ahead: " + maxAhead + "}"
		}
		return "pipelines:\n  - name: p\n    source: {" + src[source] + "}\n    event_time: " + et + "\n    sinks: [{stdout: {}}]\n"
	}
	for _, c := range []struct {
		source, maxAhead string
		want             time.Duration
	}{
		{"file", "", time.Hour},
		{"file", "0s", 0},
		{"file", "24h", 24 * time.Hour},
		{"generator", "", 0},
		{"generator", "5m", 5 * time.Minute},
	} {
		cfg, err := Parse([]byte(yaml(c.source, c.maxAhead)))
		if err != nil {
			t.Errorf("%s, max_ahead %q: %v", c.source, c.maxAhead, err)
			continue
		}
		if got := cfg.Pipelines[0].plan.maxAhead; got != c.want {
			t.Errorf("%s, max_ahead %q: bound %s, want %s", c.source, c.maxAhead, got, c.want)
		}
	}
	for maxAhead, want := range map[string]string{
		"-1s": `pipelines[0].event_time.max_ahead: (-1s) must not be negative; 0s means no bound`,
		"1x":  `pipelines[0].event_time.max_ahead: "1x" is not a duration`,
	} {
		_, err := Parse([]byte(yaml("file", maxAhead)))
		var ce *ConfigError
		if !errors.As(err, &ce) || len(ce.Problems) != 1 || ce.Problems[0].Error() != want {
			t.Errorf("max_ahead %s: %v, want %s", maxAhead, err, want)
		}
	}
}
