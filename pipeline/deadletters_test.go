package pipeline

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/edgedio/edged/operators"
)

// RecentDeadLetters keeps the latest RecentDeadLetters dead letters,
// oldest first, while DeadLetters counts them all.
func TestRecentDeadLetters(t *testing.T) {
	var b strings.Builder
	const bad = RecentDeadLetters + 4
	for i := range bad {
		fmt.Fprintf(&b, "s1,1547718199,20.5\nbroken-%d\n", i)
	}
	_, job := run(t, csvPipeline(t, b.String()))
	if job.DeadLetters() != bad {
		t.Fatalf("dead letters = %d, want %d", job.DeadLetters(), bad)
	}
	r := job.RecentDeadLetters()
	if len(r) != RecentDeadLetters {
		t.Fatalf("%d recent dead letters, want %d", len(r), RecentDeadLetters)
	}
	for i, d := range r {
		if want := fmt.Sprintf("broken-%d", bad-RecentDeadLetters+i); d.Payload != want || d.Pipeline != "csv" || !strings.Contains(d.Err, "malformed payload") {
			t.Errorf("recent[%d] = %+v, want payload %s", i, d, want)
		}
	}
}

// A record that comes after its windows closed is a dead letter (counted,
// kept, sent to the sinks' dead-letter output), never silently dropped.
func TestLateRecordsAreDeadLetters(t *testing.T) {
	// 10 s windows, no out-of-orderness: the reading at 1005 closes the
	// window [990, 1000); the one at 995 is late for it.
	out, job := runCSVWindows(t, "s1,1000,20\ns1,1005,21\ns1,995,99\ns1,1006,22\n",
		"{id: string, ts: {type: time, unit: s}, temp: float}", "0s", "[{name: n, fn: count}]")
	if job.DeadLetters() != 1 {
		t.Fatalf("dead letters = %d, want 1 (the late reading)\n%s", job.DeadLetters(), out)
	}
	d := job.RecentDeadLetters()[0]
	if !strings.Contains(d.Err, "late") || !strings.Contains(d.Payload, "99") {
		t.Fatalf("dead letter %+v", d)
	}
	if !strings.Contains(out, DeadLetterPrefix) || !strings.Contains(out, `"payload":`) {
		t.Fatalf("no dead-letter line in the output:\n%s", out)
	}
}

// Whether a reading is late depends on the end of its windows, not on how
// far its event time is behind: with 10 s windows, max_out_of_orderness 5s
// and no allowed lateness, a reading 2 s behind the watermark whose window
// has fired is a late dead letter, and one 5.5 s behind the largest event
// time read, whose window has not fired, is counted.
func TestLateIsTheWindowEndPassingTheWatermark(t *testing.T) {
	// 1006000 moves the watermark to 1000999: [990000,1000000) fires.
	// 999000 belongs to it: late, though only 1999 ms behind the
	// watermark. 1000500 is 5500 ms behind the largest event time but its
	// window [1000000,1010000) has not fired.
	out, job := runCSVWindows(t, "s1,995000,1\ns1,1006000,2\ns1,999000,3\ns1,1000500,4\n",
		"{id: string, ts: {type: time, unit: ms}, v: float}", "5s", "[{name: n, fn: count}, {name: s, fn: sum, field: v}]")
	if job.DeadLetters() != 1 {
		t.Fatalf("dead letters = %d, want 1 (the reading at 999000)\n%s", job.DeadLetters(), out)
	}
	if d := job.RecentDeadLetters()[0]; !strings.Contains(d.Err, "late") || !strings.Contains(d.Payload, "999000") {
		t.Fatalf("dead letter %+v, want the reading at 999000 as late", d)
	}
	// The error gives the rule that made it late, not how far behind it
	// was: 1999 ms is not more than max_out_of_orderness.
	if d := job.RecentDeadLetters()[0]; d.Err != lateError || !strings.Contains(d.Err, "end of each of its windows") || strings.Contains(d.Err, "by more than") {
		t.Errorf("late dead letter's error %q, want it to name the end of its windows passing the watermark", d.Err)
	}
	for _, want := range []string{
		`"window_start":990000,"window_end":1000000,"n":1,"s":1`,
		`"window_start":1000000,"window_end":1010000,"n":2,"s":6`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no result with %s in the output:\n%s", want, out)
		}
	}
}

