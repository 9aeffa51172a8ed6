package cluster

import (
	"bytes"
	"testing"
)

// A batch that waits for credit waits with a copy of its body: the
// sending task reuses its buffer as soon as Send returns, and what it
// writes there next must not reach the frame still waiting, nor the
// batches merged into it.
func TestSenderCopiesWaitingBody(t *testing.T) {
	cfg := DefaultChannelConfig()
	cfg.Credits = 1
	id := ChannelID{Job: "j", Epoch: 1, Edge: 0, From: 0, To: 1}
	s := NewSender(id, cfg)
	buf := []byte("first")
	if acts := s.Step(Send{Kind: KindBatch, Body: buf, Merge: true}); len(acts) != 1 {
		t.Fatalf("first batch: %v, want one transmit", acts)
	}
	copy(buf, "FIRST")
	buf = []byte("second")
	if acts := s.Step(Send{Kind: KindBatch, Body: buf, Merge: true}); len(acts) != 0 {
		t.Fatalf("second batch: %v, want it to wait for credit", acts)
	}
	copy(buf, "SECOND")
	buf2 := []byte("third")
	if acts := s.Step(Send{Kind: KindBatch, Body: buf2, Merge: true}); len(acts) != 0 {
		t.Fatalf("third batch: %v, want it merged", acts)
	}
	copy(buf2, "THIRD")
	acts := s.Step(Receive{Frame: Frame{Channel: id, Kind: KindAck, Seq: 1, Value: 1}})
	var got []byte
	for _, a := range acts {
		if tx, ok := a.(Transmit); ok {
			got = tx.Frame.Body
		}
	}
	if !bytes.Equal(got, []byte("secondthird")) {
		t.Fatalf("waiting frame carries %q, want %q", got, "secondthird")
	}
	if st := s.Stats(); st.Merged != 1 {
		t.Fatalf("merged %d batches, want 1", st.Merged)
	}
}

// Only the sender's own copies are marked for recycling: a batch
// transmitted at once carries the caller's buffer (Kept false), one that
// waited for credit carries the sender's copy (Kept true).
func TestSenderKeptOnlyForCopies(t *testing.T) {
	cfg := DefaultChannelConfig()
	cfg.Credits = 1
	id := ChannelID{Job: "j", Epoch: 1, Edge: 0, From: 0, To: 1}
	s := NewSender(id, cfg)
	buf := []byte("first")
	acts := s.Step(Send{Kind: KindBatch, Body: buf})
	if len(acts) != 1 {
		t.Fatalf("first batch: %v, want one transmit", acts)
	}
	if tx := acts[0].(Transmit); tx.Kept || !sameArray(tx.Frame.Body, buf) {
		t.Fatalf("direct transmit: kept %v, own buffer %v; want the caller's buffer, not kept", tx.Kept, sameArray(tx.Frame.Body, buf))
	}
	buf2 := []byte("second")
	if acts := s.Step(Send{Kind: KindBatch, Body: buf2}); len(acts) != 0 {
		t.Fatalf("second batch: %v, want it to wait for credit", acts)
	}
	acts = s.Step(Receive{Frame: Frame{Channel: id, Kind: KindAck, Seq: 1, Value: 1}})
	var tx Transmit
	for _, a := range acts {
		if t, ok := a.(Transmit); ok {
			tx = t
		}
	}
	if !tx.Kept || sameArray(tx.Frame.Body, buf2) || !bytes.Equal(tx.Frame.Body, buf2) {
		t.Fatalf("waited batch: kept %v, body %q (caller's buffer %v); want the sender's copy, kept", tx.Kept, tx.Frame.Body, sameArray(tx.Frame.Body, buf2))
	}
}
