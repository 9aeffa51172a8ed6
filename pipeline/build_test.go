package pipeline

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/edgedio/edged/stream"
)

func run(t *testing.T, pc PipelineConfig, extra ...stream.Option) (string, *Job) {
	t.Helper()
	opts, err := EnvOptions(pc)
	if err != nil {
		t.Fatal(err)
	}
	env := stream.NewEnvironment(pc.Name, append(opts, extra...)...)
	var out bytes.Buffer
	job, err := BuildJob(pc, env, &out)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := env.Execute(ctx); err != nil {
		t.Fatal(err)
	}
	return out.String(), job
}

type winKey struct {
	id    string
	start int64
}

type winVal struct {
	count    int64
	sum, max float64
}

// TestDemoEndToEnd runs configs/demo.yaml on a bounded generator and
// checks every window and alert against a plain loop over the same
// records, with each state backend (bolt's files are named by the
// operators' UIDs, which hold the pipeline's name and a '/').
func TestDemoEndToEnd(t *testing.T) {
	for _, backend := range []string{"memory", "bolt"} {
		t.Run(backend, func(t *testing.T) { demoEndToEnd(t, backend) })
	}
}

func demoEndToEnd(t *testing.T, backend string) {
	cfg, err := Load("../configs/demo.yaml")
	if err != nil {
		t.Fatal(err)
	}
	pc := cfg.Pipelines[0]
	pc.StateBackend = backend
	if backend == "bolt" {
		pc.StateDir = t.TempDir()
	}
	const count, keys = 3000, 10
	pc.Source.Generator.Count = count
	pc.Source.Generator.Keys = keys
	out, job := run(t, pc)

	// The independent computation.
	wins := map[winKey]*winVal{}
	type alertState struct {
		active, fired bool
		since         int64
	}
	states := map[string]*alertState{}
	var wantAlerts []string
	start := int64(1547718199)
	for i := int64(0); i < count; i++ {
		id := fmt.Sprintf("sensor_%d", i%keys)
		ts := (start + i/keys) * 1000
		temp := GeneratorTemp(i)
		k := winKey{id, ts - ts%10000}
		w := wins[k]
		if w == nil {
			w = &winVal{max: math.Inf(-1)}
			wins[k] = w
		}
		w.count++
		w.sum += temp
		w.max = math.Max(w.max, temp)
		s := states[id]
		if s == nil {
			s = &alertState{}
			states[id] = s
		}
		if s.active && !s.fired && ts >= s.since+5000 {
			wantAlerts = append(wantAlerts, fmt.Sprintf("%s %d", id, s.since))
			s.fired = true
		}
		if temp > 38 {
			if !s.active {
				*s = alertState{active: true, since: ts}
			}
		} else {
			*s = alertState{}
		}
	}
	for id, s := range states {
		if s.active && !s.fired {
			wantAlerts = append(wantAlerts, fmt.Sprintf("%s %d", id, s.since))
		}
	}

	gotWins := map[winKey]bool{}
	var gotAlerts []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		id := m["id"].(string)
		if _, ok := m["alert"]; ok {
			if m["alert"] != "too_hot" || m["at"].(float64)-m["since"].(float64) != 5000 {
				t.Errorf("alert line %s", line)
			}
			gotAlerts = append(gotAlerts, fmt.Sprintf("%s %d", id, int64(m["since"].(float64))))
			continue
		}
		k := winKey{id, int64(m["window_start"].(float64))}
		w := wins[k]
		switch {
		case w == nil:
			t.Errorf("unexpected window %s", line)
		case gotWins[k]:
			t.Errorf("window twice: %s", line)
		case int64(m["count"].(float64)) != w.count ||
			math.Abs(m["avg_temp"].(float64)-w.sum/float64(w.count)) > 1e-9 ||
			m["max_temp"].(float64) != w.max ||
			int64(m["window_end"].(float64)) != k.start+10000:
			t.Errorf("window %s, want count %d avg %v max %v", line, w.count, w.sum/float64(w.count), w.max)
		}
		gotWins[k] = true
	}
	if len(gotWins) != len(wins) {
		t.Errorf("%d windows, want %d", len(gotWins), len(wins))
	}
	sort.Strings(gotAlerts)
	sort.Strings(wantAlerts)
	if strings.Join(gotAlerts, "\n") != strings.Join(wantAlerts, "\n") {
		t.Errorf("alerts:\n%v\nwant:\n%v", gotAlerts, wantAlerts)
	}
	if len(wantAlerts) == 0 {
		t.Error("the test data has no alert; choose another count")
	}
	if job.DeadLetters() != 0 {
		t.Errorf("%d dead letters", job.DeadLetters())
	}
}

