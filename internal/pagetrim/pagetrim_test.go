package pagetrim

import (
	"strings"
	"testing"
)

const smaps = `00400000-00f5d000 r-xp 00000000 fd:01 4242                       /opt/edged/edged
Size:              11636 kB
Rss:               10164 kB
Anonymous:             0 kB
00f5d000-01c54000 r--p 00b5d000 fd:01 4242                       /opt/edged/edged
Size:              13276 kB
Rss:                9436 kB
Anonymous:             0 kB
01c54000-01c58000 r--p 01854000 fd:01 4242                       /opt/edged/edged
Size:                 16 kB
Rss:                  16 kB
Anonymous:            16 kB
01c58000-01cd9000 rw-p 01858000 fd:01 4242                       /opt/edged/edged
Size:                516 kB
Rss:                 468 kB
Anonymous:           120 kB
01cd9000-03d20000 rw-p 00000000 00:00 0
Size:              33052 kB
Rss:                 192 kB
Anonymous:           192 kB
7f0000000000-7f0000010000 r-xp 00000000 fd:01 4243                       /opt/edged/edged-old
Size:                 64 kB
Rss:                  64 kB
Anonymous:             0 kB
7f0000010000-7f0000020000 r--p 00000000 fd:01 99                         /usr/lib/libc.so.6
Size:                 64 kB
Rss:                  64 kB
Anonymous:             0 kB
7f0000020000-7f0000030000 r--p 00000000 fd:01 4242                       /opt/edged/edged
Size:                 64 kB
Rss:                   0 kB
Anonymous:             0 kB
`

// Only the executable's read-only mappings without private pages are
// unmapped: not its data (writable, or read-only after the dynamic
// loader wrote it: private pages), not other files, not anonymous memory.
func TestDroppable(t *testing.T) {
	ms, err := droppable(strings.NewReader(smaps), "/opt/edged/edged", 4242)
	if err != nil {
		t.Fatal(err)
	}
	want := []mapping{{0x400000, 0xf5d000, 10164 << 10}, {0xf5d000, 0x1c54000, 9436 << 10}}
	if len(ms) != len(want) {
		t.Fatalf("droppable = %+v, want %+v", ms, want)
	}
	for i := range want {
		if ms[i] != want[i] {
			t.Errorf("droppable[%d] = %+v, want %+v", i, ms[i], want[i])
		}
	}
	if ms, err := droppable(strings.NewReader(smaps), "/opt/edged/edged", 1); err != nil || len(ms) != 0 {
		t.Errorf("another inode at the same path: %+v, %v; want none", ms, err)
	}
	if _, err := droppable(strings.NewReader("zz-00400000 r-xp 0 fd:01 4242 /opt/edged/edged\n"), "/opt/edged/edged", 4242); err == nil {
		t.Error("a bad address range was accepted")
	}
}
