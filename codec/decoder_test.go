package codec

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"reflect"
	"syscall"
	"testing"
	"time"
)

// processCPU returns the process's user and system CPU time: on a loaded
// machine a steadier measure than the wall clock.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestDecoderInternsStrings wants a Decoder to decode a batch of records
// whose strings it has seen before with no allocation at all, and the
// records equal to the codec's.
func TestDecoderInternsStrings(t *testing.T) {
	c := For[SensorReading]()
	rs := make([]SensorReading, 512)
	for i := range rs {
		rs[i] = SensorReading{ID: fmt.Sprintf("sensor-%04d", i%100), Timestamp: int64(i), Temperature: float64(i) / 4}
	}
	buf, err := AppendBatch(c, nil, rs)
	if err != nil {
		t.Fatal(err)
	}
	count, k, _ := readUvarint(buf)
	d := NewDecoder(c)
	if d.flat == nil {
		t.Fatal("SensorReading does not take the flat path")
	}
	out := make([]SensorReading, 0, len(rs))
	if out, _, err = d.AppendN(out[:0], buf[k:], int(count)); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(out, rs) {
		t.Fatal("decoded records differ from the encoded ones")
	}
	if n := testing.AllocsPerRun(100, func() { out, _, err = d.AppendN(out[:0], buf[k:], int(count)) }); n != 0 || err != nil {
		t.Errorf("AppendN allocates %v times per batch of %d (err %v), want 0", n, len(rs), err)
	}
	if !reflect.DeepEqual(out, rs) {
		t.Fatal("decoded records differ from the encoded ones")
	}
	// A long string is not interned: a value of its own every time.
	long := SensorReading{ID: string(make([]byte, internMaxLen+1))}
	b, _ := c.Append(nil, long)
	if n := testing.AllocsPerRun(100, func() { _, _, err = d.Decode(b) }); n != 1 || err != nil {
		t.Errorf("Decode of a %d-byte string allocates %v times (err %v), want 1", internMaxLen+1, n, err)
	}
}

// TestDecoderStrings decodes the built-in string codec's values through
// a Decoder, interned, and a string that collides in the table.
func TestDecoderStrings(t *testing.T) {
	d := NewDecoder[string](String)
	if !d.str {
		t.Fatal("String does not take the string path")
	}
	var vs []string
	for i := range 3 * internSlots {
		vs = append(vs, fmt.Sprint("k", i%(2*internSlots)), "")
	}
	buf, err := AppendBatch(String, nil, vs)
	if err != nil {
		t.Fatal(err)
	}
	_, k, _ := readUvarint(buf)
	got, n, err := d.AppendN(nil, buf[k:], len(vs))
	if err != nil || n != len(buf)-k {
		t.Fatalf("AppendN: %v, consumed %d of %d", err, n, len(buf)-k)
	}
	if !reflect.DeepEqual(got, vs) {
		t.Fatal("decoded strings differ")
	}
}

// TestDecoderErrors wants a Decoder's errors to wrap the codec's
// sentinels, and a failed AppendN to leave dst as it was.
func TestDecoderErrors(t *testing.T) {
	d := NewDecoder(For[SensorReading]())
	dst := []SensorReading{{ID: "kept"}}
	good, _ := For[SensorReading]().Append(nil, SensorReading{ID: "a"})
	bad := append(append([]byte{}, good...), 5, 'x') // second value cut short
	got, n, err := d.AppendN(dst, bad, 2)
	if !errors.Is(err, ErrShort) || n != 0 || len(got) != 1 || got[0].ID != "kept" {
		t.Fatalf("AppendN of a short value: %v, %d bytes, %v", err, n, got)
	}
	if got[:2][1] != (SensorReading{}) {
		t.Fatalf("slot past dst not cleared: %+v", got[:2][1])
	}
	if _, _, err := d.AppendN(nil, good, len(good)+1); !errors.Is(err, ErrShort) {
		t.Fatalf("AppendN of more values than bytes: %v", err)
	}
	if _, _, err := d.Decode([]byte{0x80}); !errors.Is(err, ErrShort) {
		t.Fatalf("Decode of a cut varint: %v", err)
	}
}

