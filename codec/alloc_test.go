package codec

import (
	"fmt"
	"testing"
)

func TestAllocsSensorReading(t *testing.T) {
	c := For[SensorReading]()
	r := SensorReading{ID: "sensor-0042", Timestamp: 1_700_000_000_123, Temperature: 21.25}
	buf := make([]byte, 0, 64)
	var err error
	if n := testing.AllocsPerRun(1000, func() {
		buf, err = c.Append(buf[:0], r)
	}); n != 0 || err != nil {
		t.Errorf("Append allocates %v times per record (err %v), want 0", n, err)
	}
	var got SensorReading
	if n := testing.AllocsPerRun(1000, func() {
		got, _, err = c.Decode(buf)
	}); n > 1 || err != nil {
		t.Errorf("Decode allocates %v times per record (err %v), want at most 1 (the string)", n, err)
	}
	if got != r {
		t.Fatalf("decoded %+v, want %+v", got, r)
	}
}

func TestAllocsFlatStructs(t *testing.T) {
	type flat struct {
		A    int32
		B    uint16
		OK   bool
		Loc  location
		Hash [8]byte
		F    float32
	}
	checkZeroAllocs(t, For[flat](), flat{A: -5, B: 9, OK: true, Loc: location{1, 2}, F: 3})
	checkZeroAllocs(t, Int64, 1<<40)
	checkZeroAllocs(t, Float64, 2.5)
	checkZeroAllocs(t, String, "") // decoding "" allocates nothing
	checkZeroAllocs(t, For[[4]int](), [4]int{1, 2, 3, 4})
}

// checkZeroAllocs wants encoding and decoding v to allocate nothing.
func checkZeroAllocs[T any](t *testing.T, c Codec[T], v T) {
	t.Helper()
	buf := make([]byte, 0, 128)
	var err error
	enc := testing.AllocsPerRun(500, func() { buf, err = c.Append(buf[:0], v) })
	dec := testing.AllocsPerRun(500, func() { _, _, err = c.Decode(buf) })
	if enc != 0 || dec != 0 || err != nil {
		t.Errorf("%s: %v allocs to encode, %v to decode (err %v), want 0 and 0",
			fmt.Sprintf("%T", v), enc, dec, err)
	}
}

func TestAllocsBatch(t *testing.T) {
	c := For[SensorReading]()
	rs := make([]SensorReading, 100)
	for i := range rs {
		rs[i] = SensorReading{ID: fmt.Sprint("s", i), Timestamp: int64(i), Temperature: float64(i)}
	}
	buf := make([]byte, 0, 4096)
	out := make([]SensorReading, 0, len(rs))
	var err error
	if n := testing.AllocsPerRun(100, func() { buf, err = AppendBatch(c, buf[:0], rs) }); n != 0 || err != nil {
		t.Errorf("AppendBatch allocates %v times (err %v), want 0", n, err)
	}
	if n := testing.AllocsPerRun(100, func() { out, err = DecodeBatch(c, out, buf) }); n > float64(len(rs)) || err != nil {
		t.Errorf("DecodeBatch allocates %v times for %d records (err %v), want one per string", n, len(rs), err)
	}
}
