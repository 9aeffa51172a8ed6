//go:build linux

package pagetrim

import (
	"fmt"
	"os"
	"syscall"
)

// Executable unmaps the resident pages of the running executable's
// read-only mappings (code, read-only data, the runtime's function tables)
// from the process and returns how many bytes were resident in them.
func Executable() (int64, error) {
	exe, err := os.Executable()
	if err != nil {
		return 0, fmt.Errorf("pagetrim: %w", err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat("/proc/self/exe", &st); err != nil {
		return 0, fmt.Errorf("pagetrim: %w", err)
	}
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		return 0, fmt.Errorf("pagetrim: %w", err)
	}
	ms, err := droppable(f, exe, st.Ino)
	f.Close()
	if err != nil {
		return 0, err
	}
	var n int64
	for _, m := range ms {
		if _, _, e := syscall.Syscall(syscall.SYS_MADVISE, m.lo, m.hi-m.lo, syscall.MADV_DONTNEED); e != 0 {
			return n, fmt.Errorf("pagetrim: madvise %#x-%#x: %w", m.lo, m.hi, e)
		}
		n += m.rss
	}
	return n, nil
}
