// Package pagetrim unmaps the pages of the running executable from the
// process, so that the code and tables only start-up used (package
// initialisers, configuration parsing, job building) stop counting in its
// resident set.
//
// The pages are clean copies of the executable file: unmapping them
// (madvise MADV_DONTNEED on its read-only mappings) leaves them in the
// kernel's page cache, where they become ordinary cache the kernel
// reclaims first under memory pressure, instead of pages mapped into a
// running process. A page the process uses again is mapped back on its
// first touch (a minor fault, or a read from the file when the kernel has
// reclaimed it since). Nothing the process wrote is dropped: mappings that
// are writable or hold private copies of written pages are left alone.
package pagetrim

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// ErrUnsupported is returned by Executable where it cannot work (an
// operating system other than Linux).
var ErrUnsupported = errors.ErrUnsupported

// mapping is one read-only mapping of the executable that may be
// unmapped.
type mapping struct {
	lo, hi uintptr
	rss    int64 // resident bytes
}

// droppable reads /proc/<pid>/smaps from r and returns the mappings of the
// file exe (its path as mapped, and inode) that are not writable and hold
// no private (written) pages.
func droppable(r io.Reader, exe string, inode uint64) ([]mapping, error) {
	var out []mapping
	var cur *mapping
	var curAnon int64
	flush := func() {
		if cur != nil && curAnon == 0 && cur.rss > 0 {
			out = append(out, *cur)
		}
		cur = nil
	}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if !strings.HasSuffix(f[0], ":") { // a mapping's header
			flush()
			if len(f) < 6 {
				continue
			}
			ino, err := strconv.ParseUint(f[4], 10, 64)
			path := strings.TrimSuffix(strings.Join(f[5:], " "), " (deleted)")
			if err != nil || ino != inode || path != exe || strings.Contains(f[1], "w") {
				continue
			}
			lo, hi, ok := strings.Cut(f[0], "-")
			l, err1 := strconv.ParseUint(lo, 16, 64)
			h, err2 := strconv.ParseUint(hi, 16, 64)
			if !ok || err1 != nil || err2 != nil || h <= l {
				return nil, fmt.Errorf("pagetrim: smaps: bad mapping %q", f[0])
			}
			cur, curAnon = &mapping{lo: uintptr(l), hi: uintptr(h)}, 0
			continue
		}
		if cur == nil || len(f) < 2 {
			continue
		}
		switch f[0] {
		case "Rss:", "Anonymous:":
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				return nil, fmt.Errorf("pagetrim: smaps: bad %s %q", f[0], f[1])
			}
			if f[0] == "Rss:" {
				cur.rss = kb << 10
			} else {
				curAnon = kb << 10
			}
		}
	}
	flush()
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("pagetrim: smaps: %w", err)
	}
	return out, nil
}
