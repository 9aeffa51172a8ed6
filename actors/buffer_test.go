package actors

import (
	"testing"

	"github.com/edgedio/edged/codec"
)

// TestChannelBuffersGrowOnFirstUse: a channel's batch buffers (credits of
// them per channel, made when the job starts) hold no record memory until
// records go through them; an idle job's heap was mostly these buffers.
func TestChannelBuffersGrowOnFirstUse(t *testing.T) {
	type rec struct {
		ID  string
		Pad [32]uint64
	}
	ty := TypeOf[rec](codec.For[rec](), nil)
	b, ok := ty.newBuffer(&channel{}, 512, false).(*batch[rec])
	if !ok {
		t.Fatalf("newBuffer: %T, want *batch", b)
	}
	if cap(b.items) != 0 || cap(b.ts) != 0 {
		t.Fatalf("a new batch buffer holds room for %d records and %d timestamps; want none until used", cap(b.items), cap(b.ts))
	}
}
