package operators

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
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
// which a checkpoint stores with the identity of the file (its device and
// inode, and a fingerprint of its first KiB) and a restore gives back.
// Before it reads from a restored offset the source checks that the file
// at the path is the one the offset was taken in, as tail -F does: when
// it is another file (replaced, as by log rotation), shorter than the
// offset (truncated), or its first bytes differ from those read (truncated
// and written again), the offset means nothing in it, and the source
// reads it from its start instead, logs a warning naming the path, the
// reason, the old offset and the file's size, counts it (Resets) and
// tells the function given to WithResets. The same holds for an offset
// set with SetPosition (checked by size only) and for a file truncated
// while the source reads it: at its end, a file shorter than the offset
// is read again from its start. A file untouched or only appended to is
// read on from the exact offset.
type LineFileSource[T any] struct {
	path    string
	parse   func(line string) (T, error)
	bad     malformedLines
	long    func(prefix string, err error) T // WithLongLines
	onReset func(FileReset)                  // WithResets
	resets  atomic.Int64                     // read from any goroutine by Resets

	active bool // this subtask reads the file (subtask 0)
	f      *os.File
	id     fileID // the open file's device and inode, if hasID
	hasID  bool
	head   []byte // the open file's first bytes, up to fingerprintSize, as far as read for a fingerprint
	r      lineReader
	pos    int64      // byte offset of the next line
	seek   bool       // pos was set (Open, SetPosition, a restore or a reset): check and seek before reading
	want   *fileState // the file a restored pos was taken in, until checked
	eof    bool
	ready  chan struct{} // always closed
}

// FileReset is a LineFileSource finding that the file at its path is not
// the one its offset was taken in, or is shorter than it, and reading it
// from its start.
type FileReset struct {
	Path   string
	Reason string // FileReplaced, FileTruncated or FileRewritten
	Offset int64  // the offset the source had
	Size   int64  // the size of the file at the path
}

// The reasons of a FileReset.
const (
	// FileReplaced: the file at the path has another device or inode
	// than the one a restored offset was taken in (log rotation, a file
	// written elsewhere and renamed over it, another node's file).
	FileReplaced = "replaced"
	// FileTruncated: the file is shorter than the offset.
	FileTruncated = "truncated"
	// FileRewritten: the file is the same and not shorter, but its first
	// bytes differ from those the offset was taken after (truncated and
	// written again past the offset).
	FileRewritten = "rewritten"
)

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

// WithResets makes f receive every FileReset: each time the source reads
// its file from the start because the file is not the one its offset was
// taken in, or is shorter. f is called from the subtask's goroutine inside
// Poll, after the warning is logged. Set it before Open.
func (s *LineFileSource[T]) WithResets(f func(FileReset)) *LineFileSource[T] {
	s.onReset = f
	return s
}

// Malformed returns how many lines parse has rejected so far, and the
// lines longer than MaxLineSize. Safe to call from any goroutine.
func (s *LineFileSource[T]) Malformed() int64 { return s.bad.count.Load() }

// Resets returns how many times the source has read its file from the
// start because it was replaced or truncated (FileReset). Safe to call
// from any goroutine.
func (s *LineFileSource[T]) Resets() int64 { return s.resets.Load() }

