package mqtt

import (
	"bufio"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
)

const (
	// connReadBuffer is how much a subscriber's connection reads at once.
	connReadBuffer = 64 << 10
	// connWriteBuffer is how many bytes a subscriber's connection holds
	// before a Write flushes them itself instead of leaving them to the
	// flusher.
	connWriteBuffer = 64 << 10
	// closeFlushTimeout bounds the last flush when the connection closes.
	closeFlushTimeout = 250 * time.Millisecond
)

// bufferedConn is the network connection of a Subscriber: paho reads every
// packet with two or three reads of one to a few bytes (type, remaining
// length, body) and writes every PUBACK with a write of its own, so at
// the broker's pace each message costs about four system calls. The
// bufferedConn reads through a 64 KiB buffer, and its writes are copied to
// a buffer that a flusher goroutine writes out, so that the acks that pile
// up while one write is in the kernel leave in the next single write.
// What paho wrote is written in order; a write error is returned by the
// next Write and closes nothing by itself (paho closes the connection).
// Close writes what is still buffered (bounded by closeFlushTimeout), so a
// DISCONNECT written just before it is sent, and waits for the flusher.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader

	wmu  sync.Mutex // serialises writes to Conn and the final flush
	mu   sync.Mutex // guards buf, err and closed
	buf  []byte     // written by paho, not yet by the flusher
	err  error      // of the last write to Conn; sticky
	done bool       // Close began: the flusher stops

	kick    chan struct{} // capacity 1: buf has bytes for the flusher
	stopped chan struct{} // closed when the flusher returns
	once    sync.Once

	// The first bytes read: the CONNACK, whose session-present flag paho
	// does not pass on after a reconnect. head is used by the reading
	// goroutine only (paho's connect, then its reader, one after the
	// other); present is read by onConnect.
	head    [4]byte
	nhead   int
	present atomic.Bool
}

// newBufferedConn wraps c and starts its flusher; Close stops it.
func newBufferedConn(c net.Conn) *bufferedConn {
	b := &bufferedConn{
		Conn:    c,
		r:       bufio.NewReaderSize(c, connReadBuffer),
		kick:    make(chan struct{}, 1),
		stopped: make(chan struct{}),
	}
	go b.flusher()
	return b
}

// Read reads through the buffer.
func (b *bufferedConn) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if b.nhead < len(b.head) {
		b.nhead += copy(b.head[b.nhead:], p[:n])
		if b.nhead == len(b.head) {
			// CONNACK: type 2, remaining length 2, flags, return code.
			b.present.Store(b.head[0] == 0x20 && b.head[1] == 2 && b.head[2]&1 == 1 && b.head[3] == 0)
		}
	}
	return n, err
}

// sessionPresent reports whether the connection's CONNACK said the
// broker resumed the session.
func (b *bufferedConn) sessionPresent() bool { return b.present.Load() }

// Write queues p for the flusher, or writes the buffer itself when it is
// full (back-pressure on paho's writer).
func (b *bufferedConn) Write(p []byte) (int, error) {
	b.mu.Lock()
	if b.err != nil {
		err := b.err
		b.mu.Unlock()
		return 0, err
	}
	if b.done {
		b.mu.Unlock()
		return 0, net.ErrClosed
	}
	b.buf = append(b.buf, p...)
	full := len(b.buf) >= connWriteBuffer
	if !full {
		select { // under mu: Close closes kick under mu
		case b.kick <- struct{}{}:
		default:
		}
	}
	b.mu.Unlock()
	if full {
		if err := b.flush(); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// flush writes what is buffered to Conn.
func (b *bufferedConn) flush() error {
	b.wmu.Lock()
	defer b.wmu.Unlock()
	var out []byte
	b.mu.Lock()
	out, b.buf = b.buf, nil
	err := b.err
	b.mu.Unlock()
	if err != nil || len(out) == 0 {
		return err
	}
	if _, err := b.Conn.Write(out); err != nil {
		b.mu.Lock()
		if b.err == nil {
			b.err = err
		}
		b.mu.Unlock()
		return err
	}
	return nil
}

// flusher writes the buffer out whenever Write has added to it, until
// Close.
func (b *bufferedConn) flusher() {
	defer close(b.stopped)
	for range b.kick {
		b.mu.Lock()
		done := b.done
		b.mu.Unlock()
		if done {
			return
		}
		_ = b.flush() // the error is sticky: the next Write returns it
	}
}

// Close writes what is buffered (for at most closeFlushTimeout), stops
// the flusher and closes the connection. Closing twice closes Conn twice,
// as paho may.
func (b *bufferedConn) Close() error {
	b.once.Do(func() {
		_ = b.Conn.SetWriteDeadline(time.Now().Add(closeFlushTimeout))
		b.mu.Lock()
		b.done = true
		close(b.kick)
		b.mu.Unlock()
		<-b.stopped
		_ = b.flush()
	})
	return b.Conn.Close()
}

// bufferedDial returns paho's connection function for a Subscriber: dial
// (or, when nil, a TCP dial with paho's dialer) wrapped in a
// bufferedConn. It returns nil for a broker URL whose scheme is not plain
// TCP ("tcp", "mqtt"), which paho then dials itself (TLS, WebSocket).
func bufferedDial(broker string, dial paho.OpenConnectionFunc, last *atomic.Pointer[bufferedConn]) paho.OpenConnectionFunc {
	if dial == nil {
		u, err := url.Parse(broker)
		if err != nil || (u.Scheme != "tcp" && u.Scheme != "mqtt") {
			return nil
		}
		dial = func(uri *url.URL, o paho.ClientOptions) (net.Conn, error) {
			d := o.Dialer
			if d == nil {
				d = &net.Dialer{Timeout: 30 * time.Second}
			}
			return d.Dial("tcp", uri.Host)
		}
	}
	return func(uri *url.URL, o paho.ClientOptions) (net.Conn, error) {
		c, err := dial(uri, o)
		if err != nil {
			return nil, err
		}
		bc := newBufferedConn(c)
		last.Store(bc)
		return bc, nil
	}
}
