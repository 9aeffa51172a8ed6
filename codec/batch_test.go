package codec

import (
	"errors"
	"fmt"
	"reflect"
	"testing"
)

func TestBatchRoundTrip(t *testing.T) {
	c := For[SensorReading]()
	for _, n := range []int{0, 1, 3, 300} {
		in := make([]SensorReading, n)
		for i := range in {
			in[i] = SensorReading{ID: fmt.Sprint("s", i), Timestamp: int64(i) - 5, Temperature: float64(i) / 4}
		}
		b, err := AppendBatch(c, []byte("x"), in)
		if err != nil {
			t.Fatal(err)
		}
		got, err := DecodeBatch(c, make([]SensorReading, 7), b[1:])
		if err != nil {
			t.Fatalf("n=%d: %v", n, err)
		}
		if len(got) != n || (n > 0 && !reflect.DeepEqual(got, in)) {
			t.Fatalf("n=%d: got %d values, want %v", n, len(got), in)
		}
		checkBatchTruncations(t, c, b[1:])
	}
	strs, err := AppendBatch(String, nil, []string{"a", "", "c"})
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeBatch(String, nil, strs)
	if err != nil || !reflect.DeepEqual(got, []string{"a", "", "c"}) {
		t.Fatalf("string batch: %q, %v", got, err)
	}
}

// checkBatchTruncations wants every strict prefix of a batch to fail.
func checkBatchTruncations[T any](t *testing.T, c Codec[T], b []byte) {
	t.Helper()
	for i := range len(b) {
		if _, err := DecodeBatch(c, nil, b[:i]); !errors.Is(err, ErrShort) {
			t.Fatalf("batch cut to %d of %d bytes: err = %v, want ErrShort", i, len(b), err)
		}
	}
}

func TestBatchRejectsBadInput(t *testing.T) {
	c := For[SensorReading]()
	huge := []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0}
	if got, err := DecodeBatch(c, nil, huge); !errors.Is(err, ErrShort) || cap(got) > 0 {
		t.Errorf("huge count: cap %d, err = %v; want no allocation and ErrShort", cap(got), err)
	}
	b, _ := AppendBatch(c, nil, []SensorReading{{ID: "a"}})
	if _, err := DecodeBatch(c, nil, append(b, 0)); !errors.Is(err, ErrCorrupt) {
		t.Errorf("trailing byte: err = %v, want ErrCorrupt", err)
	}
	if _, err := AppendBatch(For[struct{}](), nil, make([]struct{}, 2)); !errors.Is(err, ErrUnsupported) {
		t.Errorf("zero-width values: err = %v, want ErrUnsupported", err)
	}
	out, err := AppendBatch(For[map[float64]int](), []byte("keep"), []map[float64]int{nil, {1: 1}, {nan(): 1, nan(): 2}})
	if !errors.Is(err, ErrUnsupported) || string(out) != "keep" {
		t.Errorf("failing value: out %q, err = %v; want dst unchanged and ErrUnsupported", out, err)
	}
}
