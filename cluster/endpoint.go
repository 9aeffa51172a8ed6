package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// Endpoint runs the cross-node channels of one node over a Transport: it
// encodes what the senders transmit, decodes what arrives and steps the
// channel's machine with it, and turns a lost connection into the failure
// of every channel with that peer. It is the Handler of its transport.
//
// Acknowledgements are stepped on the transport's goroutine, not the
// sending task's: a task blocked in OutChannel.Send on credit is woken by
// them.
//
// Safe for concurrent use.
type Endpoint struct {
	cfg    ChannelConfig
	log    *slog.Logger
	onFail func(ChannelID, error)
	// onFailEnd, if set, is called like onFail with the failed end: out
	// for a sender.
	onFailEnd func(id ChannelID, out bool, err error)

	mu        sync.RWMutex // guards tr, out and in (the maps; each channel guards its machine)
	tr        Transport
	out       map[Link]*OutChannel
	in        map[Link]*InChannel
	unrouted  atomic.Int64 // frames for no open channel
	corrupted atomic.Int64 // frames that did not decode

	earlyMu sync.Mutex // guards early
	// early counts, by channel, the frames that arrived while the
	// channel's receiving end was not open (none, or one of an older
	// epoch on the link) and were dropped: a gap the channel's receiver
	// finds at its start is then explained in its error. At most
	// maxEarlyChannels channels, the oldest epochs evicted first.
	early map[ChannelID]int64
}

// maxEarlyChannels bounds the channels Endpoint.early remembers.
const maxEarlyChannels = 64

// NewEndpoint returns an endpoint with channels configured by cfg (which
// must be valid). onFail, if not nil, is called once per failed channel,
// from whichever goroutine stepped it; it must not block. log may be nil.
func NewEndpoint(cfg ChannelConfig, log *slog.Logger, onFail func(ChannelID, error)) *Endpoint {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Endpoint{cfg: cfg, log: log, onFail: onFail, out: map[Link]*OutChannel{}, in: map[Link]*InChannel{}}
}

// Attach sets the transport the endpoint sends on; call it once, before
// opening channels.
func (e *Endpoint) Attach(tr Transport) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.tr = tr
}

// Unrouted returns the number of frames that arrived for no open channel.
func (e *Endpoint) Unrouted() int64 { return e.unrouted.Load() }

// Corrupted returns the number of frames that did not decode. The frame
// after a corrupt one shows as a gap on its channel.
func (e *Endpoint) Corrupted() int64 { return e.corrupted.Load() }

// OpenSender opens the sending end of channel id, whose receiver runs on
// node peer. A channel of the same link in an older epoch is replaced.
func (e *Endpoint) OpenSender(id ChannelID, peer string) *OutChannel {
	c := &OutChannel{ep: e, peer: peer, m: NewSender(id, e.cfg), wake: make(chan struct{}, 1)}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.out[id.Link()] = c
	return c
}

// OpenReceiver opens the receiving end of channel id, whose sender runs on
// node peer. deliver is called with the channel's frames in sequence, from
// the transport's goroutine, and must not block (it hands the frame to the
// task's mailbox); the task reports what it processed with
// InChannel.Processed. The frame's Body is the deliver function's.
func (e *Endpoint) OpenReceiver(id ChannelID, peer string, deliver func(Frame)) *InChannel {
	c := &InChannel{ep: e, peer: peer, m: NewReceiver(id, e.cfg), deliver: deliver}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.in[id.Link()] = c
	return c
}

// Close closes both ends of link l on this node, if open.
func (e *Endpoint) Close(l Link) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.out, l)
	delete(e.in, l)
}

// CloseChannel closes the ends of channel id on this node, if they are
// open in id's epoch: a channel of the same link in a newer epoch stays.
func (e *Endpoint) CloseChannel(id ChannelID) {
	l := id.Link()
	e.forgetEarly(id)
	e.mu.Lock()
	defer e.mu.Unlock()
	if c := e.out[l]; c != nil && c.m.ID() == id {
		delete(e.out, l)
	}
	if c := e.in[l]; c != nil && c.m.ID() == id {
		delete(e.in, l)
	}
}

