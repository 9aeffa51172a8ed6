//go:build !unix

package ingestlog

import (
	"os"
	"path/filepath"
)

// lockDir opens dir/LOCK. Without flock there is no protection against a
// second process opening the same directory.
func lockDir(dir string) (*os.File, error) {
	return os.OpenFile(filepath.Join(dir, "LOCK"), os.O_RDWR|os.O_CREATE, 0o644)
}
