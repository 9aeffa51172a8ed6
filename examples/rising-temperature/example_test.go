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

// TestRisingTemperatureDefault pins the alerts of the default run, worked
// out by hand from the sawtooth feed: sensor_k rises from second 4k·m+1
// until it drops at 4k·(m+1), so it alerts 10 s after a rise begins if its
// cycle is longer than 11 s, and a rise begins again right after an alert.
func TestRisingTemperatureDefault(t *testing.T) {
	got := runLines(t, 6, 60, 2)
	want := []string{
		"sensor_1 still rising at end of input (since 09:44:17)",
		"sensor_2 still rising at end of input (since 09:44:17)",
		"sensor_3 rising since 09:43:21 for 10s at 09:43:31",
		"sensor_3 rising since 09:43:33 for 10s at 09:43:43",
		"sensor_3 rising since 09:43:45 for 10s at 09:43:55",
		"sensor_3 rising since 09:43:57 for 10s at 09:44:07",
		"sensor_3 still rising at end of input (since 09:44:09)",
		"sensor_4 rising since 09:43:21 for 10s at 09:43:31",
		"sensor_4 rising since 09:43:37 for 10s at 09:43:47",
		"sensor_4 rising since 09:43:53 for 10s at 09:44:03",
		"sensor_4 still rising at end of input (since 09:44:09)",
		"sensor_5 rising since 09:43:21 for 10s at 09:43:31",
		"sensor_5 rising since 09:43:41 for 10s at 09:43:51",
		"sensor_5 rising since 09:44:01 for 10s at 09:44:11",
		"sensor_5 still rising at end of input (since 09:44:12)",
		"sensor_6 rising since 09:43:21 for 10s at 09:43:31",
		"sensor_6 rising since 09:43:32 for 10s at 09:43:42",
		"sensor_6 rising since 09:43:45 for 10s at 09:43:55",
		"sensor_6 rising since 09:43:56 for 10s at 09:44:06",
		"sensor_6 still rising at end of input (since 09:44:09)",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("alerts:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestRisingTemperatureModel compares the job with a model that scans each
// sensor's readings for rising runs, over sizes and parallelisms.
func TestRisingTemperatureModel(t *testing.T) {
	for _, tc := range []struct{ sensors, seconds, parallelism int }{
		{1, 1, 1},
		{3, 12, 1},
		{8, 100, 2},
		{12, 250, 3},
		{20, 400, 4},
	} {
		t.Run(fmt.Sprintf("sensors=%d/seconds=%d/p=%d", tc.sensors, tc.seconds, tc.parallelism), func(t *testing.T) {
			got := runLines(t, tc.sensors, tc.seconds, tc.parallelism)
			want := model(feed(tc.sensors, tc.seconds))
			if !slices.Equal(got, want) {
				t.Fatalf("got %d alerts, want %d\ngot:\n%s\nwant:\n%s",
					len(got), len(want), strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
		})
	}
}

// TestRisingTemperaturePaced sends the readings at a rate, so that
// watermarks advance while the job runs and timers fire before the input
// ends: the alerts must be those of the run where all fire at the end.
func TestRisingTemperaturePaced(t *testing.T) {
	if testing.Short() {
		t.Skip("paced run takes a second")
	}
	got := runPaced(t, 6, 40, 2, 300)
	want := model(feed(6, 40))
	if !slices.Equal(got, want) {
		t.Fatalf("alerts:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// runLines runs the job as fast as possible and returns its output lines
// sorted.
func runLines(t *testing.T, sensors, seconds, parallelism int) []string {
	t.Helper()
	return runPaced(t, sensors, seconds, parallelism, 0)
}

// runPaced runs the job at rate readings per second and returns its output
// lines sorted.
func runPaced(t *testing.T, sensors, seconds, parallelism int, rate float64) []string {
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

// model returns the sorted alert lines of readings (ordered by time) by
// scanning each sensor's readings: a rise at reading a starts a 10 s
// watch; a drop stamped at most 10 s after a ends it; otherwise it alerts
// if some reading is stamped later than that (else the input ended first),
// and the next rise after the watch starts the next one.
func model(readings []operators.SensorReading) []string {
	bySensor := map[string][]operators.SensorReading{}
	for _, r := range readings {
		bySensor[r.ID] = append(bySensor[r.ID], r)
	}
	rise := int64(riseFor / time.Second)
	var lines []string
	for id, rs := range bySensor {
		i := 1
		for {
			// The next rise.
			for i < len(rs) && rs[i].Temperature <= rs[i-1].Temperature {
				i++
			}
			if i >= len(rs) {
				break
			}
			deadline := rs[i].Timestamp + rise
			j := i + 1
			for j < len(rs) && rs[j].Timestamp <= deadline && rs[j].Temperature >= rs[j-1].Temperature {
				j++
			}
			switch {
			case j == len(rs):
				lines = append(lines, fmt.Sprintf("%s still rising at end of input (since %s)", id, clock(rs[i].Timestamp*1000)))
			case rs[j].Timestamp > deadline:
				lines = append(lines, fmt.Sprintf("%s rising since %s for 10s at %s", id, clock(rs[i].Timestamp*1000), clock(deadline*1000)))
				i = j // this reading may start the next rise
				continue
			}
			i = j + 1 // after the drop
		}
	}
	slices.Sort(lines)
	return lines
}
