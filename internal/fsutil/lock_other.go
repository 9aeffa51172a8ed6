//go:build !unix

package fsutil

import "os"

// TryLock opens the file at path. Without flock there is no protection
// against a second holder.
func TryLock(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
}
