package codec

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

// dictStream encodes batches with one DictEncoder and decodes them, in
// order, with one Decoder and DictDecoder, as a channel's two ends do.
type dictStream[T any] struct {
	c   Codec[T]
	e   DictEncoder
	d   *Decoder[T]
	dd  DictDecoder
	out []T
}

func newDictStream[T any](c Codec[T]) *dictStream[T] {
	return &dictStream[T]{c: c, d: NewDecoder(c)}
}

func (s *dictStream[T]) encode(t testing.TB, vs []T) []byte {
	t.Helper()
	b, err := AppendBatchDict(s.c, &s.e, nil, vs)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func (s *dictStream[T]) decode(t testing.TB, b []byte) []T {
	t.Helper()
	n, k := binary.Uvarint(b)
	if k <= 0 {
		t.Fatalf("batch count: %x", b)
	}
	var used int
	var err error
	s.out, used, err = s.d.AppendNDict(s.out[:0], b[k:], int(n), &s.dd)
	if err != nil {
		t.Fatal(err)
	}
	if k+used != len(b) {
		t.Fatalf("decoded %d of %d bytes", k+used, len(b))
	}
	return s.out
}

// sensorPool returns n sensor ids built once, as a source that keys its
// records from a fixed set shares them.
func sensorPool(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("sensor_%d", i)
	}
	return ids
}

// Batches of a struct of scalars round-trip through one stream whatever
// their strings: shared with earlier records, equal to earlier ones but
// of other memory, longer than the dictionary keeps, empty; and strings
// sent again take a number's bytes, not theirs.
func TestDictStreamRoundTrip(t *testing.T) {
	s := newDictStream(For[SensorReading]())
	pool := sensorPool(300)
	rng := rand.New(rand.NewPCG(1, 2))
	long := strings.Repeat("x", dictMaxLen+1)
	for batch := range 50 {
		vs := make([]SensorReading, 1+rng.IntN(600))
		for i := range vs {
			id := pool[rng.IntN(len(pool))]
			switch rng.IntN(10) {
			case 0:
				id = strings.Clone(id) // equal bytes, other memory
			case 1:
				id = long
			case 2:
				id = ""
			case 3:
				id = fmt.Sprintf("once-%d-%d", batch, i)
			}
			vs[i] = SensorReading{ID: id, Timestamp: int64(batch*1000 + i), Temperature: float64(i) / 8}
		}
		got := s.decode(t, s.encode(t, vs))
		if !slices.Equal(got, vs) {
			t.Fatalf("batch %d: decoded records differ", batch)
		}
	}
	if s.e.Len() != len(s.dd.strs) || s.e.Len() > dictEntries {
		t.Fatalf("encoder numbered %d strings, decoder %d (bound %d)", s.e.Len(), len(s.dd.strs), dictEntries)
	}

	// The pool's strings are numbered by now: a batch of them takes a
	// byte or two per string instead of its ten.
	vs := make([]SensorReading, 100)
	for i := range vs {
		vs[i] = SensorReading{ID: pool[i]}
	}
	plain, err := AppendBatch(For[SensorReading](), nil, vs)
	if err != nil {
		t.Fatal(err)
	}
	coded := s.encode(t, vs)
	if len(coded) > len(plain)-700 {
		t.Fatalf("dictionary-coded batch of %d bytes, plain %d", len(coded), len(plain))
	}
	if got := s.decode(t, coded); !slices.Equal(got, vs) {
		t.Fatal("decoded records differ")
	}
}