// Open opens the file on subtask 0; the first Poll checks the position
// set by SetPosition or a restore, if any, against it and seeks there. On
// other subtasks it does nothing.
func (s *LineFileSource[T]) Open(ctx *Context) error {
	if s.parse == nil {
		return errors.New("line file source: the parse function is nil: give NewLineFileSource a func(line string) (T, error)")
	}
	s.bad.logger = ctx.Logger
	if ctx.Subtask != 0 {
		return nil
	}
	f, err := os.Open(s.path)
	if err != nil {
		return fmt.Errorf("line file source: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("line file source: %w", err)
	}
	s.id, s.hasID = fileIDOf(fi)
	s.head = s.head[:0]
	s.f, s.r, s.active = f, lineReader{Reader: bufio.NewReaderSize(f, 64<<10)}, true
	s.seek = s.pos > 0 || s.want != nil
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
// Polls; a negative off means 0. If the file is shorter than off when the
// next Poll reads it, it is read from its start (a FileReset).
func (s *LineFileSource[T]) SetPosition(off int64) { s.setPosition(off, nil) }

// setPosition makes off the offset of the next line, taken in the file
// want describes (nil: unknown).
func (s *LineFileSource[T]) setPosition(off int64, want *fileState) {
	s.pos, s.want = max(off, 0), want
	s.eof = false
	s.seek = s.f != nil
}

// resume checks that the position set is in the open file, which must be
// the file it was taken in and not shorter; otherwise the file is read
// from its start (reset).
func (s *LineFileSource[T]) resume() error {
	want := s.want
	s.want = nil
	if s.pos == 0 {
		return nil // nothing to skip, whatever the file
	}
	fi, err := s.f.Stat()
	if err != nil {
		return fmt.Errorf("line file source: %w", err)
	}
	size := fi.Size()
	switch {
	case want != nil && want.hasID && s.hasID && want.id != s.id:
		s.reset(FileReplaced, size)
	case size < s.pos:
		s.reset(FileTruncated, size)
	case want != nil && want.head > 0:
		head, err := s.headBytes(want.head)
		if err != nil {
			return err
		}
		if head == nil || fingerprint(head) != want.fp {
			s.reset(FileRewritten, size)
		}
	}
	return nil
}

// headBytes returns the open file's first n bytes (n at most
// fingerprintSize), reading what it has not read of them yet; nil if the
// file is shorter.
func (s *LineFileSource[T]) headBytes(n int64) ([]byte, error) {
	if n <= 0 {
		return nil, nil
	}
	if have := int64(len(s.head)); have < n {
		s.head = slices.Grow(s.head, int(n-have))[:n]
		got, err := s.f.ReadAt(s.head[have:], have)
		s.head = s.head[:have+int64(got)]
		if err != nil && err != io.EOF {
			return nil, fmt.Errorf("line file source: read the first bytes of %s: %w", s.path, err)
		}
		if int64(len(s.head)) < n {
			return nil, nil
		}
	}
	return s.head[:n], nil
}

// reset makes the source read its file from the start, because it is not
// the one the position was taken in (reason), and says so.
func (s *LineFileSource[T]) reset(reason string, size int64) {
	ev := FileReset{Path: s.path, Reason: reason, Offset: s.pos, Size: size}
	s.pos, s.seek, s.eof, s.head = 0, true, false, s.head[:0]
	n := s.resets.Add(1)
	if s.bad.logger != nil {
		s.bad.logger.Warn("file source: the file is not the one the offset was taken in, or is shorter; reading it from its start",
			"path", s.path, "reason", reason, "offset", ev.Offset, "size", size, "resets", n)
	}
	if s.onReset != nil {
		s.onReset(ev)
	}
}

// byteOrderMark is UTF-8's byte order mark, which text editors and
// spreadsheets on Windows put at the start of a file: it belongs to no
// line, so the first line is read without it (in a CSV file it was read
// into the first column, so the first record's key was one of its own).
var byteOrderMark = []byte("\ufeff")

// Poll emits the records of up to limit lines (malformed and empty lines
// count towards limit). It never returns NothingAvailable.
func (s *LineFileSource[T]) Poll(out Collector[T], limit int) (Status, error) {
	if !s.active || s.eof {
		return EndOfInput, nil
	}
	if s.seek {
		if err := s.resume(); err != nil {
			return EndOfInput, err
		}
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
			err := fmt.Errorf("line file source: the line at offset %d has %d bytes, more than %d: %w", at, n-int64(s.r.eol), MaxLineSize, bufio.ErrTooLong)
			if s.long != nil {
				s.bad.count.Add(1)
				out.Collect(s.long(string(raw), err))
			} else {
				s.bad.report(string(raw), err)
			}
		} else if line := trimEOL(raw); len(line) > 0 && (at > 0 || !bytes.Equal(line, byteOrderMark)) {
			if at == 0 {
				line = bytes.TrimPrefix(line, byteOrderMark)
			}
			text := string(line)
			if v, perr := s.parse(text); perr != nil {
				s.bad.report(text, perr)
			} else {
				out.Collect(v)
			}
		}
		if err == io.EOF {
			// A file truncated while it was read ends before the
			// offset: what was written to it since is read from its
			// start.
			fi, err := s.f.Stat()
			if err != nil {
				return EndOfInput, fmt.Errorf("line file source: %w", err)
			}
			if fi.Size() < s.pos {
				s.reset(FileTruncated, fi.Size())
				return MoreAvailable, nil
			}
			s.eof = true
			return EndOfInput, nil
		}
	}
	return MoreAvailable, nil
}

// Available returns a closed channel: the file always has data or ends.
func (s *LineFileSource[T]) Available() <-chan struct{} { return s.ready }
