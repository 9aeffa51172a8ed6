// Package fsutil holds the file-system helpers that several of edged's
// durable stores share.
package fsutil

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
)

// ErrLocked is the error of TryLock on a file another holder has locked.
var ErrLocked = errors.New("in use (locked)")

// SyncDir fsyncs directory dir so that the entries created, renamed or
// removed in it are durable. Windows cannot sync directories; there it
// does nothing.
func SyncDir(dir string) error {
	if runtime.GOOS == "windows" {
		return nil
	}
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}

// WriteFile writes data to path durably and atomically: a temporary file
// beside it (unique, so concurrent writers of one path do not share it),
// fsynced, renamed over path, and the directory fsynced. A crash leaves
// path with its old content or the new, never part of it.
func WriteFile(path string, data []byte) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, filepath.Base(path)+".*.tmp")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	return SyncDir(dir)
}