// CloseEnd closes one end of channel id on this node, the sender's if out,
// if it is open in id's epoch. Both ends of one channel may be open on one
// endpoint (the control channels of a host on the job master's node).
func (e *Endpoint) CloseEnd(id ChannelID, out bool) {
	l := id.Link()
	if !out {
		e.forgetEarly(id)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if c := e.out[l]; out && c != nil && c.m.ID() == id {
		delete(e.out, l)
	}
	if c := e.in[l]; !out && c != nil && c.m.ID() == id {
		delete(e.in, l)
	}
}

// Tick steps every channel with the time: receivers repeat their
// acknowledgements, senders time out missing ones. The owner calls it
// periodically (every AckInterval/2 or more often).
func (e *Endpoint) Tick(now time.Time) {
	for _, c := range e.outs("") {
		c.step(Tick{Now: now})
	}
	for _, c := range e.ins("") {
		c.step(Tick{Now: now})
	}
}

// HandleFrame decodes a frame and steps its channel with it.
func (e *Endpoint) HandleFrame(data []byte) { e.handleFrame(data, nil) }

// HandleFrameRetained is HandleFrame for a frame in a recycled buffer: r
// is released once the frame was handled, or, for a batch delivered to a
// task, once the task reported that batch processed.
func (e *Endpoint) HandleFrameRetained(data []byte, r Releaser) { e.handleFrame(data, r) }

func (e *Endpoint) handleFrame(data []byte, r Releaser) {
	f, err := DecodeFrame(data)
	if err != nil {
		e.corrupted.Add(1)
		e.log.Warn("corrupt frame dropped", "err", err)
		release(r)
		return
	}
	e.mu.RLock()
	var out *OutChannel
	var in *InChannel
	if f.Kind == KindAck {
		out = e.out[f.Channel.Link()]
	} else {
		in = e.in[f.Channel.Link()]
	}
	e.mu.RUnlock()
	switch {
	case out != nil:
		out.step(Receive{Frame: f})
		release(r)
	case in != nil:
		if f.Channel.Epoch > in.ID().Epoch {
			// The link's receiver is of an older epoch: it drops the
			// frame.
			e.noteEarly(f.Channel)
		}
		in.receive(f, r)
	default:
		e.unrouted.Add(1)
		if f.Kind != KindAck {
			e.noteEarly(f.Channel)
		}
		release(r)
	}
}

// noteEarly counts a frame of channel id dropped because the channel's
// receiving end was not open.
func (e *Endpoint) noteEarly(id ChannelID) {
	e.earlyMu.Lock()
	defer e.earlyMu.Unlock()
	if e.early == nil {
		e.early = make(map[ChannelID]int64)
	}
	if _, ok := e.early[id]; !ok && len(e.early) >= maxEarlyChannels {
		var oldest ChannelID
		first := true
		for k := range e.early {
			if first || k.Epoch < oldest.Epoch {
				oldest, first = k, false
			}
		}
		delete(e.early, oldest)
	}
	e.early[id]++
}

// takeEarly returns and forgets the number of frames of channel id
// dropped before its receiving end opened.
func (e *Endpoint) takeEarly(id ChannelID) int64 {
	e.earlyMu.Lock()
	defer e.earlyMu.Unlock()
	n := e.early[id]
	delete(e.early, id)
	return n
}

// forgetEarly forgets the frames of channel id dropped before its
// receiving end opened.
func (e *Endpoint) forgetEarly(id ChannelID) {
	e.earlyMu.Lock()
	defer e.earlyMu.Unlock()
	delete(e.early, id)
}

// release releases r, if any.
func release(r Releaser) {
	if r != nil {
		r.Release()
	}
}

// HandleDisconnect fails every channel with node.
func (e *Endpoint) HandleDisconnect(node string, err error) {
	e.log.Warn("peer disconnected", "node", node, "err", err)
	for _, c := range e.outs(node) {
		c.step(Disconnected{Reason: err})
	}
	for _, c := range e.ins(node) {
		c.step(Disconnected{Reason: err})
	}
}

// outs returns the open senders, to peer only unless peer is "".
func (e *Endpoint) outs(peer string) []*OutChannel {
	e.mu.RLock()
	defer e.mu.RUnlock()
	var cs []*OutChannel
	for _, c := range e.out {
		if peer == "" || c.peer == peer {
			cs = append(cs, c)
		}
	}
	return cs
}

func (e *Endpoint) ins(peer string) []*InChannel {
	e.mu.RLock()
	defer e.mu.RUnlock()
	var cs []*InChannel
	for _, c := range e.in {
		if peer == "" || c.peer == peer {
			cs = append(cs, c)
		}
	}
	return cs
}

// transmit encodes f and hands it to the transport. A local failure to send
// fails the channel through the returned error.
func (e *Endpoint) transmit(peer string, f *Frame) error {
	e.mu.RLock()
	tr := e.tr
	e.mu.RUnlock()
	if tr == nil {
		return fmt.Errorf("%w: endpoint has no transport", ErrTransportClosed)
	}
	if fs, ok := tr.(frameSender); ok {
		return fs.SendFrame(peer, f)
	}
	data, err := AppendFrame(make([]byte, 0, f.EncodedSize()), f)
	if err != nil {
		return err
	}
	return tr.Send(peer, data)
}

// frameSender is a Transport that encodes frames itself, into the buffer
// it sends (RemoteTransport): one copy of the frame fewer. SendFrame
// keeps nothing of f once it returns: the body's buffer may be recycled.
type frameSender interface {
	SendFrame(to string, f *Frame) error
}

func (e *Endpoint) failed(id ChannelID, out bool, err error) {
	if !out {
		if n := e.takeEarly(id); n > 0 {
			// A frame sent before the receiving end opened was lost: the
			// gap is the sender's (or the deployment's) doing, not the
			// network's.
			what := "1 frame of the channel"
			if n > 1 {
				what = fmt.Sprintf("%d frames of the channel", n)
			}
			err = fmt.Errorf("%w (%s arrived before its receiving end was open, and dropped)", err, what)
		}
	}
	e.log.Error("channel failed", "job", id.Job, "channel", id.String(), "err", err)
	if e.onFail != nil {
		e.onFail(id, err)
	}
	if e.onFailEnd != nil {
		e.onFailEnd(id, out, err)
	}
}

// OutChannel is the sending end of a channel on an Endpoint.
type OutChannel struct {
	ep   *Endpoint
	peer string
	mu   sync.Mutex // guards m, and keeps its transmissions in order
	m    *Sender
	wake chan struct{} // capacity 1: rung on Resume, Done and Fail
	// waits counts the times Send waited for credit.
	waits atomic.Int64
}

// ID returns the channel's ID.
func (c *OutChannel) ID() ChannelID { return c.m.ID() }

// Send sends one message. It blocks while the channel has no credit, until
// a Resume, a failure or ctx's end; it returns the channel's error once it
// failed. Called by the sending task only.
func (c *OutChannel) Send(ctx context.Context, m Send) error {
	for {
		c.mu.Lock()
		if err := c.m.Err(); err != nil {
			c.mu.Unlock()
			return err
		}
		if !c.m.Blocked() {
			break
		}
		c.mu.Unlock()
		c.waits.Add(1)
		select {
		case <-c.wake:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	fail := c.run(c.m.Step(m))
	err := c.m.Err()
	c.mu.Unlock()
	if fail != nil {
		c.ep.failed(c.m.ID(), true, fail)
	}
	return err
}

// Ready reports whether Send would not block: the channel has credit and
// has not failed.
func (c *OutChannel) Ready() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m.Err() == nil && !c.m.Blocked()
}

// InFlight returns the batches sent and not yet acknowledged.
func (c *OutChannel) InFlight() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m.InFlight()
}

// Waits returns how often Send waited for credit: backpressure.
func (c *OutChannel) Waits() int64 { return c.waits.Load() }

// Done reports whether the channel's end of stream was acknowledged.
func (c *OutChannel) Done() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m.done
}

