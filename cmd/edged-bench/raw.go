package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// A raw MQTT 3.1.1 publisher: PUBLISH packets are encoded before the
// clock starts and written to the socket in large chunks, so that the
// publishers cost the machine little and the subscriber under test, not
// the load, is the bottleneck. QoS 1 keeps a window of unacknowledged
// packets per connection; a reader goroutine counts the PUBACKs.

// packets is a connection's pre-encoded PUBLISH packets, back to back.
type packets struct {
	buf  []byte
	offs []int // offs[j] is where packet j starts; offs[len-1] is len(buf)
}

func (p *packets) n() int { return len(p.offs) - 1 }

func appendVarint(b []byte, n int) []byte {
	for {
		c := byte(n % 128)
		n /= 128
		if n > 0 {
			c |= 0x80
		}
		b = append(b, c)
		if n == 0 {
			return b
		}
	}
}

func appendString(b []byte, s string) []byte {
	b = append(b, byte(len(s)>>8), byte(len(s)))
	return append(b, s...)
}

// appendPublish appends a PUBLISH packet; id is used with QoS > 0.
func appendPublish(b []byte, qos byte, id uint16, topic string, payload []byte) []byte {
	rl := 2 + len(topic) + len(payload)
	if qos > 0 {
		rl += 2
	}
	b = append(b, 0x30|qos<<1)
	b = appendVarint(b, rl)
	b = appendString(b, topic)
	if qos > 0 {
		b = append(b, byte(id>>8), byte(id))
	}
	return append(b, payload...)
}

// encodeReadings encodes readings [0, n) for conns connections: reading i
// goes on connection i%conns as that connection's packet i/conns, whose
// packet id (QoS 1) is its index modulo 65535, plus one.
func encodeReadings(n, conns int, qos byte, msg func(i int) (string, []byte)) []*packets {
	ps := make([]*packets, conns)
	for c := range ps {
		k := (n - c + conns - 1) / conns
		ps[c] = &packets{offs: make([]int, 0, k+1)}
	}
	for i := 0; i < n; i++ {
		p := ps[i%conns]
		topic, payload := msg(i)
		if p.buf == nil {
			k := (n - i%conns + conns - 1) / conns
			p.buf = make([]byte, 0, k*(len(topic)+len(payload)+8))
		}
		p.offs = append(p.offs, len(p.buf))
		p.buf = appendPublish(p.buf, qos, uint16((len(p.offs)-1)%65535+1), topic, payload)
	}
	for _, p := range ps {
		p.offs = append(p.offs, len(p.buf))
	}
	return ps
}

// rawConn is one publishing connection.
type rawConn struct {
	conn  net.Conn
	acked atomic.Int64
	sent  atomic.Int64 // publishes written
	// maxGap is the longest time between two PUBACKs, and gapOut how many
	// publishes were outstanding when it began: a full window means the
	// broker, not the publisher, held the connection.
	maxGap, gapOut atomic.Int64
	ackBell        chan struct{} // capacity 1: rung on PUBACKs
	done           chan struct{} // closed when the reader stops
	errMu          sync.Mutex
	err            error // why the reader stopped
}

func dialRaw(addr, clientID string) (*rawConn, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	// CONNECT: MQTT 3.1.1, clean session, keep-alive off.
	var vh []byte
	vh = appendString(vh, "MQTT")
	vh = append(vh, 4, 0x02, 0, 0)
	vh = appendString(vh, clientID)
	pkt := appendVarint([]byte{0x10}, len(vh))
	pkt = append(pkt, vh...)
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(pkt); err != nil {
		c.Close()
		return nil, fmt.Errorf("connect %s: %w", clientID, err)
	}
	ack := make([]byte, 4)
	if _, err := io.ReadFull(c, ack); err != nil {
		c.Close()
		return nil, fmt.Errorf("connack %s: %w", clientID, err)
	}
	if ack[0] != 0x20 || ack[3] != 0 {
		c.Close()
		return nil, fmt.Errorf("connect %s refused: % x", clientID, ack)
	}
	c.SetDeadline(time.Time{})
	r := &rawConn{conn: c, ackBell: make(chan struct{}, 1), done: make(chan struct{})}
	go r.read()
	return r, nil
}

