package operators

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// LineFileSink writes one line per record, format(v) followed by "\n",
// into a directory: subtask i writes the file "part-<i>" (PartFile), which
// Open creates together with the directory. At a fresh start Open
// truncates an existing file, and subtask 0 removes the part files of
// subtasks the job does not have (an earlier run's at a higher
// parallelism); a subtask restored from a snapshot (Context.Restored: a
// restart after a failure, a start from a savepoint or on an earlier
// run's checkpoints) appends to it, and subtask 0 cuts a torn last line
// from those other part files. It writes its buffer
// when the task has no more input waiting (Flush), and writes and fsyncs
// it at every checkpoint barrier (FlushAtBarrier); on Finish and on Close
// it flushes its buffer, fsyncs and closes the file. A write error fails
// the task.
//
// The sink has no transactions: after a restart, what was written before
// the failure stays and the replay from the restored checkpoint writes
// the records after that checkpoint again, so it is at-least-once.
type LineFileSink[T any] struct {
	dir    string
	format func(T) string
	path   string
	f      *os.File
	w      *bufio.Writer
}

var (
	_ Sink[string]   = (*LineFileSink[string])(nil)
	_ Flusher        = (*LineFileSink[string])(nil)
	_ BarrierFlusher = (*LineFileSink[string])(nil)
)

// NewLineFileSink returns a sink that writes format(v) for each record v to
// the file PartFile(dir, subtask). format is called on the subtask's
// goroutine.
func NewLineFileSink[T any](dir string, format func(T) string) *LineFileSink[T] {
	return &LineFileSink[T]{dir: dir, format: format}
}

// PartFile returns the path of the file subtask writes in dir.
func PartFile(dir string, subtask int) string {
	return filepath.Join(dir, "part-"+strconv.Itoa(subtask))
}

// Open creates the directory and this subtask's file; a restored subtask
// appends to the file it finds.
func (s *LineFileSink[T]) Open(ctx *Context) error {
	if s.format == nil {
		return errors.New("line file sink: the format function is nil: give NewLineFileSink a func(T) string")
	}
	if err := os.MkdirAll(s.dir, 0o755); err != nil {
		return fmt.Errorf("line file sink: %w", err)
	}
	s.path = PartFile(s.dir, ctx.Subtask)
	flags := os.O_CREATE | os.O_WRONLY | os.O_TRUNC
	if ctx.Restored {
		// The file holds the lines of the records before the restored
		// checkpoint, which the replay does not emit again.
		flags = os.O_CREATE | os.O_RDWR | os.O_APPEND
	}
	f, err := os.OpenFile(s.path, flags, 0o666)
	if err != nil {
		return fmt.Errorf("line file sink: %w", err)
	}
	if ctx.Restored {
		if err := cutPartialLine(f); err != nil {
			f.Close()
			return fmt.Errorf("line file sink: %s: %w", s.path, err)
		}
	}
	if ctx.Subtask == 0 {
		if err := tidyRemovedParts(s.dir, ctx.Parallelism, ctx.Restored); err != nil {
			f.Close()
			return fmt.Errorf("line file sink: %w", err)
		}
	}
	s.f, s.w = f, bufio.NewWriterSize(f, 64<<10)
	return nil
}

// tidyRemovedParts deals with the part files in dir of subtasks at or
// above parallelism, which a run at a higher parallelism wrote and no
// subtask of this run opens. Restored, it cuts their partial last line
// (see cutPartialLine): a line a killed process left torn there would
// stay in the output for good, beside the record's whole line the replay
// writes elsewhere; their whole lines are output of the records before the
// restored checkpoint, and stay. At a fresh start it removes them, as each
// subtask truncates its own file: an earlier run's lines would stand
// beside this run's. Subtask 0 does it once per start.
func tidyRemovedParts(dir string, parallelism int, restored bool) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		num, ok := strings.CutPrefix(e.Name(), "part-")
		if !ok || !e.Type().IsRegular() {
			continue
		}
		sub, err := strconv.Atoi(num)
		if err != nil || sub < parallelism || strconv.Itoa(sub) != num {
			continue
		}
		path := filepath.Join(dir, e.Name())
		if !restored {
			if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
			continue
		}
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			return err
		}
		err = cutPartialLine(f)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("%s: %w", e.Name(), err)
		}
	}
	return nil
}

// cutPartialLine truncates f after its last line end. A process killed
// while its buffer went out may leave part of a line at the end; that
// line is of a record after the last checkpoint (every barrier writes
// whole lines), which the replay emits again, and a line appended to it
// would run on from it.
func cutPartialLine(f *os.File) error {
	end, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return err
	}
	buf := make([]byte, 4096)
	for pos := end; pos > 0; {
		n := min(int64(len(buf)), pos)
		pos -= n
		if _, err := f.ReadAt(buf[:n], pos); err != nil {
			return err
		}
		if i := bytes.LastIndexByte(buf[:n], '\n'); i >= 0 {
			return truncateTo(f, end, pos+int64(i)+1)
		}
	}
	return truncateTo(f, end, 0)
}

// truncateTo truncates f, end bytes long, to size and fsyncs it, unless
// it is that long already.
func truncateTo(f *os.File, end, size int64) error {
	if size == end {
		return nil
	}
	if err := f.Truncate(size); err != nil {
		return err
	}
	return f.Sync()
}

// Collect buffers the line of v.
func (s *LineFileSink[T]) Collect(v T) {
	_, err := s.w.WriteString(s.format(v))
	if err == nil {
		err = s.w.WriteByte('\n')
	}
	if err != nil {
		Fail(fmt.Errorf("line file sink: write %s: %w", s.path, err))
	}
}

// Flush writes the buffered lines to the file (without fsync).
func (s *LineFileSink[T]) Flush() error {
	if s.w == nil {
		return nil
	}
	if err := s.w.Flush(); err != nil {
		return fmt.Errorf("line file sink: write %s: %w", s.path, err)
	}
	return nil
}

// FlushAtBarrier writes and fsyncs the buffered lines at the checkpoint
// barrier, so that a restore from this checkpoint, which replays only the
// records after it, finds the lines of every record before it in the
// file, also after a crash.
func (s *LineFileSink[T]) FlushAtBarrier(int64) error {
	if s.f == nil {
		return nil
	}
	if err := errors.Join(s.w.Flush(), s.f.Sync()); err != nil {
		return fmt.Errorf("line file sink: %s: %w", s.path, err)
	}
	return nil
}

// Finish flushes, fsyncs and closes the file.
func (s *LineFileSink[T]) Finish() error { return s.closeFile() }

// Close flushes, fsyncs and closes the file unless Finish has.
func (s *LineFileSink[T]) Close() error { return s.closeFile() }

func (s *LineFileSink[T]) closeFile() error {
	if s.f == nil {
		return nil
	}
	err := errors.Join(s.w.Flush(), s.f.Sync(), s.f.Close())
	s.f, s.w = nil, nil
	if err != nil {
		return fmt.Errorf("line file sink: %s: %w", s.path, err)
	}
	return nil
}
