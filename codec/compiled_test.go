package codec

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"strings"
	"testing"
	"time"
	"unsafe"
)

func TestCompiledSensorReading(t *testing.T) {
	c := For[SensorReading]()
	for _, r := range []SensorReading{
		{},
		{ID: "sensor-1", Timestamp: 1_700_000_000_000, Temperature: 21.5},
		{ID: strings.Repeat("x", 1000), Timestamp: math.MinInt64, Temperature: math.Inf(-1)},
	} {
		checkTruncations(t, c, roundTrip(t, c, r))
	}
	b, err := c.Append(nil, SensorReading{ID: "a", Timestamp: -2, Temperature: 1})
	want := []byte{1, 'a', 3, 0, 0, 0, 0, 0, 0, 0xf0, 0x3f}
	if err != nil || !bytes.Equal(b, want) {
		t.Fatalf("encoding = %x, %v; want %x", b, err, want)
	}
}

func TestCompiledNested(t *testing.T) {
	c := For[device]()
	rich := richDevice()
	checkTruncations(t, c, roundTrip(t, c, rich))
	roundTrip(t, c, device{}) // every pointer, slice and map nil

	got, _, err := c.Decode(mustAppend(t, c, rich))
	if err != nil {
		t.Fatal(err)
	}
	if got.Parent == rich.Parent || got.Calib == rich.Calib {
		t.Error("decoded pointers share memory with the encoded value")
	}
	if got.Tags == nil || got.Parent.Tags == nil || len(got.Parent.Tags) != 0 || got.Parent.Attrs == nil {
		t.Error("empty slices and maps must decode non-nil")
	}
	if got.Parent.Readings != nil || got.Parent.Parent != nil {
		t.Error("nil slices and pointers must decode nil")
	}
}

func TestCompiledSkipsTaggedFields(t *testing.T) {
	c := For[device]()
	v := device{Skipped: 5, cache: 6}
	got, _, err := c.Decode(mustAppend(t, c, v))
	if err != nil || got.Skipped != 0 || got.cache != 0 {
		t.Fatalf("skipped fields came back: %+v, %v", got, err)
	}
}

func TestCompiledTopLevelKinds(t *testing.T) {
	type celsius float64
	type id string
	roundTrip(t, For[celsius](), -40)
	roundTrip(t, For[id](), "k")
	roundTrip(t, For[*SensorReading](), nil)
	roundTrip(t, For[*SensorReading](), &SensorReading{ID: "p"})
	roundTrip(t, For[[]SensorReading](), []SensorReading{{ID: "a"}, {ID: "b"}})
	roundTrip(t, For[map[string][]int](), map[string][]int{"a": {1}, "b": nil})
	roundTrip(t, For[[3]string](), [3]string{"x", "", "z"})
	roundTrip(t, For[time.Time](), time.Time{})
	roundTrip(t, For[time.Time](), time.Unix(0, -1).UTC())
	roundTrip(t, For[netip.Addr](), netip.MustParseAddr("10.0.0.1"))
	roundTrip(t, For[netip.Addr](), netip.Addr{})
	roundTrip(t, For[struct{}](), struct{}{})
}

func TestCompiledTime(t *testing.T) {
	c := For[time.Time]()
	local := time.Date(2024, 2, 29, 12, 0, 0, 5, time.FixedZone("X", 3600))
	got, _, err := c.Decode(mustAppend(t, c, local))
	if err != nil || !got.Equal(local) || got.Location() != time.UTC {
		t.Fatalf("got %v (%v), %v; want %v in UTC", got, got.Location(), err, local)
	}
	for _, bad := range []time.Time{time.Date(1600, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2300, 1, 1, 0, 0, 0, 0, time.UTC)} {
		if _, err := c.Append(nil, bad); !errors.Is(err, ErrUnsupported) {
			t.Errorf("Append(%v) err = %v, want ErrUnsupported", bad, err)
		}
	}
}

// ptrMarshaler has its methods on the pointer only, so Binary and the
// compiled codec must copy it before calling them.
type ptrMarshaler struct{ N int }

func (m *ptrMarshaler) MarshalBinary() ([]byte, error) { return []byte{byte(m.N)}, nil }

