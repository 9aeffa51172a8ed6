//go:build linux

package pagetrim

import (
	"os"
	"syscall"
	"testing"
)

// exeRSS returns the resident bytes of the test binary's read-only
// mappings.
func exeRSS(t *testing.T) int64 {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat("/proc/self/exe", &st); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Skipf("no /proc/self/smaps: %v", err)
	}
	defer f.Close()
	ms, err := droppable(f, exe, st.Ino)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, m := range ms {
		n += m.rss
	}
	return n
}

// Executable unmaps the executable's resident pages, and the process goes
// on running (what it uses maps back).
func TestExecutable(t *testing.T) {
	before := exeRSS(t)
	if before == 0 {
		t.Fatal("the test binary has no resident read-only mapping: nothing to measure")
	}
	n, err := Executable()
	if err != nil {
		t.Fatal(err)
	}
	after := exeRSS(t)
	t.Logf("resident in the executable's read-only mappings: %d KB before, %d KB unmapped, %d KB after", before>>10, n>>10, after>>10)
	if n < before/2 || after >= before {
		t.Errorf("unmapped %d of %d resident bytes, %d resident after; want most of them unmapped", n, before, after)
	}
}
