package cluster

import (
	"errors"
	"strings"
	"testing"

	"github.com/edgedio/edged/codec"
)

// Batches are capped in bytes as well as in records: records of any size
// end up in batches under the cap, in order, none lost.
func TestBatchEncoderCaps(t *testing.T) {
	c := codec.For[string]()
	const maxRecords, maxBytes = 100, 1000
	e := NewBatchEncoder(c, maxRecords, maxBytes)
	var bodies [][]byte
	var want []string
	add := func(ts int64, v string) {
		t.Helper()
		want = append(want, v)
		for {
			ok, err := e.Add(ts, v)
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				return
			}
			bodies = append(bodies, e.Flush(nil))
		}
	}
	for i := range 500 {
		add(int64(i*10-300), strings.Repeat("x", i%97))
	}
	bodies = append(bodies, e.Flush(nil))
	var got []string
	var ts []int64
	byBytes := false
	for _, b := range bodies {
		if len(b) > maxBytes {
			t.Fatalf("batch of %d bytes exceeds the cap %d", len(b), maxBytes)
		}
		var items []string
		var err error
		ts, items, err = DecodeBatch(c, ts, nil, b)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) > maxBytes-100 {
			byBytes = true
		}
		for i, v := range items {
			if wantTS := int64(len(got)*10 - 300); ts[i] != wantTS {
				t.Fatalf("record %d: timestamp %d, want %d", len(got), ts[i], wantTS)
			}
			got = append(got, v)
		}
	}
	if len(got) != len(want) {
		t.Fatalf("decoded %d records, want %d", len(got), len(want))
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("record %d: %q, want %q", i, got[i], want[i])
		}
	}
	if !byBytes {
		t.Error("no batch was cut by the byte cap")
	}
	// Small records: the record cap cuts.
	e2 := NewBatchEncoder(c, maxRecords, maxBytes)
	n := 0
	for {
		ok, err := e2.Add(0, "")
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		n++
	}
	if n != maxRecords || !e2.Full() {
		t.Errorf("record cap: %d records, full=%t; want %d, true", n, e2.Full(), maxRecords)
	}
	if e.Len() != 0 || e.Size() != 2 {
		t.Errorf("after Flush: Len %d Size %d, want 0 and 2", e.Len(), e.Size())
	}
}

func TestBatchEncoderRecordTooLarge(t *testing.T) {
	e := NewBatchEncoder(codec.For[string](), 10, 50)
	if _, err := e.Add(0, strings.Repeat("y", 60)); !errors.Is(err, ErrRecordTooLarge) {
		t.Fatalf("Add of a 60-byte record under a 50-byte cap: %v, want ErrRecordTooLarge", err)
	}
}

func FuzzDecodeBatch(f *testing.F) {
	c := codec.For[string]()
	e := NewBatchEncoder(c, 10, 1000)
	for i, v := range []string{"a", "", "sensor-1", "ü"} {
		if _, err := e.Add(int64(i-2), v); err != nil {
			f.Fatal(err)
		}
	}
	f.Add(e.Flush(nil))
	f.Add([]byte{0})
	f.Fuzz(func(t *testing.T, data []byte) {
		ts, items, err := DecodeBatch(c, nil, nil, data)
		half := len(data) / 2
		_, _, _ = DecodeBatch(c, nil, nil, data[:half])
		_, _, _ = DecodeBatch(c, nil, nil, data[half:])
		if err != nil || len(items) == 0 {
			return
		}
		e := NewBatchEncoder(c, len(items)+1, len(data)+16)
		for i, v := range items {
			if ok, err := e.Add(ts[i], v); !ok || err != nil {
				t.Fatalf("re-encode record %d: %t %v", i, ok, err)
			}
		}
		ts2, items2, err := DecodeBatch(c, nil, nil, e.Flush(nil))
		if err != nil || len(items2) != len(items) {
			t.Fatalf("round trip: %d records, %v; want %d", len(items2), err, len(items))
		}
		for i := range items {
			if items[i] != items2[i] || ts[i] != ts2[i] {
				t.Fatalf("record %d: %q@%d, want %q@%d", i, items2[i], ts2[i], items[i], ts[i])
			}
		}
	})
}