// checkDecoder wants a Decoder to decode src as the codec does: the same
// values and bytes consumed, or an error where the codec fails, value by
// value until one fails.
func checkDecoder[T any](t *testing.T, c Codec[T], d *Decoder[T], src []byte) {
	rest := src
	for len(rest) > 0 {
		want, wn, werr := c.Decode(rest)
		got, gn, gerr := d.Decode(rest)
		if (werr == nil) != (gerr == nil) || gn != wn {
			t.Fatalf("Decode of %x: decoder %v (%d bytes), codec %v (%d bytes)", rest, gerr, gn, werr, wn)
		}
		if werr != nil {
			if !errors.Is(gerr, ErrCorrupt) && !errors.Is(gerr, ErrShort) {
				t.Fatalf("Decoder error %v wraps neither ErrCorrupt nor ErrShort", gerr)
			}
			return
		}
		// Equal values encode to equal bytes (NaNs too, which
		// reflect.DeepEqual tells apart from themselves).
		if !sameEncoding(t, c, got, want) {
			t.Fatalf("Decode of %x: decoder %+v, codec %+v", rest, got, want)
		}
		vs, n, err := d.AppendN(nil, rest, 1)
		if err != nil || n != wn || !sameEncoding(t, c, vs[0], want) {
			t.Fatalf("AppendN of %x: %v, %d bytes, %+v; codec %+v, %d bytes", rest, err, n, vs, want, wn)
		}
		rest = rest[wn:]
	}
}

// sameEncoding reports whether a and b encode to the same bytes.
func sameEncoding[T any](t *testing.T, c Codec[T], a, b T) bool {
	ea, err := c.Append(nil, a)
	if err != nil {
		t.Fatal(err)
	}
	eb, err := c.Append(nil, b)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Equal(ea, eb)
}

func FuzzDecoderSensorReading(f *testing.F) {
	c := For[SensorReading]()
	d := NewDecoder(c)
	addSeeds(f, c, SensorReading{}, SensorReading{ID: "sensor-1", Timestamp: -7, Temperature: 21.5},
		SensorReading{ID: string(make([]byte, 40))})
	f.Fuzz(func(t *testing.T, src []byte) { checkDecoder(t, c, d, src) })
}

func FuzzDecoderString(f *testing.F) {
	d := NewDecoder[string](String)
	addSeeds(f, String, "", "hello", string(make([]byte, 200)))
	f.Fuzz(func(t *testing.T, src []byte) { checkDecoder(t, String, d, src) })
}

func FuzzDecoderNested(f *testing.F) {
	c := For[fuzzDevice]()
	d := NewDecoder(c)
	addSeeds(f, c, fuzzDevice{}, fuzzDevice{
		Name:   "d",
		Tags:   []string{"a", ""},
		Attrs:  map[string]int32{"k": -1},
		Parent: &fuzzDevice{Tags: []string{}},
		Seen:   time.Unix(1, 2).UTC(),
	})
	f.Fuzz(func(t *testing.T, src []byte) { checkDecoder(t, c, d, src) })
}

