package cluster

import (
	"encoding/binary"
	"errors"
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/runtime/protoiface"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
)

// wireFrameName is the protobuf message name a frame crosses under:
//
//	message Frame { bytes value = 1; }
//
// the layout of google.protobuf.BytesValue, under a name of its own so
// that the receiving node decodes it with wireFrame's methods, which alias
// the received bytes instead of copying them.
const wireFrameName = "edged.cluster.Frame"

// wireFrame is one frame as protoactor remote carries it: a protobuf
// message whose encoding is built once, with the frame, and handed to
// protoactor as it is. protoactor marshals every message before it packs
// it into a gRPC message; for a BytesValue that meant copying every frame
// into a new buffer on the sending node, and again out of the received
// message on the receiving one. wireFrame's fast-path methods do neither:
// Marshal returns the encoding built by appendWireFrame, Unmarshal keeps
// a slice of the bytes it is given (protoactor's own copy of the envelope,
// which nothing else holds).
type wireFrame struct {
	// enc is the message's encoding: the tag of field 1, the frame's
	// length and the frame.
	enc []byte
	// frame is the frame: a slice of enc.
	frame []byte
	// r is the frame's reflective view, set up once.
	r wireFrameReflect
	// pooled says enc is a pooled buffer: Marshal hands it over once, to
	// be recycled by the transport's codec (see lentBufs), and refuses a
	// second time, when the buffer may hold another frame already.
	pooled, handedOver bool
}

// newWireFrameOf returns a wireFrame of enc and frame.
func newWireFrameOf(enc, frame []byte) *wireFrame {
	w := &wireFrame{enc: enc, frame: frame}
	w.r = wireFrameReflect{Message: wireFrameZero, w: w}
	return w
}

// appendWireFrame appends the frame f, as a wireFrame's encoding, to dst.
func appendWireFrame(dst []byte, f *Frame) (*wireFrame, error) {
	n := f.EncodedSize()
	dst = protowire.AppendTag(dst, 1, protowire.BytesType)
	dst = binary.AppendUvarint(dst, uint64(n))
	head := len(dst)
	dst, err := AppendFrame(dst, f)
	if err != nil {
		return nil, err
	}
	if len(dst)-head != n {
		return nil, fmt.Errorf("%w: %s frame of %d bytes encoded to %d", ErrCorruptFrame, f.Kind, n, len(dst)-head)
	}
	return newWireFrameOf(dst, dst[head:]), nil
}

// newWireFrame wraps the encoded frame frame, copying it once.
func newWireFrame(frame []byte) *wireFrame {
	enc := make([]byte, 0, 1+binary.MaxVarintLen64+len(frame))
	enc = protowire.AppendTag(enc, 1, protowire.BytesType)
	enc = protowire.AppendBytes(enc, frame)
	return newWireFrameOf(enc, enc[len(enc)-len(frame):])
}

// Reset empties the frame (proto.Reset, before proto.Unmarshal).
func (w *wireFrame) Reset() { w.enc, w.frame = nil, nil }

// ProtoReflect implements proto.Message.
func (w *wireFrame) ProtoReflect() protoreflect.Message {
	if w == nil {
		return &wireFrameReflect{Message: wireFrameZero}
	}
	return &w.r
}

// wireFrameReflect is a wireFrame's reflective view: the descriptor and
// type of edged.cluster.Frame, and the fast-path methods protobuf calls to
// marshal and unmarshal it. The reflective accessors see an empty,
// read-only message (wireFrameZero): nothing but the fast paths reads or
// writes a frame.
type wireFrameReflect struct {
	protoreflect.Message
	w *wireFrame
}

func (m *wireFrameReflect) Interface() protoreflect.ProtoMessage { return m.w }
func (m *wireFrameReflect) Type() protoreflect.MessageType       { return wireFrameType{} }
func (m *wireFrameReflect) New() protoreflect.Message            { return newWireFrameOf(nil, nil).ProtoReflect() }
func (m *wireFrameReflect) IsValid() bool                        { return m.w != nil }
func (m *wireFrameReflect) ProtoMethods() *protoiface.Methods    { return &wireFrameMethods }

// errFrameHandedOver refuses to marshal a frame whose pooled buffer was
// handed over already: protoactor marshals a frame once, and a frame it
// marshalled again (after a failed send) would carry whatever the
// recycled buffer holds by then. Refused, the frame is lost, which the
// channel detects: a gap, or at its tail the acknowledgement timeout.
var errFrameHandedOver = errors.New("cluster: frame buffer already handed over")

