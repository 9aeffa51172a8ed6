package cluster

import (
	"bytes"
	"context"
	"sync"
	"testing"

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
