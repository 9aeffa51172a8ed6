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
