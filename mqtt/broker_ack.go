package mqtt

import (
	"context"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"
)

// maxHeldBytes bounds the bytes an ackGate holds for its connection while
// they wait for an fsync; a write past it waits (back-pressure on the
// connection's goroutine).
const maxHeldBytes = 1 << 20

// gatedListener is the broker's TCP listener (mochi's listeners.Listener):
// it wraps every accepted connection in an ackGate. (mochi's own TCP
// listener shares one error variable among its connection goroutines, a
// data race when two connections end at once, and see Close.)
type gatedListener struct {
	b       *Broker
	address string
	mu      sync.Mutex   // guards listen, conns, and end's change
	listen  net.Listener // set by Init
	log     *slog.Logger
	end     atomic.Bool
	conns   map[*ackGate]struct{} // the connections established or being established
	// refused counts the connections closed as they were accepted, the
	// broker holding BrokerConfig.MaxConnections.
	refused atomic.Uint64
}

// ID returns the listener's id.
func (l *gatedListener) ID() string { return "tcp" }

// Protocol returns "tcp".
func (l *gatedListener) Protocol() string { return "tcp" }

// Address returns the address listened on (with the real port once
// listening).
func (l *gatedListener) Address() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.listen != nil {
		return l.listen.Addr().String()
	}
	return l.address
}

// Init binds the address.
func (l *gatedListener) Init(log *slog.Logger) error {
	ln, err := net.Listen("tcp", l.address)
	if err != nil {
		return err
	}
	l.mu.Lock()
	l.listen, l.log = ln, log
	l.mu.Unlock()
	return nil
}

// Serve accepts connections until Close and hands each to mochi wrapped
// in an ackGate.
func (l *gatedListener) Serve(establish listeners.EstablishFn) {
	l.mu.Lock()
	ln, log := l.listen, l.log
	l.mu.Unlock()
	for !l.end.Load() {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		// The connection counts among mochi's clients from here, under mu,
		// so that Close's caller cannot begin to wait for the clients
		// before it is counted (mochi counts it in the goroutine:
		// WaitGroup.Add racing with Wait when a device connects as the
		// broker stops).
		l.mu.Lock()
		if l.end.Load() {
			l.mu.Unlock()
			conn.Close()
			return
		}
		if len(l.conns) >= l.b.cfg.MaxConnections {
			l.mu.Unlock()
			// Counted and logged before the close, so that whoever sees
			// the connection end sees it counted.
			if n := l.refused.Add(1); n&(n-1) == 0 { // the 1st, 2nd, 4th, 8th, ...
				log.Warn("mqtt broker: connections at their bound; connection closed as it was accepted",
					"remote", conn.RemoteAddr().String(), "max_connections", l.b.cfg.MaxConnections, "refused_total", n)
			}
			conn.Close()
			continue
		}
		clients := &l.b.server.Listeners.ClientsWg
		clients.Add(1)
		g := newAckGate(l.b, conn)
		// mochi reads the CONNECT without a deadline; its own (the
		// keepalive's) is set only after it. A connection that never
		// sends one would hold its place among MaxConnections for good.
		_ = g.SetReadDeadline(time.Now().Add(l.b.cfg.ConnectTimeout))
		if l.conns == nil {
			l.conns = map[*ackGate]struct{}{}
		}
		l.conns[g] = struct{}{}
		l.mu.Unlock()
		go func() {
			defer clients.Done()
			if err := establish(l.ID(), g); err != nil {
				log.Warn("mqtt broker: connection ended", "error", err)
			}
			l.mu.Lock()
			delete(l.conns, g)
			l.mu.Unlock()
		}()
	}
}