// TestFileSourceDeadLetters runs a CSV file with malformed lines through
// a pipeline without window: the good rows and the dead letters come out.
func TestFileSourceDeadLetters(t *testing.T) {
	data := "s1,1547718199,20.5\nbroken\ns2,1547718200,hot\ns1,1547718201,30\n"
	out, job := run(t, csvPipeline(t, data, "    filter: temp > 25\n", "    compute: {hot: temp > 28, f: temp * 2}\n"))
	lines := strings.Split(strings.TrimSpace(out), "\n")
	sort.Strings(lines)
	want := []string{
		`dead-letter: {"pipeline":"csv","error":"pipeline: malformed payload: csv: 1 columns, want at least 3","payload":"broken"}`,
		`dead-letter: {"pipeline":"csv","error":"pipeline: malformed payload: field \"temp\": \"hot\" is not a float","payload":"s2,1547718200,hot"}`,
		`{"id":"s1","ts":1547718201000,"temp":30,"hot":true,"f":60}`,
	}
	sort.Strings(want)
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Errorf("output:\n%s\nwant:\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
	if job.DeadLetters() != 2 {
		t.Errorf("dead letters = %d, want 2", job.DeadLetters())
	}
}

// Jobs built with Inputs.Counts add to the counts of the Job given (a
// cluster's worker builds a pipeline again for each deployment).
func TestBuildAddsToCounts(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "in.csv")
	if err := os.WriteFile(path, []byte("s1,1547718199,20.5\nbroken\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := Parse([]byte(`
pipelines:
  - name: csv
    source:
      file: {path: ` + path + `, format: csv, fields: {id: string, ts: {type: time, unit: s}, temp: float}}
    sinks: [{stdout: {}}]
`))
	if err != nil {
		t.Fatal(err)
	}
	var counts *Job
	for i := range 3 {
		env := stream.NewEnvironment("csv")
		pj, err := BuildJobWith(cfg.Pipelines[0], env, io.Discard, Inputs{Counts: counts})
		if err != nil {
			t.Fatal(err)
		}
		if counts == nil {
			counts = pj
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		err = env.Execute(ctx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if got, want := pj.DeadLetters(), int64(i+1); got != want || counts.DeadLetters() != want {
			t.Fatalf("build %d: dead letters %d (the first Job's %d), want %d", i+1, got, counts.DeadLetters(), want)
		}
	}
	if n := len(counts.RecentDeadLetters()); n != 3 {
		t.Fatalf("%d recent dead letters, want 3", n)
	}
}

func TestMQTTNotAvailable(t *testing.T) {
	cfg, err := Load("../configs/checkpointed.yaml")
	if err != nil {
		t.Fatal(err)
	}
	env := stream.NewEnvironment("x")
	err = Build(cfg.Pipelines[1], env, &bytes.Buffer{})
	if !errors.Is(err, ErrNotAvailable) || !strings.Contains(err.Error(), "mqtt source") {
		t.Errorf("err = %v, want mqtt source not available", err)
	}
}

// A file sink whose dir is an existing file is refused when the job is
// built, naming the key, instead of failing every attempt of the job at
// run time with an error that names the sink's operator.
func TestFileSinkDirThatIsAFileRefused(t *testing.T) {
	file := filepath.Join(t.TempDir(), "out")
	if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	pc := parsePipeline(t, fmt.Sprintf(`
pipelines:
  - name: p
    source:
      generator: {count: 10, rate: 0, keys: 2}
    key: id
    window: {type: tumbling, size: 10s, aggregates: [{name: n, fn: count}]}
    sinks:
      - file: {dir: %s}
`, file))
	err := Build(pc, stream.NewEnvironment("p"), &bytes.Buffer{})
	if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "sinks[0].file.dir") || !strings.Contains(err.Error(), "is a file") {
		t.Fatalf("err = %v, want the file sink's dir refused as a file", err)
	}
}
