package cluster

import (
	"bytes"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
)

func sampleFrames() []Frame {
	id := ChannelID{Job: "sensors", Epoch: 7, Edge: 2, From: 1, To: 3}
	return []Frame{
		{Channel: id, Seq: 1, Kind: KindBatch, Body: []byte{1, 2, 3}},
		{Channel: id, Seq: 2, Kind: KindBatch, Body: []byte{}},
		{Channel: id, Seq: 3, Kind: KindWatermark, Value: -5},
		{Channel: id, Seq: 4, Kind: KindWatermark, Value: math.MaxInt64},
		{Channel: id, Seq: 5, Kind: KindStatus, Value: 1},
		{Channel: id, Seq: 6, Kind: KindStatus},
		{Channel: id, Seq: 7, Kind: KindBarrier, Value: 42},
		{Channel: id, Seq: 8, Kind: KindEndOfStream},
		{Channel: id, Seq: 8, Kind: KindAck, Value: 8},
		{Channel: ChannelID{Job: strings.Repeat("j", MaxJobName), Epoch: math.MaxUint64, Edge: math.MaxInt32, From: math.MaxInt32, To: math.MaxInt32},
			Seq: math.MaxUint64, Kind: KindBarrier, Value: math.MinInt64},
	}
}

func TestFrameRoundTrip(t *testing.T) {
	for _, f := range sampleFrames() {
		b, err := AppendFrame(nil, &f)
		if err != nil {
			t.Fatalf("encode %+v: %v", f, err)
		}
		if len(b) != f.EncodedSize() {
			t.Errorf("%s: encoded %d bytes, EncodedSize says %d", f.Kind, len(b), f.EncodedSize())
		}
		if len(b) > f.EncodedSize()-len(f.Body)+FrameOverhead {
			t.Errorf("%s: header of %d bytes exceeds FrameOverhead %d", f.Kind, len(b)-len(f.Body), FrameOverhead)
		}
		got, err := DecodeFrame(b)
		if err != nil {
			t.Fatalf("decode %s: %v", f.Kind, err)
		}
		if f.Kind == KindBatch && len(f.Body) == 0 {
			f.Body = got.Body // nil and empty are the same body
		}
		if !reflect.DeepEqual(got, f) {
			t.Errorf("round trip: got %+v, want %+v", got, f)
		}
	}
}

func TestFrameEncodeRefuses(t *testing.T) {
	id := ChannelID{Job: "j", Epoch: 1}
	for _, f := range []Frame{
		{Channel: id, Kind: 0},
		{Channel: id, Kind: maxKind + 1},
		{Channel: ChannelID{Job: strings.Repeat("j", MaxJobName+1)}, Kind: KindEndOfStream},
		{Channel: ChannelID{Job: "j", Edge: -1}, Kind: KindEndOfStream},
		{Channel: id, Kind: KindBarrier, Body: []byte{1}},
		{Channel: id, Kind: KindStatus, Value: 2},
		{Channel: id, Kind: KindEndOfStream, Value: 1},
	} {
		if b, err := AppendFrame([]byte("x"), &f); err == nil || string(b) != "x" {
			t.Errorf("AppendFrame(%+v) = %q, %v; want an error and dst unchanged", f, b, err)
		}
	}
}

func TestFrameDecodeErrors(t *testing.T) {
	good, err := AppendFrame(nil, &Frame{Channel: ChannelID{Job: "job", Epoch: 1}, Seq: 1, Kind: KindBarrier, Value: 9})
	if err != nil {
		t.Fatal(err)
	}
	mut := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }
	for _, tc := range []struct {
		name string
		in   []byte
		want error
	}{
		{"empty", nil, ErrShortFrame},
		{"magic", mut(func(b []byte) []byte { b[0] = 'x'; return b }), ErrBadMagic},
		{"version", mut(func(b []byte) []byte { b[2] = 9; return b }), ErrBadVersion},
		// Version 1 carried strings inline: a node of that version is
		// refused, not misread.
		{"version 1", mut(func(b []byte) []byte { b[2] = 1; return b }), ErrBadVersion},
		// Version 2 wrote a batch's int64 fields whole.
		{"version 2", mut(func(b []byte) []byte { b[2] = 2; return b }), ErrBadVersion},
		// Version 3 wrote a batch's timestamp count without the flag of
		// one shared timestamp.
		{"version 3", mut(func(b []byte) []byte { b[2] = 3; return b }), ErrBadVersion},
		{"kind", mut(func(b []byte) []byte { b[3] = 0; return b }), ErrBadKind},
		{"kind high", mut(func(b []byte) []byte { b[3] = byte(maxKind + 1); return b }), ErrBadKind},
		{"job too long", mut(func(b []byte) []byte { return append(b[:4], 0x80, 0x02) }), ErrCorruptFrame},
		{"job short", mut(func(b []byte) []byte { return b[:6] }), ErrShortFrame},
		{"header short", mut(func(b []byte) []byte { return b[:9] }), ErrShortFrame},
		{"value missing", good[:len(good)-1], ErrShortFrame},
		{"trailing", append(bytes.Clone(good), 0), ErrCorruptFrame},
		{"varint overflow", append(bytes.Clone(good[:8]), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01), ErrCorruptFrame},
		{"status", []byte{'e', 'F', frameVersion, byte(KindStatus), 0, 0, 0, 0, 0, 0, 2}, ErrCorruptFrame},
		{"edge range", []byte{'e', 'F', frameVersion, byte(KindEndOfStream), 0, 0, 0xff, 0xff, 0xff, 0xff, 0x0f, 0, 0, 0}, ErrCorruptFrame},
	} {
		if _, err := DecodeFrame(tc.in); !errors.Is(err, tc.want) {
			t.Errorf("%s: DecodeFrame = %v, want %v", tc.name, err, tc.want)
		}
	}
}

// FuzzDecodeFrame checks that decoding never panics, that what decodes
// re-encodes to the same bytes, and that a frame split in two halves is
// refused at the first half (a transport delivers frames whole, so a half
// frame must never pass for a whole one unless its kind allows a body).
func FuzzDecodeFrame(f *testing.F) {
	for _, fr := range sampleFrames() {
		b, err := AppendFrame(nil, &fr)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add([]byte("eF"))
	f.Fuzz(func(t *testing.T, data []byte) {
		fr, err := DecodeFrame(data)
		half := len(data) / 2
		_, herr := DecodeFrame(data[:half])
		if err != nil {
			return
		}
		again, err := AppendFrame(nil, &fr)
		if err != nil {
			t.Fatalf("decoded frame %+v does not encode: %v", fr, err)
		}
		if !bytes.Equal(again, data) {
			t.Fatalf("re-encoded %x, decoded from %x", again, data)
		}
		if herr == nil && fr.Kind != KindBatch {
			// Only a batch's body has no length: cutting a frame of any
			// other kind must fail.
			t.Fatalf("first half %x of a %s frame decoded", data[:half], fr.Kind)
		}
	})
}