// Close stops accepting and disconnects the listener's clients: an MQTT 5
// client with a DISCONNECT (server shutting down), an MQTT 3.1.1 client by
// ending its connection, since that version's server sends none. It does
// not call closeClients: mochi's (Clients.GetByListener) takes the
// clients' read lock twice, and deadlocks when a client ends between the
// two (its Delete waits for the write lock, which blocks the second read
// lock): Close would hang when a device disconnects while the broker
// stops.
//
// While the broker stops, every connection's deadlines are first fixed
// at the linger bound (see ackGate.bound): mochi writes to a client under
// the client's lock, which DisconnectClient takes, so a write blocked on
// a device that reads nothing would hold the stop until the keepalive
// deadline; and a connection that never sent its CONNECT has no deadline
// at all, while mochi's Close waits for its goroutine.
func (l *gatedListener) Close(listeners.CloseFn) {
	l.mu.Lock()
	first := l.end.CompareAndSwap(false, true)
	if first && l.b.stopping.Load() {
		until := time.Now().Add(l.b.lingerTimeout)
		for g := range l.conns {
			g.bound(until)
		}
	}
	l.mu.Unlock()
	if first {
		for _, cl := range l.b.server.Clients.GetAll() {
			if cl.Net.Listener != l.ID() || cl.Closed() {
				continue
			}
			if cl.Properties.ProtocolVersion < 5 {
				// MQTT 3.1.1 has no DISCONNECT from the server: the
				// connection just ends (mosquitto_sub, for one, exits
				// with a protocol error on the packet instead of
				// reconnecting).
				cl.Stop(packets.ErrServerShuttingDown)
				continue
			}
			_ = l.b.server.DisconnectClient(cl, packets.ErrServerShuttingDown)
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.listen != nil {
		l.listen.Close()
	}
}

// ackGate is a client connection whose outgoing bytes wait until every
// record the broker appended for that client so far is durable.
//
// The broker's OnPublish hook writes a message to the ingest log without
// waiting for the fsync (ingestlog.Log.AppendNoWait) and tells the gate
// the record's offset; mochi then writes the PUBACK (PUBREC) on the
// connection. The gate holds those bytes, and whatever is written after
// them, until the records are durable, then writes them in order, many
// acknowledgements in one write. So the connection's goroutine goes on
// reading and appending the next PUBLISH packets while an fsync runs
// (pipelining: a client with many messages in flight shares each fsync
// with itself and with every other client), yet no acknowledgement leaves
// before its message is fsynced, and acknowledgements keep their order.
//
// Bytes written while nothing appended is waiting for an fsync go straight
// to the connection. A flusher goroutine, started at the first append,
// leads or joins the group commits and writes the held bytes; it ends when
// the connection closes, after making its records durable (so Readers see
// them even if no other append comes). If the log fails, the held bytes
// are dropped and the connection closed: the device resends.
type ackGate struct {
	net.Conn
	b *Broker

	mu      sync.Mutex
	cond    sync.Cond // on mu: the held bytes were written, or the gate closed
	written []uint64  // per route key: 1 + the last offset appended for this connection, 0 if none
	// session is the sequence number of the last session-journal record
	// stored for this connection's messages (0 if none): bytes written
	// after it wait until it is durable too.
	session uint64
	held    []byte // bytes waiting for written to be durable
	spare   []byte // the previous batch, reused for held
	// marks records, for held, each record appended (and session record
	// stored) for this connection while the bytes wait: the bytes of
	// held before a mark's pos were written before that record was
	// appended and do not wait for it. A failed wait lets out the
	// prefix whose records are durable (see ackable).
	marks      []ackMark
	spareMarks []ackMark
	batched    int  // bytes of the batch the flusher is waiting to write
	syncDue    bool // records were appended since the flusher last took a batch
	writing    bool // a batch or a direct write is being written (or waited for)
	owed       bool // counted in the drain hook as acknowledgements pending
	running    bool // the flusher goroutine was started
	closed     bool
	// lingering is set when Close began a lingering close: the socket is
	// closed by linger.
	lingering bool
	// bounded is set when the deadlines were fixed for the stop (bound):
	// SetDeadline and its kin change them no more.
	bounded bool
	err     error         // sticky: the log failed or a write failed
	wake    chan struct{} // cap 1: there is work for the flusher
	waitBuf []uint64      // the flusher's copy of written
	in      *cutReader    // the connection as mochi reads it
	// ctx is the broker's, cancelled too when the connection closes: it
	// ends a publish of this connection waiting for room in a full
	// session store, which would otherwise keep the client (and its
	// read goroutine) until the store has room.
	ctx    context.Context
	cancel context.CancelFunc
}

func newAckGate(b *Broker, c net.Conn) *ackGate {
	g := &ackGate{Conn: c, b: b, written: make([]uint64, 1+len(b.routes)), wake: make(chan struct{}, 1),
		in: newCutReader(c, b.cfg.MaxMessageBytes, b.cutMark)}
	g.cond.L = &g.mu
	g.ctx, g.cancel = context.WithCancel(b.ctx)
	return g
}

// Read reads the connection through its cutReader (see broker_cut.go).
func (g *ackGate) Read(p []byte) (int, error) { return g.in.Read(p) }

// appended records that the record at off of route key's log was written
// for this connection: bytes written from now on wait until it is durable.
// It runs on the connection's goroutine.
func (g *ackGate) appended(key int, off uint64) {
	g.mu.Lock()
	g.written[key] = off + 1
	g.marks = append(g.marks, ackMark{pos: len(g.held), key: key, off: off})
	g.syncDue = true
	g.kick()
	g.mu.Unlock()
}

// storedSession records that the session-journal record seq was added
// for a message of this connection: bytes written from now on wait until
// it is durable. It runs on the connection's goroutine.
func (g *ackGate) storedSession(seq uint64) {
	g.mu.Lock()
	g.session = max(g.session, seq)
	g.marks = append(g.marks, ackMark{pos: len(g.held), key: -1, off: seq})
	g.syncDue = true
	g.kick()
	g.mu.Unlock()
}

// kick marks acknowledgements pending for the drain and wakes (or starts)
// the flusher. g.mu is held.
func (g *ackGate) kick() {
	if !g.owed {
		g.owed = true
		g.b.drain.hold(1)
	}
	if !g.running {
		g.running = true
		g.b.flushers.Add(1)
		go g.flush()
	}
	g.signal()
}

// signal wakes the flusher if it waits.
func (g *ackGate) signal() {
	select {
	case g.wake <- struct{}{}:
	default:
	}
}

// covered reports whether every record appended for this connection is
// durable. g.mu is held.
func (g *ackGate) covered() bool {
	for key, w := range g.written {
		if w > 0 && g.b.routeLog(key).DurableOffset() < w {
			return false
		}
	}
	return g.session == 0 || g.b.store.syncedTo(g.session)
}

// Write sends p once every record appended for this connection before it
// is durable: at once if they already are, else after the flusher's next
// fsync. It returns before p is sent in the second case.
func (g *ackGate) Write(p []byte) (int, error) {
	g.mu.Lock()
	for {
		switch {
		case g.err != nil:
			err := g.err
			g.mu.Unlock()
			return 0, err
		case g.closed:
			g.mu.Unlock()
			return 0, net.ErrClosed
		case len(g.held) == 0 && !g.writing && !g.syncDue && g.covered():
			g.writing = true
			g.mu.Unlock()
			n, err := g.Conn.Write(p)
			g.mu.Lock()
			g.writing = false
			if len(g.held) > 0 || g.syncDue {
				g.kick()
			} else {
				g.signal()
			}
			g.cond.Broadcast()
			g.mu.Unlock()
			return n, err
		case len(g.held) > 0 && len(g.held)+len(p) > maxHeldBytes:
			g.cond.Wait()
			continue
		}
		break
	}
	g.held = append(g.held, p...)
	g.kick()
	g.mu.Unlock()
	return len(p), nil
}

// settled returns once nothing appended for this connection waits for
// an fsync and every held byte is written, or the gate closed or failed.
func (g *ackGate) settled() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for !g.closed && g.err == nil && (len(g.held) > 0 || g.syncDue || g.writing) {
		g.cond.Wait()
	}
}

// closeWriter is a connection whose sending side can be ended alone
// (*net.TCPConn).
type closeWriter interface{ CloseWrite() error }

// Close closes the connection; held bytes are dropped (their messages were
// not acknowledged, so the device resends them). While the broker stops,
// and when the connection can end its sending side alone, the close
// lingers instead (see linger): Close returns at once, the broker's Close
// waits for it. Any other connection closes at once, as before.
func (g *ackGate) Close() error {
	g.cancel()
	g.mu.Lock()
	g.closed = true
	g.cond.Broadcast()
	g.signal()
	if g.lingering {
		g.mu.Unlock()
		return nil
	}
	cw, ok := g.Conn.(closeWriter)
	if !ok || !g.b.stopping.Load() {
		g.mu.Unlock()
		return g.Conn.Close()
	}
	g.lingering = true
	// Bounds the reads of linger and of mochi's connection goroutine, and
	// a write a device does not read.
	g.boundLocked(time.Now().Add(g.b.lingerTimeout))
	g.b.lingerers.Add(1)
	g.mu.Unlock()
	go g.linger(cw)
	return nil
}

// linger closes the connection without a reset: once the bytes being
// written are out, it ends the sending side (the device reads everything
// written, then the end of the stream), reads and discards what the
// device still sends until it closes its side (or the deadline fixed
// for the stop passes, see bound), and then closes the socket. A socket closed with unread
// data in it is reset by the kernel, and a reset may make the device drop
// acknowledgements it has received but not read.
func (g *ackGate) linger(cw closeWriter) {
	defer g.b.lingerers.Done()
	g.mu.Lock()
	for g.writing { // a write to the device, or the flusher's wait for an fsync before it
		g.cond.Wait()
	}
	g.mu.Unlock()
	if err := cw.CloseWrite(); err == nil {
		var buf [512]byte
		for {
			if _, err := g.Conn.Read(buf[:]); err != nil {
				break
			}
		}
	}
	g.Conn.Close()
}

// bound fixes the connection's read and write deadlines at t, unless
// they were fixed already: the stop waits for nothing on this connection
// past t.
func (g *ackGate) bound(t time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.boundLocked(t)
}

// boundLocked is bound with g.mu held.
func (g *ackGate) boundLocked(t time.Time) {
	if !g.bounded {
		g.bounded = true
		_ = g.Conn.SetDeadline(t)
	}
}

// SetDeadline sets the connection's deadlines, but leaves those fixed for
// the stop alone (mochi's connection goroutine refreshes them before each
// packet it reads, and would lift the bound).
func (g *ackGate) SetDeadline(t time.Time) error { return g.unlessBound(g.Conn.SetDeadline, t) }

// SetReadDeadline sets the connection's read deadline, unless fixed for
// the stop (see SetDeadline).
func (g *ackGate) SetReadDeadline(t time.Time) error { return g.unlessBound(g.Conn.SetReadDeadline, t) }

// SetWriteDeadline sets the connection's write deadline, unless fixed
// for the stop (see SetDeadline).
func (g *ackGate) SetWriteDeadline(t time.Time) error {
	return g.unlessBound(g.Conn.SetWriteDeadline, t)
}

// unlessBound calls set(t) unless the deadlines were fixed for the stop.
func (g *ackGate) unlessBound(set func(time.Time) error, t time.Time) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.bounded {
		return nil
	}
	return set(t)
}

