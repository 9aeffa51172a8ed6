package cluster

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/eventstream"
	"github.com/asynkron/protoactor-go/remote"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// frameActorName is the name under which every node receives its peers'
// frames: a process that hands each frame to the Handler on the goroutine
// of protoactor's endpoint reader (one per peer connection), with no
// mailbox between.
const frameActorName = "edged-frames"

// selfActorName is the name of the actor that receives the frames a node
// sends to itself (both ends of a control channel on the job master's
// node). They go through a mailbox: handled on the sending goroutine, a
// frame's acknowledgement would step the sender that is transmitting it.
const selfActorName = "edged-frames-self"

// startMu serialises remote.Start within the process. Start sets gRPC's
// global logger (grpclog.SetLoggerV2) on every call, which races with the
// logging of a remote already serving: an upstream data race that only
// shows with several nodes in one process, as in tests. Holding startMu
// keeps two Starts apart; it cannot keep a Start apart from gRPC's own
// goroutines, so tests of several remotes in one process still report
// that race under -race.
var startMu sync.Mutex

// ioBufferBytes is the size of gRPC's read and write buffers on a
// connection: a message of several frames goes out in a few system calls
// rather than one per 32 KiB (gRPC's default).
const ioBufferBytes = 256 << 10

// envelopeOverhead bounds what protoactor adds around one frame in a gRPC
// message: the edged.cluster.Frame wrapper (see wireFrame) and the message
// envelope's ids.
const envelopeOverhead = 128

// RemoteConfig configures a RemoteTransport. Start from
// DefaultRemoteConfig. The YAML keys are under cluster.transport.
type RemoteConfig struct {
	// Host is the address to listen on. Default 127.0.0.1.
	Host string
	// Port is the port to listen on; 0 picks a free one. Default 0.
	Port int
	// AdvertisedHost, if set, is the host:port peers reach this node at.
	AdvertisedHost string
	// MaxFrameBytes is the largest frame sent, in bytes: the channels'
	// ChannelConfig.MaxFrameBytes. Default 256 KiB.
	MaxFrameBytes int
	// MaxMessageBytes is gRPC's largest message, in bytes: protoactor
	// packs up to WriterBatchSize frames into one. It is also the HTTP/2
	// flow-control window of a connection and its stream, so that a whole
	// message goes out without waiting for a window update (the channels'
	// credits bound what is in flight). Default 4 MiB, gRPC's own default.
	MaxMessageBytes int
	// WriterQueueSize is the initial size of the queue of frames waiting
	// for a peer's connection (it grows). Default 4096.
	WriterQueueSize int
	// ConnectRetries is how often a connection to a peer is tried, two
	// seconds apart, before the peer counts as disconnected. Default 5.
	ConnectRetries int
	// Logger receives the transport's logs, protoactor's at warning and
	// above. Default: discard.
	Logger *slog.Logger
}

// DefaultRemoteConfig returns the default remote transport configuration.
func DefaultRemoteConfig() RemoteConfig {
	return RemoteConfig{
		Host:            "127.0.0.1",
		MaxFrameBytes:   DefaultChannelConfig().MaxFrameBytes,
		MaxMessageBytes: 4 << 20,
		WriterQueueSize: 4096,
		ConnectRetries:  5,
		Logger:          slog.New(slog.DiscardHandler),
	}
}

// WriterBatchSize returns how many frames protoactor's endpoint writer may
// pack into one gRPC message: as many as fit, at the largest frame size,
// in three quarters of MaxMessageBytes. Left at protoactor's default of
// 1000, 24 KiB frames overflow gRPC's 4 MiB limit and every frame of the
// message is lost.
func (c RemoteConfig) WriterBatchSize() int {
	return max(1, c.MaxMessageBytes/4*3/(c.MaxFrameBytes+envelopeOverhead))
}

