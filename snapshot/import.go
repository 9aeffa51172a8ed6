package snapshot

import (
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// Import stores a state file of snapshot id that another node wrote: the
// size bytes read from r become file name in the snapshot's directory,
// through a temporary file that is synced and renamed only when its size
// and CRC32C (Castagnoli) are size and checksum. A file that does not
// match is removed and the error wraps ErrChecksum or ErrSize. name is a
// state file's name as a Handle holds it: no directories.
func (s *Store) Import(id ID, name string, size int64, checksum uint32, r io.Reader) error {
	if name == "" || name != filepath.Base(name) || strings.HasPrefix(name, ".") || name == metadataFile {
		return fmt.Errorf("import into snapshot %d: %w: %q", id, ErrName, name)
	}
	loc, err := s.location(id)
	if err != nil {
		return fmt.Errorf("import %s: %w", name, err)
	}
	if err := writeChecked(filepath.Join(loc.dir, name), r, size, checksum); err != nil {
		return fmt.Errorf("import %s into snapshot %d: %w", name, id, err)
	}
	return nil
}

// CopyFile copies the state file of h, read from src, to path, checking its
// size and CRC32C against h; the copy is synced. A file that does not
// match is removed and the error wraps ErrSize or ErrChecksum.
func CopyFile(src io.Reader, h Handle, path string) error {
	if err := writeChecked(path, src, h.Size, h.Checksum); err != nil {
		return fmt.Errorf("copy %s: %w", h.File, err)
	}
	return nil
}

// writeChecked writes size bytes of r to path through a Writer, and
// keeps the file only when its size and CRC32C are size and checksum.
func writeChecked(path string, r io.Reader, size int64, checksum uint32) error {
	w, err := newWriter(path)
	if err != nil {
		return err
	}
	n, err := io.Copy(w, io.LimitReader(r, size+1))
	switch {
	case err != nil:
	case n != size:
		err = fmt.Errorf("%w: %d bytes, want %d", ErrSize, n, size)
	case w.crc != checksum:
		err = fmt.Errorf("%w: CRC32C %08x, want %08x", ErrChecksum, w.crc, checksum)
	}
	if err != nil {
		w.Abort()
		return err
	}
	_, err = w.Finish()
	return err
}

// Checksum returns the CRC32C (Castagnoli) of the file at path and its
// size, as a Handle holds them.
func Checksum(path string) (size int64, sum uint32, err error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	h := crc32.New(castagnoli)
	size, err = io.Copy(h, f)
	return size, h.Sum32(), err
}