// In a dictionary-coded batch an int64 of a struct of scalars is its
// difference from the record before's: rising timestamps take a byte
// each, and differences that overflow (the extremes next to each other)
// wrap back to the values.
func TestDictStreamIntDifferences(t *testing.T) {
	type rec struct {
		A     int64
		Name  string
		B     int64
		Small int32
		C     time.Duration
	}
	s := newDictStream(For[rec]())
	extremes := []int64{math.MinInt64, math.MaxInt64, 0, -1, 1, math.MinInt64 + 1, math.MaxInt64 - 1}
	var vs []rec
	for i, a := range extremes {
		for j, b := range extremes {
			vs = append(vs, rec{A: a, Name: "n", B: b, Small: int32(i - j), C: time.Duration(b - a)})
		}
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for range 200 {
		vs = append(vs, rec{A: int64(rng.Uint64()), B: rng.Int64N(1000) - 500, C: time.Duration(rng.Int64())})
	}
	if got := s.decode(t, s.encode(t, vs)); !slices.Equal(got, vs) {
		t.Fatal("decoded records differ")
	}
	// Each batch starts from zero: its first record does not depend on
	// the batch before, which another decoder may have read.
	if got := s.decode(t, s.encode(t, vs[len(vs)-1:])); !slices.Equal(got, vs[len(vs)-1:]) {
		t.Fatal("decoded records differ in a batch of one")
	}

	r := newDictStream(For[SensorReading]())
	readings := make([]SensorReading, 1000)
	for i := range readings {
		readings[i] = SensorReading{ID: "s", Timestamp: 1_764_000_000_000 + int64(i/10), Temperature: 20}
	}
	coded := r.encode(t, readings)
	// The count, then per record: the numbered string, the difference
	// and the float64, 1 + 1 + 8 bytes (the first record's string and
	// timestamp take more).
	if max := 3 + len(readings)*10 + 8; len(coded) > max {
		t.Fatalf("1000 readings of rising timestamps took %d bytes, want at most %d", len(coded), max)
	}
	if got := r.decode(t, coded); !slices.Equal(got, readings) {
		t.Fatal("decoded readings differ")
	}
}

// Past dictEntries strings neither end numbers more: both send and read
// them inline, and the numbered ones still decode.
func TestDictStreamFull(t *testing.T) {
	s := newDictStream(String)
	var all []string
	for i := range dictEntries + 500 {
		all = append(all, fmt.Sprintf("k%d", i))
	}
	for chunk := range slices.Chunk(all, 512) {
		if got := s.decode(t, s.encode(t, chunk)); !slices.Equal(got, chunk) {
			t.Fatal("decoded strings differ")
		}
	}
	if s.e.Len() != dictEntries || len(s.dd.strs) != dictEntries {
		t.Fatalf("numbered %d and %d strings, want %d", s.e.Len(), len(s.dd.strs), dictEntries)
	}
	again := []string{all[0], all[dictEntries-1], all[dictEntries+1]}
	if got := s.decode(t, s.encode(t, again)); !slices.Equal(got, again) {
		t.Fatalf("decoded %q, want %q", got, again)
	}
}

// Once every number is given, strings that never repeat stop being
// looked up by content for a while (a round that mostly missed), and
// numbered strings in other memory are found again after it; every batch
// decodes to its strings throughout.
func TestDictFullSkipsLookUpsThatMiss(t *testing.T) {
	s := newDictStream(String)
	var numbered []string
	for i := range dictEntries {
		numbered = append(numbered, fmt.Sprintf("k%d", i))
	}
	send := func(strs []string) int {
		t.Helper()
		size := 0
		for chunk := range slices.Chunk(strs, 512) {
			b := s.encode(t, chunk)
			size += len(b)
			if got := s.decode(t, b); !slices.Equal(got, chunk) {
				t.Fatal("decoded strings differ")
			}
		}
		return size
	}
	send(numbered)
	var once []string
	for i := range dictProbe + 1 {
		once = append(once, fmt.Sprintf("once-%d", i))
	}
	send(once)
	if s.e.skip == 0 {
		t.Fatalf("after %d strings that were not numbered, look-ups still made", dictProbe+1)
	}
	// Copies of numbered strings: sent whole while look-ups are skipped,
	// as numbers again once a round finds them.
	clones := func(n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = strings.Clone(numbered[i%len(numbered)])
		}
		return out
	}
	send(clones(dictSkip + dictProbe + 1))
	if s.e.skip != 0 {
		t.Fatalf("look-ups still skipped after a round that found every string")
	}
	batch := clones(512)
	if size := send(batch); size > 3*len(batch) {
		t.Fatalf("%d numbered strings in other memory take %d bytes: not found by content", len(batch), size)
	}
}