// Validate reports every problem of c at once, naming the YAML keys.
func (c RemoteConfig) Validate() error {
	var errs []error
	if c.Host == "" {
		errs = append(errs, errors.New("cluster.transport.host must be set"))
	}
	if c.Port < 0 || c.Port > 65535 {
		errs = append(errs, fmt.Errorf("cluster.transport.port (%d) must be 0 to 65535", c.Port))
	}
	if c.MaxFrameBytes < 2*FrameOverhead {
		errs = append(errs, fmt.Errorf("cluster.transport.max_frame_bytes (%d) must be at least %d", c.MaxFrameBytes, 2*FrameOverhead))
	}
	if c.MaxFrameBytes+envelopeOverhead > c.MaxMessageBytes/4*3 {
		errs = append(errs, fmt.Errorf("cluster.transport.max_frame_bytes (%d) must leave room in three quarters of cluster.transport.max_message_bytes (%d)", c.MaxFrameBytes, c.MaxMessageBytes))
	}
	if c.WriterQueueSize < 1 {
		errs = append(errs, fmt.Errorf("cluster.transport.writer_queue_size (%d) must be at least 1", c.WriterQueueSize))
	}
	if c.ConnectRetries < 1 {
		errs = append(errs, fmt.Errorf("cluster.transport.connect_retries (%d) must be at least 1", c.ConnectRetries))
	}
	if c.Logger == nil {
		errs = append(errs, errors.New("logger must be set"))
	}
	return errors.Join(errs...)
}

// RemoteTransport carries frames between nodes on protoactor-go's remote
// package: one actor system per node, one gRPC stream per peer, every
// frame wrapped in a protobuf message of its own, edged.cluster.Frame,
// encoded once (see wireFrame). protoactor reports a lost
// connection with an EndpointTerminatedEvent, which the transport passes
// to its Handler as a disconnect. Delivery is at most once.
//
// Safe for concurrent use after Start.
type RemoteTransport struct {
	cfg RemoteConfig
	h   Handler

	mu      sync.Mutex // guards system, remote, sub, pids and stopped
	system  *actor.ActorSystem
	remote  *remote.Remote
	sub     *eventstream.Subscription
	pids    map[string]*actor.PID
	self    *actor.PID
	stopped bool

	wireBytes, wireWrites atomic.Int64 // on the connections the node dialled
}

// WireStats counts what a node wrote on the connections it opened to its
// peers: every frame it sent, with protoactor's envelopes and gRPC's and
// HTTP/2's framing (everything above TCP). Every field only grows.
type WireStats struct {
	// Bytes counts the bytes written.
	Bytes int64
	// Writes counts the write calls: system calls, roughly.
	Writes int64
}

// WireStats returns what the node wrote to its peers so far.
func (t *RemoteTransport) WireStats() WireStats {
	return WireStats{Bytes: t.wireBytes.Load(), Writes: t.wireWrites.Load()}
}

// dial opens a connection to a peer that counts what is written on it.
func (t *RemoteTransport) dial(ctx context.Context, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: c, t: t}, nil
}

// countingConn counts the bytes and writes of a connection.
type countingConn struct {
	net.Conn
	t *RemoteTransport
}

func (c *countingConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.t.wireBytes.Add(int64(n))
	c.t.wireWrites.Add(1)
	return n, err
}

// NewRemoteTransport returns a transport delivering to h. It starts
// nothing: call Start.
func NewRemoteTransport(cfg RemoteConfig, h Handler) *RemoteTransport {
	return &RemoteTransport{cfg: cfg, h: h, pids: map[string]*actor.PID{}}
}

