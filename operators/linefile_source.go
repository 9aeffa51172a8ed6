package operators

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync/atomic"
)

// MaxLineSize is the longest line, in bytes, that the line sources
// (LineFileSource, SocketSource) take: a longer one is a malformed line
// (its dead letter's error wraps bufio.ErrTooLong) holding its first
// bytes.
const MaxLineSize = 1 << 20

// malformedLines counts the lines a line source could not parse and hands
// each to the dead-letter function, or, without one, logs the first and
// every 1000th. It is shared by the line sources.
type malformedLines struct {
	count      atomic.Int64 // read from any goroutine by Malformed
	deadLetter func(line string, err error)
	logger     *slog.Logger
}

// report records that line failed to parse with err. Called from the
// subtask's goroutine.
func (m *malformedLines) report(line string, err error) {
	n := m.count.Add(1)
	if m.deadLetter != nil {
		m.deadLetter(line, err)
		return
	}
	if m.logger != nil && (n == 1 || n%1000 == 0) {
		if len(line) > 256 {
			line = line[:256]
		}
		m.logger.Warn("malformed line", "line", line, "err", err, "malformed", n)
	}
}

// LineFileSource reads a text file line by line and emits parse(line) for
// each. A file is one split: subtask 0 reads the whole file and the other
// subtasks report EndOfInput at once, so the records are read once whatever
// the parallelism.
//
// Empty lines are skipped; a trailing "\r" is removed; the last line need
// not end with "\n". A line parse rejects is not emitted: it is counted
// (Malformed) and passed to the dead-letter function (WithDeadLetter), or
// logged when there is none (the first and every 1000th). A line longer
// than MaxLineSize is a malformed line too: its first bytes are passed
// on, the rest skipped.
//
// The source is replayable: Position is the byte offset of the next line,
// which a checkpoint stores and a restore passes to SetPosition.
type LineFileSource[T any] struct {
	path  string
	parse func(line string) (T, error)
	bad   malformedLines
	long  func(prefix string, err error) T // WithLongLines

	active bool // this subtask reads the file (subtask 0)
	f      *os.File
	r      lineReader
	pos    int64 // byte offset of the next line
	seek   bool  // pos was set by SetPosition after Open
	eof    bool
	ready  chan struct{} // always closed
}

var _ Source[string] = (*LineFileSource[string])(nil)

// NewLineFileSource returns a source of the lines of the file at path,
// parsed by parse on the subtask's goroutine. The file is opened by Open.
func NewLineFileSource[T any](path string, parse func(line string) (T, error)) *LineFileSource[T] {
	ready := make(chan struct{})
	close(ready)
	return &LineFileSource[T]{path: path, parse: parse, ready: ready}
}

// WithDeadLetter makes f receive every line that parse rejects, with the
// error, instead of having it logged. f is called from the subtask's
// goroutine inside Poll. Set it before Open.
func (s *LineFileSource[T]) WithDeadLetter(f func(line string, err error)) *LineFileSource[T] {
	s.bad.deadLetter = f
	return s
}

// WithLongLines makes every line longer than MaxLineSize an element:
// f gets the line's first bytes and the error (wrapping
// bufio.ErrTooLong), and what it returns is emitted in the line's place,
// so that a job whose dead letters are elements of the stream (a declared
// pipeline's) keeps it with the others. Such a line still counts in
// Malformed, and is not passed to the dead-letter function. Set it before
// Open.
func (s *LineFileSource[T]) WithLongLines(f func(prefix string, err error) T) *LineFileSource[T] {
	s.long = f
	return s
}

// Malformed returns how many lines parse has rejected so far, and the
// lines longer than MaxLineSize. Safe to call from any goroutine.
func (s *LineFileSource[T]) Malformed() int64 { return s.bad.count.Load() }

// Open opens the file on subtask 0 and seeks to the position set by
// SetPosition, if any. On other subtasks it does nothing.
func (s *LineFileSource[T]) Open(ctx *Context) error {
	s.bad.logger = ctx.Logger
	if ctx.Subtask != 0 {
		return nil
	}
	f, err := os.Open(s.path)
	if err != nil {
		return fmt.Errorf("line file source: %w", err)
	}
	if s.pos > 0 {
		if _, err := f.Seek(s.pos, io.SeekStart); err != nil {
			f.Close()
			return fmt.Errorf("line file source: seek %s to %d: %w", s.path, s.pos, err)
		}
	}
	s.f, s.r, s.active = f, lineReader{Reader: bufio.NewReaderSize(f, 64<<10)}, true
	return nil
}

// Finish does nothing.
func (s *LineFileSource[T]) Finish() error { return nil }

// Close closes the file.
func (s *LineFileSource[T]) Close() error {
	if s.f == nil {
		return nil
	}
	err := s.f.Close()
	s.f, s.r, s.active = nil, lineReader{}, false
	return err
}

// Position returns the byte offset in the file of the next line to read.
func (s *LineFileSource[T]) Position() int64 { return s.pos }

// SetPosition makes off the byte offset of the next line to read; it must
// be a value Position returned. Called before Open (a restore) or between
// Polls; a negative off means 0.
func (s *LineFileSource[T]) SetPosition(off int64) {
	s.pos = max(off, 0)
	s.eof = false
	s.seek = s.f != nil
}

// Poll emits the records of up to limit lines (malformed and empty lines
// count towards limit). It never returns NothingAvailable.
func (s *LineFileSource[T]) Poll(out Collector[T], limit int) (Status, error) {
	if !s.active || s.eof {
		return EndOfInput, nil
	}
	if s.seek {
		if _, err := s.f.Seek(s.pos, io.SeekStart); err != nil {
			return EndOfInput, fmt.Errorf("line file source: seek %s to %d: %w", s.path, s.pos, err)
		}
		s.r.Reset(s.f)
		s.seek = false
	}
	for range max(limit, 1) {
		raw, n, long, err := s.r.readLine()
		if err != nil && err != io.EOF {
			return EndOfInput, fmt.Errorf("line file source: read %s at offset %d: %w", s.path, s.pos, err)
		}
		at := s.pos
		s.pos += n
		if long {
			err := fmt.Errorf("line file source: the line at offset %d has %d bytes, more than %d: %w", at, n, MaxLineSize, bufio.ErrTooLong)
			if s.long != nil {
				s.bad.count.Add(1)
				out.Collect(s.long(string(raw), err))
			} else {
				s.bad.report(string(raw), err)
			}
		} else if line := trimEOL(raw); len(line) > 0 {
			text := string(line)
			if v, perr := s.parse(text); perr != nil {
				s.bad.report(text, perr)
			} else {
				out.Collect(v)
			}
		}
		if err == io.EOF {
			s.eof = true
			return EndOfInput, nil
		}
	}
	return MoreAvailable, nil
}

// Available returns a closed channel: the file always has data or ends.
func (s *LineFileSource[T]) Available() <-chan struct{} { return s.ready }