// Err returns the channel's failure, or nil.
func (c *OutChannel) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m.Err()
}

// Stats returns the sender's counters.
func (c *OutChannel) Stats() SenderStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m.Stats()
}

func (c *OutChannel) step(in Input) {
	c.mu.Lock()
	fail := c.run(c.m.Step(in))
	c.mu.Unlock()
	if fail != nil {
		c.ep.failed(c.m.ID(), true, fail)
	}
}

// run carries out the sender's actions; c.mu is held. It returns the
// failure, if the channel failed.
func (c *OutChannel) run(acts []Action) error {
	var fail error
	for _, a := range acts {
		if fail != nil {
			break // the channel failed: send nothing after it
		}
		switch a := a.(type) {
		case Transmit:
			err := c.ep.transmit(c.peer, &a.Frame)
			if a.Kept {
				putBuf(a.Frame.Body)
			}
			if err != nil {
				// Sent nothing: fail now rather than at the peer's gap.
				acts := c.m.Step(Disconnected{Reason: err})
				if len(acts) > 0 {
					fail = acts[0].(Fail).Err
				}
			}
		case Fail:
			fail = a.Err
		}
		switch a.(type) {
		case Resume, Done, Fail:
			select {
			case c.wake <- struct{}{}:
			default:
			}
		}
	}
	if fail != nil {
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
	return fail
}

// InChannel is the receiving end of a channel on an Endpoint.
type InChannel struct {
	ep      *Endpoint
	peer    string
	mu      sync.Mutex // guards m and held
	m       *Receiver
	deliver func(Frame)
	// held are the buffers of the batches delivered in recycled buffers
	// and not yet reported processed, by sequence number.
	held map[uint64]Releaser
}

// ID returns the channel's ID.
func (c *InChannel) ID() ChannelID { return c.m.ID() }

// Processed reports that the task processed every batch up to seq: the
// receiver acknowledges them, returning their credits. Called by the
// receiving task, once for each batch, when nothing uses the batch's
// Body any more: the buffer of batch seq (only that one) may be recycled.
func (c *InChannel) Processed(seq uint64) {
	c.stepHeld(Processed{Seq: seq}, Frame{}, nil, seq)
}

// receive steps the receiver with f, whose bytes r holds (nil if none).
// r is released at once unless f is a batch delivered to the task; then
// when the task reports it processed.
func (c *InChannel) receive(f Frame, r Releaser) {
	c.stepHeld(Receive{Frame: f}, f, r, 0)
}

// Err returns the channel's failure, or nil.
func (c *InChannel) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m.Err()
}