// Start starts the actor system and listens. The Handler may be called as
// soon as it returns.
func (t *RemoteTransport) Start() (err error) {
	if err := t.cfg.Validate(); err != nil {
		return fmt.Errorf("remote transport: %w", err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.system != nil {
		return errors.New("remote transport: already started")
	}
	logger := t.cfg.Logger
	// A dead letter's throttle goroutine lives one interval (1 s by
	// default); protoactor logs dead letters at Info, which warnOnly
	// drops anyway.
	system := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(warnOnly{logger.Handler()}).With("component", "protoactor")
	}), actor.WithDeadLetterThrottleInterval(time.Millisecond))
	win := int32(t.cfg.MaxMessageBytes)
	rc := remote.Configure(t.cfg.Host, t.cfg.Port,
		remote.WithDialOptions(
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithContextDialer(t.dial),
			grpc.WithInitialWindowSize(win),
			grpc.WithInitialConnWindowSize(win),
			grpc.WithWriteBufferSize(ioBufferBytes),
			grpc.WithReadBufferSize(ioBufferBytes),
		),
		remote.WithServerOptions(t.serverOptions(win)...),
		// Frames are encoded into pooled buffers, which the codec
		// recycles once it has copied them into the message, itself a
		// pooled buffer that gRPC recycles once it has written it.
		remote.WithCallOptions(grpc.ForceCodecV2(frameCodec{})),
		remote.WithEndpointWriterBatchSize(t.cfg.WriterBatchSize()),
		remote.WithEndpointWriterQueueSize(t.cfg.WriterQueueSize),
		remote.WithEndpointManagerQueueSize(t.cfg.WriterQueueSize),
	)
	if t.cfg.AdvertisedHost != "" {
		rc.AdvertisedHost = t.cfg.AdvertisedHost
	}
	rc.MaxRetryCount = t.cfg.ConnectRetries
	r := remote.NewRemote(system, rc)
	defer func() {
		// remote.Start panics when it cannot listen.
		if p := recover(); p != nil {
			system.Shutdown()
			err = fmt.Errorf("remote transport: start on %s:%d: %v", t.cfg.Host, t.cfg.Port, p)
		}
	}()
	startMu.Lock()
	func() {
		defer startMu.Unlock()
		r.Start()
	}()
	h := t.h
	if _, ok := system.ProcessRegistry.Add(&frameProcess{h: h}, frameActorName); !ok {
		r.Shutdown(false)
		system.Shutdown()
		return fmt.Errorf("remote transport: register %s: name taken", frameActorName)
	}
	props := actor.PropsFromProducer(func() actor.Actor { return &frameActor{h: h} })
	self, err := system.Root.SpawnNamed(props, selfActorName)
	if err != nil {
		r.Shutdown(false)
		system.Shutdown()
		return fmt.Errorf("remote transport: spawn %s: %w", selfActorName, err)
	}
	t.sub = system.EventStream.Subscribe(func(evt any) {
		if e, ok := evt.(*remote.EndpointTerminatedEvent); ok {
			h.HandleDisconnect(e.Address, fmt.Errorf("%w: connection to %s lost", ErrDisconnected, e.Address))
		}
	})
	t.system, t.remote, t.self = system, r, self
	logger.Info("remote transport started", "node", system.Address(), "writer_batch_size", t.cfg.WriterBatchSize())
	return nil
}

// serverOptions returns the gRPC options of the node's server. It
// decodes frames as slices of the message they arrived in (see
// frameCodec). For a RetainingHandler that message is in a pooled
// buffer, recycled once every frame in it was handled (see rxBuf);
// otherwise every message is in a buffer of its own.
func (t *RemoteTransport) serverOptions(win int32) []grpc.ServerOption {
	_, retain := t.h.(RetainingHandler)
	return []grpc.ServerOption{
		grpc.InitialWindowSize(win),
		grpc.InitialConnWindowSize(win),
		grpc.WriteBufferSize(ioBufferBytes),
		grpc.ReadBufferSize(ioBufferBytes),
		grpc.ForceServerCodecV2(frameCodec{alias: true, retain: retain}),
	}
}

// Addr returns the host:port peers send to; "" before Start.
func (t *RemoteTransport) Addr() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.system == nil {
		return ""
	}
	return t.system.Address()
}

// Send queues frame for the node at address to.
func (t *RemoteTransport) Send(to string, frame []byte) error {
	if len(frame) > t.cfg.MaxFrameBytes {
		return fmt.Errorf("%w: %d bytes, limit %d", ErrFrameTooLarge, len(frame), t.cfg.MaxFrameBytes)
	}
	return t.send(to, newWireFrame(frame))
}

// SendFrame encodes f and queues it for the node at address to, as Send
// does with its encoding: the frame is encoded once, into the buffer
// protoactor sends (see wireFrame). A frame to a peer is encoded into a
// pooled buffer, recycled once the codec has copied it (see frameCodec).
func (t *RemoteTransport) SendFrame(to string, f *Frame) error {
	n := f.EncodedSize()
	if n > t.cfg.MaxFrameBytes {
		return fmt.Errorf("%w: %d bytes, limit %d", ErrFrameTooLarge, n, t.cfg.MaxFrameBytes)
	}
	pid, root, self, err := t.target(to)
	if err != nil {
		return err
	}
	size := wireFrameOverhead + n
	pooled := !self && size >= minPooled
	var buf []byte
	if pooled {
		buf = getBuf(size)
	} else {
		buf = make([]byte, 0, size)
	}
	w, err := appendWireFrame(buf, f)
	if err != nil {
		if pooled {
			putBuf(buf)
		}
		return err
	}
	w.pooled = pooled
	root.Send(pid, w)
	return nil
}