// A batch encoded and not sent is taken back: the strings it numbered
// are numbered again by the next batch, which a receiver that never saw
// the first decodes.
func TestDictRollback(t *testing.T) {
	s := newDictStream(For[SensorReading]())
	pool := sensorPool(20)
	first := []SensorReading{{ID: pool[0]}, {ID: pool[1]}}
	s.decode(t, s.encode(t, first))

	mark := s.e.Len()
	dropped := []SensorReading{{ID: pool[1]}, {ID: pool[2]}, {ID: pool[3]}, {ID: pool[2]}}
	s.encode(t, dropped) // not sent
	if s.e.Len() != mark+2 {
		t.Fatalf("numbered %d strings, want %d", s.e.Len(), mark+2)
	}
	s.e.Rollback(mark)
	if s.e.Len() != mark {
		t.Fatalf("after Rollback numbered %d strings, want %d", s.e.Len(), mark)
	}
	for _, half := range [][]SensorReading{dropped[:2], dropped[2:]} {
		if got := s.decode(t, s.encode(t, half)); !slices.Equal(got, half) {
			t.Fatalf("decoded %v, want %v", got, half)
		}
	}
}

// Without Rollback the receiver is told of numbers it never saw: the
// decode fails with ErrCorrupt instead of returning other strings.
func TestDictNumberNotGivenIsCorrupt(t *testing.T) {
	s := newDictStream(For[SensorReading]())
	pool := sensorPool(3)
	s.encode(t, []SensorReading{{ID: pool[0]}}) // lost
	b := s.encode(t, []SensorReading{{ID: pool[0]}})
	n, k := binary.Uvarint(b)
	_, _, err := s.d.AppendNDict(nil, b[k:], int(n), &s.dd)
	if !errors.Is(err, ErrCorrupt) {
		t.Fatalf("decoding a number not given: %v, want ErrCorrupt", err)
	}
}

// A codec the dictionary does not apply to writes what AppendBatch writes.
func TestDictOtherCodecsUnchanged(t *testing.T) {
	type nested struct {
		Tags []string
	}
	vs := []nested{{Tags: []string{"a", "b"}}, {Tags: []string{"a"}}}
	var e DictEncoder
	got, err := AppendBatchDict(For[nested](), &e, nil, vs)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := AppendBatch(For[nested](), nil, vs)
	if !slices.Equal(got, want) || e.Len() != 0 {
		t.Fatalf("AppendBatchDict wrote %x (%d numbered), AppendBatch %x", got, e.Len(), want)
	}
	s := newDictStream(For[nested]())
	if out := s.decode(t, got); len(out) != 2 || !slices.Equal(out[0].Tags, vs[0].Tags) {
		t.Fatalf("decoded %v", out)
	}
}

