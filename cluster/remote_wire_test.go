package cluster

import (
	"bytes"
	"testing"
	"unsafe"

	"github.com/asynkron/protoactor-go/remote"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// sameArray reports whether a and b start at the same byte of memory.
func sameArray(a, b []byte) bool {
	return len(a) > 0 && len(b) > 0 && unsafe.SliceData(a) == unsafe.SliceData(b)
}

// TestWireFrameNoCopies checks that a frame crosses protoactor's
// serializer without being copied: Serialize returns the encoding built
// with the frame, and Deserialize keeps a slice of the bytes it is given,
// which decode to the frame sent; both as protoactor calls them, and
// without allocating on the sending side.
func TestWireFrameNoCopies(t *testing.T) {
	f := Frame{Channel: ChannelID{Job: "job", Epoch: 3, Edge: 1, From: 0, To: 1}, Seq: 42, Kind: KindBatch, Body: bytes.Repeat([]byte("records "), 1000)}
	w, err := appendWireFrame(nil, &f)
	if err != nil {
		t.Fatal(err)
	}
	data, name, err := remote.Serialize(w, 0)
	if err != nil {
		t.Fatal(err)
	}
	if name != wireFrameName {
		t.Fatalf("type name %q, want %q", name, wireFrameName)
	}
	if !sameArray(data, w.enc) || len(data) != len(w.enc) {
		t.Fatal("Serialize copied the frame")
	}
	if n := testing.AllocsPerRun(100, func() { _, _, _ = remote.Serialize(w, 0) }); n != 0 {
		t.Fatalf("Serialize allocates %.0f times per frame", n)
	}
	// The same bytes as a BytesValue: the layout is BytesValue's.
	var bv wrapperspb.BytesValue
	if err := proto.Unmarshal(data, &bv); err != nil || !bytes.Equal(bv.Value, w.frame) {
		t.Fatalf("not a BytesValue's layout: %v", err)
	}

	msg, err := remote.Deserialize(data, name, 0)
	if err != nil {
		t.Fatal(err)
	}
	got, ok := msg.(*wireFrame)
	if !ok {
		t.Fatalf("deserialized a %T", msg)
	}
	if !sameArray(got.enc, data) {
		t.Fatal("Deserialize copied the frame")
	}
	back, err := DecodeFrame(frameOf(got))
	if err != nil {
		t.Fatal(err)
	}
	if back.Channel != f.Channel || back.Seq != f.Seq || back.Kind != f.Kind || !bytes.Equal(back.Body, f.Body) {
		t.Fatalf("frame %+v decoded to %+v", f, back)
	}
	// A BytesValue from a node of an earlier version is still a frame.
	if got := frameOf(&wrapperspb.BytesValue{Value: w.frame}); !bytes.Equal(got, w.frame) {
		t.Fatal("BytesValue frame lost")
	}
}

// TestWireFrameBadEncoding checks that a malformed edged.cluster.Frame is
// refused, not half decoded.
func TestWireFrameBadEncoding(t *testing.T) {
	for _, b := range [][]byte{{0x0a, 0x05, 1, 2}, {0x0a}, {0x80}} {
		if _, err := remote.Deserialize(b, wireFrameName, 0); err == nil {
			t.Errorf("% x deserialized", b)
		}
	}
}