// wireFrameOverhead bounds what a wireFrame's encoding adds to its frame.
const wireFrameOverhead = 1 + binary.MaxVarintLen64

func (t *RemoteTransport) send(to string, w *wireFrame) error {
	pid, root, _, err := t.target(to)
	if err != nil {
		return err
	}
	root.Send(pid, w)
	return nil
}

// target returns the process frames for the node at address to go to,
// the root context to send them with, and whether to is this node.
func (t *RemoteTransport) target(to string) (pid *actor.PID, root *actor.RootContext, self bool, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.system == nil || t.stopped {
		return nil, nil, false, ErrTransportClosed
	}
	pid = t.pids[to]
	if pid == nil {
		pid = actor.NewPID(to, frameActorName)
		if to == t.system.Address() {
			pid = t.self
		}
		t.pids[to] = pid
	}
	return pid, t.system.Root, pid == t.self, nil
}

// Stop stops the transport. With graceful false it drops its connections at
// once, as a crash would; with graceful true it lets gRPC finish what it
// is sending, for up to ctx's deadline. No Handler call starts after Stop
// returns... except those of frames already received, which the stopped
// actor system drops.
func (t *RemoteTransport) Stop(ctx context.Context, graceful bool) {
	t.mu.Lock()
	if t.system == nil || t.stopped {
		t.mu.Unlock()
		return
	}
	t.stopped = true
	system, r, sub := t.system, t.remote, t.sub
	t.mu.Unlock()
	system.EventStream.Unsubscribe(sub)
	if graceful {
		done := make(chan struct{})
		go func() {
			defer close(done)
			r.Shutdown(true)
		}()
		select {
		case <-done:
		case <-ctx.Done():
			r.Shutdown(false)
			<-done
		}
	} else {
		r.Shutdown(false)
	}
	system.Shutdown()
}

// frameProcess hands the frames arriving from a peer to the Handler on
// the goroutine of protoactor's endpoint reader for that peer: one at a
// time, in the order they arrived, without the hop through a mailbox (and
// its goroutine wake-up) an actor would add to every frame.
type frameProcess struct{ h Handler }

func (p *frameProcess) SendUserMessage(_ *actor.PID, message any) {
	if e, ok := message.(*actor.MessageEnvelope); ok {
		message = e.Message
	}
	if w, ok := message.(*wireFrame); ok {
		if rh, ok := p.h.(RetainingHandler); ok {
			if b := rxBufs.claim(w.frame); b != nil {
				rh.HandleFrameRetained(w.frame, b)
				return
			}
		}
	}
	if f := frameOf(message); f != nil {
		p.h.HandleFrame(f)
	}
}

// frameOf returns the frame a message carries: a wireFrame's, or a
// BytesValue's (as nodes of earlier versions send them); nil for any
// other message.
func frameOf(message any) []byte {
	switch m := message.(type) {
	case *wireFrame:
		return m.frame
	case *wrapperspb.BytesValue:
		return m.Value
	}
	return nil
}

func (p *frameProcess) SendSystemMessage(*actor.PID, any) {}

func (p *frameProcess) Stop(*actor.PID) {}

// frameActor hands the frames a node sends itself to the Handler, one at a
// time, in the order its mailbox received them.
type frameActor struct{ h Handler }

func (a *frameActor) Receive(ctx actor.Context) {
	if f := frameOf(ctx.Message()); f != nil {
		a.h.HandleFrame(f)
	}
}

// warnOnly passes on log records at warning level and above: protoactor
// logs every connection at info.
type warnOnly struct{ slog.Handler }

func (h warnOnly) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn && h.Handler.Enabled(ctx, l)
}

func (h warnOnly) WithAttrs(as []slog.Attr) slog.Handler { return warnOnly{h.Handler.WithAttrs(as)} }
func (h warnOnly) WithGroup(name string) slog.Handler    { return warnOnly{h.Handler.WithGroup(name)} }
