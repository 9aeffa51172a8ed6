package test

import (
	"cmp"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/operators/operatorstest"
)

// kindsReading is a reading of the window-kinds test, as the file holds it.
type kindsReading struct {
	ID string  `json:"id"`
	V  float64 `json:"v"`
	TS int64   `json:"ts"`
}

// kindsAgg is the reference of the aggregates the pipeline computes:
// count, sum, min, max, and first and last by event time.
type kindsAgg struct {
	n             int64
	sum, min, max float64
	first, last   float64
	firstT, lastT int64
}

func (a *kindsAgg) add(r kindsReading) {
	if a.n == 0 || r.V < a.min {
		a.min = r.V
	}
	if a.n == 0 || r.V > a.max {
		a.max = r.V
	}
	if a.n == 0 || r.TS < a.firstT {
		a.first, a.firstT = r.V, r.TS
	}
	if a.n == 0 || r.TS >= a.lastT {
		a.last, a.lastT = r.V, r.TS
	}
	a.n++
	a.sum += r.V
}

func kindsLine(id string, start, end int64, n int64, sum, mn, mx, first, last float64) string {
	return fmt.Sprintf("%s [%d,%d) n=%d sum=%g min=%g max=%g first=%g last=%g", id, start, end, n, sum, mn, mx, first, last)
}

// kindsReference computes every window of rs (none of them late: each
// reading is at most the watermark bound behind the largest before it), by
// plain loops: sliding windows of size and slide, or sessions of gap.
func kindsReference(kind string, size, slide, gap int64, rs []kindsReading) []string {
	type win struct {
		id         string
		start, end int64
	}
	wins := map[win]*kindsAgg{}
	add := func(w win, r kindsReading) {
		if wins[w] == nil {
			wins[w] = &kindsAgg{}
		}
		wins[w].add(r)
	}
	byKey := map[string][]kindsReading{}
	for _, r := range rs {
		byKey[r.ID] = append(byKey[r.ID], r)
	}
	for id, l := range byKey {
		if kind == "sliding" {
			for _, r := range l {
				for st := r.TS - ((r.TS%slide)+slide)%slide; st > r.TS-size; st -= slide {
					add(win{id, st, st + size}, r)
				}
			}
			continue
		}
		// Sessions: in event-time order (stable: equal times keep
		// their arrival order), a reading within gap of the session's
		// end extends it.
		slices.SortStableFunc(l, func(a, b kindsReading) int { return cmp.Compare(a.TS, b.TS) })
		var cur win
		var in []kindsReading
		flush := func() {
			for _, r := range in {
				add(cur, r)
			}
		}
		for _, r := range l {
			if len(in) > 0 && r.TS <= cur.end {
				cur.end = max(cur.end, r.TS+gap)
				in = append(in, r)
				continue
			}
			flush()
			cur, in = win{id, r.TS, r.TS + gap}, []kindsReading{r}
		}
		flush()
	}
	var out []string
	for w, a := range wins {
		out = append(out, kindsLine(w.id, w.start, w.end, a.n, a.sum, a.min, a.max, a.first, a.last))
	}
	slices.Sort(out)
	return out
}

