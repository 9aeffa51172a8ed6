package codec

import (
	"encoding/binary"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
)

// binReading is SensorReading with a hand-written binary encoding, the
// "binary" contender of the benchmarks.
type binReading SensorReading

// AppendBinary appends the ID, Timestamp and Temperature of r.
func (r binReading) AppendBinary(b []byte) ([]byte, error) {
	b = binary.AppendUvarint(b, uint64(len(r.ID)))
	b = append(b, r.ID...)
	b = binary.AppendVarint(b, r.Timestamp)
	return binary.LittleEndian.AppendUint64(b, math.Float64bits(r.Temperature)), nil
}

// UnmarshalBinary decodes what AppendBinary wrote.
func (r *binReading) UnmarshalBinary(b []byte) error {
	l, n := binary.Uvarint(b)
	if n <= 0 || l > uint64(len(b)-n) {
		return errors.New("bad id")
	}
	id := string(b[n : n+int(l)])
	b = b[n+int(l):]
	ts, n := binary.Varint(b)
	if n <= 0 || len(b)-n != 8 {
		return errors.New("bad timestamp or temperature")
	}
	*r = binReading{ID: id, Timestamp: ts, Temperature: math.Float64frombits(binary.LittleEndian.Uint64(b[n:]))}
	return nil
}

func TestExternalRoundTrip(t *testing.T) {
	r := SensorReading{ID: "sensor-1", Timestamp: 1_700_000_000_000, Temperature: -3.5}
	checkTruncations(t, CBOR[SensorReading](), roundTrip(t, CBOR[SensorReading](), r))
	checkTruncations(t, Gob[SensorReading](), roundTrip(t, Gob[SensorReading](), r))
	checkTruncations(t, JSON[SensorReading](), roundTrip(t, JSON[SensorReading](), r))
	checkTruncations(t, Binary[binReading](), roundTrip(t, Binary[binReading](), binReading(r)))
	roundTrip(t, Binary[ptrMarshaler](), ptrMarshaler{N: 200})

	long := binReading{ID: strings.Repeat("long", 100)}
	roundTrip(t, Binary[binReading](), long)
	// For picks the type's own methods, with the same bytes as Binary.
	viaFor := roundTrip(t, For[binReading](), long)
	viaBinary := mustAppend(t, Binary[binReading](), long)
	if !reflect.DeepEqual(viaFor, viaBinary) {
		t.Fatalf("For and Binary encode differently:\n%x\n%x", viaFor, viaBinary)
	}
}

func TestExternalRejectsGarbage(t *testing.T) {
	garbage := []byte{4, 0xff, 0xfe, 0xfd, 0xfc}
	for name, err := range map[string]error{
		"cbor":   decErr(CBOR[SensorReading]())(garbage),
		"gob":    decErr(Gob[SensorReading]())(garbage),
		"json":   decErr(JSON[SensorReading]())(garbage),
		"binary": decErr(Binary[binReading]())(garbage),
	} {
		if !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: err = %v, want ErrCorrupt", name, err)
		}
	}
}

func TestBinaryPanicsWithoutEncoder(t *testing.T) {
	defer func() {
		if msg, _ := recover().(string); !strings.Contains(msg, "codec.Binary[") {
			t.Errorf("panic = %q, want a message naming codec.Binary", msg)
		}
	}()
	Binary[onlyUnmarshaler]()
	t.Error("Binary did not panic")
}

// onlyUnmarshaler can be decoded but not encoded.
type onlyUnmarshaler struct{}

func (*onlyUnmarshaler) UnmarshalBinary([]byte) error { return nil }

func nan() float64 { return math.NaN() }
