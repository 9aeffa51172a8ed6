package actors

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/edgedio/edged/codec"
	"github.com/edgedio/edged/operators"
)

type wireReading struct {
	ID    string
	Value float64
}

func wireBatchOf(t *testing.T, c codec.Codec[wireReading], e *codec.DictEncoder, from, n int) ([]byte, []int64, []wireReading) {
	t.Helper()
	var ts []int64
	var items []wireReading
	for i := from; i < from+n; i++ {
		ts = append(ts, 1_700_000_000_000+int64(i*7))
		items = append(items, wireReading{ID: fmt.Sprintf("sensor-%d", i), Value: float64(i) / 4})
	}
	b, err := encodeWire(c, e, nil, ts, items)
	if err != nil {
		t.Fatal(err)
	}
	return b, ts, items
}

// A frame that crossed nodes may carry several wire batches one after the
// other (batches that joined one waiting for credit): they decode to every
// record, in order, with its timestamp.
func TestDecodeWireConcatenated(t *testing.T) {
	c := codec.For[wireReading]()
	e := new(codec.DictEncoder)
	var body []byte
	var wantTS []int64
	var want []wireReading
	for i, n := range []int{3, 1, 5, 3} {
		// The last batch repeats the first one's strings: numbers.
		b, ts, items := wireBatchOf(t, c, e, 10*(i%3), n)
		body = append(body, b...)
		wantTS = append(wantTS, ts...)
		want = append(want, items...)
	}
	ts, items, err := decodeWire(codec.NewDecoder(c), new(codec.DictDecoder), nil, nil, body)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ts, wantTS) || !slices.Equal(items, want) {
		t.Fatalf("decoded %v %v, want %v %v", ts, items, wantTS, want)
	}
	// One batch alone decodes as before, into reused slices.
	one, wantTS1, want1 := wireBatchOf(t, c, new(codec.DictEncoder), 0, 4)
	ts, items, err = decodeWire(codec.NewDecoder(c), new(codec.DictDecoder), ts, items, one)
	if err != nil || !slices.Equal(ts, wantTS1) || !slices.Equal(items, want1) {
		t.Fatalf("decoded %v %v %v, want %v %v", ts, items, err, wantTS1, want1)
	}
}

// Every cut of a concatenation decodes only at a batch boundary; anywhere
// else it is an error wrapping errWire, never a panic or a partial result.
func TestDecodeWireTruncated(t *testing.T) {
	c := codec.For[wireReading]()
	e := new(codec.DictEncoder)
	a, _, _ := wireBatchOf(t, c, e, 0, 3)
	b, _, _ := wireBatchOf(t, c, e, 1, 2)
	body := append(slices.Clip(a), b...)
	for cut := range len(body) {
		ts, items, err := decodeWire(codec.NewDecoder(c), new(codec.DictDecoder), nil, nil, body[:cut])
		switch {
		case cut == len(a):
			if err != nil || len(items) != 3 || len(ts) != 3 {
				t.Fatalf("cut at the boundary %d: %d records, %v", cut, len(items), err)
			}
		case err == nil:
			t.Fatalf("cut at %d of %d decoded %d records", cut, len(body), len(items))
		case !errors.Is(err, errWire):
			t.Fatalf("cut at %d: %v, want errWire", cut, err)
		case len(ts) != 0 || len(items) != 0:
			t.Fatalf("cut at %d: partial result %d/%d", cut, len(ts), len(items))
		}
	}
}

