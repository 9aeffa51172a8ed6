package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/edgedio/edged/actors"
)

// Network is one node's end of the cross-node channels of the jobs it
// runs: it implements actors.Network over an Endpoint, so that the task
// host of package actors opens channels by their plan-derived ids and
// never sees a transport. Node ids of the placement table are mapped to
// transport addresses by SetPeer (an unmapped id is used as the address,
// as on a MemoryNetwork).
//
// Time enters through Tick (receivers repeat acknowledgements, senders
// time out missing ones); Start runs a ticker until Stop.
//
// Safe for concurrent use.
type Network struct {
	node string
	cfg  ChannelConfig
	ep   *Endpoint

	mu    sync.Mutex // guards peers and fails
	peers map[string]string
	fails map[chanEnd]func(error)

	// sent adds up what the senders closed so far transmitted.
	sentMu sync.Mutex // guards sent and control
	sent   SenderStats
	// control adds up what the closed control channels between a job
	// master and its task hosts transmitted (a batch is one message).
	control SenderStats

	tickMu sync.Mutex // guards stop and wg's use
	stop   chan struct{}
	wg     sync.WaitGroup
}

// NewNetwork returns the network of node node, with channels configured by
// cfg (which must be valid). log may be nil. It starts nothing: attach a
// transport whose Handler is Endpoint().
func NewNetwork(node string, cfg ChannelConfig, log *slog.Logger) *Network {
	n := &Network{node: node, cfg: cfg, peers: map[string]string{}, fails: map[chanEnd]func(error){}}
	n.ep = NewEndpoint(cfg, log, nil)
	n.ep.onFailEnd = n.failed
	return n
}

// Node returns the node's id.
func (n *Network) Node() string { return n.node }

// Endpoint returns the network's endpoint: the Handler to give the
// transport.
func (n *Network) Endpoint() *Endpoint { return n.ep }

// Attach sets the transport the network sends on.
func (n *Network) Attach(tr Transport) { n.ep.Attach(tr) }

// SetPeer maps node id to the transport address addr.
func (n *Network) SetPeer(id, addr string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.peers[id] = addr
}

// ControlSent returns what the control channels closed so far
// transmitted, added up like Sent: each batch is one message between a job
// master and a task host.
func (n *Network) ControlSent() SenderStats {
	n.sentMu.Lock()
	defer n.sentMu.Unlock()
	return n.control
}

// Sent returns what the data channels closed so far transmitted, added
// up (MaxInFlight is the largest of any one channel); control channels
// are counted apart (ControlSent).
func (n *Network) Sent() SenderStats {
	n.sentMu.Lock()
	defer n.sentMu.Unlock()
	return n.sent
}

// Tick steps every channel with the time.
func (n *Network) Tick(now time.Time) { n.ep.Tick(now) }

// Start ticks the network every interval, on a goroutine of its own, until
// Stop.
func (n *Network) Start(interval time.Duration) {
	n.tickMu.Lock()
	defer n.tickMu.Unlock()
	if n.stop != nil {
		return
	}
	stop := make(chan struct{})
	n.stop = stop
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case now := <-t.C:
				n.Tick(now)
			case <-stop:
				return
			}
		}
	}()
}

// Stop stops the ticker started by Start and waits for it.
func (n *Network) Stop() {
	n.tickMu.Lock()
	defer n.tickMu.Unlock()
	if n.stop == nil {
		return
	}
	close(n.stop)
	n.wg.Wait()
	n.stop = nil
}

// Fingerprint returns the hex fingerprint of j's plan (FingerprintOf),
// then, after a space, the channel settings two nodes must share
// (ChannelConfig.Shared): a receiver holds its sender to its own credits,
// so a node whose credits differ from the job master's is refused at
// deployment (actors.ErrPlanMismatch, naming the setting) instead of
// failing every channel from a node with more.
func (n *Network) Fingerprint(j *actors.Job) (string, error) {
	fp, err := FingerprintOf(j)
	if err != nil {
		return "", err
	}
	return fp.String() + " " + n.cfg.Shared(), nil
}

func (n *Network) addr(peer string) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if a, ok := n.peers[peer]; ok {
		return a
	}
	return peer
}

func channelID(k actors.ChannelKey) (ChannelID, error) {
	edge, err := edgeWithGen(k.Edge, k.Gen)
	if err != nil {
		return ChannelID{}, err
	}
	return ChannelID{Job: k.Job, Epoch: k.Epoch, Edge: edge, From: k.From, To: k.To}, nil
}

// OpenSender opens the sending end of channel key towards node peer.
func (n *Network) OpenSender(key actors.ChannelKey, peer string, onFail func(error)) (actors.RemoteSender, error) {
	id, err := channelID(key)
	if err != nil {
		return nil, err
	}
	if len(id.Job) > MaxJobName {
		return nil, fmt.Errorf("%w: job name of %d bytes exceeds %d", ErrCorruptFrame, len(id.Job), MaxJobName)
	}
	n.setFail(chanEnd{id, true}, onFail)
	return &netSender{n: n, id: id, c: n.ep.OpenSender(id, n.addr(peer))}, nil
}

