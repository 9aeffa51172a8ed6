package cluster

import (
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
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

// The server's codec decodes what gRPC's codec encodes to the same
// messages, with the envelopes' bytes slices of the received buffer (no
// copy) unless the message is large and they are a small part of it (a
// small frame does not keep a large message in memory), and hands anything
// it does not know to gRPC's codec.
func TestFrameCodecDecodesAsGRPC(t *testing.T) {
	c := frameCodec{alias: true}
	// A large message with a large frame and a small one: the small one is
	// copied, so that it does not keep the message in memory.
	large := &remote.RemoteMessage{MessageType: &remote.RemoteMessage_MessageBatch{MessageBatch: &remote.MessageBatch{
		TypeNames: []string{wireFrameName},
		Envelopes: []*remote.MessageEnvelope{{MessageData: make([]byte, aliasMaxBytes)}, {MessageData: frameBody(1)}},
	}}}
	for i, want := range append(codecSamples(frameBody(3)), large) {
		data, err := protoCodec.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		got := &remote.RemoteMessage{}
		if err := c.Unmarshal(data, got); err != nil {
			t.Fatalf("sample %d: %v", i, err)
		}
		if !proto.Equal(got, want) {
			t.Fatalf("sample %d: decoded %v, want %v", i, got, want)
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
	data, _ := protoCodec.Marshal(codecSamples(frameBody(3))[0])
	inner, _ := protowire.ConsumeBytes(data[1:])
	inner = protowire.AppendTag(inner, 99, protowire.VarintType)
	inner = protowire.AppendVarint(inner, 1)
	odd := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), inner)
	if _, ok := decodeMessageBatch(odd); ok {
		t.Fatal("a batch with an unknown field took the fast path")
	}
	got := &remote.RemoteMessage{}
	if err := c.Unmarshal(odd, got); err != nil || len(got.GetMessageBatch().GetEnvelopes()) != 3 {
		t.Fatalf("fallback decode: %v, %v", err, got)
	}
	// The client's codec never aliases: its buffers are pooled.
	got = &remote.RemoteMessage{}
	if err := (frameCodec{}).Unmarshal(data, got); err != nil {
		t.Fatal(err)
	}
	if inside(got.GetMessageBatch().GetEnvelopes()[0].MessageData, data) {
		t.Fatal("the client's codec kept a slice of its pooled buffer")
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
// codec on any input: both accept it, with equal messages, or both refuse
// it.
func FuzzFrameCodecUnmarshal(f *testing.F) {
	// Small seeds: the fuzzer mutates large inputs slowly.
	for _, m := range codecSamples([]byte("eF\x01\x01frame")) {
		data, err := protoCodec.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		want := &remote.RemoteMessage{}
		werr := protoCodec.Unmarshal(data, want)
		got := &remote.RemoteMessage{}
		gerr := frameCodec{alias: true}.Unmarshal(data, got)
		if (werr == nil) != (gerr == nil) {
			t.Fatalf("gRPC's codec: %v; frame codec: %v", werr, gerr)
		}
		if werr == nil && !proto.Equal(got, want) {
			t.Fatalf("decoded %v, gRPC's codec %v", got, want)
		}
	})
}
