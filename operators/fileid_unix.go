//go:build unix

package operators

import (
	"os"
	"syscall"
)

// fileIDOf returns the device and inode of the file fi describes; ok is
// false when the platform does not give them.
func fileIDOf(fi os.FileInfo) (id fileID, ok bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileID{}, false
	}
	return fileID{dev: uint64(st.Dev), ino: uint64(st.Ino)}, true
}
