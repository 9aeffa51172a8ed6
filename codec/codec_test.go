package codec

import (
	"bytes"
	"errors"
	"net/netip"
	"reflect"
	"testing"
	"time"
)

// SensorReading is the flat record the allocation tests and benchmarks use.
type SensorReading struct {
	ID          string
	Timestamp   int64
	Temperature float64
}

// location is nested by value inside device.
type location struct {
	Lat, Lon float64
}

// device exercises every kind the compiled codec supports.
type device struct {
	Name     string
	Loc      location
	Tags     []string
	Readings []SensorReading
	Attrs    map[string]int32
	Parent   *device
	Calib    *location
	Seen     time.Time
	Hash     [4]byte
	Flags    [2]bool
	Raw      []byte
	Counts   map[int]*location
	Matrix   [][]int16
	Enabled  bool
	Small    int8
	U16      uint16
	U        uint
	Ptr      uintptr
	C64      complex64
	C128     complex128
	F32      float32
	Addr     netip.Addr
	Empty    struct{}
	Units    []struct{}
	Skipped  int `codec:"-"`
	cache    int `codec:"-"` // a tagged unexported field is skipped
	_        int
}

// richDevice returns a device with every field set, pointers non-nil.
func richDevice() device {
	return device{
		Name:     "pump-7",
		Loc:      location{Lat: 52.52, Lon: -13.405},
		Tags:     []string{"north", "", "ünïcödé"},
		Readings: []SensorReading{{ID: "a", Timestamp: -1, Temperature: 21.5}, {ID: "b", Timestamp: 1 << 40}},
		Attrs:    map[string]int32{"x": 1, "y": -2, "zz": 1 << 30},
		Parent:   &device{Name: "rack", Tags: []string{}, Attrs: map[string]int32{}},
		Calib:    &location{Lat: 1, Lon: 2},
		Seen:     time.Date(2026, 3, 4, 5, 6, 7, 891011121, time.UTC),
		Hash:     [4]byte{0xde, 0xad, 0xbe, 0xef},
		Flags:    [2]bool{true, false},
		Raw:      []byte{0, 1, 2, 255},
		Counts:   map[int]*location{1: {Lat: 3}, -5: nil},
		Matrix:   [][]int16{{1, -2}, nil, {}},
		Enabled:  true,
		Small:    -128,
		U16:      65535,
		U:        1<<32 - 1, // the largest uint on 32-bit targets
		Ptr:      42,
		C64:      complex(1.5, -2),
		C128:     complex(-0.0, 3e300),
		F32:      -3.25,
		Addr:     netip.MustParseAddr("fe80::1"),
		Units:    make([]struct{}, 3),
	}
}

// roundTrip encodes v after a prefix, decodes it back and checks the value,
// the bytes consumed and that re-encoding gives the same bytes.
func roundTrip[T any](t *testing.T, c Codec[T], v T) []byte {
	t.Helper()
	prefix := []byte("hdr")
	b, err := c.Append(bytes.Clone(prefix), v)
	if err != nil {
		t.Fatalf("Append(%#v): %v", v, err)
	}
	if !bytes.Equal(b[:len(prefix)], prefix) {
		t.Fatalf("Append overwrote the prefix: %q", b[:len(prefix)])
	}
	enc := b[len(prefix):]
	got, n, err := c.Decode(append(bytes.Clone(enc), "trailing"...))
	if err != nil {
		t.Fatalf("Decode(Append(%#v)): %v", v, err)
	}
	if n != len(enc) {
		t.Fatalf("Decode consumed %d bytes, Append wrote %d", n, len(enc))
	}
	if !reflect.DeepEqual(got, v) {
		t.Fatalf("round trip:\n got %#v\nwant %#v", got, v)
	}
	again, err := c.Append(nil, got)
	if err != nil || !bytes.Equal(again, enc) {
		t.Fatalf("re-encoding gave %x, %v; want %x", again, err, enc)
	}
	return enc
}

// checkTruncations decodes every strict prefix of enc and wants ErrShort.
func checkTruncations[T any](t *testing.T, c Codec[T], enc []byte) {
	t.Helper()
	for i := range len(enc) {
		_, n, err := c.Decode(enc[:i])
		if !errors.Is(err, ErrShort) {
			t.Fatalf("Decode of %d of %d bytes: n=%d err=%v, want ErrShort", i, len(enc), n, err)
		}
	}
}
