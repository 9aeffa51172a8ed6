package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/asynkron/protoactor-go/remote"
	"github.com/edgedio/edged/internal/testutil"
)

// Frames sent to a peer are encoded into pooled buffers, which the
// transport's codec recycles once gRPC has copied them: thousands of
// distinct frames sent back to back arrive intact (a buffer recycled
// while its frame was still to be copied would carry a later frame's
// bytes), and every buffer lent to protoactor came back.
func TestRemoteTransportRecyclesFrameBuffers(t *testing.T) {
	const n = 3000
	var mu sync.Mutex // guards got and bad
	got := 0
	var bad []string
	hb := &countingHandler{onFrame: func(b []byte) {
		f, err := DecodeFrame(b)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			bad = append(bad, err.Error())
			return
		}
		if want := frameBody(int(f.Seq)); !bytes.Equal(f.Body, want) {
			bad = append(bad, fmt.Sprintf("seq %d: body of %d bytes differs", f.Seq, len(f.Body)))
		}
		got++
	}}
	a, b := startRemote(t, &countingHandler{}, nil), startRemote(t, hb, nil)
	lends0, releases0 := lent.counts()
	id := ChannelID{Job: "recycle", Epoch: 1, Edge: 0, From: 0, To: 1}
	for i := 1; i <= n; i++ {
		f := Frame{Channel: id, Seq: uint64(i), Kind: KindBatch, Body: frameBody(i)}
		if err := a.SendFrame(b.Addr(), &f); err != nil {
			t.Fatal(err)
		}
	}
	testutil.Eventually(t, 0, "every frame at b", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return got+len(bad) == n
	})
	mu.Lock()
	if len(bad) > 0 {
		t.Fatalf("%d frames corrupt, first: %s", len(bad), bad[0])
	}
	mu.Unlock()
	lends, releases := lent.counts()
	if lends-lends0 < n {
		t.Fatalf("%d frame buffers lent to protoactor for %d frames: frames not pooled", lends-lends0, n)
	}
	if releases-releases0 != lends-lends0 {
		t.Fatalf("%d buffers lent, %d recycled", lends-lends0, releases-releases0)
	}
}

// frameBody is the distinct body of frame i, 2 to 20 KiB.
func frameBody(i int) []byte {
	b := make([]byte, 2048+(i*7919)%18432)
	for j := range b {
		b[j] = byte(i + j/64)
	}
	return b
}

// A pooled frame hands its buffer over when protoactor serializes it,
// without a copy, and refuses a second time, when the buffer may hold
// another frame already; the transport's codec recycles the buffer once
// it has encoded the message batch carrying it.
func TestWireFrameHandedOverOnce(t *testing.T) {
	f := Frame{Channel: ChannelID{Job: "j", Epoch: 1, Edge: 0, From: 0, To: 1}, Seq: 1, Kind: KindBatch, Body: frameBody(1)}
	w, err := appendWireFrame(getBuf(wireFrameOverhead+f.EncodedSize()), &f)
	if err != nil {
		t.Fatal(err)
	}
	w.pooled = true
	lends0, releases0 := lent.counts()
	data, name, err := remote.Serialize(w, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !sameArray(data, w.enc) {
		t.Fatal("Serialize copied the pooled frame")
	}
	if _, _, err := remote.Serialize(w, 0); !errors.Is(err, errFrameHandedOver) {
		t.Fatalf("second Serialize: %v, want %v", err, errFrameHandedOver)
	}
	if lends, _ := lent.counts(); lends != lends0+1 {
		t.Fatalf("%d buffers lent, want 1", lends-lends0)
	}
	msg := &remote.RemoteMessage{MessageType: &remote.RemoteMessage_MessageBatch{MessageBatch: &remote.MessageBatch{
		TypeNames: []string{name},
		Envelopes: []*remote.MessageEnvelope{{MessageData: data}},
	}}}
	enc, err := frameCodec{}.Marshal(msg)
	if err != nil {
		t.Fatal(err)
	}
	defer enc.Free()
	if _, releases := lent.counts(); releases != releases0+1 {
		t.Fatalf("%d buffers recycled after the batch was encoded, want 1", releases-releases0)
	}
	// The encoding is gRPC's own codec's.
	want, err := protoCodec.Marshal(msg)
	if err != nil || !bytes.Equal(enc.Materialize(), want.Materialize()) {
		t.Fatalf("codec encodes differently from gRPC's: %v", err)
	}
	want.Free()
}
