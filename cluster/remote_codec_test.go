package cluster

import (
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// codecSamples are RemoteMessages as protoactor sends them: batches with
// every envelope field set or not (the first envelope's bytes body), and
// the other messages of the stream.
func codecSamples(body []byte) []*remote.RemoteMessage {
	batch := &remote.MessageBatch{
		TypeNames: []string{wireFrameName, "actor.Terminated"},
		Targets:   []*actor.PID{{Address: "127.0.0.1:1", Id: "edged-frames"}, {Address: "127.0.0.1:1", Id: "x", RequestId: 7}},
		Senders:   []*actor.PID{{Address: "127.0.0.1:2", Id: "s"}},
		Envelopes: []*remote.MessageEnvelope{
			{TypeId: 0, MessageData: body, Target: 0},
			{TypeId: 1, MessageData: []byte{1, 2, 3}, Target: 1, Sender: -1, SerializerId: 1,
				MessageHeader: &remote.MessageHeader{HeaderData: map[string]string{"k": "v"}}, TargetRequestId: 9, SenderRequestId: 1 << 31},
			{},
		},
	}
	return []*remote.RemoteMessage{
		{MessageType: &remote.RemoteMessage_MessageBatch{MessageBatch: batch}},
		{MessageType: &remote.RemoteMessage_MessageBatch{MessageBatch: &remote.MessageBatch{}}},
		{MessageType: &remote.RemoteMessage_ConnectRequest{ConnectRequest: &remote.ConnectRequest{}}},
		{MessageType: &remote.RemoteMessage_DisconnectRequest{DisconnectRequest: &remote.DisconnectRequest{}}},
		{},
	}
}

// grpcEncode returns gRPC's codec's encoding of m.
func grpcEncode(t testing.TB, m *remote.RemoteMessage) []byte {
	t.Helper()
	enc, err := protoCodec.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	defer enc.Free()
	return enc.Materialize()
}

// pieces returns data as gRPC hands a received message to its codec: in
// pieces (of its HTTP/2 frames), here of at most size bytes each.
func pieces(data []byte, size int) mem.BufferSlice {
	var s mem.BufferSlice
	for len(data) > 0 {
		n := min(size, len(data))
		s = append(s, mem.SliceBuffer(data[:n]))
		data = data[n:]
	}
	return s
}

// The server's codec decodes what gRPC's codec encodes to the same
// messages, with the envelopes' bytes slices of the received buffer (no
// copy) unless the message is large and they are a small part of it (a
// small frame does not keep a large message in memory), and hands anything
// it does not know to gRPC's codec.
func TestFrameCodecDecodesAsGRPC(t *testing.T) {
	// A large message with a large frame and a small one: the small one is
	// copied, so that it does not keep the message in memory.
	large := &remote.RemoteMessage{MessageType: &remote.RemoteMessage_MessageBatch{MessageBatch: &remote.MessageBatch{
		TypeNames: []string{wireFrameName},
		Envelopes: []*remote.MessageEnvelope{{MessageData: make([]byte, aliasMaxBytes)}, {MessageData: frameBody(1)}},
	}}}
	for i, want := range append(codecSamples(frameBody(3)), large) {
		data := grpcEncode(t, want)
		for _, c := range []frameCodec{{alias: true}, {alias: true, retain: true}, {}} {
			got := &remote.RemoteMessage{}
			if err := c.Unmarshal(pieces(data, 16<<10), got); err != nil {
				t.Fatalf("sample %d, %+v: %v", i, c, err)
			}
			if !proto.Equal(got, want) {
				t.Fatalf("sample %d, %+v: decoded %v, want %v", i, c, got, want)
			}
		}
		got := &remote.RemoteMessage{}
		if err := unmarshalRemote(data, nil, got); err != nil {
			t.Fatalf("sample %d: %v", i, err)
		}
		for j, e := range got.GetMessageBatch().GetEnvelopes() {
			big := len(e.MessageData)*aliasShare >= len(data) || len(data) <= aliasMaxBytes
			if kept := inside(e.MessageData, data); len(e.MessageData) > 0 && kept != big {
				t.Fatalf("sample %d, envelope %d of %d bytes in a message of %d: kept as a slice %v, want %v",
					i, j, len(e.MessageData), len(data), kept, big)
			}
		}
	}
	// A batch with a field protoactor does not write: gRPC's codec
	// decodes it (keeping the unknown field).
	data := grpcEncode(t, codecSamples(frameBody(3))[0])
	inner, _ := protowire.ConsumeBytes(data[1:])
	inner = protowire.AppendTag(inner, 99, protowire.VarintType)
	inner = protowire.AppendVarint(inner, 1)
	odd := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), inner)
	if _, ok := decodeMessageBatch(odd); ok {
		t.Fatal("a batch with an unknown field took the fast path")
	}
	got := &remote.RemoteMessage{}
	if err := (frameCodec{alias: true}).Unmarshal(pieces(odd, 4096), got); err != nil || len(got.GetMessageBatch().GetEnvelopes()) != 3 {
		t.Fatalf("fallback decode: %v, %v", err, got)
	}
	// The client's codec never aliases: gRPC recycles its buffers.
	got = &remote.RemoteMessage{}
	if err := (frameCodec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(data)}, got); err != nil {
		t.Fatal(err)
	}
	if inside(got.GetMessageBatch().GetEnvelopes()[0].MessageData, data) {
		t.Fatal("the client's codec kept a slice of gRPC's buffer")
	}
}

// inside reports whether b lies within buf.
func inside(b, buf []byte) bool {
	if len(b) == 0 || len(buf) == 0 {
		return false
	}
	for i := range buf {
		if &buf[i] == &b[0] {
			return i+len(b) <= len(buf)
		}
	}
	return false
}

// FuzzFrameCodecUnmarshal checks the server's decoder against gRPC's
// codec on any input, received in pieces of any size: both accept it,
// with equal messages, or both refuse it.
func FuzzFrameCodecUnmarshal(f *testing.F) {
	// Small seeds: the fuzzer mutates large inputs slowly.
	for _, m := range codecSamples([]byte("eF\x01\x01frame")) {
		data := grpcEncode(f, m)
		f.Add(data, uint16(0))
		f.Add(data, uint16(7))
	}
	f.Fuzz(func(t *testing.T, data []byte, piece uint16) {
		want := &remote.RemoteMessage{}
		werr := protoCodec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(data)}, want)
		size := len(data)
		if piece > 0 {
			size = int(piece)
		}
		for _, c := range []frameCodec{{alias: true}, {alias: true, retain: true}} {
			got := &remote.RemoteMessage{}
			gerr := c.Unmarshal(pieces(data, size), got)
			if (werr == nil) != (gerr == nil) {
				t.Fatalf("%+v: gRPC's codec: %v; frame codec: %v", c, werr, gerr)
			}
			if werr == nil && !proto.Equal(got, want) {
				t.Fatalf("%+v: decoded %v, gRPC's codec %v", c, got, want)
			}
		}
	})
}
