package main

import (
	"bytes"
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgedio/edged/operators"
)

// TestWindowAverage runs the job and compares its lines with the windows
// computed by a plain loop over the same readings.
func TestWindowAverage(t *testing.T) {
	for _, tc := range []struct {
		n           int64
		sensors     int
		parallelism int
	}{
		{n: 1, sensors: 1, parallelism: 1},
		{n: 120, sensors: 3, parallelism: 1},
		{n: 1000, sensors: 7, parallelism: 2},
		{n: 2000, sensors: 4, parallelism: 3},
	} {
		t.Run(fmt.Sprintf("n=%d/sensors=%d/p=%d", tc.n, tc.sensors, tc.parallelism), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var out bytes.Buffer
			if err := run(ctx, &out, tc.n, tc.sensors, tc.parallelism); err != nil {
				t.Fatal(err)
			}
			got := stripSubtasks(t, out.String(), tc.parallelism)
			want := expectedWindows(tc.n, tc.sensors)
			if !slices.Equal(got, want) {
				t.Fatalf("got %d lines, want %d\ngot:\n%s\nwant:\n%s",
					len(got), len(want), strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
		})
	}
}

// TestWindowAverageKnownLines pins the windows of sensor_0 at the default
// sizes, computed outside Go from the generator's definition (SplitMix64
// temperatures) and the jitter, so a change of either shows up here too.
func TestWindowAverageKnownLines(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), &out, 300, 5, 2); err != nil {
		t.Fatal(err)
	}
	got := stripSubtasks(t, out.String(), 2)
	if len(got) != 35 {
		t.Errorf("%d lines, want 35 (5 sensors, 7 windows)", len(got))
	}
	want := []string{
		"sensor_0 [09:43:10,09:43:20) count=1 avg=35.35",
		"sensor_0 [09:43:20,09:43:30) count=11 avg=28.62",
		"sensor_0 [09:43:30,09:43:40) count=10 avg=31.53",
		"sensor_0 [09:43:40,09:43:50) count=9 avg=30.47",
		"sensor_0 [09:43:50,09:44:00) count=10 avg=29.30",
		"sensor_0 [09:44:00,09:44:10) count=10 avg=29.55",
		"sensor_0 [09:44:10,09:44:20) count=9 avg=30.08",
	}
	var sensor0 []string
	for _, l := range got {
		if strings.HasPrefix(l, "sensor_0 ") {
			sensor0 = append(sensor0, l)
		}
	}
	if !slices.Equal(sensor0, want) {
		t.Errorf("sensor_0 windows:\n%s\nwant:\n%s", strings.Join(sensor0, "\n"), strings.Join(want, "\n"))
	}
}

var subtaskPrefix = regexp.MustCompile(`^([0-9]+)> `)

// stripSubtasks removes the "2> " prefixes of the print sink, checking
// that each sensor is printed by one subtask only, and returns the lines
// sorted.
func stripSubtasks(t *testing.T, out string, parallelism int) []string {
	t.Helper()
	owner := map[string]string{}
	var lines []string
	for l := range strings.Lines(out) {
		l = strings.TrimSuffix(l, "\n")
		if parallelism > 1 {
			m := subtaskPrefix.FindStringSubmatch(l)
			if m == nil {
				t.Fatalf("line %q has no subtask prefix", l)
			}
			l = l[len(m[0]):]
			sensor, _, _ := strings.Cut(l, " ")
			if o, ok := owner[sensor]; ok && o != m[1] {
				t.Errorf("%s printed by subtasks %s and %s", sensor, o, m[1])
			}
			owner[sensor] = m[1]
		}
		lines = append(lines, l)
	}
	slices.Sort(lines)
	return lines
}

// expectedWindows computes the sorted output lines with a plain loop: the
// generator's readings, jittered, bucketed by sensor and 10-second window.
func expectedWindows(n int64, sensors int) []string {
	type bucket struct {
		sensor string
		start  int64 // unix seconds
	}
	acc := map[bucket]countSum{}
	for _, r := range generated(n, sensors) {
		r = jitter(r)
		b := bucket{r.ID, r.Timestamp - r.Timestamp%10}
		cs := acc[b]
		cs.Count++
		cs.Sum += centi(r.Temperature)
		acc[b] = cs
	}
	var lines []string
	for b, cs := range acc {
		lines = append(lines, fmt.Sprintf("%s [%s,%s) count=%d avg=%.2f", b.sensor,
			time.Unix(b.start, 0).UTC().Format("15:04:05"), time.Unix(b.start+10, 0).UTC().Format("15:04:05"),
			cs.Count, float64(cs.Sum)/float64(cs.Count)/100))
	}
	slices.Sort(lines)
	return lines
}

// generated returns the readings of the job's generator, read directly.
func generated(n int64, sensors int) []operators.SensorReading {
	g := generator(n, sensors)
	var all []operators.SensorReading
	col := operators.CollectorFunc[operators.SensorReading](func(r operators.SensorReading) { all = append(all, r) })
	if err := g.Open(&operators.Context{Parallelism: 1}); err != nil {
		panic(err)
	}
	for {
		st, err := g.Poll(col, 1024)
		if err != nil {
			panic(err)
		}
		if st == operators.EndOfInput {
			return all
		}
	}
}
