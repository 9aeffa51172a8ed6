package codec

import (
	"encoding/binary"
	"math"
	"math/bits"
)

// maxDepth bounds how deeply pointers, slices and maps may nest in one
// value, so that a corrupt input cannot exhaust the stack through a
// recursive type and a cyclic value cannot loop forever.
const maxDepth = 1000

// readUvarint decodes a minimally encoded uvarint from the front of src. It
// rejects encodings longer than needed so that every value has exactly one
// encoding and a decoded value re-encodes to the bytes it came from.
func readUvarint(src []byte) (uint64, int, error) {
	if len(src) > 0 && src[0] < 0x80 {
		return uint64(src[0]), 1, nil
	}
	if len(src) >= 8 {
		// Up to 8 bytes from one load: the first byte with its high bit
		// clear ends the varint, and the 7-bit groups before it are
		// gathered without a loop. Longer varints take the loop below.
		w := binary.LittleEndian.Uint64(src)
		if stop := ^w & 0x8080808080808080; stop != 0 {
			n := bits.TrailingZeros64(stop)/8 + 1 // 2 to 8: the first byte continues
			if src[n-1] == 0 {
				return 0, 0, errPaddedVarint
			}
			w &= 1<<(8*n) - 1 // 8*n == 64 keeps all of w
			x := w&0x7f | w>>1&(0x7f<<7) | w>>2&(0x7f<<14) | w>>3&(0x7f<<21) |
				w>>4&(0x7f<<28) | w>>5&(0x7f<<35) | w>>6&(0x7f<<42) | w>>7&(0x7f<<49)
			return x, n, nil
		}
	}
	var x uint64
	var s uint
	for i, b := range src {
		if i == binary.MaxVarintLen64 {
			return 0, 0, errLongVarint
		}
		if b < 0x80 {
			if i == binary.MaxVarintLen64-1 && b > 1 {
				return 0, 0, errLongVarint
			}
			if b == 0 {
				return 0, 0, errPaddedVarint
			}
			return x | uint64(b)<<s, i + 1, nil
		}
		x |= uint64(b&0x7f) << s
		s += 7
	}
	return 0, 0, errShortVarint
}

// oneByteVarint decodes the zig-zag varint at the front of src when it
// takes one byte, the common case in a batch (the Decoder's loops read it
// inline); ok is false for any other, which readVarint decodes.
func oneByteVarint(src []byte) (v int64, ok bool) {
	if len(src) == 0 || src[0] >= 0x80 {
		return 0, false
	}
	x := uint64(src[0])
	return int64(x>>1) ^ -int64(x&1), true
}

// readVarint decodes a minimally encoded zig-zag varint, the encoding of
// binary.AppendVarint.
func readVarint(src []byte) (int64, int, error) {
	ux, n, err := readUvarint(src)
	x := int64(ux >> 1)
	if ux&1 != 0 {
		x = ^x
	}
	return x, n, err
}

// readLen decodes a uvarint length prefix and checks that that many bytes
// follow it. It returns the length and the size of the prefix.
func readLen(src []byte) (int, int, error) {
	l, n, err := readUvarint(src)
	if err != nil {
		return 0, 0, err
	}
	if l > uint64(len(src)-n) {
		return 0, 0, errShortBytes
	}
	return int(l), n, nil
}

// readPrefixed returns the length-prefixed bytes at the front of src and
// the number of bytes they and their prefix occupy. The result aliases src.
func readPrefixed(src []byte) ([]byte, int, error) {
	l, n, err := readLen(src)
	if err != nil {
		return nil, 0, err
	}
	return src[n : n+l], n + l, nil
}

// appendPrefixed appends the uvarint length of b and then b.
func appendPrefixed(dst, b []byte) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(b)))
	return append(dst, b...)
}

// prefixFrom turns dst[start+1:] into a length-prefixed payload, where
// dst[start] is a byte reserved for the prefix before the payload was
// appended. Payloads under 128 bytes, the common case, need no copy.
func prefixFrom(dst []byte, start int) []byte {
	n := len(dst) - start - 1
	if n < 0x80 {
		dst[start] = byte(n)
		return dst
	}
	var p [binary.MaxVarintLen64]byte
	k := binary.PutUvarint(p[:], uint64(n))
	dst = append(dst, p[:k-1]...)
	copy(dst[start+k:], dst[start+1:start+1+n])
	copy(dst[start:], p[:k])
	return dst
}

// appendFloat64 appends the IEEE 754 bits of f, little-endian.
func appendFloat64(dst []byte, f float64) []byte {
	return binary.LittleEndian.AppendUint64(dst, math.Float64bits(f))
}

// readFloat64 decodes eight little-endian bytes as float64 bits.
func readFloat64(src []byte) (float64, int, error) {
	if len(src) < 8 {
		return 0, 0, errShortFixed
	}
	return math.Float64frombits(binary.LittleEndian.Uint64(src)), 8, nil
}

// appendFloat32 appends the IEEE 754 bits of f, little-endian.
func appendFloat32(dst []byte, f float32) []byte {
	return binary.LittleEndian.AppendUint32(dst, math.Float32bits(f))
}

// readFloat32 decodes four little-endian bytes as float32 bits.
func readFloat32(src []byte) (float32, int, error) {
	if len(src) < 4 {
		return 0, 0, errShortFixed
	}
	return math.Float32frombits(binary.LittleEndian.Uint32(src)), 4, nil
}

// appendBool appends 1 for true and 0 for false.
func appendBool(dst []byte, b bool) []byte {
	if b {
		return append(dst, 1)
	}
	return append(dst, 0)
}

// readBool decodes one byte that must be 0 or 1.
func readBool(src []byte) (bool, int, error) {
	if len(src) < 1 {
		return false, 0, errShortFixed
	}
	switch src[0] {
	case 0:
		return false, 1, nil
	case 1:
		return true, 1, nil
	}
	return false, 0, errBool
}

// readString decodes a length-prefixed string. The string is the one
// allocation; an empty string allocates nothing.
func readString(src []byte) (string, int, error) {
	b, n, err := readPrefixed(src)
	if err != nil {
		return "", 0, err
	}
	return string(b), n, nil
}
