package operators

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// startLineServer listens on 127.0.0.1, serves the first connection with
// handle on its own goroutine, and returns the address. Cleanup closes the
// listener and the connection, and waits for the handler.
func startLineServer(t *testing.T, handle func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex // guards conn
		conn net.Conn
	)
	wg.Go(func() {
		c, err := ln.Accept()
		if err != nil {
			return // listener closed by cleanup
		}
		mu.Lock()
		conn = c
		mu.Unlock()
		defer c.Close()
		handle(c)
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		if conn != nil {
			conn.Close() // ends a handler still waiting, if the test failed
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

type rejectedLine struct {
	line string
	err  error
}

func TestSocketSourceReadsUntilEOF(t *testing.T) {
	addr := startLineServer(t, func(c net.Conn) {
		io.WriteString(c, "sensor_1,1547718199,35.8\n\nnot a reading\r\nsensor_2,1547718200,20\r\nsensor_3,1547718201,-1.5")
	})
	var dead []rejectedLine
	src := NewSocketSource(addr, ParseSensorReading).WithDeadLetter(func(line string, err error) {
		dead = append(dead, rejectedLine{line, err})
	})
	got, err := runSource(t, Source[SensorReading](src), subtaskContext(0, 1), 2)
	if err != nil {
		t.Fatalf("Poll: %v", err)
	}
	want := []SensorReading{
		{"sensor_1", 1547718199, 35.8},
		{"sensor_2", 1547718200, 20},
		{"sensor_3", 1547718201, -1.5},
	}
	if !equalReadings(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	if n := src.Malformed(); n != 1 {
		t.Errorf("Malformed() = %d, want 1", n)
	}
	if len(dead) != 1 || dead[0].line != "not a reading" || !errors.Is(dead[0].err, ErrMalformed) {
		t.Errorf("dead letters %v, want one: %q with ErrMalformed", dead, "not a reading")
	}
}

func equalReadings(a, b []SensorReading) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestSocketSourceCloseWhileConnected(t *testing.T) {
	serverDone := make(chan struct{})
	addr := startLineServer(t, func(c net.Conn) {
		defer close(serverDone)
		io.WriteString(c, "sensor_1,1,20\n")
		io.Copy(io.Discard, c) // until the source closes the connection
	})
	src := NewSocketSource(addr, ParseSensorReading)
	if err := src.Open(subtaskContext(0, 1)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() }) // if the test stops early
	var got []SensorReading
	out := CollectorFunc[SensorReading](func(r SensorReading) { got = append(got, r) })
	for len(got) == 0 {
		st, err := src.Poll(out, 10)
		if err != nil || st == EndOfInput {
			t.Fatalf("Poll = %v, %v while the server is connected", st, err)
		}
		if len(got) == 0 {
			waitAvailable(t, src.Available())
		}
	}
	if err := src.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	timer := time.NewTimer(waitTimeout)
	defer timer.Stop()
	select {
	case <-serverDone:
	case <-timer.C:
		t.Fatal("the server still sees the connection open after Close")
	}
	// Nothing more comes, and Close again is harmless.
	if err := src.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestSocketSourceCloseWithFullQueue(t *testing.T) {
	addr := startLineServer(t, func(c net.Conn) {
		w := bufio.NewWriter(c)
		for range 3 * socketQueueSize {
			if _, err := w.WriteString("sensor_1,1,20\n"); err != nil {
				return
			}
		}
		w.Flush()
		io.Copy(io.Discard, c)
	})
	src := NewSocketSource(addr, ParseSensorReading)
	if err := src.Open(subtaskContext(0, 1)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() }) // if the test stops early
	// Nobody polls: the reader fills the queue and blocks.
	for len(src.lines) < socketQueueSize {
		waitAvailable(t, src.Available())
	}
	if err := src.Close(); err != nil { // must not hang
		t.Fatalf("Close: %v", err)
	}
}

// A line longer than MaxLineSize is a malformed line, not a failure: its
// first bytes go to the dead-letter function and the lines after it are
// read. At exactly MaxLineSize it is a line.
func TestSocketSourceLineTooLong(t *testing.T) {
	exact := "sensor_2,2," + strings.Repeat("9", MaxLineSize-len("sensor_2,2,"))
	addr := startLineServer(t, func(c net.Conn) {
		io.WriteString(c, "sensor_1,1,20\n")
		io.WriteString(c, strings.Repeat("x", MaxLineSize+10)+"\r\n")
		io.WriteString(c, exact+"\n")
		io.WriteString(c, strings.Repeat("y", 3*MaxLineSize)+"\n")
		io.WriteString(c, "sensor_3,3,30")
	})
	var dead []string
	var deadErr error
	src := NewSocketSource(addr, func(s string) (string, error) { return s, nil }).
		WithDeadLetter(func(line string, err error) { dead, deadErr = append(dead, line), err })
	got, err := runSource(t, Source[string](src), subtaskContext(0, 1), 10)
	if err != nil {
		t.Fatalf("Poll error = %v, want none", err)
	}
	if len(got) != 3 || got[0] != "sensor_1,1,20" || got[1] != exact || got[2] != "sensor_3,3,30" {
		t.Errorf("got lines of lengths %v, want 13, %d, 13", lineLengths(got), MaxLineSize)
	}
	if len(dead) != 2 || !errors.Is(deadErr, bufio.ErrTooLong) || !strings.HasPrefix(dead[0], "xxx") || len(dead[0]) > 8<<10 || len(dead[1]) > 8<<10 {
		t.Errorf("dead letters of lengths %v (%v), want two cut long lines wrapping bufio.ErrTooLong", lineLengths(dead), deadErr)
	}
	if src.Malformed() != 2 {
		t.Errorf("Malformed() = %d, want 2", src.Malformed())
	}
}

func TestSocketSourceDialError(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	_, err = runSource(t, Source[SensorReading](NewSocketSource(addr, ParseSensorReading)), subtaskContext(0, 1), 10)
	if err == nil || !strings.Contains(err.Error(), "dial") {
		t.Errorf("Poll error = %v, want a dial error", err)
	}
}

func TestSocketSourceOnlySubtaskZeroConnects(t *testing.T) {
	src := NewSocketSource("127.0.0.1:1", ParseSensorReading)
	got, err := runSource(t, Source[SensorReading](src), subtaskContext(1, 2), 10)
	if err != nil || len(got) != 0 {
		t.Errorf("subtask 1: %v, %v; want no records and no error", got, err)
	}
}

func TestSocketSourceCloseBeforeOpen(t *testing.T) {
	if err := NewSocketSource("127.0.0.1:1", ParseSensorReading).Close(); err != nil {
		t.Errorf("Close before Open: %v", err)
	}
}

func TestSourcesSayWhetherTheyReplay(t *testing.T) {
	var socket any = NewSocketSource("127.0.0.1:1", ParseSensorReading)
	if r, ok := socket.(Replayer); !ok || r.Replayable() {
		t.Errorf("socket source: Replayer %v, want one that cannot replay", ok)
	}
	for name, src := range map[string]any{
		"generator": SensorGenerator(GeneratorConfig{Count: 1}),
		"file":      NewLineFileSource("x", func(s string) (string, error) { return s, nil }),
	} {
		if r, ok := src.(Replayer); ok && !r.Replayable() {
			t.Errorf("%s source says it cannot replay", name)
		}
	}
}

// The dead letter of a long line names the line's length, without its
// "\r\n" (TestLongLineDeadLetterNamesTheLinesLength for the file source).
func TestSocketSourceLongLineDeadLetterNamesTheLinesLength(t *testing.T) {
	long := strings.Repeat("x", MaxLineSize+1)
	addr := startLineServer(t, func(c net.Conn) {
		io.WriteString(c, long+"\r\n")
		io.WriteString(c, "b")
	})
	var errs []string
	src := NewSocketSource(addr, func(s string) (string, error) { return s, nil }).
		WithDeadLetter(func(_ string, err error) { errs = append(errs, err.Error()) })
	if _, err := runSource(t, Source[string](src), subtaskContext(0, 1), 10); err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("a line of %d bytes, more than %d", len(long), MaxLineSize); len(errs) != 1 || !strings.Contains(errs[0], want) {
		t.Errorf("dead letter errors %q, want one saying %q", errs, want)
	}
}
