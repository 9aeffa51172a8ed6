package pipeline

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// RecentDeadLetters keeps the latest RecentDeadLetters dead letters,
// oldest first, while DeadLetters counts them all.
func TestRecentDeadLetters(t *testing.T) {
	path := filepath.Join(t.TempDir(), "in.csv")
	var b strings.Builder
	const bad = RecentDeadLetters + 4
	for i := range bad {
		fmt.Fprintf(&b, "s1,1547718199,20.5\nbroken-%d\n", i)
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
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
    sinks: [{stdout: {}}]
`))
	if err != nil {
		t.Fatal(err)
	}
	_, job := run(t, cfg.Pipelines[0])
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
	path := filepath.Join(t.TempDir(), "in.csv")
	// 10 s windows, no out-of-orderness: the reading at 1005 closes the
	// window [990, 1000); the one at 995 is late for it.
	in := "s1,1000,20\ns1,1005,21\ns1,995,99\ns1,1006,22\n"
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
        fields: {id: string, ts: {type: time, unit: s}, temp: float}
    event_time: {field: ts, max_out_of_orderness: 0s}
    key: id
    window:
      type: tumbling
      size: 10s
      aggregates: [{name: n, fn: count}]
    sinks: [{stdout: {}}]
`))
	if err != nil {
		t.Fatal(err)
	}
	out, job := run(t, cfg.Pipelines[0])
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