func (r *rawConn) read() {
	defer close(r.done)
	br := bufio.NewReaderSize(r.conn, 64<<10)
	var last, out int64 // time of the last PUBACK, publishes outstanding after it
	for {
		h, err := br.ReadByte()
		if err != nil {
			r.setErr(err)
			return
		}
		n, mul := 0, 1
		for {
			c, err := br.ReadByte()
			if err != nil {
				r.setErr(err)
				return
			}
			n += int(c&0x7f) * mul
			mul *= 128
			if c&0x80 == 0 {
				break
			}
		}
		if _, err := br.Discard(n); err != nil {
			r.setErr(err)
			return
		}
		if h>>4 == 4 { // PUBACK
			acked := r.acked.Add(1)
			now := time.Now().UnixNano()
			if last != 0 && now-last > r.maxGap.Load() {
				r.maxGap.Store(now - last)
				r.gapOut.Store(out)
			}
			last, out = now, r.sent.Load()-acked
			select {
			case r.ackBell <- struct{}{}:
			default:
			}
		}
	}
}

func (r *rawConn) setErr(err error) {
	r.errMu.Lock()
	defer r.errMu.Unlock()
	r.err = err
}

func (r *rawConn) readErr() error {
	r.errMu.Lock()
	defer r.errMu.Unlock()
	if r.err == nil {
		return errors.New("connection closed")
	}
	return r.err
}

func (r *rawConn) close() {
	r.conn.SetWriteDeadline(time.Now().Add(time.Second))
	r.conn.Write([]byte{0xe0, 0}) // DISCONNECT
	r.conn.Close()
	<-r.done
}

// maxChunk bounds one write, so that a rate-limited or windowed sender
// stays responsive.
const maxChunk = 512

// send writes the packets of p: with QoS 1 at most window unacknowledged
// at once, then waits for every PUBACK; with rate > 0 at most rate packets
// per second. Packet ids repeat every 65535 packets, so window must be
// smaller than that.
func (r *rawConn) send(p *packets, qos byte, window int, rate float64, deadline time.Time) error {
	n := p.n()
	base := r.acked.Load()
	start := time.Now()
	timer := time.NewTimer(time.Second)
	defer timer.Stop()
	wait := func() error {
		if time.Now().After(deadline) {
			return fmt.Errorf("publishing past its deadline (%d of %d PUBACKed)", r.acked.Load()-base, n)
		}
		timer.Reset(100 * time.Millisecond)
		select {
		case <-r.ackBell:
		case <-r.done:
			return fmt.Errorf("publish: %w", r.readErr())
		case <-timer.C:
		}
		return nil
	}
	for sent := 0; sent < n; {
		k := min(n-sent, maxChunk)
		if qos > 0 {
			k = min(k, window-(sent-int(r.acked.Load()-base)))
		}
		if rate > 0 {
			allowed := int(time.Since(start).Seconds()*rate) + 1 - sent
			if allowed <= 0 {
				time.Sleep(2 * time.Millisecond)
				continue
			}
			k = min(k, allowed)
		}
		if k <= 0 {
			if err := wait(); err != nil {
				return err
			}
			continue
		}
		r.sent.Add(int64(k))
		if _, err := r.conn.Write(p.buf[p.offs[sent]:p.offs[sent+k]]); err != nil {
			return fmt.Errorf("publish: %w", err)
		}
		sent += k
	}
	for qos > 0 && r.acked.Load()-base < int64(n) {
		if err := wait(); err != nil {
			return err
		}
	}
	return nil
}

// load is a set of publishing connections with their packets.
type load struct {
	conns []*rawConn
	pkts  []*packets
	qos   byte
}

func newLoad(addr, prefix string, pkts []*packets, qos byte) (*load, error) {
	l := &load{pkts: pkts, qos: qos}
	for i := range pkts {
		c, err := dialRaw(addr, fmt.Sprintf("%s-%d", prefix, i))
		if err != nil {
			l.close()
			return nil, err
		}
		l.conns = append(l.conns, c)
	}
	return l, nil
}

// run publishes everything, window packets in flight per connection and
// rate packets per second over all connections (0: as fast as possible).
// It returns when every connection has written (QoS 0) or seen every
// PUBACK (QoS 1).
func (l *load) run(window int, rate float64, deadline time.Time) error {
	var wg sync.WaitGroup
	errs := make([]error, len(l.conns))
	for i, c := range l.conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = c.send(l.pkts[i], l.qos, window, rate/float64(len(l.conns)), deadline)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// maxAckGap is the longest wait between two PUBACKs on any connection, and
// how many publishes that connection had outstanding when it began.
func (l *load) maxAckGap() (time.Duration, int64) {
	var gap time.Duration
	var out int64
	for _, c := range l.conns {
		if g := time.Duration(c.maxGap.Load()); g > gap {
			gap, out = g, c.gapOut.Load()
		}
	}
	return gap, out
}

func (l *load) close() {
	for _, c := range l.conns {
		c.close()
	}
}

// hostPort strips the scheme of a tcp:// URL.
func hostPort(url string) string { return strings.TrimPrefix(url, "tcp://") }
