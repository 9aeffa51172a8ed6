package snapshot

import (
	"bufio"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"sync"
)

// Writer writes one state file of a snapshot: into a temporary file, which
// Finish syncs and renames to its final name. It buffers (64 KiB) and
// computes the CRC32C as it goes. Not safe for concurrent use: it belongs
// to the task that created it.
type Writer struct {
	f     *os.File
	buf   *bufio.Writer
	path  string // final path
	crc   uint32
	size  int64
	err   error // first write error; sticks
	ended bool
}

// errEnded is returned by a Writer used after Finish or Abort.
var errEnded = errors.New("snapshot: state file writer already finished")

// writerBufSize is the buffer of a Writer.
const writerBufSize = 64 << 10

// writerBufs holds the buffers of finished Writers: every checkpoint
// writes a state file per stateful operator, and a new 64 KiB buffer for
// each was most of an idle node's garbage.
var writerBufs = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, writerBufSize) }}

func newWriter(path string) (*Writer, error) {
	f, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".*.tmp")
	if err != nil {
		return nil, fmt.Errorf("create state file: %w", err)
	}
	buf := writerBufs.Get().(*bufio.Writer)
	buf.Reset(f)
	return &Writer{f: f, buf: buf, path: path}, nil
}

// release returns the buffer to writerBufs; the Writer has ended.
func (w *Writer) release() {
	if w.buf != nil {
		w.buf.Reset(nil)
		writerBufs.Put(w.buf)
		w.buf = nil
	}
}

// Write appends p to the file.
func (w *Writer) Write(p []byte) (int, error) {
	if w.ended {
		return 0, errEnded
	}
	if w.err != nil {
		return 0, w.err
	}
	n, err := w.buf.Write(p)
	w.crc = crc32.Update(w.crc, castagnoli, p[:n])
	w.size += int64(n)
	if err != nil {
		w.err = fmt.Errorf("write state file %s: %w", w.path, err)
	}
	return n, w.err
}

// Finish flushes, fsyncs and closes the file, renames it to its final name
// and returns its Handle (File, Size, Checksum; the caller fills in the
// opaque fields). The directory entry becomes durable when Store.Commit
// syncs the directory. On error the temporary file is removed.
func (w *Writer) Finish() (Handle, error) {
	if w.ended {
		return Handle{}, errEnded
	}
	w.ended = true
	err := w.err
	if err == nil {
		err = w.buf.Flush()
	}
	w.release()
	if err == nil {
		err = w.f.Sync()
	}
	if cerr := w.f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(w.f.Name(), w.path)
	}
	if err != nil {
		os.Remove(w.f.Name())
		return Handle{}, fmt.Errorf("finish state file %s: %w", w.path, err)
	}
	return Handle{File: filepath.Base(w.path), Size: w.size, Checksum: w.crc}, nil
}

// Abort closes and removes the temporary file. It does nothing after
// Finish, so a deferred Abort is safe.
func (w *Writer) Abort() error {
	if w.ended {
		return nil
	}
	w.ended = true
	w.release()
	cerr := w.f.Close()
	if err := os.Remove(w.f.Name()); err != nil {
		return fmt.Errorf("abort state file %s: %w", w.path, err)
	}
	if cerr != nil && !errors.Is(cerr, os.ErrClosed) {
		return fmt.Errorf("abort state file %s: %w", w.path, cerr)
	}
	return nil
}