// Decoding a wire batch whose strings the channel carried before
// allocates nothing: they come as numbers of strings the receiving end
// holds, and the records and timestamps go into the reused slices. A
// string sent again is a number, not its bytes.
func TestDecodeWireReusesStrings(t *testing.T) {
	c := codec.For[wireReading]()
	var wantTS []int64
	var want []wireReading
	for i := range 512 {
		wantTS = append(wantTS, int64(i))
		want = append(want, wireReading{ID: fmt.Sprintf("sensor-%d", i%100), Value: float64(i)})
	}
	e := new(codec.DictEncoder)
	first, err := encodeWire(c, e, nil, wantTS, want)
	if err != nil {
		t.Fatal(err)
	}
	body, err := encodeWire(c, e, nil, wantTS, want)
	if err != nil {
		t.Fatal(err)
	}
	if len(body) >= len(first) {
		t.Fatalf("the batch sent again takes %d bytes, the first %d: its strings were not numbered", len(body), len(first))
	}
	d, dd := codec.NewDecoder(c), new(codec.DictDecoder)
	ts, items, err := decodeWire(d, dd, nil, nil, first)
	if err != nil || !slices.Equal(items, want) {
		t.Fatalf("first batch: %v", err)
	}
	// body only refers to the strings numbered by first, so decoding it
	// again and again gives the same records.
	if n := testing.AllocsPerRun(50, func() { ts, items, err = decodeWire(d, dd, ts, items, body) }); n > 0 || err != nil {
		t.Errorf("decodeWire allocates %v times per batch of %d records (err %v), want 0", n, len(want), err)
	}
	if !slices.Equal(ts, wantTS) || !slices.Equal(items, want) {
		t.Fatal("decoded records differ")
	}
}

// A batch whose records share one timestamp (records without one, or of
// one instant) writes it once, not a byte per record; batches of either
// kind decode to the timestamps encoded, alone and one after the other.
func TestWireSharedTimestamp(t *testing.T) {
	c := codec.For[wireReading]()
	items := make([]wireReading, 1000)
	for i := range items {
		items[i] = wireReading{ID: "s", Value: float64(i)}
	}
	same := func(v int64, n int) []int64 {
		ts := make([]int64, n)
		for i := range ts {
			ts[i] = v
		}
		return ts
	}
	last := same(7, 1000)
	last[999] = 8
	cases := []struct {
		name string
		ts   []int64
		head int // bytes of the head at most: count, timestamps, count
	}{
		{"no timestamp", same(operators.NoTimestamp, 1000), 2 + 10 + 2},
		{"one instant", same(1_700_000_000_000, 1000), 2 + 7 + 2},
		{"one record", same(5, 1), 1 + 1 + 1},
		{"all but the last", last, 2 + 1000 + 2},
	}
	var body []byte
	var wantTS []int64
	var want []wireReading
	e := new(codec.DictEncoder)
	for _, tc := range cases {
		n := len(tc.ts)
		b, err := encodeWire(c, e, nil, tc.ts, items[:n])
		if err != nil {
			t.Fatal(err)
		}
		ts, m, rest, err := DecodeWireHead(nil, b)
		if err != nil || m != n || !slices.Equal(ts, tc.ts) {
			t.Fatalf("%s: head decoded %d records, %v (timestamps equal: %t)", tc.name, m, err, slices.Equal(ts, tc.ts))
		}
		if h := len(b) - len(rest); h > tc.head {
			t.Errorf("%s: head of %d bytes, want at most %d", tc.name, h, tc.head)
		}
		body = append(body, b...)
		wantTS = append(wantTS, tc.ts...)
		want = append(want, items[:n]...)
	}
	ts, got, err := decodeWire(codec.NewDecoder(c), new(codec.DictDecoder), nil, nil, body)
	if err != nil || !slices.Equal(ts, wantTS) || !slices.Equal(got, want) {
		t.Fatalf("concatenated batches: %d records, %v; timestamps equal: %t", len(got), err, slices.Equal(ts, wantTS))
	}
	// A shared timestamp with a count the bytes cannot hold is refused,
	// before anything is grown for it.
	bad := binary.AppendUvarint(nil, 1<<40|1)
	bad = binary.AppendVarint(bad, 5)
	if _, _, _, err := DecodeWireHead(nil, bad); err == nil {
		t.Fatal("a shared-timestamp head claiming 2^39 records decoded")
	}
}