// flush waits for the records appended for this connection to become
// durable, then writes the bytes held meanwhile, until the connection
// closes.
func (g *ackGate) flush() {
	defer g.b.flushers.Done()
	for {
		g.mu.Lock()
		for g.writing || (len(g.held) == 0 && !g.syncDue && !g.closed) {
			g.mu.Unlock()
			<-g.wake
			g.mu.Lock()
		}
		if g.err != nil || (g.closed && !g.syncDue) {
			g.settle()
			g.mu.Unlock()
			return
		}
		batch, marks := g.held, g.marks
		g.batched = len(batch)
		g.held, g.marks = g.spare[:0], g.spareMarks[:0]
		g.spare, g.spareMarks = nil, nil
		g.syncDue = false
		g.writing = true
		closed := g.closed
		g.waitBuf = append(g.waitBuf[:0], g.written...)
		session := g.session
		g.mu.Unlock()

		var err error
		for key, w := range g.waitBuf {
			if w > 0 {
				if err = g.b.waitDurable(g.b.routeLog(key), w-1); err != nil {
					break
				}
			}
		}
		if err == nil && session > 0 {
			err = g.b.store.waitSyncedTo(session)
		}
		waitFailed := err != nil
		if err == nil && len(batch) > 0 && !closed {
			_, err = g.Conn.Write(batch)
		}

		g.mu.Lock()
		if waitFailed && !closed && g.err == nil {
			// The log (or the session journal) failed: what is durable is
			// acknowledged all the same, so that the device resends only
			// the messages the log does not hold.
			all := append(batch, g.held...)
			n := g.ackable(all, len(batch), marks)
			g.mu.Unlock()
			if n > 0 {
				_, _ = g.Conn.Write(all[:n])
			}
			g.mu.Lock()
		}
		g.writing = false
		g.batched = 0
		g.spare, g.spareMarks = batch[:0], marks[:0]
		if err != nil && g.err == nil {
			g.err = err
			if !closed && g.b.ctx.Err() == nil {
				g.b.logger.Warn("mqtt broker: acknowledgements not sent; disconnecting client", "error", err)
			}
		}
		if g.err != nil {
			g.held, g.marks = nil, nil
			g.cond.Broadcast()
			g.settle()
			lingering := g.lingering
			g.mu.Unlock()
			if !lingering { // else linger closes it
				g.Conn.Close()
			}
			return
		}
		if len(g.held) == 0 && !g.syncDue && g.owed {
			g.owed = false
			g.b.drain.hold(-1)
		}
		g.cond.Broadcast()
		g.mu.Unlock()
	}
}

