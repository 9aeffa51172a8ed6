// Package fsutil holds the file-system helpers that several of edged's
// durable stores share.
package fsutil

import (
	"fmt"
	"os"
	"runtime"
)

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