// Stats returns the receiver's counters.
func (c *InChannel) Stats() ReceiverStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m.Stats()
}

// step steps the receiver, transmits its acks under c.mu, and delivers
// after releasing it, so that deliver may call Processed. Deliveries keep
// their order because the transport hands over one peer's frames one at a
// time.
func (c *InChannel) step(in Input) { c.stepHeld(in, Frame{}, nil, 0) }

// stepHeld is step for a frame f received with the releaser r, or for
// the processing of batch done (0 for none), whose held buffer it
// releases.
func (c *InChannel) stepHeld(in Input, f Frame, r Releaser, done uint64) {
	c.mu.Lock()
	acts := c.m.Step(in)
	if r != nil {
		for _, a := range acts {
			if d, ok := a.(Deliver); ok && d.Frame.Kind == KindBatch && d.Frame.Seq == f.Seq && len(f.Body) > 0 {
				if isControl(f.Channel.Edge) {
					// A control message keeps slices of its frame past
					// Processed: its buffer is left to the collector.
					r = nil
					break
				}
				if c.held == nil {
					c.held = map[uint64]Releaser{}
				}
				c.held[f.Seq], r = r, nil
				break
			}
		}
	}
	if done != 0 {
		if h, ok := c.held[done]; ok {
			delete(c.held, done)
			r = h
		}
	}
	var fail error
	for _, a := range acts {
		if fail != nil {
			break
		}
		switch a := a.(type) {
		case Transmit:
			if err := c.ep.transmit(c.peer, &a.Frame); err != nil {
				if fa := c.m.Step(Disconnected{Reason: err}); len(fa) > 0 {
					fail = fa[0].(Fail).Err
				}
			}
		case Fail:
			fail = a.Err
		}
	}
	c.mu.Unlock()
	// Not delivered, or not a batch, or processed: nothing uses the
	// frame's bytes any more (a delivered frame's bytes are the task's
	// until it reports the batch processed).
	release(r)
	for _, a := range acts {
		if d, ok := a.(Deliver); ok && fail == nil {
			c.deliver(d.Frame)
		}
	}
	if fail != nil {
		c.ep.failed(c.m.ID(), false, fail)
	}
}

var _ Handler = (*Endpoint)(nil)
