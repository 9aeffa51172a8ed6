package cluster

import (
	"fmt"

	"github.com/asynkron/protoactor-go/remote"
	"google.golang.org/grpc/encoding"
	"google.golang.org/protobuf/proto"
)

// frameCodec is the gRPC codec of the connections a RemoteTransport
// dials: gRPC's protobuf codec, which, once it has copied a message batch
// into the bytes it writes, recycles the pooled buffers of the frames in
// it (see lentBufs). It encodes exactly as gRPC's own codec, under the
// same name, so that peers see no difference.
type frameCodec struct{}

// Name returns "proto", the name of gRPC's protobuf codec.
func (frameCodec) Name() string { return "proto" }

// Marshal encodes v and recycles the frame buffers of a message batch.
func (frameCodec) Marshal(v any) ([]byte, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("remote transport: marshal %T, not a protobuf message", v)
	}
	b, err := proto.Marshal(m)
	if rm, ok := v.(*remote.RemoteMessage); ok {
		// Copied into b, or never to be sent: protoactor drops the
		// envelopes once the batch is sent or the stream failed.
		for _, e := range rm.GetMessageBatch().GetEnvelopes() {
			lent.release(e.MessageData)
		}
	}
	return b, err
}

// Unmarshal decodes data into v, as gRPC's codec does.
func (frameCodec) Unmarshal(data []byte, v any) error {
	return protoCodec.Unmarshal(data, v)
}

// protoCodec is gRPC's protobuf codec.
var protoCodec = encoding.GetCodec("proto")

var _ encoding.Codec = frameCodec{}