// wireFrameMethods has no Size: proto.Marshal would allocate a buffer of
// that size for Marshal to fill, the copy wireFrame avoids.
var wireFrameMethods = protoiface.Methods{
	Marshal: func(in protoiface.MarshalInput) (protoiface.MarshalOutput, error) {
		w := in.Message.(*wireFrameReflect).w
		if w.pooled {
			if w.handedOver {
				return protoiface.MarshalOutput{}, errFrameHandedOver
			}
			w.handedOver = true
			if len(in.Buf) == 0 {
				lent.lend(w.enc)
				return protoiface.MarshalOutput{Buf: w.enc}, nil
			}
			out := append(in.Buf, w.enc...)
			putBuf(w.enc)
			return protoiface.MarshalOutput{Buf: out}, nil
		}
		if len(in.Buf) == 0 {
			return protoiface.MarshalOutput{Buf: w.enc}, nil
		}
		return protoiface.MarshalOutput{Buf: append(in.Buf, w.enc...)}, nil
	},
	Unmarshal: func(in protoiface.UnmarshalInput) (protoiface.UnmarshalOutput, error) {
		w := in.Message.(*wireFrameReflect).w
		b := in.Buf
		for len(b) > 0 {
			num, typ, n := protowire.ConsumeTag(b)
			if n < 0 {
				return protoiface.UnmarshalOutput{}, protowire.ParseError(n)
			}
			if num == 1 && typ == protowire.BytesType {
				v, m := protowire.ConsumeBytes(b[n:])
				if m < 0 {
					return protoiface.UnmarshalOutput{}, protowire.ParseError(m)
				}
				w.enc, w.frame = in.Buf, v
				b = b[n+m:]
				continue
			}
			m := protowire.ConsumeFieldValue(num, typ, b[n:])
			if m < 0 {
				return protoiface.UnmarshalOutput{}, protowire.ParseError(m)
			}
			b = b[n+m:]
		}
		return protoiface.UnmarshalOutput{Flags: protoiface.UnmarshalInitialized}, nil
	},
	CheckInitialized: func(protoiface.CheckInitializedInput) (protoiface.CheckInitializedOutput, error) {
		return protoiface.CheckInitializedOutput{}, nil
	},
}

// wireFrameType is edged.cluster.Frame's message type, registered with
// protobuf's global registry, where protoactor looks up the types it
// receives by name.
type wireFrameType struct{}

func (wireFrameType) New() protoreflect.Message                  { return newWireFrameOf(nil, nil).ProtoReflect() }
func (wireFrameType) Zero() protoreflect.Message                 { return (*wireFrame)(nil).ProtoReflect() }
func (wireFrameType) Descriptor() protoreflect.MessageDescriptor { return wireFrameDesc }

var wireFrameDesc = func() protoreflect.MessageDescriptor {
	fd, err := protodesc.NewFile(&descriptorpb.FileDescriptorProto{
		Name:    proto.String("edged/cluster/frame.proto"),
		Package: proto.String("edged.cluster"),
		Syntax:  proto.String("proto3"),
		MessageType: []*descriptorpb.DescriptorProto{{
			Name: proto.String("Frame"),
			Field: []*descriptorpb.FieldDescriptorProto{{
				Name:     proto.String("value"),
				JsonName: proto.String("value"),
				Number:   proto.Int32(1),
				Label:    descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum(),
				Type:     descriptorpb.FieldDescriptorProto_TYPE_BYTES.Enum(),
			}},
		}},
	}, protoregistry.GlobalFiles)
	if err != nil {
		panic(fmt.Sprintf("cluster: frame descriptor: %v", err))
	}
	md := fd.Messages().Get(0)
	if md.FullName() != wireFrameName {
		panic(fmt.Sprintf("cluster: frame descriptor named %s, not %s", md.FullName(), wireFrameName))
	}
	return md
}()

// wireFrameZero is an empty, read-only edged.cluster.Frame: the
// reflective view of every wireFrame.
var wireFrameZero = dynamicpb.NewMessageType(wireFrameDesc).Zero()

func init() {
	if err := protoregistry.GlobalTypes.RegisterMessage(wireFrameType{}); err != nil && !errors.Is(err, protoregistry.NotFound) {
		panic(fmt.Sprintf("cluster: register %s: %v", wireFrameName, err))
	}
}