// BenchmarkDecoder decodes a batch of 512 readings of 1000 sensors with
// DecodeBatch and with a Decoder, in the same run.
func BenchmarkDecoder(b *testing.B) {
	c := For[SensorReading]()
	rs := make([]SensorReading, 512)
	for i := range rs {
		rs[i] = SensorReading{ID: fmt.Sprintf("sensor-%04d", (i*7919)%1000), Timestamp: 1_700_000_000_000 + int64(i), Temperature: float64(i) / 4}
	}
	buf, err := AppendBatch(c, nil, rs)
	if err != nil {
		b.Fatal(err)
	}
	count, k, _ := readUvarint(buf)
	out := make([]SensorReading, 0, len(rs))
	b.Run("codec", func(b *testing.B) {
		b.ReportAllocs()
		cpu := processCPU(b)
		defer func() { b.ReportMetric(float64(processCPU(b)-cpu)/float64(b.N*len(rs)), "cpu-ns/record") }()
		for b.Loop() {
			out, _ = DecodeBatch(c, out, buf)
		}
	})
	b.Run("decoder", func(b *testing.B) {
		b.ReportAllocs()
		d := NewDecoder(c)
		cpu := processCPU(b)
		defer func() { b.ReportMetric(float64(processCPU(b)-cpu)/float64(b.N*len(rs)), "cpu-ns/record") }()
		for b.Loop() {
			out, _, _ = d.AppendN(out[:0], buf[k:], int(count))
		}
	})
	b.Run("encode", func(b *testing.B) {
		cpu := processCPU(b)
		defer func() { b.ReportMetric(float64(processCPU(b)-cpu)/float64(b.N*len(rs)), "cpu-ns/record") }()
		for b.Loop() {
			buf, _ = AppendBatch(c, buf[:0], rs)
		}
	})
	// A channel's steady state: the strings numbered by an earlier batch.
	var e DictEncoder
	var dd DictDecoder
	first, _ := AppendBatchDict(c, &e, nil, rs)
	d := NewDecoder(c)
	if _, _, err := d.AppendNDict(out[:0], first[k:], int(count), &dd); err != nil {
		b.Fatal(err)
	}
	coded, _ := AppendBatchDict(c, &e, nil, rs)
	b.Run("decoder-dict", func(b *testing.B) {
		b.ReportAllocs()
		cpu := processCPU(b)
		defer func() { b.ReportMetric(float64(processCPU(b)-cpu)/float64(b.N*len(rs)), "cpu-ns/record") }()
		for b.Loop() {
			out, _, _ = d.AppendNDict(out[:0], coded[k:], int(count), &dd)
		}
		b.ReportMetric(float64(len(coded))/float64(len(rs)), "B/record")
	})
	b.Run("encode-dict", func(b *testing.B) {
		cpu := processCPU(b)
		defer func() { b.ReportMetric(float64(processCPU(b)-cpu)/float64(b.N*len(rs)), "cpu-ns/record") }()
		for b.Loop() {
			coded, _ = AppendBatchDict(c, &e, coded[:0], rs)
		}
	})
}

// flatAll is a struct of every scalar kind, the Decoder's flat path.
type flatAll struct {
	S   string
	I   int
	I8  int8
	I16 int16
	I32 int32
	I64 int64
	U   uint
	U8  uint8
	U16 uint16
	U32 uint32
	U64 uint64
	P   uintptr
	B   bool
	F32 float32
	F64 float64
	C64 complex64
	Loc location
	T   string
}

// TestDecoderFlatEveryLength decodes structs of every scalar kind through
// a Decoder, with strings of every length around the interned ones
// (strings that differ in one byte, wherever it is, must stay apart) and
// integers of every varint length, and wants what the codec decodes.
func TestDecoderFlatEveryLength(t *testing.T) {
	c := For[flatAll]()
	d := NewDecoder(c)
	if d.flat == nil {
		t.Fatal("flatAll does not take the flat path")
	}
	var vs []flatAll
	for n := 1; n <= internMaxLen+2; n++ {
		for pos := range n {
			b := bytes.Repeat([]byte{'k'}, n)
			b[pos] = 'j'
			s := 1 << (n * 2 % 64)
			vs = append(vs, flatAll{
				S: string(b), T: string(b[:n-1]),
				I: -s, I8: int8(-n), I16: int16(s), I32: int32(s), I64: int64(s) * int64(1-2*(pos&1)),
				U: uint(s), U8: uint8(n), U16: uint16(s), U32: uint32(s), U64: uint64(s) << 1, P: uintptr(s),
				B: pos&1 == 1, F32: float32(n), F64: float64(s), C64: complex(1, float32(pos)),
				Loc: location{Lat: float64(n)},
			})
		}
	}
	buf, err := AppendBatch(c, nil, vs)
	if err != nil {
		t.Fatal(err)
	}
	_, k, _ := readUvarint(buf)
	for range 2 { // the second time with every short string interned
		got, n, err := d.AppendN(nil, buf[k:], len(vs))
		if err != nil || n != len(buf)-k {
			t.Fatalf("AppendN: %v, consumed %d of %d", err, n, len(buf)-k)
		}
		if !reflect.DeepEqual(got, vs) {
			for i := range vs {
				if got[i] != vs[i] {
					t.Fatalf("value %d: decoded %+v, want %+v", i, got[i], vs[i])
				}
			}
		}
	}
	for i := range vs {
		b, _ := c.Append(nil, vs[i])
		checkDecoder(t, c, d, b)
		checkDecoder(t, c, d, b[:len(b)-1])
	}
}

