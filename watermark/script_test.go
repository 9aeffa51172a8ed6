package watermark

import (
	"strconv"
	"strings"

	"github.com/edgedio/edged/internal/script"
)

// The scripts in testdata/*.txt are run by internal/script; the
// Test*Scripts functions list their commands. Run
//
//	go test ./watermark/ -run Script -update
//
// to rewrite the expected output with what the machines print. This file
// holds what the watermark scripts share: event times, written as numbers
// or as min and max.

// times returns argument key of c as a comma-separated list of event times,
// where "min" and "max" stand for MinWatermark and MaxWatermark.
func times(c *script.Command, key string) ([]int64, error) {
	v, err := c.String(key)
	if err != nil {
		return nil, err
	}
	var out []int64
	for _, s := range strings.Split(v, ",") {
		ts, err := parseTime(s)
		if err != nil {
			return nil, c.Errorf("%s=%s: %w", key, v, err)
		}
		out = append(out, ts)
	}
	return out, nil
}

func parseTime(s string) (int64, error) {
	switch s {
	case "min":
		return MinWatermark, nil
	case "max":
		return MaxWatermark, nil
	}
	return strconv.ParseInt(s, 10, 64)
}

// fmtTime prints an event time, with min and max for the sentinels.
func fmtTime(ts int64) string {
	switch ts {
	case MinWatermark:
		return "min"
	case MaxWatermark:
		return "max"
	}
	return strconv.FormatInt(ts, 10)
}
