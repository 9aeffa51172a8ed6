package cluster

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/edgedio/edged/internal/script"
)

// TestChannelScripts runs testdata/channel/*.txt: a sender and a receiver
// joined by a scripted wire. Commands (t is an offset from the Unix epoch):
//
//	new [credits=128 inflight-bytes= window=64 epoch=1 ack-interval=1s ack-timeout=10s max-frame= max-merge=]
//	send kind=batch|watermark|status|barrier|eos [value=0 bytes=8 n=1 merge=false]
//	deliver [seq=]      deliver wire frame seq (may be a duplicate), or
//	                    every frame still on the wire, in order
//	drop seq=           lose a frame on the wire
//	forge seq= kind= [epoch= value= bytes=8]   a frame out of nowhere, to the receiver
//	process seq=        the task processed every batch up to seq
//	acks [drop=true]    deliver (or lose) the acks on the wire, in order
//	ack seq= received= [epoch=]        an ack out of nowhere, to the sender
//	tick t= [side=both|sender|receiver]
//	disconnect side=sender|receiver
//	state               (with inflight-bytes set, also the bytes in flight)
//
// Each action is printed with s: (sender) or r: (receiver) before it.
// go test ./cluster/ -run Script -update rewrites the expected output.
func TestChannelScripts(t *testing.T) {
	script.Run(t, "testdata/channel", func(*testing.T) func(*script.Command) (string, error) {
		h := &chanHarness{}
		return h.handle
	})
}

type chanHarness struct {
	s    *Sender
	r    *Receiver
	id   ChannelID
	sent map[uint64]Frame // every frame transmitted, by seq
	wire []uint64         // frames transmitted, not yet delivered or dropped
	acks []Frame          // acks transmitted, not yet delivered
	out  []string
	// bytes is set when the script set inflight-bytes: state prints the
	// bytes in flight.
	bytes bool
}

func (h *chanHarness) handle(cmd *script.Command) (string, error) {
	if cmd.Name == "new" {
		return h.create(cmd)
	}
	if h.s == nil {
		return "", errors.New("start with new")
	}
	h.out = h.out[:0]
	var err error
	switch cmd.Name {
	case "send":
		err = h.send(cmd)
	case "deliver":
		err = h.deliver(cmd)
	case "drop":
		var seq int64
		if seq, err = cmd.Int64("seq"); err == nil {
			if !h.take(uint64(seq)) {
				return "", fmt.Errorf("seq %d not on the wire", seq)
			}
		}
	case "forge":
		err = h.forge(cmd)
	case "process":
		var seq int64
		if seq, err = cmd.Int64("seq"); err == nil {
			h.receiver(Processed{Seq: uint64(seq)})
		}
	case "acks":
		var drop bool
		if drop, err = cmd.BoolOr("drop", false); err == nil {
			acks := h.acks
			h.acks = nil
			for _, a := range acks {
				if drop {
					h.out = append(h.out, "lost "+frameString(&a))
					continue
				}
				h.sender(Receive{Frame: a})
			}
		}
	case "ack":
		err = h.forgeAck(cmd)
	case "tick":
		err = h.tick(cmd)
	case "disconnect":
		switch side := cmd.StringOr("side", ""); side {
		case "sender":
			h.sender(Disconnected{Reason: errors.New("connection reset")})
		case "receiver":
			h.receiver(Disconnected{Reason: errors.New("connection reset")})
		default:
			return "", fmt.Errorf("side=%q: want sender or receiver", side)
		}
	case "state":
		h.state()
	default:
		return "", fmt.Errorf("unknown command %q", cmd.Name)
	}
	if err != nil {
		return "", err
	}
	return strings.Join(h.out, "\n"), nil
}

func (h *chanHarness) create(cmd *script.Command) (string, error) {
	cfg := DefaultChannelConfig()
	var err error
	get := func(key string, p *int) {
		if err == nil {
			*p, err = cmd.IntOr(key, *p)
		}
	}
	getD := func(key string, p *time.Duration) {
		if err == nil {
			*p, err = cmd.DurationOr(key, *p)
		}
	}
	get("credits", &cfg.Credits)
	get("inflight-bytes", &cfg.MaxInFlightBytes)
	h.bytes = cmd.Has("inflight-bytes")
	get("window", &cfg.DuplicateWindow)
	get("max-frame", &cfg.MaxFrameBytes)
	get("max-merge", &cfg.MaxMergeBytes)
	getD("ack-interval", &cfg.AckInterval)
	getD("ack-timeout", &cfg.AckTimeout)
	epoch, e2 := cmd.Int64Or("epoch", 1)
	if err = errors.Join(err, e2, cfg.Validate()); err != nil {
		return "", err
	}
	h.id = ChannelID{Job: "job", Epoch: uint64(epoch), Edge: 1, From: 0, To: 2}
	h.s, h.r = NewSender(h.id, cfg), NewReceiver(h.id, cfg)
	h.sent, h.wire, h.acks = map[uint64]Frame{}, nil, nil
	return "ok", nil
}

func parseKind(s string) (Kind, error) {
	for k := KindBatch; k <= maxKind; k++ {
		if k.String() == s {
			return k, nil
		}
	}
	return 0, fmt.Errorf("unknown kind %q", s)
}