// TestSlidingAndSessionWindowsExactAcrossKills runs a declared pipeline
// with sliding windows, and one with session windows, over a file of
// readings out of order within the watermark bound (so none is late),
// with count, sum, min, max, first and last, at parallelism 2. edged is
// SIGKILLed twice while it reads (each time restarted with the same
// config) and then runs to the end of the file. The windows the file
// sink committed must be exactly those of a plain computation over the
// readings: none lost, none twice, no session split or merged
// differently, first and last by event time.
func TestSlidingAndSessionWindowsExactAcrossKills(t *testing.T) {
	rng := seededRand(t)
	const n = 1_500_000
	base := (time.Now().Add(-30*time.Hour).UnixMilli() / 1000) * 1000
	type arrival struct {
		at int64
		r  kindsReading
	}
	as := make([]arrival, n)
	ts := base
	for i := range as {
		ts += 1 + rng.Int64N(8)
		if rng.IntN(300) == 0 {
			ts += 500 + rng.Int64N(3000) // a silence: sessions end
		}
		r := kindsReading{ID: fmt.Sprintf("k%d", rng.IntN(12)), V: float64(rng.IntN(1000)), TS: ts}
		as[i] = arrival{ts + rng.Int64N(2001), r} // at most the 2 s bound behind
	}
	slices.SortStableFunc(as, func(a, b arrival) int { return cmp.Compare(a.at, b.at) })
	rs := make([]kindsReading, n)
	for i, a := range as {
		rs[i] = a.r
	}
	for _, kind := range []string{"sliding", "session"} {
		t.Run(kind, func(t *testing.T) {
			dir := t.TempDir()
			in := filepath.Join(dir, "in.jsonl")
			f, err := os.Create(in)
			if err != nil {
				t.Fatal(err)
			}
			enc := json.NewEncoder(f)
			for _, r := range rs {
				if err := enc.Encode(r); err != nil {
					t.Fatal(err)
				}
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
			window := "type: sliding\n      size: 2s\n      slide: 500ms"
			want := kindsReference(kind, 2000, 500, 0, rs)
			if kind == "session" {
				window = "type: session\n      gap: 300ms"
				want = kindsReference(kind, 0, 0, 300, rs)
			}
			broker, api := freeAddr(t), freeAddr(t)
			out := filepath.Join(dir, "out")
			cfg := fmt.Sprintf(`node:
  data_dir: %[1]s/data
  broker: %[2]s
  listen: %[3]s
pipelines:
  - name: kinds
    parallelism: 2
    source:
      file: {path: %[4]s, format: json, fields: {id: string, v: float, ts: {type: time, unit: ms}}}
    event_time: {field: ts, max_out_of_orderness: 2s}
    key: id
    window:
      %[5]s
      aggregates: [{name: n, fn: count}, {name: s, fn: sum, field: v}, {name: mn, fn: min, field: v}, {name: mx, fn: max, field: v}, {name: f, fn: first, field: v}, {name: l, fn: last, field: v}]
    sinks: [{file: {dir: %[6]s}}]
    checkpoint: {dir: %[1]s/ck, interval: 50ms}
    restart: {strategy: fixed_delay, attempts: 10, delay: 100ms}
`, dir, broker, api, in, window, out)
			cfgPath := filepath.Join(dir, "edged.yaml")
			if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
				t.Fatal(err)
			}
			logf, err := os.OpenFile(filepath.Join(dir, "edged.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			defer logf.Close()
			nd := &node{t: t, cfgPath: cfgPath, logPath: logf.Name(), brokerAddr: broker, apiAddr: api}
			// Each run but the last is SIGKILLed once it has read a
			// sixth of the file (the restored run goes on from its
			// checkpoint); a run that finishes first is not killed.
			kills := 0
			for run := 0; ; run++ {
				cmd := exec.Command(edgedBin, "run", "-c", cfgPath)
				cmd.Stdout, cmd.Stderr = logf, logf
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				done := make(chan error, 1)
				go func() { done <- cmd.Wait() }()
				var exited error
				finished := false
				if run < 2 {
					testutil.Eventually(t, 2*time.Minute, "the source to read on, or the job to finish", func() bool {
						select {
						case exited = <-done:
							finished = true
							return true
						default:
						}
						out, ok := nd.sourceOut("kinds")
						return ok && out >= n/6
					})
					if !finished {
						_ = cmd.Process.Kill()
						<-done
						kills++
						continue
					}
				} else if !testutil.Within(2*time.Minute, func() bool {
					select {
					case exited = <-done:
						return true
					default:
						return false
					}
				}) {
					_ = cmd.Process.Kill()
					<-done
					t.Fatalf("the last run did not finish\n%s", nd.logTail())
				}
				if exited != nil {
					t.Fatalf("run %d: %v\n%s", run, exited, nd.logTail())
				}
				break
			}
			lines, err := operatorstest.CommittedLines(filepath.Join(out, "windows"))
			if err != nil {
				t.Fatal(err)
			}
			got := make([]string, 0, len(lines))
			for _, l := range lines {
				var m struct {
					ID              string `json:"id"`
					Start           int64  `json:"window_start"`
					End             int64  `json:"window_end"`
					N               int64  `json:"n"`
					S, Mn, Mx, F, L float64
				}
				if err := json.Unmarshal([]byte(l), &m); err != nil {
					t.Fatalf("result %q: %v", l, err)
				}
				got = append(got, kindsLine(m.ID, m.Start, m.End, m.N, m.S, m.Mn, m.Mx, m.F, m.L))
			}
			slices.Sort(got)
			dead, err := operatorstest.CommittedLines(filepath.Join(out, "dead-letter-late"))
			if err != nil {
				t.Fatal(err)
			}
			if len(dead) > 0 {
				t.Errorf("%d late dead letters, want none (the first: %s)", len(dead), dead[0])
			}
			if !slices.Equal(got, want) {
				t.Errorf("%d windows committed, want %d\n%s", len(got), len(want), kindsDiff(got, want))
			}
			t.Logf("%d %s windows exact across %d kills", len(want), kind, kills)
		})
	}
}

// kindsDiff lists the lines in one of got and want and not the other (at
// most 20).
func kindsDiff(got, want []string) string {
	c := map[string]int{}
	for _, l := range got {
		c[l]++
	}
	for _, l := range want {
		c[l]--
	}
	var d []string
	for l, k := range c {
		if k != 0 {
			d = append(d, fmt.Sprintf("%+d %s", k, l))
		}
	}
	slices.Sort(d)
	if len(d) > 20 {
		d = append(d[:20], "…")
	}
	return fmt.Sprint(d)
}