// FuzzDictStream encodes batches drawn from the input with one encoder,
// some of them taken back, and wants every batch sent to decode, in
// order, to its records.
func FuzzDictStream(f *testing.F) {
	f.Add([]byte("\x05\x01\x02\x03\x04\x05\x06"), uint64(1))
	f.Add([]byte("\xff\xfe\x00\x10\x20\x30\x40\x50\x60\x70"), uint64(7))
	f.Fuzz(func(t *testing.T, in []byte, seed uint64) {
		s := newDictStream(For[SensorReading]())
		pool := sensorPool(64)
		rng := rand.New(rand.NewPCG(seed, uint64(len(in))))
		for len(in) > 0 {
			n := int(in[0]%32) + 1
			in = in[1:]
			vs := make([]SensorReading, 0, n)
			for i := 0; i < n && len(in) > 0; i++ {
				b := in[0]
				in = in[1:]
				id := pool[int(b)%len(pool)]
				switch b >> 6 {
				case 1:
					id = strings.Clone(id)
				case 2:
					id = strings.Repeat(string(rune('a'+b%26)), int(b%40))
				}
				ts := int64(b)
				if b&1 == 1 {
					ts *= -0x0102030405060708 // far apart, both signs: differences wrap
				}
				vs = append(vs, SensorReading{ID: id, Timestamp: ts, Temperature: float64(b)})
			}
			if rng.IntN(4) == 0 {
				mark := s.e.Len()
				s.encode(t, vs)
				s.e.Rollback(mark)
			}
			if got := s.decode(t, s.encode(t, vs)); !slices.Equal(got, vs) {
				t.Fatalf("decoded %v, want %v", got, vs)
			}
		}
	})
}

// FuzzDecodeDict decodes any bytes as a dictionary-coded batch with a
// numbering of a few strings: an error wrapping ErrCorrupt or ErrShort,
// never a panic.
func FuzzDecodeDict(f *testing.F) {
	f.Add([]byte("\x02\x03\x04abcd"))
	f.Add([]byte("\x01\x09"))
	f.Fuzz(func(t *testing.T, in []byte) {
		for _, n := range []int{1, 2, 7} {
			dd := DictDecoder{strs: []string{"a", "b", "c"}}
			_, _, err := NewDecoder(For[SensorReading]()).AppendNDict(nil, in, n, &dd)
			if err != nil && !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrShort) {
				t.Fatalf("error %v wraps neither ErrCorrupt nor ErrShort", err)
			}
			dd = DictDecoder{strs: []string{"a"}}
			_, _, err = NewDecoder(String).AppendNDict(nil, in, n, &dd)
			if err != nil && !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrShort) {
				t.Fatalf("string: error %v wraps neither ErrCorrupt nor ErrShort", err)
			}
		}
	})
}

// A tag of two bytes reads as the uvarint it is: the number of a string
// past 63, or a string of 64 bytes and more; a two-byte tag padded with a
// zero byte is refused, as every non-minimal varint is.
func TestDictTwoByteTags(t *testing.T) {
	c := For[string]()
	long := strings.Repeat("x", 70) // a tag of 140: two bytes
	var e DictEncoder
	var vs []string
	for i := range 100 {
		vs = append(vs, fmt.Sprintf("s%d", i))
	}
	vs = append(vs, long)
	first, err := AppendBatchDict(c, &e, nil, vs)
	if err != nil {
		t.Fatal(err)
	}
	again, err := AppendBatchDict(c, &e, nil, vs[:100]) // numbers 0..99: tags up to 199
	if err != nil {
		t.Fatal(err)
	}
	d, dd := NewDecoder(c), new(DictDecoder)
	for _, b := range [][]byte{first, again} {
		n, k := binary.Uvarint(b)
		got, _, err := d.AppendNDict(nil, b[k:], int(n), dd)
		if err != nil || !slices.Equal(got, vs[:n]) {
			t.Fatalf("decoded %d strings, %v; want %d", len(got), err, n)
		}
	}
	// Number 70 (tag 141) as 0x8d 0x01, and padded as 0x8d 0x81 0x00.
	if got, _, err := d.AppendNDict(nil, []byte{0x8d, 0x01}, 1, dd); err != nil || got[0] != vs[70] {
		t.Fatalf("tag 0x8d 0x01: %q, %v; want %q", got, err, vs[70])
	}
	for _, b := range [][]byte{{0x8d, 0x81, 0x00}, {0xf0, 0x00}} {
		if _, _, err := d.AppendNDict(nil, b, 1, dd); err == nil {
			t.Fatalf("padded tag % x decoded", b)
		}
	}
}

