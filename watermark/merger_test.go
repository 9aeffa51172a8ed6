package watermark

import (
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/edgedio/edged/internal/script"
)

// TestMergerScripts runs testdata/merger_*.txt. Commands:
//
//	new channels=N      a new Merger
//	wm ch=I ts=T        Merger.Watermark (T may be min or max)
//	idle ch=I           Merger.SetIdle(I, true)
//	active ch=I         Merger.SetIdle(I, false)
//	show                every channel's state
//
// wm, idle and active print "status -> idle|active" when StatusChanged
// reports a change, then the combined watermark, whether it advanced and
// Idle.
func TestMergerScripts(t *testing.T) {
	script.Run(t, "testdata/merger_*.txt", func(*testing.T) func(*script.Command) (string, error) {
		var m *Merger
		result := func(combined int64, advanced bool) string {
			var b strings.Builder
			if idle, changed := m.StatusChanged(); changed {
				fmt.Fprintf(&b, "status -> %s\n", statusName(idle))
			}
			if combined != m.Current() {
				fmt.Fprintf(&b, "returned %s but Current is %s\n", fmtTime(combined), fmtTime(m.Current()))
			}
			fmt.Fprintf(&b, "combined=%s advanced=%t idle=%t", fmtTime(combined), advanced, m.Idle())
			return b.String()
		}
		return func(c *script.Command) (string, error) {
			if c.Name != "new" && m == nil {
				return "", errors.New("no merger: start with new")
			}
			switch c.Name {
			case "new":
				n, err := c.Int("channels")
				if err != nil {
					return "", err
				}
				m = NewMerger(n)
				return fmt.Sprintf("combined=%s idle=%t", fmtTime(m.Current()), m.Idle()), nil
			case "wm":
				ch, err := c.Int("ch")
				if err != nil {
					return "", err
				}
				ts, err := times(c, "ts")
				if err != nil {
					return "", err
				}
				if len(ts) != 1 {
					return "", errors.New("wm takes one ts")
				}
				return result(m.Watermark(ch, ts[0])), nil
			case "idle", "active":
				ch, err := c.Int("ch")
				if err != nil {
					return "", err
				}
				return result(m.SetIdle(ch, c.Name == "idle")), nil
			case "show":
				var b strings.Builder
				for i := range m.chans {
					wm, idle := m.Channel(i)
					fmt.Fprintf(&b, "ch%d: wm=%s idle=%t\n", i, fmtTime(wm), idle)
				}
				fmt.Fprintf(&b, "combined=%s idle=%t", fmtTime(m.Current()), m.Idle())
				return b.String(), nil
			}
			return "", fmt.Errorf("unknown command %q", c.Name)
		}
	})
}

func statusName(idle bool) string {
	if idle {
		return "idle"
	}
	return "active"
}

func TestNewMergerPanicsWithoutChannels(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("NewMerger(0) did not panic")
		}
	}()
	NewMerger(0)
}

var seed = flag.Uint64("seed", 0, "seed of the random Merger schedule (0: from the time)")

// mergerModel is the naive Merger: it keeps each channel's largest raw
// watermark and recomputes everything from scratch.
type mergerModel struct {
	wm       []int64
	idle     []bool
	combined int64
	reported bool
}

func newMergerModel(n int) *mergerModel {
	m := &mergerModel{wm: make([]int64, n), idle: make([]bool, n), combined: MinWatermark}
	for i := range m.wm {
		m.wm[i] = MinWatermark
	}
	return m
}

// taskIdle: no channel active (not idle, not ended), at least one idle.
func (m *mergerModel) taskIdle() bool {
	active, idle := 0, 0
	for i := range m.wm {
		switch {
		case m.wm[i] == MaxWatermark:
		case m.idle[i]:
			idle++
		default:
			active++
		}
	}
	return active == 0 && idle > 0
}

// recompute takes the minimum over the channels that are active or ended,
// or, when the task is idle, the largest watermark of the idle channels,
// and clamps the result so it never decreases.
func (m *mergerModel) recompute() (int64, bool) {
	lo := MaxWatermark
	if m.taskIdle() {
		lo = MinWatermark
		for i := range m.wm {
			if m.idle[i] && m.wm[i] != MaxWatermark {
				lo = max(lo, m.wm[i])
			}
		}
	} else {
		for i := range m.wm {
			if !m.idle[i] || m.wm[i] == MaxWatermark {
				lo = min(lo, m.wm[i])
			}
		}
	}
	if lo > m.combined {
		m.combined = lo
		return lo, true
	}
	return m.combined, false
}