func (h *chanHarness) send(cmd *script.Command) error {
	kind, err := parseKind(cmd.StringOr("kind", ""))
	if err != nil {
		return err
	}
	value, err := cmd.Int64Or("value", 0)
	if err != nil {
		return err
	}
	size, err := cmd.IntOr("bytes", 8)
	if err != nil {
		return err
	}
	n, err := cmd.IntOr("n", 1)
	if err != nil {
		return err
	}
	merge, err := cmd.BoolOr("merge", false)
	if err != nil {
		return err
	}
	for range n {
		m := Send{Kind: kind, Value: value, Merge: merge}
		if kind == KindBatch {
			m.Body = make([]byte, size)
		}
		h.sender(m)
	}
	if h.s.Blocked() {
		h.out = append(h.out, "s: blocked")
	}
	return nil
}

func (h *chanHarness) deliver(cmd *script.Command) error {
	if !cmd.Has("seq") {
		wire := h.wire
		h.wire = nil
		for _, seq := range wire {
			h.receiver(Receive{Frame: h.sent[seq]})
		}
		return nil
	}
	seq, err := cmd.Int64("seq")
	if err != nil {
		return err
	}
	f, ok := h.sent[uint64(seq)]
	if !ok {
		return fmt.Errorf("seq %d was never transmitted", seq)
	}
	h.take(uint64(seq))
	h.receiver(Receive{Frame: f})
	return nil
}

// take removes seq from the wire and reports whether it was there.
func (h *chanHarness) take(seq uint64) bool {
	for i, s := range h.wire {
		if s == seq {
			h.wire = append(h.wire[:i], h.wire[i+1:]...)
			return true
		}
	}
	return false
}

func (h *chanHarness) forge(cmd *script.Command) error {
	kind, err := parseKind(cmd.StringOr("kind", ""))
	if err != nil {
		return err
	}
	seq, err := cmd.Int64("seq")
	if err != nil {
		return err
	}
	epoch, err := cmd.Int64Or("epoch", int64(h.id.Epoch))
	if err != nil {
		return err
	}
	value, err := cmd.Int64Or("value", 0)
	if err != nil {
		return err
	}
	size, err := cmd.IntOr("bytes", 8)
	if err != nil {
		return err
	}
	id := h.id
	id.Epoch = uint64(epoch)
	f := Frame{Channel: id, Seq: uint64(seq), Kind: kind, Value: value}
	if kind == KindBatch {
		f.Body = make([]byte, size)
	}
	h.receiver(Receive{Frame: f})
	return nil
}

func (h *chanHarness) forgeAck(cmd *script.Command) error {
	seq, err := cmd.Int64("seq")
	if err != nil {
		return err
	}
	rcv, err := cmd.Int64("received")
	if err != nil {
		return err
	}
	epoch, err := cmd.Int64Or("epoch", int64(h.id.Epoch))
	if err != nil {
		return err
	}
	id := h.id
	id.Epoch = uint64(epoch)
	h.sender(Receive{Frame: Frame{Channel: id, Kind: KindAck, Seq: uint64(seq), Value: rcv}})
	return nil
}

func (h *chanHarness) tick(cmd *script.Command) error {
	d, err := cmd.Duration("t")
	if err != nil {
		return err
	}
	now := time.UnixMilli(0).Add(d)
	side := cmd.StringOr("side", "both")
	if side == "both" || side == "sender" {
		h.sender(Tick{Now: now})
	}
	if side == "both" || side == "receiver" {
		h.receiver(Tick{Now: now})
	}
	return nil
}

func (h *chanHarness) sender(in Input) {
	for _, a := range h.s.Step(in) {
		if t, ok := a.(Transmit); ok {
			h.sent[t.Frame.Seq] = t.Frame
			h.wire = append(h.wire, t.Frame.Seq)
		}
		h.out = append(h.out, fmt.Sprint("s: ", a))
	}
}

func (h *chanHarness) receiver(in Input) {
	for _, a := range h.r.Step(in) {
		if t, ok := a.(Transmit); ok {
			h.acks = append(h.acks, t.Frame)
		}
		h.out = append(h.out, fmt.Sprint("r: ", a))
	}
}

func (h *chanHarness) state() {
	ss, rs := h.s.Stats(), h.r.Stats()
	h.out = append(h.out,
		fmt.Sprintf("sender: in-flight=%d credits=%d blocked=%t max-in-flight=%d frames=%d batches=%d stale-acks=%d epoch-dropped=%d err=%v",
			h.s.InFlight(), h.s.Credits(), h.s.Blocked(), ss.MaxInFlight, ss.Frames, ss.Batches, ss.StaleAcks, ss.EpochDropped, h.s.Err() != nil),
		fmt.Sprintf("receiver: held=%d delivered=%d batches=%d duplicates=%d epoch-dropped=%d acks=%d err=%v",
			h.r.Held(), rs.Delivered, rs.Batches, rs.Duplicates, rs.EpochDropped, rs.Acks, h.r.Err() != nil))
	if h.bytes {
		h.out = append(h.out, fmt.Sprintf("bytes: in-flight=%d max-in-flight=%d held=%d",
			h.s.bytes, ss.MaxInFlightBytes, h.r.HeldBytes()))
	}
	if ss.Merged > 0 {
		h.out = append(h.out, fmt.Sprintf("merged: %d", ss.Merged))
	}
	if len(h.wire) > 0 {
		h.out = append(h.out, fmt.Sprintf("wire: %v", h.wire))
	}
}
