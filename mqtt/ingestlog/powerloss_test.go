package ingestlog

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// powerLossLog builds the state a power loss can leave: acked records
// appended and fsynced one by one (msg(0..acked-1)), then one group
// commit's worth of records written after the last fsync that returned
// (extra(0..n-1), the first carrying the commit mark acked, as the writer
// puts it), never fsynced. It returns the directory, the last segment's
// path and the byte positions of the unacknowledged frames in it (and
// their end).
func powerLossLog(t testing.TB, acked, n int) (dir, path string, starts []int64) {
	t.Helper()
	dir = t.TempDir()
	l, err := Open(dir, testOptions(1<<20), nil)
	if err != nil {
		t.Fatal(err)
	}
	appendN(t, l, 0, acked)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	path = lastSegment(t, dir)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	pos := fileSizeOf(t, path)
	for i := range n {
		m := extra(i)
		frame := appendFrame(nil, &m)
		if i == 0 {
			frame = addMark(frame, uint64(acked))
		}
		if _, err := f.Write(frame); err != nil {
			t.Fatal(err)
		}
		starts = append(starts, pos)
		pos += int64(len(frame))
	}
	return dir, path, append(starts, pos)
}

// extra is the i-th message written after the last acknowledged one.
func extra(i int) Message {
	return Message{Topic: "sensors/extra", Payload: fmt.Appendf(nil, `{"extra":%d}`, i), QoS: 1, PacketID: uint16(100 + i)}
}

// overwrite writes b at pos in the file at path.
func overwrite(t testing.TB, path string, pos int64, b []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(b, pos); err != nil {
		t.Fatal(err)
	}
}

// A power loss writes pages back in any order: the unacknowledged tail
// of the last segment can be a hole of zeros followed by data, garbage
// followed by whole records, or records after a partial one. Recovery
// keeps the valid records before the first damaged one and cuts the rest,
// whatever its shape.
func TestPowerLossTail(t *testing.T) {
	const acked, n = 20, 6
	tests := []struct {
		name string
		// damage damages the unacknowledged frames (at starts, the last
		// entry their end) and returns how many survive.
		damage func(t *testing.T, path string, starts []int64) int
	}{
		{"zero hole then data", func(t *testing.T, path string, s []int64) int {
			// Records 1 and half of 2 never reached the disk; 3..5 did.
			overwrite(t, path, s[1], make([]byte, (s[2]-s[1])+(s[3]-s[2])/2))
			return 1
		}},
		{"zero hole at the first unacknowledged record", func(t *testing.T, path string, s []int64) int {
			overwrite(t, path, s[0], make([]byte, 5))
			return 0
		}},
		{"garbage then whole records", func(t *testing.T, path string, s []int64) int {
			overwrite(t, path, s[2]+3, bytes.Repeat([]byte{0xa5}, int(s[3]-s[2])))
			return 2
		}},
		{"partial record then whole records", func(t *testing.T, path string, s []int64) int {
			// Record 3's body is half zeros (a torn page); 4 and 5 are whole.
			overwrite(t, path, s[3]+frameHeaderSize+2, make([]byte, 4))
			return 3
		}},
		{"zero hole then a partial record", func(t *testing.T, path string, s []int64) int {
			overwrite(t, path, s[2], make([]byte, s[4]-s[2]))
			truncateFile(t, path, s[5]-3)
			return 2
		}},
		{"zero hole then zeros to a page end", func(t *testing.T, path string, s []int64) int {
			overwrite(t, path, s[4], make([]byte, 4096))
			return 4
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir, path, starts := powerLossLog(t, acked, n)
			kept := tt.damage(t, path, starts)
			logger, logs := newLogger()
			l, err := Open(dir, testOptions(1<<20), logger)
			if err != nil {
				t.Fatalf("Open after a power loss: %v", err)
			}
			defer l.Close()
			if got := l.Stats().NextOffset; got != uint64(acked+kept) {
				t.Fatalf("next offset %d, want %d\n%s", got, acked+kept, logs)
			}
			if got := fileSize(t, path); got != starts[kept] {
				t.Fatalf("last segment cut at %d, want %d", got, starts[kept])
			}
			if !strings.Contains(logs.String(), "dropped torn tail") {
				t.Fatalf("torn tail not reported:\n%s", logs)
			}
			recs := readAll(t, l, 0)
			checkRecords(t, recs[:acked], 0, acked)
			for k, r := range recs[acked:] {
				if !sameMessage(r.Message, extra(k)) || r.PacketID != extra(k).PacketID {
					t.Fatalf("record %d = %+v, want %+v", acked+k, r.Message, extra(k))
				}
			}
		})
	}
}

// Damage to a record that a later record proves was acknowledged (its
// commit mark says the damaged one had been fsynced) is corruption, not a
// torn tail, even in the last segment and even when it looks like a torn
// write (a hole of zeros).
func TestPowerLossAcknowledgedDamage(t *testing.T) {
	const acked = 20
	for _, shape := range []string{"zeros", "flipped byte"} {
		t.Run(shape, func(t *testing.T) {
			dir, path, _ := powerLossLog(t, acked, 0)
			starts := frameStarts(t, path)
			// Record 10 was acknowledged: records 11.. were each written
			// after it was fsynced, and say so.
			switch shape {
			case "zeros":
				overwrite(t, path, starts[10], make([]byte, starts[12]-starts[10]))
			default:
				flipByte(t, path, starts[10]+12)
			}
			_, err := Open(dir, testOptions(1<<20), nil)
			var ce *CorruptError
			if !errors.As(err, &ce) || !errors.Is(err, ErrCorrupt) || ce.Offset != 10 || ce.Pos != starts[10] ||
				!strings.Contains(err.Error(), "acknowledged") {
				t.Fatalf("Open = %v, want a CorruptError at offset 10 (byte %d)", err, starts[10])
			}
		})
	}
}

