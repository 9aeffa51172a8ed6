package operators

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeTempFile(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "input.txt")
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

const sensorFile = "sensor_1,1547718199,35.8\r\n\nbad line\nsensor_2,1547718200,20\nsensor_3,1547718201,-1.5"

var sensorFileReadings = []SensorReading{
	{"sensor_1", 1547718199, 35.8},
	{"sensor_2", 1547718200, 20},
	{"sensor_3", 1547718201, -1.5},
}

func TestLineFileSource(t *testing.T) {
	path := writeTempFile(t, sensorFile)
	for _, limit := range []int{1, 2, 100} {
		var dead []rejectedLine
		src := NewLineFileSource(path, ParseSensorReading).WithDeadLetter(func(line string, err error) {
			dead = append(dead, rejectedLine{line, err})
		})
		got, err := runSource(t, Source[SensorReading](src), subtaskContext(0, 2), limit)
		if err != nil {
			t.Fatalf("limit %d: %v", limit, err)
		}
		if !equalReadings(got, sensorFileReadings) {
			t.Errorf("limit %d: got %v, want %v", limit, got, sensorFileReadings)
		}
		if src.Malformed() != 1 || len(dead) != 1 || dead[0].line != "bad line" || !errors.Is(dead[0].err, ErrMalformed) {
			t.Errorf("limit %d: Malformed() = %d, dead letters %v; want 1, %q", limit, src.Malformed(), dead, "bad line")
		}
		if got, want := src.Position(), int64(len(sensorFile)); got != want {
			t.Errorf("limit %d: Position() = %d at end, want %d", limit, got, want)
		}
	}
}

func TestLineFileSourceOtherSubtasksEnd(t *testing.T) {
	src := NewLineFileSource(filepath.Join(t.TempDir(), "missing"), ParseSensorReading)
	got, err := runSource(t, Source[SensorReading](src), subtaskContext(1, 2), 10)
	if err != nil || len(got) != 0 {
		t.Errorf("subtask 1: %v, %v; want no records and no error", got, err)
	}
}

func TestLineFileSourceMissingFile(t *testing.T) {
	src := NewLineFileSource(filepath.Join(t.TempDir(), "missing"), ParseSensorReading)
	err := src.Open(subtaskContext(0, 1))
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Open = %v, want fs.ErrNotExist", err)
	}
	src.Close()
}

func TestLineFileSourceLogsMalformed(t *testing.T) {
	var lines strings.Builder
	for range 2500 {
		lines.WriteString("bad\n")
	}
	var logs bytes.Buffer
	ctx := subtaskContext(0, 1)
	ctx.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	src := NewLineFileSource(writeTempFile(t, lines.String()), ParseSensorReading)
	if _, err := runSource(t, Source[SensorReading](src), ctx, 64); err != nil {
		t.Fatal(err)
	}
	if src.Malformed() != 2500 {
		t.Errorf("Malformed() = %d, want 2500", src.Malformed())
	}
	// The first, the 1000th and the 2000th.
	if n := strings.Count(logs.String(), "malformed line"); n != 3 {
		t.Errorf("%d log lines, want 3:\n%s", n, logs.String())
	}
}

func TestLineFileSourcePosition(t *testing.T) {
	path := writeTempFile(t, sensorFile)
	first := NewLineFileSource(path, ParseSensorReading)
	if err := first.Open(subtaskContext(0, 1)); err != nil {
		t.Fatal(err)
	}
	var got []SensorReading
	out := CollectorFunc[SensorReading](func(r SensorReading) { got = append(got, r) })
	for range 3 { // sensor_1, the empty line, bad line
		if st, err := first.Poll(out, 1); err != nil || st != MoreAvailable {
			t.Fatalf("Poll = %v, %v", st, err)
		}
	}
	pos := first.Position()
	if want := int64(strings.Index(sensorFile, "sensor_2")); pos != want {
		t.Fatalf("Position() = %d, want %d", pos, want)
	}

	// Rewind the open source.
	first.SetPosition(0)
	again, err := pollToEnd(t, Source[SensorReading](first), 10)
	if err != nil {
		t.Fatal(err)
	}
	if !equalReadings(again, sensorFileReadings) {
		t.Errorf("after SetPosition(0): %v, want %v", again, sensorFileReadings)
	}
	first.Close()

	// Restore a new source.
	restored := NewLineFileSource(path, ParseSensorReading)
	restored.SetPosition(pos)
	rest, err := runSource(t, Source[SensorReading](restored), subtaskContext(0, 1), 10)
	if err != nil {
		t.Fatal(err)
	}
	if all := append(got, rest...); !equalReadings(all, sensorFileReadings) {
		t.Errorf("before and after restore: %v, want %v", all, sensorFileReadings)
	}
}

