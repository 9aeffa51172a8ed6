package cluster

import (
	"bytes"
	"context"
	"sync"
	"testing"

	"github.com/asynkron/protoactor-go/remote"
	"github.com/edgedio/edged/internal/testutil"
)

// batchBody returns a batch body of n bytes that names seq in every byte.
func batchBody(seq uint64, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(seq*31 + uint64(i))
	}
	return b
}

// A batch received over protoactor remote is read into a recycled buffer,
// which is recycled once the task reports that batch processed, and not
// before: a batch held unprocessed keeps its bytes while the buffers of
// hundreds of batches after it are recycled and reused.
func TestRemoteRecyclesReceivedBatchesOnceProcessed(t *testing.T) {
	cfg := DefaultChannelConfig()
	a, r := NewEndpoint(cfg, nil, nil), NewEndpoint(cfg, nil, nil)
	ta, tr := startRemote(t, a, nil), startRemote(t, r, nil)
	a.Attach(ta)
	r.Attach(tr)
	id := ChannelID{Job: "rx", Epoch: 1, Edge: 0, From: 0, To: 0}
	out := a.OpenSender(id, tr.Addr())
	const n, size = 300, 8 << 10
	var (
		mu       sync.Mutex
		held     Frame
		received int
		bad      []uint64
	)
	var in *InChannel
	in = r.OpenReceiver(id, ta.Addr(), func(f Frame) {
		mu.Lock()
		defer mu.Unlock()
		received++
		if !bytes.Equal(f.Body, batchBody(f.Seq, size)) {
			bad = append(bad, f.Seq)
		}
		if f.Seq == 1 {
			held = f // processed only at the end
			return
		}
		in.Processed(f.Seq)
	})
	taken, recycled := rxStats.taken.Load(), rxStats.recycled.Load()
	ctx := context.Background()
	for seq := range uint64(n) {
		if err := out.Send(ctx, Send{Kind: KindBatch, Body: batchBody(seq+1, size)}); err != nil {
			t.Fatal(err)
		}
	}
	testutil.Eventually(t, 0, "every batch delivered", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return received == n
	})
	mu.Lock()
	defer mu.Unlock()
	if len(bad) > 0 {
		t.Fatalf("batches %v arrived corrupt", bad)
	}
	if got := rxStats.taken.Load() - taken; got == 0 {
		t.Fatal("no batch was read into a pooled buffer")
	}
	if got := rxStats.recycled.Load() - recycled; got == 0 {
		t.Fatal("no receive buffer was recycled")
	}
	if !bytes.Equal(held.Body, batchBody(1, size)) {
		t.Fatal("the batch held unprocessed changed while later buffers were recycled")
	}
	in.mu.Lock()
	_, ok := in.held[1]
	in.mu.Unlock()
	if !ok {
		t.Fatal("the unprocessed batch's buffer is not held")
	}
	in.Processed(1)
	in.mu.Lock()
	left := len(in.held)
	in.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d buffers still held after every batch was processed", left)
	}
}

// In a batch read into a recycled buffer only the frames are counted as
// holding it; any other envelope (another message type, a system
// message) gets its own copy of its bytes, since the buffer may be reused
// as soon as gRPC drops its reference, before that envelope is
// deserialized.
func TestAliasedFramesCopiesOtherEnvelopes(t *testing.T) {
	data := []byte("frame-bytes|other-bytes")
	b := &remote.MessageBatch{
		TypeNames: []string{wireFrameName, "google.protobuf.BytesValue"},
		Envelopes: []*remote.MessageEnvelope{
			{TypeId: 0, MessageData: data[:11]},
			{TypeId: 1, MessageData: data[12:]},
		},
	}
	if n := aliasedFrames(b, data); n != 1 {
		t.Fatalf("%d frames counted, want 1", n)
	}
	if !within(b.Envelopes[0].MessageData, data) {
		t.Fatal("the frame was copied out of the buffer")
	}
	other := b.Envelopes[1].MessageData
	if within(other, data) {
		t.Fatal("the other envelope still points into the recycled buffer")
	}
	copy(data, bytes.Repeat([]byte{'x'}, len(data)))
	if string(other) != "other-bytes" {
		t.Fatalf("the other envelope reads %q after the buffer was reused", other)
	}
}
