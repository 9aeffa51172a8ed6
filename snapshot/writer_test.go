package snapshot

import (
	"runtime"
	"testing"
)

// TestWriterReusesItsBuffer: a checkpoint writes a state file per stateful
// operator; each file's 64 KiB write buffer is reused from one file to the
// next instead of allocated anew (it was most of an idle node's garbage).
func TestWriterReusesItsBuffer(t *testing.T) {
	s, err := OpenStore(t.TempDir(), "job", 128, nil)
	if err != nil {
		t.Fatal(err)
	}
	for id := ID(1); id <= 21; id++ {
		if _, err := s.Begin(Trigger{Checkpoint: id}); err != nil {
			t.Fatal(err)
		}
	}
	write := func(id ID, abort bool) {
		w, err := s.Create(id, "op", 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write([]byte("state")); err != nil {
			t.Fatal(err)
		}
		if abort {
			if err := w.Abort(); err != nil {
				t.Fatal(err)
			}
			return
		}
		if _, err := w.Finish(); err != nil {
			t.Fatal(err)
		}
	}
	write(1, false) // the first file may allocate the buffer
	const n = 20
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := range n {
		write(ID(i+2), i%2 == 1)
	}
	runtime.ReadMemStats(&after)
	perFile := (after.TotalAlloc - before.TotalAlloc) / n
	if perFile >= writerBufSize/2 {
		t.Fatalf("%d bytes allocated per state file; want well under the %d-byte buffer (reused)", perFile, writerBufSize)
	}
	t.Logf("%d bytes allocated per state file", perFile)
}