// paddedReading has padding after Flag, skippedReading a field the codec
// skips: decoding their fields does not write every byte of a value.
type paddedReading struct {
	Flag bool
	ID   string
	N    int64
}

type skippedReading struct {
	ID    string
	Cache int64 `codec:"-"`
	N     int64
}

// A batch decoded into a slice whose spare room holds earlier values
// leaves nothing of them behind: a struct whose fields are all its bytes
// is overwritten field by field, any other zeroed first, so a field the
// codec skips decodes to zero.
func TestDictFlatOverwritesEarlierValues(t *testing.T) {
	if !For[SensorReading]().(compiled[SensorReading]).pl.flatWhole {
		t.Fatal("SensorReading: its fields are not all its bytes")
	}
	if For[paddedReading]().(compiled[paddedReading]).pl.flatWhole {
		t.Fatal("paddedReading: its padding counted as a field's")
	}
	if For[skippedReading]().(compiled[skippedReading]).pl.flatWhole {
		t.Fatal("skippedReading: its skipped field counted as encoded")
	}

	s := newDictStream(For[skippedReading]())
	s.out = slices.Repeat([]skippedReading{{ID: "stale", Cache: 99, N: 7}}, 4)[:0]
	vs := []skippedReading{{ID: "a", Cache: 1, N: 5}, {ID: "a", Cache: 2, N: 3}, {ID: "b", N: -9}}
	want := []skippedReading{{ID: "a", N: 5}, {ID: "a", N: 3}, {ID: "b", N: -9}}
	if got := s.decode(t, s.encode(t, vs)); !slices.Equal(got, want) {
		t.Fatalf("decoded %v, want %v", got, want)
	}

	p := newDictStream(For[paddedReading]())
	pvs := []paddedReading{{Flag: true, ID: "x", N: 1}, {ID: "x", N: 2}}
	p.out = slices.Repeat([]paddedReading{{Flag: true, ID: "stale", N: 9}}, 2)[:0]
	if got := p.decode(t, p.encode(t, pvs)); !slices.Equal(got, pvs) {
		t.Fatalf("decoded %v, want %v", got, pvs)
	}
}

// A batch that fails part way returns the slice it was given, at its
// length, the values decoded before the failure cleared from its spare
// room, and an error that names the failing value.
func TestDictFlatFailureMidBatch(t *testing.T) {
	for _, tc := range []struct {
		name string
		cut  func(b []byte) []byte
		want error
	}{
		{"truncated", func(b []byte) []byte { return b[:len(b)-3] }, ErrShort},
		{"number not given", func(b []byte) []byte {
			// The third value's number, its first byte, made odd and
			// past the numbering.
			b = slices.Clone(b)
			b[len(b)-10] = 0x7f
			return b
		}, ErrCorrupt},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newDictStream(For[SensorReading]())
			pool := sensorPool(2)
			s.decode(t, s.encode(t, []SensorReading{{ID: pool[0]}, {ID: pool[1]}}))
			b := s.encode(t, []SensorReading{{ID: pool[0], Timestamp: 5}, {ID: pool[1], Timestamp: 6}, {ID: pool[0], Timestamp: 7}})
			n, k := binary.Uvarint(b)
			dst := make([]SensorReading, 1, 8)
			dst[0] = SensorReading{ID: "kept"}
			got, used, err := s.d.AppendNDict(dst, tc.cut(b)[k:], int(n), &s.dd)
			if !errors.Is(err, tc.want) || !strings.HasPrefix(err.Error(), "value 2: ") {
				t.Fatalf("error %v, want value 2 and %v", err, tc.want)
			}
			if used != 0 || len(got) != 1 || got[0].ID != "kept" {
				t.Fatalf("returned %v and %d bytes, want the slice given", got, used)
			}
			if spare := got[1:4]; !slices.Equal(spare, make([]SensorReading, 3)) {
				t.Fatalf("spare room holds %v after a failure", spare)
			}
		})
	}
}