// TestHashShortEveryByte wants every byte of a short string to change
// its hash.
func TestHashShortEveryByte(t *testing.T) {
	for _, seed := range []uint64{0, 1, 0x9e3779b97f4a7c15} {
		for n := 1; n <= internMaxLen; n++ {
			b := bytes.Repeat([]byte{'a'}, n)
			h := hashShort(seed, b)
			for pos := range n {
				for _, x := range []byte{'b', 'a' ^ 0x80, 0} {
					c := bytes.Clone(b)
					c[pos] = x
					if hashShort(seed, c) == h {
						t.Errorf("seed %#x: %q and %q hash alike", seed, b, c)
					}
				}
			}
			if n > 1 && hashShort(seed, b[:n-1]) == h {
				t.Errorf("seed %#x: %q and its prefix hash alike", seed, b)
			}
		}
	}
}

func FuzzDecoderFlat(f *testing.F) {
	c := For[flatAll]()
	d := NewDecoder(c)
	addSeeds(f, c, flatAll{}, flatAll{S: "sensor-1", I64: -1 << 40, U64: 1 << 63, T: string(make([]byte, 40)), F64: 2.5})
	f.Fuzz(func(t *testing.T, src []byte) { checkDecoder(t, c, d, src) })
}

// TestAppendBatchFlat wants a batch of structs of scalars, encoded in one
// loop over their fields, to be the count followed by each value as
// Append encodes it alone.
func TestAppendBatchFlat(t *testing.T) {
	c := For[flatAll]()
	if c.(compiled[flatAll]).pl.flat == nil {
		t.Fatal("flatAll does not take the flat path")
	}
	vs := []flatAll{{}, {S: string(make([]byte, 300)), I: math.MinInt, I64: 1 << 62, U64: 1 << 63, P: ^uintptr(0),
		F32: -0.5, F64: 1e300, C64: complex(2, -3), B: true, Loc: location{Lat: -1, Lon: 2}, T: "t"}}
	for i := range 200 {
		vs = append(vs, flatAll{S: fmt.Sprint("sensor-", i), I64: int64(i) << (i % 64), I8: int8(i), F64: float64(i) / 3})
	}
	got, err := AppendBatch(c, nil, vs)
	if err != nil {
		t.Fatal(err)
	}
	want := binary.AppendUvarint(nil, uint64(len(vs)))
	for _, v := range vs {
		if want, err = c.Append(want, v); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("AppendBatch: %x\nAppend one by one: %x", got, want)
	}
}

func FuzzDecodeBatchFlat(f *testing.F) {
	c := For[flatAll]()
	addSeeds(f, c, flatAll{}, flatAll{S: "sensor-1", I64: -1 << 40, U64: 1 << 63, T: string(make([]byte, 200)), F64: 2.5})
	f.Fuzz(func(t *testing.T, src []byte) { checkDecodeBatch(t, c, src) })
}

// TestInternTableTagCollision plants a string under the set and tag of
// another: a lookup of the other must compare the strings, not trust the
// tag, and return a string of its own bytes.
func TestInternTableTagCollision(t *testing.T) {
	tb := &internTable{seed: 7}
	b := []byte("sensor-2")
	h := hashShort(tb.seed, b)
	set := &tb.sets[int(h)&(len(tb.sets)-1)]
	for i := range set.tags {
		set.tags[i], set.strs[i] = uint32(h>>32)|1, fmt.Sprint("sensor-", 3+i)
	}
	if got := tb.get(b); got != "sensor-2" {
		t.Fatalf("get(%q) = %q", b, got)
	}
	if got := tb.get(b); got != "sensor-2" {
		t.Fatalf("get(%q) again = %q", b, got)
	}
}