// A dead letter's payload is cut to MaxDeadLetterPayload in the
// dead-letter output, and to RecentPayloadBytes among the latest (at a
// rune boundary, with its length): a dead letter must fit in a broker's
// packet, and 16 payloads of megabytes must not pin the node's memory,
// nor every answer of the API.
func TestRecentDeadLettersCutLongPayloads(t *testing.T) {
	long := strings.Repeat("€", 170_000) // under MaxLineSize; 3-byte runes: 1024 is not a boundary
	out, job := run(t, csvPipeline(t, long+"\n"))
	kept := MaxDeadLetterPayload - MaxDeadLetterPayload%3
	if !strings.Contains(out, long[:kept]+fmt.Sprintf("… (%d bytes in all)", len(long))) || strings.Contains(out, long[:kept+3]) {
		t.Fatalf("the dead-letter output does not hold the payload's first %d bytes and its length", kept)
	}
	r := job.RecentDeadLetters()
	if len(r) != 1 {
		t.Fatalf("%d recent", len(r))
	}
	// The latest dead letters cut the payload again, still naming the
	// message's own length (before, the length of the first cut's
	// result: 65561 bytes for a message of 2,000,043).
	p := r[0].Payload
	if !strings.HasPrefix(p, "€€€") || !strings.HasSuffix(p, fmt.Sprintf("… (%d bytes in all)", len(long))) || len(p) > RecentPayloadBytes+32 || !utf8.ValidString(p) {
		t.Fatalf("kept payload of %d bytes: %.40q…%q", len(p), p, p[max(0, len(p)-30):])
	}
}

// csvPipeline returns a pipeline that reads data as a CSV file of id, ts
// (seconds) and temp, with the config lines more, printing its rows.
func csvPipeline(t *testing.T, data string, more ...string) PipelineConfig {
	t.Helper()
	path := filepath.Join(t.TempDir(), "in.csv")
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := Parse([]byte(`
pipelines:
  - name: csv
    source:
      file:
        path: ` + path + `
        format: csv
        fields: {id: string, ts: {type: time, unit: s}, temp: float}
` + strings.Join(more, "") + `    sinks: [{stdout: {}}]
`))
	if err != nil {
		t.Fatal(err)
	}
	return cfg.Pipelines[0]
}

// A line of a file source longer than operators.MaxLineSize is a dead
// letter with its first bytes, counted and written to the dead-letter
// output like a malformed line, and the lines after it are read.
func TestFileSourceLongLinesAreDeadLetters(t *testing.T) {
	long := "s9,1547718199," + strings.Repeat("7", operators.MaxLineSize)
	in := "s1,1547718199,20.5\n" + long + "\ns2,1547718199,21.5\n" + long + "\r\nbroken\ns3,1547718199,22.5\n" + long
	out, job := run(t, csvPipeline(t, in))
	if job.DeadLetters() != 4 {
		t.Fatalf("dead letters = %d, want 4 (three long lines, one malformed)\n%.2000s", job.DeadLetters(), out)
	}
	var longs int
	for _, d := range job.RecentDeadLetters() {
		if strings.Contains(d.Err, "more than") && strings.HasPrefix(d.Payload, "s9,1547718199,777") {
			longs++
		}
	}
	if longs != 3 {
		t.Fatalf("%d long-line dead letters among %+v", longs, job.RecentDeadLetters())
	}
	if n := strings.Count(out, DeadLetterPrefix); n != 4 {
		t.Fatalf("%d dead-letter lines in the output, want 4", n)
	}
	for _, id := range []string{`"s1"`, `"s2"`, `"s3"`} {
		if !strings.Contains(out, id) {
			t.Fatalf("row %s missing from the output", id)
		}
	}
	if len(out) > 100<<10 {
		t.Fatalf("output of %d bytes: the long lines were not cut", len(out))
	}
}

// runCSVWindows runs a pipeline over the CSV lines in, with the given
// fields, per-sensor 10 s tumbling windows with the given aggregates and
// max_out_of_orderness, a watermark after every reading, and a stdout
// sink, and returns its output and job.
func runCSVWindows(t *testing.T, in, fields, outOfOrderness, aggregates string) (string, *Job) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "in.csv")
	if err := os.WriteFile(path, []byte(in), 0o644); err != nil {
		t.Fatal(err)
	}
	perEventWatermarks = true
	defer func() { perEventWatermarks = false }()
	cfg, err := Parse([]byte(`
pipelines:
  - name: late
    source:
      file:
        path: ` + path + `
        format: csv
        fields: ` + fields + `
    event_time: {field: ts, max_out_of_orderness: ` + outOfOrderness + `}
    key: id
    window:
      type: tumbling
      size: 10s
      aggregates: ` + aggregates + `
    sinks: [{stdout: {}}]
`))
	if err != nil {
		t.Fatal(err)
	}
	return run(t, cfg.Pipelines[0])
}