// ackMark is a record appended for a gate's connection (key, the route
// key, and off, its offset in that route's log), or a session-journal
// record stored for it (key -1, off its sequence number), at pos: the
// length of the gate's held bytes then.
type ackMark struct {
	pos int
	key int
	off uint64
}

// ackable returns how many bytes at the front of b can be written after
// a failed wait for durability: those written before the first record
// appended (or session record stored) for the connection that is not
// durable. b is the batch the flusher waited for, whose marks are marks,
// followed from base on by the bytes held since, whose marks are
// g.marks. g.mu is held.
func (g *ackGate) ackable(b []byte, base int, marks []ackMark) int {
	for _, m := range marks {
		if !g.durable(m) {
			return m.pos
		}
	}
	for _, m := range g.marks {
		if !g.durable(m) {
			return base + m.pos
		}
	}
	return len(b)
}

// durable reports whether the record m marks is durable.
func (g *ackGate) durable(m ackMark) bool {
	if m.key < 0 {
		return g.b.store.syncedTo(m.off)
	}
	l := g.b.routeLog(m.key)
	return l != nil && l.DurableOffset() > m.off
}

// settle ends the gate's count in the drain hook. g.mu is held.
func (g *ackGate) settle() {
	if g.owed {
		g.owed = false
		g.b.drain.hold(-1)
	}
}