// TestMergerAgainstModel drives a Merger and the naive model with the same
// random schedule of watermarks (in order, backwards, final) and status
// changes, and compares every output.
func TestMergerAgainstModel(t *testing.T) {
	s := *seed
	if s == 0 {
		s = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun with -seed %d)", s, s)
	rng := rand.New(rand.NewPCG(s, s^0x9e3779b97f4a7c15))
	for run := range 500 {
		n := 1 + rng.IntN(5)
		m, model := NewMerger(n), newMergerModel(n)
		var trace []string
		for step := range 200 {
			ch := rng.IntN(n)
			var got, want int64
			var gotAdv, wantAdv bool
			switch r := rng.IntN(100); {
			case r < 55:
				// Mostly forward, sometimes backwards, rarely the end.
				base := model.wm[ch]
				if base == MinWatermark || base == MaxWatermark {
					base = int64(rng.IntN(100))
				}
				ts := base + int64(rng.IntN(60)) - 15
				if rng.IntN(50) == 0 {
					ts = MaxWatermark
				}
				trace = append(trace, fmt.Sprintf("wm ch=%d ts=%s", ch, fmtTime(ts)))
				got, gotAdv = m.Watermark(ch, ts)
				model.wm[ch] = max(model.wm[ch], ts)
				want, wantAdv = model.recompute()
			default:
				idle := r < 78
				trace = append(trace, fmt.Sprintf("%s ch=%d", statusName(idle), ch))
				got, gotAdv = m.SetIdle(ch, idle)
				model.idle[ch] = idle
				want, wantAdv = model.recompute()
			}
			gotIdle, gotChanged := m.StatusChanged()
			wantIdle := model.taskIdle()
			wantChanged := wantIdle != model.reported
			model.reported = wantIdle
			if got != want || gotAdv != wantAdv || got != m.Current() || gotIdle != wantIdle ||
				gotChanged != wantChanged || m.Idle() != wantIdle {
				t.Fatalf("seed %d run %d step %d, %d channels: merger combined=%s advanced=%t current=%s idle=%t changed=%t; model combined=%s advanced=%t idle=%t changed=%t\nscript:\nnew channels=%d\n%s",
					s, run, step, n, fmtTime(got), gotAdv, fmtTime(m.Current()), gotIdle, gotChanged,
					fmtTime(want), wantAdv, wantIdle, wantChanged, n, strings.Join(trace, "\n"))
			}
		}
	}
}

// TestMergerQuietWatermarkWhateverTheInterleaving: once every channel
// fell quiet (went idle last), the task's watermark is the largest
// watermark its channels sent, whatever the interleaving of the
// channels' messages: two tasks reading the same channels (the window
// subtasks behind the same decoding subtasks) end at the same watermark.
// Each channel sends increasing watermarks, goes idle and active again
// at random, and ends idle. Fixed seeds: the schedules are the same in
// every run.
func TestMergerQuietWatermarkWhateverTheInterleaving(t *testing.T) {
	type event struct {
		wm   int64 // 0: a status change
		idle bool
	}
	for trial := range uint64(300) {
		rng := rand.New(rand.NewPCG(trial, 0x5eed))
		n := 2 + rng.IntN(3)
		chans := make([][]event, n)
		largest := MinWatermark
		for ch := range chans {
			wm, idle := int64(0), false
			for range 1 + rng.IntN(6) {
				if rng.IntN(3) == 0 {
					idle = !idle
					chans[ch] = append(chans[ch], event{idle: idle})
				} else {
					wm += 1 + int64(rng.IntN(1000))
					chans[ch] = append(chans[ch], event{wm: wm})
				}
			}
			if !idle {
				chans[ch] = append(chans[ch], event{idle: true})
			}
			if wm > 0 {
				largest = max(largest, wm)
			}
		}
		for interleaving := range 20 {
			m := NewMerger(n)
			next := make([]int, n)
			var trace []string
			for left := true; left; {
				left = false
				var ready []int
				for ch := range chans {
					if next[ch] < len(chans[ch]) {
						ready = append(ready, ch)
					}
				}
				if len(ready) == 0 {
					break
				}
				left = true
				ch := ready[rng.IntN(len(ready))]
				e := chans[ch][next[ch]]
				next[ch]++
				if e.wm != 0 {
					trace = append(trace, fmt.Sprintf("wm ch=%d ts=%d", ch, e.wm))
					m.Watermark(ch, e.wm)
				} else {
					trace = append(trace, fmt.Sprintf("%s ch=%d", statusName(e.idle), ch))
					m.SetIdle(ch, e.idle)
				}
			}
			if m.Current() != largest || !m.Idle() {
				t.Fatalf("trial %d interleaving %d: quiet at %s (idle %t), want the largest channel watermark %s\nscript:\nnew channels=%d\n%s",
					trial, interleaving, fmtTime(m.Current()), m.Idle(), fmtTime(largest), n, strings.Join(trace, "\n"))
			}
		}
	}
}
