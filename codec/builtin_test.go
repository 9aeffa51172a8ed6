package codec

import (
	"errors"
	"math"
	"testing"
)

func TestBuiltinRoundTrip(t *testing.T) {
	for _, v := range []string{"", "a", "hello, world", "\xff\xfe not utf-8", string(make([]byte, 300))} {
		checkTruncations(t, String, roundTrip(t, String, v))
		checkTruncations(t, For[string](), roundTrip(t, For[string](), v))
	}
	for _, v := range []int64{0, 1, -1, 63, -64, 64, -65, math.MaxInt64, math.MinInt64} {
		checkTruncations(t, Int64, roundTrip(t, Int64, v))
		roundTrip(t, For[int64](), v)
		roundTrip(t, Int, int(v))
	}
	for _, v := range []uint64{0, 1, 127, 128, 1 << 35, math.MaxUint64} {
		checkTruncations(t, Uint64, roundTrip(t, Uint64, v))
		roundTrip(t, For[uint64](), v)
	}
	for _, v := range []float64{0, math.Copysign(0, -1), 1.5, -math.MaxFloat64, math.SmallestNonzeroFloat64, math.Inf(1)} {
		checkTruncations(t, Float64, roundTrip(t, Float64, v))
	}
	for _, v := range []bool{false, true} {
		checkTruncations(t, Bool, roundTrip(t, Bool, v))
	}
	for _, v := range [][]byte{nil, {0}, []byte("bytes"), make([]byte, 200)} {
		checkTruncations(t, Bytes, roundTrip(t, Bytes, v))
	}
	roundTrip(t, For[int8](), math.MinInt8)
	roundTrip(t, For[int16](), math.MaxInt16)
	roundTrip(t, For[int32](), math.MinInt32)
	roundTrip(t, For[uint](), math.MaxUint)
	roundTrip(t, For[uint8](), math.MaxUint8)
	roundTrip(t, For[uint16](), math.MaxUint16)
	roundTrip(t, For[uint32](), math.MaxUint32)
	roundTrip(t, For[uintptr](), 7)
	roundTrip(t, For[float32](), -1.25)
	roundTrip(t, For[bool](), true)
	roundTrip(t, For[[]byte](), []byte{9, 8})
}

func TestBuiltinWireFormat(t *testing.T) {
	check := func(name string, got []byte, err error, want ...byte) {
		t.Helper()
		if err != nil || string(got) != string(want) {
			t.Errorf("%s: got %x, %v; want %x", name, got, err, want)
		}
	}
	b, err := Int64.Append(nil, -1)
	check("Int64(-1)", b, err, 0x01)
	b, err = Int64.Append(nil, 64)
	check("Int64(64)", b, err, 0x80, 0x01)
	b, err = Uint64.Append(nil, 300)
	check("Uint64(300)", b, err, 0xac, 0x02)
	b, err = Float64.Append(nil, 1)
	check("Float64(1)", b, err, 0, 0, 0, 0, 0, 0, 0xf0, 0x3f)
	b, err = String.Append(nil, "hi")
	check(`String("hi")`, b, err, 2, 'h', 'i')
	b, err = Bool.Append(nil, true)
	check("Bool(true)", b, err, 1)
}

func TestBuiltinNaNKeepsBits(t *testing.T) {
	nan := math.Float64frombits(0x7ff8_0000_dead_beef)
	b, _ := Float64.Append(nil, nan)
	got, _, err := Float64.Decode(b)
	if err != nil || math.Float64bits(got) != 0x7ff8_0000_dead_beef {
		t.Fatalf("NaN decoded as %x, %v", math.Float64bits(got), err)
	}
}

func TestBuiltinRejectsBadInput(t *testing.T) {
	corrupt := []struct {
		name string
		dec  func([]byte) error
		in   []byte
	}{
		{"bool 2", decErr(Bool), []byte{2}},
		{"padded uvarint", decErr(Uint64), []byte{0x80, 0x00}},
		{"padded varint", decErr(Int64), []byte{0x81, 0x80, 0x00}},
		{"11-byte varint", decErr(Uint64), []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}},
		{"varint past 64 bits", decErr(Uint64), []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02}},
		{"int8 out of range", decErr(For[int8]()), []byte{0x80, 0x02}},
		{"uint8 out of range", decErr(For[uint8]()), []byte{0x80, 0x02}},
		{"uint32 out of range", decErr(For[uint32]()), []byte{0x80, 0x80, 0x80, 0x80, 0x10}},
	}
	for _, tc := range corrupt {
		if err := tc.dec(tc.in); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: err = %v, want ErrCorrupt", tc.name, err)
		}
	}
	short := []struct {
		name string
		dec  func([]byte) error
		in   []byte
	}{
		{"empty bool", decErr(Bool), nil},
		{"string longer than input", decErr(String), []byte{5, 'a'}},
		{"huge string length", decErr(String), []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f}},
		{"bytes longer than input", decErr(Bytes), []byte{2, 0}},
		{"7-byte float", decErr(Float64), make([]byte, 7)},
	}
	for _, tc := range short {
		if err := tc.dec(tc.in); !errors.Is(err, ErrShort) {
			t.Errorf("%s: err = %v, want ErrShort", tc.name, err)
		}
	}
}

// decErr returns a func that decodes with c and returns the error.
func decErr[T any](c Codec[T]) func([]byte) error {
	return func(b []byte) error {
		_, _, err := c.Decode(b)
		return err
	}
}

func TestBytesDecodeCopies(t *testing.T) {
	src, _ := Bytes.Append(nil, []byte("abc"))
	got, _, err := Bytes.Decode(src)
	if err != nil {
		t.Fatal(err)
	}
	src[1] = 'X'
	if string(got) != "abc" {
		t.Fatalf("decoded bytes alias the input: %q", got)
	}
}