// Damage inside a sealed segment stops recovery whatever its shape,
// including the shapes a torn write takes at the end of the last one.
func TestPowerLossSealedSegmentDamage(t *testing.T) {
	for _, shape := range []string{"zero hole", "zeros to the end"} {
		t.Run(shape, func(t *testing.T) {
			dir := buildLog(t, 30)
			path := filepath.Join(dir, segmentFiles(t, dir)[1])
			starts := frameStarts(t, path)
			switch shape {
			case "zero hole":
				overwrite(t, path, starts[0], make([]byte, starts[1]-starts[0]))
			default:
				overwrite(t, path, starts[1], make([]byte, fileSize(t, path)-starts[1]))
			}
			if _, err := Open(dir, testOptions(400), nil); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Open with a damaged sealed segment = %v, want ErrCorrupt", err)
			}
		})
	}
}

// FuzzPowerLossTail gives the unacknowledged tail of the last segment
// random shapes (holes, garbage, cuts, whole records appended after them
// with commit marks no later than the last fsync that returned): Open
// always succeeds, keeps every acknowledged record, and keeps only
// records that were written, in order.
func FuzzPowerLossTail(f *testing.F) {
	f.Add([]byte{0, 10, 30})                   // zero hole then data
	f.Add([]byte{1, 3, 20, 3, 0})              // garbage then a valid record
	f.Add([]byte{2, 40, 3, 5})                 // cut, then a record
	f.Add([]byte{4, 9, 9, 0, 0, 200, 3, 3, 3}) // zeros appended, records
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, ops []byte) {
		const acked, n = 8, 6
		dir, path, starts := powerLossLog(t, acked, n)
		tailStart := starts[0]
		next := func() int {
			if len(ops) == 0 {
				return 0
			}
			b := ops[0]
			ops = ops[1:]
			return int(b)
		}
		written := n // extra messages written, in order
		for len(ops) > 0 && len(ops) < 64 {
			size := fileSize(t, path)
			span := max(size-tailStart, 1)
			switch next() % 5 {
			case 0: // a hole of zeros
				at := tailStart + int64(next())*span/256
				overwrite(t, path, at, make([]byte, 1+next()))
			case 1: // garbage
				at := tailStart + int64(next())*span/256
				g := make([]byte, 1+next()%32)
				for i := range g {
					g[i] = byte(next()*31 + i)
				}
				overwrite(t, path, at, g)
			case 2: // cut
				truncateFile(t, path, tailStart+int64(next())*span/256)
			case 3: // a later record of the same unacknowledged batch
				m := extra(written)
				written++
				frame := appendFrame(nil, &m)
				if next()%2 == 0 {
					frame = addMark(frame, uint64(next()%(acked+1)))
				}
				overwrite(t, path, size, frame)
			case 4: // zeros at the end
				overwrite(t, path, size, make([]byte, next()))
			}
		}
		l, err := Open(dir, testOptions(1<<20), nil)
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		defer l.Close()
		recs := readAll(t, l, 0)
		if len(recs) < acked {
			t.Fatalf("%d records recovered, %d were acknowledged", len(recs), acked)
		}
		checkRecords(t, recs[:acked], 0, acked)
		last := -1
		for _, r := range recs[acked:] {
			var k int
			if _, err := fmt.Sscanf(string(r.Payload), `{"extra":%d}`, &k); err != nil || k <= last || k >= written ||
				!sameMessage(r.Message, extra(k)) {
				t.Fatalf("recovered record %d = %+v: not one written, or out of order", r.Offset, r.Message)
			}
			last = k
		}
		// The recovered log appends and reopens clean.
		appendN(t, l, len(recs), 0)
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		l2, err := Open(dir, testOptions(1<<20), nil)
		if err != nil {
			t.Fatalf("reopen: %v", err)
		}
		if st := l2.Stats(); st.TornBytes != 0 || st.NextOffset != uint64(len(recs)) {
			t.Fatalf("reopen: stats %+v", st)
		}
		l2.Close()
	})
}

// A torn tail of random bytes (megabytes of it, as a large unsynced batch
// written back as garbage) is cut in about the time it takes to read it
// (looking for a commit mark after the damage does not compute a checksum
// at every byte; it used to take minutes).
func TestPowerLossLargeGarbageTail(t *testing.T) {
	dir, path, starts := powerLossLog(t, 5, 1)
	garbage := make([]byte, 4<<20)
	x := uint32(2463534242)
	for i := range garbage {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		// Small little-endian lengths everywhere: each position looks
		// like the start of a frame that fits.
		if i%4 == 0 {
			garbage[i] = byte(x)
		} else if i%4 == 1 {
			garbage[i] = byte(x>>8) & 0x0f
		}
	}
	overwrite(t, path, starts[0], garbage)
	l, err := Open(dir, testOptions(64<<20), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if got := l.Stats().NextOffset; got != 5 {
		t.Fatalf("next offset %d, want 5", got)
	}
}
