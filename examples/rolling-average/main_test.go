package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// lockedBuffer is a writer the print subtasks may share.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// The feeder sends 20 readings of 5 sensors, temperatures 30 + i%7: the
// final rolling average of each sensor is known.
func TestRollingAverage(t *testing.T) {
	var out lockedBuffer
	log := slog.New(slog.DiscardHandler)
	if err := run(context.Background(), log, &out, "", 20, 2); err != nil {
		t.Fatal(err)
	}
	last := map[string]string{}
	lines := strings.Split(strings.TrimSpace(out.b.String()), "\n")
	if len(lines) != 20 {
		t.Fatalf("%d lines, want 20:\n%s", len(lines), out.b.String())
	}
	for _, l := range lines {
		f := strings.Fields(l) // "2>" "sensor_1" "count=4" "avg=32.25"
		last[f[1]] = f[2] + " " + f[3]
	}
	// sensor k+1 gets readings i = k, k+5, k+10, k+15 with 30 + i%7.
	for k := range 5 {
		sum := 0.0
		for j := range 4 {
			sum += 30 + float64((k+5*j)%7)
		}
		id := fmt.Sprintf("sensor_%d", k+1)
		if want := "count=4 avg=" + strconv.FormatFloat(sum/4, 'f', 2, 64); last[id] != want {
			t.Errorf("%s: got %q, want %q", id, last[id], want)
		}
	}
}
