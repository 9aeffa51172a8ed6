package operators

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
)

// socketQueueSize is how many lines the reader goroutine of a SocketSource
// may hold ahead of Poll; when the queue is full it stops reading, so
// backpressure reaches the sender through TCP.
const socketQueueSize = 1024

// SocketSource connects to a TCP server and emits parse(line) for each line
// it sends, like Flink's socketTextStream. A connection is one split:
// subtask 0 connects and the other subtasks report EndOfInput at once.
//
// A socket is not replayable (Replayable is false): lines read before a
// failure are gone, so a job fed by a SocketSource is at-most-once
// whatever its checkpoint mode, and the stream package refuses to run it
// with checkpoints unless stream.AllowAtMostOnceSources is given. It is
// meant for demos and tests.
//
// Empty lines are skipped and a trailing "\r" is removed. A line parse
// rejects is not emitted: it is counted (Malformed) and passed to the
// dead-letter function (WithDeadLetter), or logged when there is none (the
// first and every 1000th). A line longer than MaxLineSize is such a line
// too: it is read to its end, and its dead letter holds its first 4 KiB
// and an error wrapping bufio.ErrTooLong. When the server closes the
// connection, the source reports EndOfInput after the last line; a
// failure to connect or to read is returned by Poll.
//
// Open starts one reader goroutine, which dials and reads lines into a
// bounded queue (socketQueueSize); Close stops it and waits for it.
type SocketSource[T any] struct {
	addr  string
	parse func(line string) (T, error)
	bad   malformedLines

	lines  chan socketLine // reader -> Poll; closed by the reader when it ends
	bell   chan struct{}   // capacity 1; rung by the reader after each line and at its end
	cancel context.CancelFunc
	done   chan struct{} // closed when the reader goroutine has returned
	// readErr is why the reader ended, nil for end of stream or Close.
	// Written by the reader before it closes lines; read by Poll after it
	// has seen lines closed.
	readErr error
	ready   chan struct{} // always closed
}

// socketLine is a line the reader goroutine read: its text, or the first
// bytes of a line longer than MaxLineSize, whose length is then n.
type socketLine struct {
	text string
	n    int64 // set for a line longer than MaxLineSize: its length without its end of line
}

var (
	_ Source[string] = (*SocketSource[string])(nil)
	_ Replayer       = (*SocketSource[string])(nil)
)

// NewSocketSource returns a source of the lines sent by the TCP server at
// addr ("host:port"), parsed by parse on the subtask's goroutine. It
// connects in Open.
func NewSocketSource[T any](addr string, parse func(line string) (T, error)) *SocketSource[T] {
	ready := make(chan struct{})
	close(ready)
	return &SocketSource[T]{addr: addr, parse: parse, ready: ready}
}

// WithDeadLetter makes f receive every line that parse rejects, with the
// error, instead of having it logged. f is called from the subtask's
// goroutine inside Poll. Set it before Open.
func (s *SocketSource[T]) WithDeadLetter(f func(line string, err error)) *SocketSource[T] {
	s.bad.deadLetter = f
	return s
}

// Malformed returns how many lines parse has rejected so far. Safe to call
// from any goroutine.
func (s *SocketSource[T]) Malformed() int64 { return s.bad.count.Load() }

// Open starts, on subtask 0, the goroutine that connects to the server and
// reads lines. It does not wait for the connection: a failure to connect
// is returned by Poll.
func (s *SocketSource[T]) Open(ctx *Context) error {
	s.bad.logger = ctx.Logger
	if ctx.Subtask != 0 {
		return nil
	}
	rctx, cancel := context.WithCancel(context.Background())
	s.lines = make(chan socketLine, socketQueueSize)
	s.bell = make(chan struct{}, 1)
	s.done = make(chan struct{})
	s.cancel = cancel
	go s.run(rctx)
	return nil
}

// Replayable returns false: lines read before a failure are gone, and a
// restarted job reconnects and reads what the server sends next.
func (s *SocketSource[T]) Replayable() bool { return false }

// Finish does nothing.
func (s *SocketSource[T]) Finish() error { return nil }

// Close cancels the dial or closes the connection, and waits until the
// reader goroutine has returned.
func (s *SocketSource[T]) Close() error {
	if s.cancel == nil {
		return nil
	}
	s.cancel()
	<-s.done
	s.cancel = nil
	return nil
}

// run is the reader goroutine.
func (s *SocketSource[T]) run(ctx context.Context) {
	defer close(s.done)
	err := s.read(ctx)
	if ctx.Err() != nil {
		err = nil // stopped by Close: not a failure of the source
	}
	s.readErr = err
	close(s.lines)
	s.ring()
}

// read dials and queues lines until the stream ends, fails or ctx is done.
func (s *SocketSource[T]) read(ctx context.Context) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", s.addr)
	if err != nil {
		return fmt.Errorf("socket source: dial %s: %w", s.addr, err)
	}
	defer conn.Close()
	// Closing the connection is what interrupts a blocked Read.
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()

	r := lineReader{Reader: bufio.NewReaderSize(conn, 64<<10)}
	for {
		raw, n, long, err := r.readLine()
		var l socketLine
		if long {
			l = socketLine{text: string(raw), n: n - int64(r.eol)}
		} else if line := trimEOL(raw); len(line) > 0 {
			l = socketLine{text: string(line)}
		}
		if l.text != "" {
			select {
			case s.lines <- l:
				s.ring()
			case <-ctx.Done():
				return nil
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("socket source: read %s: %w", s.addr, err)
		}
	}
}

// ring signals the doorbell without blocking; one pending signal is enough.
func (s *SocketSource[T]) ring() {
	select {
	case s.bell <- struct{}{}:
	default:
	}
}

// Poll emits the records of the queued lines, up to limit (malformed lines
// count towards limit), without blocking.
func (s *SocketSource[T]) Poll(out Collector[T], limit int) (Status, error) {
	if s.lines == nil {
		return EndOfInput, nil
	}
	for range max(limit, 1) {
		select {
		case line, ok := <-s.lines:
			if !ok {
				if s.readErr != nil {
					return EndOfInput, s.readErr
				}
				return EndOfInput, nil
			}
			if line.n > 0 {
				s.bad.report(line.text, fmt.Errorf("socket source: a line of %d bytes, more than %d: %w", line.n, MaxLineSize, bufio.ErrTooLong))
				continue
			}
			v, err := s.parse(line.text)
			if err != nil {
				s.bad.report(line.text, err)
				continue
			}
			out.Collect(v)
		default:
			return NothingAvailable, nil
		}
	}
	return MoreAvailable, nil
}

// Available returns the doorbell the reader goroutine rings after queuing
// a line and when it ends; it may ring when Poll has already taken the
// line, which costs only a Poll that finds nothing.
func (s *SocketSource[T]) Available() <-chan struct{} {
	if s.bell == nil {
		return s.ready
	}
	return s.bell
}