func TestLineFileSourceLongLines(t *testing.T) {
	long := strings.Repeat("y", 200_000) // longer than the read buffer
	path := writeTempFile(t, "a\n"+long+"\r\nb")
	src := NewLineFileSource(path, func(s string) (string, error) { return s, nil })
	got, err := runSource(t, Source[string](src), subtaskContext(0, 1), 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0] != "a" || got[1] != long || got[2] != "b" {
		t.Errorf("got %d lines (lengths %v), want a, %d bytes, b", len(got), lineLengths(got), len(long))
	}

	// A line longer than MaxLineSize is a malformed line: its first bytes
	// go to the dead-letter function, the lines around it are read, and
	// a restore after it starts at the next line. At exactly MaxLineSize
	// it is a line.
	exact := strings.Repeat("w", MaxLineSize)
	tooLong := writeTempFile(t, "a\n"+strings.Repeat("z", MaxLineSize+1)+"\r\nb\n"+exact+"\n"+strings.Repeat("q", 3*MaxLineSize)+"\nc")
	var dead []string
	var deadErr error
	src = NewLineFileSource(tooLong, func(s string) (string, error) { return s, nil }).
		WithDeadLetter(func(line string, err error) { dead, deadErr = append(dead, line), err })
	got, err = runSource(t, Source[string](src), subtaskContext(0, 1), 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 4 || got[0] != "a" || got[1] != "b" || got[2] != exact || got[3] != "c" {
		t.Errorf("got lines of lengths %v, want a, b, %d bytes, c", lineLengths(got), MaxLineSize)
	}
	if len(dead) != 2 || !errors.Is(deadErr, bufio.ErrTooLong) || !strings.HasPrefix(dead[0], "zzz") || len(dead[0]) > 8<<10 {
		t.Errorf("dead letters of lengths %v (%v), want two cut long lines wrapping bufio.ErrTooLong", lineLengths(dead), deadErr)
	}
	if want := int64(len("a\n") + MaxLineSize + 3 + len("b\n") + MaxLineSize + 1 + 3*MaxLineSize + 1 + 1); src.Position() != want {
		t.Errorf("position %d at the end, want %d", src.Position(), want)
	}

	// WithLongLines: a long line is an element in its place, counted,
	// and not passed to the dead-letter function.
	dead = nil
	src = NewLineFileSource(tooLong, func(s string) (string, error) { return s, nil }).
		WithDeadLetter(func(line string, err error) { dead = append(dead, line) }).
		WithLongLines(func(prefix string, err error) string {
			if !errors.Is(err, bufio.ErrTooLong) {
				t.Errorf("long line error %v", err)
			}
			return "long:" + prefix[:3]
		})
	got, err = runSource(t, Source[string](src), subtaskContext(0, 1), 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 6 || got[1] != "long:zzz" || got[4] != "long:qqq" || got[5] != "c" || len(dead) != 0 || src.Malformed() != 2 {
		t.Errorf("got lines of lengths %v (%.12q), %d dead letters, %d malformed; want the long lines in place", lineLengths(got), got, len(dead), src.Malformed())
	}
}

func lineLengths(lines []string) []int {
	n := make([]int, len(lines))
	for i, l := range lines {
		n[i] = len(l)
	}
	return n
}

// The dead letter of a long line names the line's length, without its end
// of line: ended by "\r\n", by "\n", by "\r\n" whose "\r" ends a full read
// buffer (64 KiB), or by the end of the file, in the line file source and
// the socket source.
func TestLongLineDeadLetterNamesTheLinesLength(t *testing.T) {
	long := strings.Repeat("z", MaxLineSize+1)
	crAtBufferEnd := strings.Repeat("z", 17*(64<<10)-1) // its "\r" is the last byte of the 17th buffer
	for _, c := range []struct {
		name, text string
		n          int
	}{
		{"CRLF", long + "\r\nb\n", len(long)},
		{"LF", long + "\nb\n", len(long)},
		{"CR at a buffer's end", crAtBufferEnd + "\r\nb\n", len(crAtBufferEnd)},
		{"end of file", "b\n" + long, len(long)},
	} {
		t.Run(c.name, func(t *testing.T) {
			var errs []string
			src := NewLineFileSource(writeTempFile(t, c.text), func(s string) (string, error) { return s, nil }).
				WithDeadLetter(func(_ string, err error) { errs = append(errs, err.Error()) })
			if _, err := runSource(t, Source[string](src), subtaskContext(0, 1), 10); err != nil {
				t.Fatal(err)
			}
			if want := fmt.Sprintf("has %d bytes, more than %d", c.n, MaxLineSize); len(errs) != 1 || !strings.Contains(errs[0], want) {
				t.Errorf("dead letter errors %q, want one saying %q", errs, want)
			}
		})
	}
}

// A UTF-8 byte order mark at the start of the file (a CSV saved by a
// spreadsheet on Windows) is not part of the first line: it was read into
// the first column, so the first reading's key was "\ufeffsensor_1", a
// key of its own beside "sensor_1", without a word.
func TestLineFileSourceSkipsAByteOrderMark(t *testing.T) {
	path := writeTempFile(t, "\ufeff"+sensorFile)
	var dead []rejectedLine
	src := NewLineFileSource(path, ParseSensorReading).WithDeadLetter(func(line string, err error) {
		dead = append(dead, rejectedLine{line, err})
	})
	got, err := runSource(t, Source[SensorReading](src), subtaskContext(0, 1), 100)
	if err != nil {
		t.Fatal(err)
	}
	if !equalReadings(got, sensorFileReadings) {
		t.Errorf("got %q, want %q", got, sensorFileReadings)
	}
	if len(dead) != 1 || dead[0].line != "bad line" {
		t.Errorf("dead letters %v, want only %q", dead, "bad line")
	}
	if got, want := src.Position(), int64(len("\ufeff"+sensorFile)); got != want {
		t.Errorf("Position() = %d at end, want %d", got, want)
	}

	// A mark alone on the first line is an empty line; one after the
	// start is data.
	path = writeTempFile(t, "\ufeff\n\ufeffsensor_2,1547718200,20\n")
	got, err = runSource(t, Source[SensorReading](NewLineFileSource(path, ParseSensorReading)), subtaskContext(0, 1), 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].ID != "\ufeffsensor_2" {
		t.Errorf("got %q, want the one reading of \"\\ufeffsensor_2\"", got)
	}
}
