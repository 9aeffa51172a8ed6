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

// TestBroadcastThresholdsKnownLines pins sensor_1's alerts at the default
// settings, computed outside Go from the generator's definition.
func TestBroadcastThresholdsKnownLines(t *testing.T) {
	cfg := config{n: 300, sensors: 5, parallelism: 2, def: 39,
		thresholds: []threshold{{"sensor_1", 37}, {"sensor_3", 35.5}}}
	var sensor1 []string
	for _, l := range runLines(t, cfg) {
		if strings.HasPrefix(l, "sensor_1 ") {
			sensor1 = append(sensor1, l)
		}
	}
	want := []string{
		"sensor_1 at 09:43:26: 37.70 above threshold 37.00",
		"sensor_1 at 09:43:30: 38.32 above threshold 37.00",
		"sensor_1 at 09:43:42: 39.77 above threshold 37.00",
		"sensor_1 at 09:43:46: 37.60 above threshold 37.00",
		"sensor_1 at 09:43:47: 38.25 above threshold 37.00",
		"sensor_1 at 09:43:49: 38.57 above threshold 37.00",
		"sensor_1 at 09:44:07: 38.83 above threshold 37.00",
		"sensor_1 at 09:44:16: 38.09 above threshold 37.00",
	}
	if !slices.Equal(sensor1, want) {
		t.Fatalf("sensor_1 alerts:\n%s\nwant:\n%s", strings.Join(sensor1, "\n"), strings.Join(want, "\n"))
	}
}

// TestBroadcastThresholds compares the job with a plain filter over the
// same readings. The slow thresholds reach the check long after the
// readings, which must wait for them rather than be checked against the
// default.
func TestBroadcastThresholds(t *testing.T) {
	many := []threshold{{"sensor_0", 30}, {"sensor_2", 38.5}, {"sensor_5", 25}, {"sensor_6", 39.9}, {"sensor_99", 0}}
	for _, tc := range []struct {
		name string
		cfg  config
	}{
		{"one reading", config{n: 1, sensors: 1, parallelism: 1, def: 0}},
		{"no thresholds", config{n: 500, sensors: 4, parallelism: 2, def: 38}},
		{"p=1", config{n: 1000, sensors: 8, parallelism: 1, def: 39.5, thresholds: many}},
		{"p=3", config{n: 3000, sensors: 8, parallelism: 3, def: 39.5, thresholds: many}},
		{"slow thresholds", config{n: 2000, sensors: 8, parallelism: 2, def: 39.5, thresholds: many, thresholdRate: 40}},
		{"updated threshold", config{n: 600, sensors: 3, parallelism: 2, def: 45,
			thresholds: []threshold{{"sensor_1", 20}, {"sensor_1", 38}}, thresholdRate: 20}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := runLines(t, tc.cfg)
			want := expected(tc.cfg)
			if !slices.Equal(got, want) {
				t.Fatalf("got %d alerts, want %d\ngot:\n%s\nwant:\n%s",
					len(got), len(want), strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
		})
	}
}

func TestParseThresholds(t *testing.T) {
	got, err := parseThresholds(" sensor_1=37, sensor_3 = 35.5 ,")
	if err != nil {
		t.Fatal(err)
	}
	if want := []threshold{{"sensor_1", 37}, {"sensor_3", 35.5}}; !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	for _, bad := range []string{"sensor_1", "sensor_1=", "=3", "sensor_1=hot"} {
		if _, err := parseThresholds(bad); err == nil {
			t.Errorf("parseThresholds(%q) succeeded", bad)
		}
	}
}

// runLines runs the job and returns its output lines sorted.
func runLines(t *testing.T, cfg config) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := run(ctx, &out, cfg); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if lines[0] == "" {
		lines = nil
	}
	slices.Sort(lines)
	return lines
}

// expected returns the sorted alert lines by checking every generated
// reading against the last threshold given for its sensor, or the default.
func expected(cfg config) []string {
	limits := map[string]float64{}
	for _, th := range cfg.thresholds {
		limits[th.Sensor] = th.Max
	}
	var lines []string
	for _, r := range generated(cfg.n, cfg.sensors) {
		at := time.Unix(r.Timestamp, 0).UTC().Format("15:04:05")
		if limit, ok := limits[r.ID]; ok {
			if r.Temperature > limit {
				lines = append(lines, fmt.Sprintf("%s at %s: %.2f above threshold %.2f", r.ID, at, r.Temperature, limit))
			}
		} else if r.Temperature > cfg.def {
			lines = append(lines, fmt.Sprintf("%s at %s: %.2f above default threshold %.2f", r.ID, at, r.Temperature, cfg.def))
		}
	}
	slices.Sort(lines)
	return lines
}

// generated returns the readings of the job's generator, read directly.
func generated(n int64, sensors int) []operators.SensorReading {
	g := operators.SensorGenerator(operators.GeneratorConfig{Count: n, Keys: sensors, Start: start})
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
