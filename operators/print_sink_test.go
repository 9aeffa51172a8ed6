package operators

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
)

func TestPrintSink(t *testing.T) {
	tests := []struct {
		subtask, parallelism int
		want                 string
	}{
		{0, 1, "sensor_1,1,20\nsensor_2,2,21.5\n"},
		{1, 3, "2> sensor_1,1,20\n2> sensor_2,2,21.5\n"},
		{0, 2, "1> sensor_1,1,20\n1> sensor_2,2,21.5\n"},
	}
	for _, tt := range tests {
		var buf bytes.Buffer
		sink := NewPrintSink(&buf, SensorReading.String)
		if err := sink.Open(subtaskContext(tt.subtask, tt.parallelism)); err != nil {
			t.Fatal(err)
		}
		sink.Collect(SensorReading{"sensor_1", 1, 20})
		sink.Collect(SensorReading{"sensor_2", 2, 21.5})
		if buf.Len() != 0 {
			t.Errorf("subtask %d/%d: %q written before Finish, want buffering", tt.subtask, tt.parallelism, buf.String())
		}
		if err := sink.Finish(); err != nil {
			t.Fatal(err)
		}
		if err := sink.Close(); err != nil {
			t.Fatal(err)
		}
		if buf.String() != tt.want {
			t.Errorf("subtask %d/%d: output %q, want %q", tt.subtask, tt.parallelism, buf.String(), tt.want)
		}
	}
}

// writeRecorder records each Write separately.
type writeRecorder struct{ writes []string }

func (w *writeRecorder) Write(p []byte) (int, error) {
	w.writes = append(w.writes, string(p))
	return len(p), nil
}

func TestPrintSinkWritesWholeLines(t *testing.T) {
	var w writeRecorder
	sink := NewPrintSink(&w, func(i int) string { return fmt.Sprintf("record %d %s", i, strings.Repeat("-", i%50)) })
	if err := sink.Open(subtaskContext(3, 4)); err != nil {
		t.Fatal(err)
	}
	var want strings.Builder
	for i := range 2000 {
		sink.Collect(i)
		fmt.Fprintf(&want, "4> record %d %s\n", i, strings.Repeat("-", i%50))
	}
	if len(w.writes) == 0 {
		t.Error("nothing written before Close: the buffer is unbounded")
	}
	if err := sink.Close(); err != nil {
		t.Fatal(err)
	}
	for i, s := range w.writes {
		if !strings.HasSuffix(s, "\n") || !strings.HasPrefix(s, "4> ") {
			t.Fatalf("write %d is not whole lines: %q...", i, s[:min(len(s), 40)])
		}
	}
	if got := strings.Join(w.writes, ""); got != want.String() {
		t.Error("output differs from the records")
	}
}

type failingPrintWriter struct{}

var errDiskFull = errors.New("disk full")

func (failingPrintWriter) Write([]byte) (int, error) { return 0, errDiskFull }

func TestPrintSinkWriteErrorFails(t *testing.T) {
	sink := NewPrintSink(failingPrintWriter{}, func(s string) string { return s })
	if err := sink.Open(subtaskContext(0, 1)); err != nil {
		t.Fatal(err)
	}
	sink.Collect("short")
	if err := sink.Finish(); !errors.Is(err, errDiskFull) {
		t.Errorf("Finish = %v, want errDiskFull", err)
	}

	defer func() {
		var f *Failure
		if r := recover(); r == nil {
			t.Error("Collect did not fail the task on a write error")
		} else if err, ok := r.(error); !ok || !errors.As(err, &f) || !errors.Is(f, errDiskFull) {
			t.Errorf("Collect panicked with %v, want a *Failure wrapping errDiskFull", r)
		}
	}()
	for range 1000 {
		sink.Collect(strings.Repeat("x", 100))
	}
}

func TestPrintSinkFlush(t *testing.T) {
	var buf bytes.Buffer
	sink := NewPrintSink(&buf, strconv.Itoa)
	if err := sink.Open(subtaskContext(0, 1)); err != nil {
		t.Fatal(err)
	}
	sink.Collect(4)
	if buf.Len() != 0 {
		t.Fatalf("%q written before Flush, want buffering", buf.String())
	}
	if err := sink.Flush(); err != nil {
		t.Fatal(err)
	}
	if buf.String() != "4\n" {
		t.Errorf("output %q after Flush, want %q", buf.String(), "4\n")
	}
}
