package cluster

import (
	"fmt"
	"unicode/utf8"
	"unsafe"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// frameCodec is the gRPC codec of a RemoteTransport's connections:
// gRPC's protobuf codec, with differences that spare every frame a copy
// and an allocation. Sending, it encodes a message into a pooled buffer,
// which gRPC recycles once it has written it, and, once it has copied a
// message batch into that buffer, it recycles the pooled buffers of the
// frames in it (see lentBufs). Receiving, with alias set (the server
// side), it copies the message gRPC received (in pieces of at most one
// HTTP/2 frame) into one buffer and decodes a message batch with each
// envelope's bytes a slice of that buffer rather than a copy, unless the
// message is large and they are a small part of it (see aliasShare).
// With retain set as well the buffer is pooled, and recycled once every
// frame that aliases it was handled (see rxBuf); without, it is the
// collector's. It encodes and decodes exactly as gRPC's own codec, under
// the same name, so that peers see no difference.
type frameCodec struct {
	// alias lets Unmarshal decode a message batch with its envelopes'
	// bytes slices of a buffer of the codec's own.
	alias bool
	// retain makes that buffer a pooled one (the handler is a
	// RetainingHandler).
	retain bool
}

// Name returns "proto", the name of gRPC's protobuf codec.
func (frameCodec) Name() string { return grpcproto.Name }

// Marshal encodes v into a pooled buffer, which gRPC frees once it has
// written it, and recycles the frame buffers of a message batch.
func (frameCodec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("remote transport: marshal %T, not a protobuf message", v)
	}
	if rm, ok := v.(*remote.RemoteMessage); ok {
		// Copied into the encoding, or never to be sent: protoactor
		// drops the envelopes once the batch is sent or the stream
		// failed.
		defer func() {
			for _, e := range rm.GetMessageBatch().GetEnvelopes() {
				lent.release(e.MessageData)
			}
		}()
	}
	// proto.Size sets the sizes UseCachedSize reuses.
	size := proto.Size(m)
	opts := proto.MarshalOptions{UseCachedSize: true}
	if size < minPooled || size > 1<<maxPoolShift {
		b, err := opts.Marshal(m)
		if err != nil {
			return nil, err
		}
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	b, err := opts.MarshalAppend(getBuf(size), m)
	if err != nil {
		putBuf(b)
		return nil, err
	}
	return mem.BufferSlice{mem.NewBuffer(&b, framePool{})}, nil
}

// framePool is the frame buffers' pool (getBuf, putBuf) as a gRPC
// buffer pool.
type framePool struct{}

func (framePool) Get(n int) *[]byte {
	b := getBuf(n)[:n]
	return &b
}

func (framePool) Put(b *[]byte) { putBuf(*b) }

// Unmarshal decodes data into v, as gRPC's codec does; with alias set,
// the envelopes of a message batch keep slices of a copy of data (see
// frameCodec).
func (c frameCodec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(*remote.RemoteMessage)
	if !ok || !c.alias {
		return protoCodec.Unmarshal(data, v)
	}
	n := data.Len()
	var buf []byte
	var rb *rxBuf
	if c.retain {
		rb = newRxBuf(n)
	}
	if rb != nil {
		// The codec's reference, dropped once the frames that alias
		// the buffer have taken theirs.
		defer rb.Release()
		buf = rb.buf
	} else {
		buf = make([]byte, n)
	}
	data.CopyTo(buf)
	return unmarshalRemote(buf, rb, m)
}

// unmarshalRemote decodes the RemoteMessage in buf into m: a message
// batch with its envelopes' bytes slices of buf (see decodeEnvelope),
// anything else as gRPC's codec does. With rb, the pooled buffer that buf
// is, it takes a reference to rb for every frame that stays a slice of
// it.
func unmarshalRemote(buf []byte, rb *rxBuf, m *remote.RemoteMessage) error {
	b, ok := decodeMessageBatch(buf)
	if !ok {
		return proto.Unmarshal(buf, m)
	}
	proto.Reset(m)
	m.MessageType = &remote.RemoteMessage_MessageBatch{MessageBatch: b}
	if rb != nil {
		n := int32(aliasedFrames(b, buf))
		rb.refs.Add(n)
		rb.unclaimed.Add(n)
	}
	return nil
}

// aliasedFrames counts the envelopes of b that carry a frame
// (edged.cluster.Frame) and are a slice of data, which is a recycled
// buffer. Every other envelope that is a slice of data (another message
// type, a system message) gets a copy of its bytes: nothing counts it,
// and the buffer goes back to the pool when the codec drops its
// reference, before the envelope is deserialized.
func aliasedFrames(b *remote.MessageBatch, data []byte) int {
	n := 0
	for _, e := range b.Envelopes {
		if len(e.MessageData) == 0 || !within(e.MessageData, data) {
			continue
		}
		if int(e.TypeId) >= len(b.TypeNames) || b.TypeNames[e.TypeId] != wireFrameName {
			e.MessageData = append([]byte(nil), e.MessageData...)
			continue
		}
		n++
	}
	return n
}

// within reports whether b lies in data's bytes.
func within(b, data []byte) bool {
	start := uintptr(unsafe.Pointer(unsafe.SliceData(data)))
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	return p >= start && p+uintptr(len(b)) <= start+uintptr(len(data))
}

// An envelope's bytes are kept as a slice of the received message when
// they are 1/aliasShare of it or more, or the message is at most
// aliasMaxBytes: a frame waiting to be processed keeps at most
// max(aliasShare × its size, aliasMaxBytes) in memory.
const (
	aliasShare    = 4
	aliasMaxBytes = 256 << 10
)

// decodeMessageBatch decodes a RemoteMessage that carries one message
// batch and nothing else, in the layout protoactor writes; false for
// anything else (another message, a field it does not know, bad input),
// which gRPC's codec then decodes, or refuses.
func decodeMessageBatch(data []byte) (*remote.MessageBatch, bool) {
	num, typ, n := protowire.ConsumeTag(data)
	if n < 0 || num != 1 || typ != protowire.BytesType {
		return nil, false
	}
	src, m := protowire.ConsumeBytes(data[n:])
	if m < 0 || n+m != len(data) {
		return nil, false
	}
	b := &remote.MessageBatch{}
	for len(src) > 0 {
		num, typ, n := protowire.ConsumeTag(src)
		if n < 0 || typ != protowire.BytesType {
			return nil, false
		}
		v, m := protowire.ConsumeBytes(src[n:])
		if m < 0 {
			return nil, false
		}
		src = src[n+m:]
		switch num {
		case 1:
			if !utf8.Valid(v) {
				return nil, false
			}
			b.TypeNames = append(b.TypeNames, string(v))
		case 2, 4:
			pid := &actor.PID{}
			if err := proto.Unmarshal(v, pid); err != nil {
				return nil, false
			}
			if num == 2 {
				b.Targets = append(b.Targets, pid)
			} else {
				b.Senders = append(b.Senders, pid)
			}
		case 3:
			e, ok := decodeEnvelope(v, len(data))
			if !ok {
				return nil, false
			}
			b.Envelopes = append(b.Envelopes, e)
		default:
			return nil, false
		}
	}
	return b, true
}

// decodeEnvelope decodes a MessageEnvelope of a message of size bytes:
// its message_data a slice of src when it is a quarter of the message or
// more or the message is small (see aliasShare), else a copy.
func decodeEnvelope(src []byte, size int) (*remote.MessageEnvelope, bool) {
	e := &remote.MessageEnvelope{}
	for len(src) > 0 {
		num, typ, n := protowire.ConsumeTag(src)
		if n < 0 {
			return nil, false
		}
		src = src[n:]
		switch {
		case typ == protowire.VarintType && num != 2 && num != 6 && num >= 1 && num <= 8:
			v, m := protowire.ConsumeVarint(src)
			if m < 0 {
				return nil, false
			}
			src = src[m:]
			switch num {
			case 1:
				e.TypeId = int32(v)
			case 3:
				e.Target = int32(v)
			case 4:
				e.Sender = int32(v)
			case 5:
				e.SerializerId = int32(v)
			case 7:
				e.TargetRequestId = uint32(v)
			case 8:
				e.SenderRequestId = uint32(v)
			}
		case typ == protowire.BytesType && (num == 2 || num == 6):
			v, m := protowire.ConsumeBytes(src)
			if m < 0 {
				return nil, false
			}
			src = src[m:]
			if num == 2 {
				switch {
				case len(v) == 0:
					e.MessageData = nil
				case len(v)*aliasShare >= size || size <= aliasMaxBytes:
					e.MessageData = v[:len(v):len(v)]
				default:
					e.MessageData = append([]byte(nil), v...)
				}
				continue
			}
			if e.MessageHeader == nil {
				e.MessageHeader = &remote.MessageHeader{}
			}
			if err := (proto.UnmarshalOptions{Merge: true}).Unmarshal(v, e.MessageHeader); err != nil {
				return nil, false
			}
		default:
			return nil, false
		}
	}
	return e, true
}

// protoCodec is gRPC's protobuf codec.
var protoCodec = encoding.GetCodecV2(grpcproto.Name)

var _ encoding.CodecV2 = frameCodec{}