// OpenReceiver opens the receiving end of channel key from node peer.
func (n *Network) OpenReceiver(key actors.ChannelKey, peer string, deliver func(actors.RemoteFrame), onFail func(error)) (actors.RemoteReceiver, error) {
	id, err := channelID(key)
	if err != nil {
		return nil, err
	}
	if len(id.Job) > MaxJobName {
		return nil, fmt.Errorf("%w: job name of %d bytes exceeds %d", ErrCorruptFrame, len(id.Job), MaxJobName)
	}
	n.setFail(chanEnd{id, false}, onFail)
	c := n.ep.OpenReceiver(id, n.addr(peer), func(f Frame) {
		deliver(actors.RemoteFrame{Seq: f.Seq, Kind: frameKindOf(f.Kind), Value: f.Value, Body: f.Body})
	})
	return &netReceiver{n: n, id: id, c: c}, nil
}

// chanEnd names one end of a channel: both ends of a channel may be open
// on one node (the control channels of the host on the master's node).
type chanEnd struct {
	id  ChannelID
	out bool
}

func (n *Network) setFail(e chanEnd, onFail func(error)) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if onFail != nil {
		n.fails[e] = onFail
	}
}

func (n *Network) failed(id ChannelID, out bool, err error) {
	e := chanEnd{id, out}
	n.mu.Lock()
	f := n.fails[e]
	delete(n.fails, e)
	n.mu.Unlock()
	if f != nil {
		f(err)
	}
}

func (n *Network) close(id ChannelID, out bool) {
	n.mu.Lock()
	delete(n.fails, chanEnd{id, out})
	n.mu.Unlock()
	n.ep.CloseEnd(id, out)
}

// kindOf maps a frame kind of package actors to the frame's kind (0 for
// an unknown one, which the sender refuses).
func kindOf(k actors.FrameKind) Kind {
	switch k {
	case actors.FrameBatch:
		return KindBatch
	case actors.FrameWatermark:
		return KindWatermark
	case actors.FrameStatus:
		return KindStatus
	case actors.FrameBarrier:
		return KindBarrier
	case actors.FrameEnd:
		return KindEndOfStream
	}
	return 0
}

// frameKindOf maps a frame's kind to package actors' (0 for an ack).
func frameKindOf(k Kind) actors.FrameKind {
	switch k {
	case KindBatch:
		return actors.FrameBatch
	case KindWatermark:
		return actors.FrameWatermark
	case KindStatus:
		return actors.FrameStatus
	case KindBarrier:
		return actors.FrameBarrier
	case KindEndOfStream:
		return actors.FrameEnd
	}
	return 0
}

type netSender struct {
	n  *Network
	id ChannelID
	c  *OutChannel
}

// Send sends one message. A record batch of a data channel may join the
// batch before it while that one waits for credit (Send.Merge): the
// receiving task's decoder splits the wire batches of a frame. A control
// channel's batch is one message, never merged.
func (s *netSender) Send(ctx context.Context, kind actors.FrameKind, value int64, body []byte) error {
	merge := kind == actors.FrameBatch && !isControl(s.id.Edge)
	return s.c.Send(ctx, Send{Kind: kindOf(kind), Value: value, Body: body, Merge: merge})
}

// isControl reports whether edge is one of the control channels' between
// a job master and its task hosts.
func isControl(edge int) bool { return edge == actors.ControlEdgeUp || edge == actors.ControlEdgeDown }

func (s *netSender) MaxBody() int { return s.n.cfg.MaxBatchBytes() }

func (s *netSender) Close() {
	st := s.c.Stats()
	s.n.sentMu.Lock()
	if isControl(s.id.Edge) {
		s.n.control.Frames += st.Frames
		s.n.control.Batches += st.Batches
		s.n.control.Bytes += st.Bytes
		s.n.control.MaxInFlight = max(s.n.control.MaxInFlight, st.MaxInFlight)
		s.n.sentMu.Unlock()
		s.n.close(s.id, true)
		return
	}
	s.n.sent.Frames += st.Frames
	s.n.sent.Batches += st.Batches
	s.n.sent.Bytes += st.Bytes
	s.n.sent.Merged += st.Merged
	s.n.sent.MaxInFlight = max(s.n.sent.MaxInFlight, st.MaxInFlight)
	s.n.sentMu.Unlock()
	s.n.close(s.id, true)
}

type netReceiver struct {
	n  *Network
	id ChannelID
	c  *InChannel
}

func (r *netReceiver) Processed(seq uint64) { r.c.Processed(seq) }

func (r *netReceiver) Close() { r.n.close(r.id, false) }

var _ actors.Network = (*Network)(nil)
