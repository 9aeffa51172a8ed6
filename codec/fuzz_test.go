package codec

import (
	"bytes"
	"errors"
	"testing"
	"time"
)

// fuzzDevice is the nested type the fuzzers decode: every container kind,
// no binary marshalers (their formats need not be canonical).
type fuzzDevice struct {
	Name    string
	Loc     location
	Tags    []string
	Attrs   map[string]int32
	Parent  *fuzzDevice
	Seen    time.Time
	Hash    [4]byte
	Raw     []byte
	Counts  map[int8]*location
	Matrix  [][]uint16
	Enabled bool
	C       complex64
	Units   []struct{}
}

// checkDecode decodes src with c and, if that works, wants the value to
// re-encode to exactly the bytes it was decoded from.
func checkDecode[T any](t *testing.T, c Codec[T], src []byte) {
	v, n, err := c.Decode(src)
	if err != nil {
		if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrShort) {
			t.Fatalf("Decode error %v wraps neither ErrCorrupt nor ErrShort", err)
		}
		return
	}
	if n < 0 || n > len(src) {
		t.Fatalf("Decode consumed %d of %d bytes", n, len(src))
	}
	again, err := c.Append(nil, v)
	if err != nil {
		t.Fatalf("re-encoding a decoded value: %v", err)
	}
	if !bytes.Equal(again, src[:n]) {
		t.Fatalf("decoded %x, re-encoded %x", src[:n], again)
	}
}

// checkDecodeBatch does what checkDecode does for a whole batch.
func checkDecodeBatch[T any](t *testing.T, c Codec[T], src []byte) {
	vs, err := DecodeBatch(c, nil, src)
	if err != nil {
		if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrShort) {
			t.Fatalf("DecodeBatch error %v wraps neither ErrCorrupt nor ErrShort", err)
		}
		return
	}
	again, err := AppendBatch(c, nil, vs)
	if err != nil {
		t.Fatalf("re-encoding a decoded batch: %v", err)
	}
	if !bytes.Equal(again, src) {
		t.Fatalf("decoded %x, re-encoded %x", src, again)
	}
}

func addSeeds[T any](f *testing.F, c Codec[T], vs ...T) {
	for _, v := range vs {
		b, err := c.Append(nil, v)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		if b, err = AppendBatch(c, nil, []T{v, v}); err == nil {
			f.Add(b)
		}
	}
	f.Add([]byte{})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01})
}

func FuzzDecodeSensorReading(f *testing.F) {
	c := For[SensorReading]()
	addSeeds(f, c, SensorReading{}, SensorReading{ID: "sensor-1", Timestamp: -7, Temperature: 21.5})
	f.Fuzz(func(t *testing.T, src []byte) { checkDecode(t, c, src) })
}

func FuzzDecodeBatchSensorReading(f *testing.F) {
	c := For[SensorReading]()
	addSeeds(f, c, SensorReading{ID: "a", Timestamp: 1 << 40, Temperature: -1})
	f.Fuzz(func(t *testing.T, src []byte) { checkDecodeBatch(t, c, src) })
}

func FuzzDecodeString(f *testing.F) {
	addSeeds(f, String, "", "hello", string(make([]byte, 200)))
	f.Fuzz(func(t *testing.T, src []byte) {
		checkDecode(t, String, src)
		checkDecode(t, For[string](), src)
	})
}

func FuzzDecodeBatchString(f *testing.F) {
	addSeeds(f, String, "x", "")
	f.Fuzz(func(t *testing.T, src []byte) { checkDecodeBatch(t, String, src) })
}

func FuzzDecodeNested(f *testing.F) {
	c := For[fuzzDevice]()
	addSeeds(f, c, fuzzDevice{}, fuzzDevice{
		Name:   "d",
		Tags:   []string{"a", ""},
		Attrs:  map[string]int32{"k": -1, "l": 2},
		Parent: &fuzzDevice{Tags: []string{}, Counts: map[int8]*location{1: nil, 2: {Lat: 1}}},
		Seen:   time.Unix(1, 2).UTC(),
		Raw:    []byte{1, 2},
		Matrix: [][]uint16{nil, {}, {65535}},
		Units:  []struct{}{{}, {}},
	})
	f.Fuzz(func(t *testing.T, src []byte) { checkDecode(t, c, src) })
}