func (m *ptrMarshaler) UnmarshalBinary(b []byte) error {
	if len(b) != 1 {
		return errors.New("want one byte")
	}
	m.N = int(b[0])
	return nil
}

func TestCompiledMarshalers(t *testing.T) {
	type wrap struct {
		P ptrMarshaler
		A netip.Addr
	}
	c := For[wrap]()
	enc := roundTrip(t, c, wrap{P: ptrMarshaler{N: 7}, A: netip.MustParseAddr("::1")})
	checkTruncations(t, c, enc)
	if enc[0] != 1 || enc[1] != 7 {
		t.Fatalf("marshaler field not length-prefixed: %x", enc)
	}
	if _, _, err := c.Decode([]byte{2, 7, 7, 0}); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("UnmarshalBinary failure: err = %v, want ErrCorrupt", err)
	}
	// Long payloads move to make room for a longer length prefix.
	type long struct{ A []netip.Addr }
	addrs := make([]netip.Addr, 40)
	for i := range addrs {
		addrs[i] = netip.AddrFrom16([16]byte{15: byte(i)})
	}
	roundTrip(t, For[long](), long{A: addrs})
}

func TestCompiledMapsAreDeterministic(t *testing.T) {
	c := For[map[string]int]()
	a, b := map[string]int{}, map[string]int{}
	for i := range 200 {
		a[string(rune('a'+i%26))+strings.Repeat("!", i)] = i
	}
	for k, v := range a { // a different insertion order, if the runtime allows it
		b[k] = v
	}
	first := mustAppend(t, c, a)
	for range 20 {
		if !bytes.Equal(mustAppend(t, c, a), first) || !bytes.Equal(mustAppend(t, c, b), first) {
			t.Fatal("equal maps encoded differently")
		}
	}
	roundTrip(t, c, a)
}

func TestCompiledMapRejectsDisorder(t *testing.T) {
	c := For[map[string]bool]()
	enc := mustAppend(t, c, map[string]bool{"a": true, "b": false})
	// enc is 3 (two entries), 1 'a' 1, 1 'b' 0: swap the entries.
	swapped := []byte{enc[0], 1, 'b', 0, 1, 'a', 1}
	if _, _, err := c.Decode(swapped); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("unsorted keys: err = %v, want ErrCorrupt", err)
	}
	dup := []byte{enc[0], 1, 'a', 0, 1, 'a', 1}
	if _, _, err := c.Decode(dup); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("repeated key: err = %v, want ErrCorrupt", err)
	}
	// +0 and -0 encode differently but are one key.
	fc := For[map[float64]int]()
	zeros := []byte{3}
	zeros = append(appendFloat64(zeros, 0), 2)
	zeros = append(appendFloat64(zeros, math.Copysign(0, -1)), 4)
	if _, _, err := fc.Decode(zeros); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("+0 and -0 keys: err = %v, want ErrCorrupt", err)
	}
	nan := map[float64]int{math.NaN(): 1, math.NaN(): 2}
	if _, err := fc.Append(nil, nan); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("two NaN keys: err = %v, want ErrUnsupported", err)
	}
}

// node is a recursive type.
type node struct {
	V    int
	Next *node
	Kids []node
}

func TestCompiledRecursive(t *testing.T) {
	c := For[node]()
	roundTrip(t, c, node{V: 1, Next: &node{V: 2, Next: &node{V: 3}}, Kids: []node{{V: 4}, {Kids: []node{{V: 5}}}}})

	cyclic := &node{V: 1}
	cyclic.Next = cyclic
	if _, err := c.Append(nil, *cyclic); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("cyclic value: err = %v, want ErrUnsupported", err)
	}
	// A chain deeper than maxDepth, as corrupt input could claim.
	deep := bytes.Repeat([]byte{0, 1}, maxDepth+10) // V=0, Next present, ...
	if _, _, err := c.Decode(deep); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("deep input: err = %v, want ErrCorrupt", err)
	}
}

