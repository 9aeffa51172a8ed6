package codec

import (
	"encoding/binary"
	"errors"
	"math"
	"testing"
)

// refUvarint is readUvarint's rule written plainly: a uvarint of at most
// ten bytes, the last of them at most 1, with no trailing zero byte.
func refUvarint(src []byte) (uint64, int, error) {
	v, n := binary.Uvarint(src)
	switch {
	case n == 0:
		return 0, 0, errShortVarint
	case n < 0:
		return 0, 0, errLongVarint
	case n > 1 && src[n-1] == 0:
		return 0, 0, errPaddedVarint
	}
	return v, n, nil
}

// checkUvarint wants readUvarint to agree with refUvarint on src.
func checkUvarint(t *testing.T, src []byte) {
	t.Helper()
	v, n, err := readUvarint(src)
	wv, wn, werr := refUvarint(src)
	if v != wv || n != wn || !errors.Is(err, werr) || (err == nil) != (werr == nil) {
		t.Fatalf("readUvarint(%x) = %d, %d, %v; want %d, %d, %v", src, v, n, err, wv, wn, werr)
	}
}

// TestReadUvarint checks readUvarint on every length of encoding, each
// followed by 0 to 9 bytes (so that both the one-load path and the loop
// decode it), padded, cut short and overlong.
func TestReadUvarint(t *testing.T) {
	var vals []uint64
	for s := range 64 {
		vals = append(vals, 1<<s-1, 1<<s, 1<<s+1, 0x5555555555555555>>s, math.MaxUint64>>s)
	}
	for _, v := range vals {
		enc := binary.AppendUvarint(nil, v)
		for tail := range 10 {
			src := append(append([]byte{}, enc...), make([]byte, tail)...)
			for i := len(enc); i < len(src); i++ {
				src[i] = byte(0x80 | i) // continuation bits: must not be read
			}
			checkUvarint(t, src)
			if v, n, err := readUvarint(src); err != nil || n != len(enc) {
				t.Fatalf("readUvarint(%x) = %d, %d, %v", src, v, n, err)
			}
			checkUvarint(t, src[:len(enc)-1])
			// v padded with a zero group: not canonical.
			if len(enc) < binary.MaxVarintLen64 {
				pad := append(append([]byte{}, enc...), src[len(enc):]...)
				pad[len(enc)-1] |= 0x80
				pad = append(pad[:len(enc)], append([]byte{0}, pad[len(enc):]...)...)
				checkUvarint(t, pad)
				if _, _, err := readUvarint(pad); !errors.Is(err, errPaddedVarint) && len(enc) < binary.MaxVarintLen64-1 {
					t.Fatalf("readUvarint(%x): %v, want a padded varint", pad, err)
				}
			}
		}
	}
	for n := range 12 {
		long := make([]byte, n)
		for i := range long {
			long[i] = 0xff
		}
		checkUvarint(t, long)
		checkUvarint(t, append(long, 1))
		checkUvarint(t, append(long, 2))
	}
}

func FuzzReadUvarint(f *testing.F) {
	f.Add([]byte{0x80, 0x01})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0})
	f.Add([]byte{0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00})
	f.Fuzz(checkUvarint)
}
