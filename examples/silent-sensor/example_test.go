package main

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgedio/edged/operators"
)

// TestSilentSensorDefault pins the alerts of the default run, worked out
// by hand from the feed: sensor_2 and sensor_5 stop after seconds 62 and
// 65 of 120; sensor_3 pauses 25 s (too short), sensor_6 35 s.
func TestSilentSensorDefault(t *testing.T) {
	got := runLines(t, 6, 120, 2, 0)
	want := []string{
		"sensor_1 last reading 09:45:19, input ended before 30s of silence",
		"sensor_2 silent since 09:44:22 (no reading for 30s at 09:44:52)",
		"sensor_3 last reading 09:45:19, input ended before 30s of silence",
		"sensor_4 last reading 09:45:19, input ended before 30s of silence",
		"sensor_5 silent since 09:44:25 (no reading for 30s at 09:44:55)",
		"sensor_6 back at 09:44:25 after silence since 09:43:49",
		"sensor_6 last reading 09:45:19, input ended before 30s of silence",
		"sensor_6 silent since 09:43:49 (no reading for 30s at 09:44:19)",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("alerts:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestSilentSensorModel compares the job with a model computed from the
// gaps between each sensor's readings, over sizes and parallelisms.
func TestSilentSensorModel(t *testing.T) {
	for _, tc := range []struct{ sensors, seconds, parallelism int }{
		{1, 1, 1},
		{3, 40, 1},
		{9, 100, 2},
		{12, 200, 3},
		{30, 300, 4},
	} {
		t.Run(fmt.Sprintf("sensors=%d/seconds=%d/p=%d", tc.sensors, tc.seconds, tc.parallelism), func(t *testing.T) {
			got := runLines(t, tc.sensors, tc.seconds, tc.parallelism, 0)
			want := model(feed(tc.sensors, tc.seconds))
			if !slices.Equal(got, want) {
				t.Fatalf("got %d alerts, want %d\ngot:\n%s\nwant:\n%s",
					len(got), len(want), strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
		})
	}
}

// TestSilentSensorPaced sends the readings at a rate, so that watermarks
// advance while the job runs and timers fire before the input ends: the
// alerts must be the same.
func TestSilentSensorPaced(t *testing.T) {
	if testing.Short() {
		t.Skip("paced run takes a second")
	}
	got := runLines(t, 9, 100, 2, 600)
	want := model(feed(9, 100))
	if !slices.Equal(got, want) {
		t.Fatalf("alerts:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// runLines runs the job and returns its output lines sorted.
func runLines(t *testing.T, sensors, seconds, parallelism int, rate float64) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := run(ctx, &out, sensors, seconds, parallelism, rate); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if lines[0] == "" {
		lines = nil
	}
	slices.Sort(lines)
	return lines
}

// model returns the sorted alert lines of readings from the gaps between
// each sensor's readings: a gap over 30 s is a silence and a return; the
// time after a sensor's last reading is a silence if 30 s of it passed
// before the feed's last reading.
func model(readings []operators.SensorReading) []string {
	times := map[string][]int64{}
	var end int64
	for _, r := range readings {
		times[r.ID] = append(times[r.ID], r.Timestamp)
		end = max(end, r.Timestamp)
	}
	hms := func(sec int64) string { return time.Unix(sec, 0).UTC().Format("15:04:05") }
	var lines []string
	for id, ts := range times {
		for i := 1; i < len(ts); i++ {
			if ts[i]-ts[i-1] > 30 {
				lines = append(lines,
					fmt.Sprintf("%s silent since %s (no reading for 30s at %s)", id, hms(ts[i-1]), hms(ts[i-1]+30)),
					fmt.Sprintf("%s back at %s after silence since %s", id, hms(ts[i]), hms(ts[i-1])))
			}
		}
		last := ts[len(ts)-1]
		if last+30 < end {
			lines = append(lines, fmt.Sprintf("%s silent since %s (no reading for 30s at %s)", id, hms(last), hms(last+30)))
		} else {
			lines = append(lines, fmt.Sprintf("%s last reading %s, input ended before 30s of silence", id, hms(last)))
		}
	}
	slices.Sort(lines)
	return lines
}