// TestCompiledDeepChain round-trips a value nested just under maxDepth, so
// the goroutine stack grows, and moves, while the codec holds pointers into
// it; run it with -race (which adds checkptr) and GOGC=1 to shake out
// pointer bugs.
func TestCompiledDeepChain(t *testing.T) {
	type link struct {
		Name string
		Next *link
		Kids map[string][]int
	}
	var head *link
	for i := range maxDepth - 1 {
		head = &link{Name: fmt.Sprint(i), Next: head, Kids: map[string][]int{"k": {i}}}
	}
	enc := roundTrip(t, For[link](), *head)
	for _, cut := range []int{1, len(enc) / 2, len(enc) - 1} {
		if _, _, err := For[link]().Decode(enc[:cut]); !errors.Is(err, ErrShort) {
			t.Fatalf("cut to %d of %d bytes: err = %v, want ErrShort", cut, len(enc), err)
		}
	}
	if _, err := For[link]().Append(nil, link{Next: head}); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("one level too deep: err = %v, want ErrUnsupported", err)
	}
}

func TestCompiledRejectsBadInput(t *testing.T) {
	type withPtr struct{ P *int }
	if _, _, err := For[withPtr]().Decode([]byte{2, 0}); !errors.Is(err, ErrCorrupt) {
		t.Errorf("pointer tag 2: err = %v, want ErrCorrupt", err)
	}
	if _, _, err := For[[]int]().Decode([]byte{0xff, 0xff, 0xff, 0xff, 0x0f, 1}); !errors.Is(err, ErrShort) {
		t.Errorf("huge slice count: err = %v, want ErrShort", err)
	}
	if _, _, err := For[map[int]int]().Decode([]byte{0xff, 0xff, 0xff, 0xff, 0x0f, 1}); !errors.Is(err, ErrShort) {
		t.Errorf("huge map count: err = %v, want ErrShort", err)
	}
	if _, _, err := For[time.Time]().Decode(binaryAppendVarint(math.MinInt64 + 1)); !errors.Is(err, ErrCorrupt) {
		t.Errorf("time out of range: err = %v, want ErrCorrupt", err)
	}
	if _, _, err := For[SensorReading]().Decode([]byte{0, 0x80, 0x00}); !errors.Is(err, ErrCorrupt) {
		t.Errorf("padded varint field: err = %v, want ErrCorrupt", err)
	}
}

func binaryAppendVarint(v int64) []byte {
	b, _ := Int64.Append(nil, v)
	return b
}

func TestCompileUnsupported(t *testing.T) {
	type unexported struct {
		A int
		b int
	}
	type deep struct{ X []map[string]func() }
	type zeroWidth struct {
		S []struct {
			skip int `codec:"-"`
		}
	}
	checks := []struct {
		name string
		err  func() error
	}{
		{"chan", func() error { _, err := Compile[chan int](); return err }},
		{"func", func() error { _, err := Compile[func()](); return err }},
		{"interface", func() error { _, err := Compile[struct{ V any }](); return err }},
		{"unsafe.Pointer", func() error { _, err := Compile[unsafe.Pointer](); return err }},
		{"unexported field", func() error { _, err := Compile[unexported](); return err }},
		{"nested func", func() error { _, err := Compile[deep](); return err }},
		{"zero-width elements", func() error { _, err := Compile[zeroWidth](); return err }},
	}
	for _, tc := range checks {
		if err := tc.err(); !errors.Is(err, ErrUnsupported) {
			t.Errorf("%s: err = %v, want ErrUnsupported", tc.name, err)
		}
	}
	_, err := Compile[unexported]()
	if !strings.Contains(err.Error(), "field b") {
		t.Errorf("error does not name the field: %v", err)
	}
	defer func() {
		msg, _ := recover().(string)
		if !strings.Contains(msg, "codec.For[") || !strings.Contains(msg, "unexported") {
			t.Errorf("For panic = %q, want it to name the type and the reason", msg)
		}
	}()
	For[unexported]()
	t.Error("For did not panic")
}

func mustAppend[T any](t *testing.T, c Codec[T], v T) []byte {
	t.Helper()
	b, err := c.Append(nil, v)
	if err != nil {
		t.Fatalf("Append: %v", err)
	}
	return b
}
