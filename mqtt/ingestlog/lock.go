package ingestlog

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/edgedio/edged/internal/fsutil"
)

// lockDir takes an exclusive lock on dir/LOCK (fsutil.TryLock), released
// when the returned file is closed (or the process dies).
func lockDir(dir string) (*os.File, error) {
	f, err := fsutil.TryLock(filepath.Join(dir, "LOCK"))
	if errors.Is(err, fsutil.ErrLocked) {
		return nil, fmt.Errorf("%w: %s", ErrLocked, dir)
	}
	return f, err
}
