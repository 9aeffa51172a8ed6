package mqtt

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"sync"
	"time"

	"github.com/eclipse/paho.mqtt.golang/packets"
)

// pubConn is the connection of a Publisher to a tcp:// or ssl:// broker:
// an MQTT 3.1.1 client that only publishes. Publishes are encoded into a
// shared buffer and written by one writer goroutine, so publishes made
// while the previous write is in the kernel go out together in one write
// (paho writes every packet with its own system call and reads every
// acknowledgement with several). A reader goroutine takes the
// acknowledgements (PUBACK; PUBREC, answered with PUBREL, and PUBCOMP for
// QoS 2).
//
// The Publisher's goroutine calls publish, wait and close; mu guards the
// state the reader and writer share with it.
type pubConn struct {
	nc        net.Conn
	qos       byte
	timeout   time.Duration
	keepAlive time.Duration

	mu       sync.Mutex
	out      []byte        // packets to write next; guarded by mu
	spare    []byte        // the writer's last buffer, reused; guarded by mu
	inflight []bool        // packet ids not yet completed (QoS 1 and 2); guarded by mu
	unacked  int           // count of true in inflight; guarded by mu
	queued   int64         // publishes put into out; guarded by mu
	written  int64         // publishes handed to the kernel; guarded by mu
	acked    int64         // publishes acknowledged (QoS 1 and 2); guarded by mu
	err      error         // the first failure; guarded by mu
	lastID   uint16        // last packet id given; publishing goroutine only
	wake     chan struct{} // capacity 1: out has bytes for the writer
	progress chan struct{} // capacity 1: an acknowledgement, a write or a failure
	lost     chan struct{} // closed at the first failure (with err set)
	done     chan struct{} // closed by close
	wdone    chan struct{} // closed when the writer returned
	rdone    chan struct{} // closed when the reader returned
}

// leanScheme tells whether the broker URL's scheme is served by pubConn
// (tcp and TLS); other schemes (websockets) go through paho.
func leanScheme(broker string) bool {
	u, err := url.Parse(broker)
	if err != nil {
		return false
	}
	switch u.Scheme {
	case "tcp", "mqtt", "ssl", "tls", "mqtts", "tcps", "mqtt+ssl":
		return true
	}
	return false
}

// pubKeepAlive is the keep-alive a pubConn announces; it sends PINGREQ
// every half of it when it has written nothing else.
var pubKeepAlive = 30 * time.Second

// dialPubConn connects to cfg.Broker, sends CONNECT (clean session) and
// waits for a successful CONNACK, then starts the reader and the writer.
func dialPubConn(cfg PublisherConfig) (*pubConn, error) {
	u, err := url.Parse(cfg.Broker)
	if err != nil {
		return nil, fmt.Errorf("%w: broker %q: %w", ErrPublish, cfg.Broker, err)
	}
	d := net.Dialer{Timeout: cfg.Timeout}
	var nc net.Conn
	switch u.Scheme {
	case "ssl", "tls", "mqtts", "tcps", "mqtt+ssl":
		nc, err = tls.DialWithDialer(&d, "tcp", u.Host, nil)
	default:
		nc, err = d.Dial("tcp", u.Host)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: connect to %s: %w", ErrPublish, redactBroker(cfg.Broker), err)
	}
	keepAlive := pubKeepAlive
	cp := packets.NewControlPacket(packets.Connect).(*packets.ConnectPacket)
	cp.ProtocolName, cp.ProtocolVersion = "MQTT", 4
	cp.CleanSession = true
	cp.ClientIdentifier = cfg.ClientID
	cp.Keepalive = uint16(keepAlive / time.Second)
	_ = nc.SetDeadline(time.Now().Add(cfg.Timeout))
	r := bufio.NewReaderSize(nc, 4096)
	if err := cp.Write(nc); err != nil {
		nc.Close()
		return nil, fmt.Errorf("%w: connect to %s: %w", ErrPublish, redactBroker(cfg.Broker), err)
	}
	pk, err := packets.ReadPacket(r)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("%w: connect to %s: %w", ErrPublish, redactBroker(cfg.Broker), err)
	}
	ack, ok := pk.(*packets.ConnackPacket)
	if !ok {
		nc.Close()
		return nil, fmt.Errorf("%w: connect to %s: got %T instead of CONNACK", ErrPublish, cfg.Broker, pk)
	}
	if ack.ReturnCode != packets.Accepted {
		nc.Close()
		return nil, fmt.Errorf("%w: connect to %s: %w", ErrPublish, cfg.Broker, packets.ConnErrors[ack.ReturnCode])
	}
	_ = nc.SetDeadline(time.Time{})
	c := &pubConn{
		nc:        nc,
		qos:       cfg.QoS,
		timeout:   cfg.Timeout,
		keepAlive: keepAlive,
		wake:      make(chan struct{}, 1),
		progress:  make(chan struct{}, 1),
		lost:      make(chan struct{}),
		done:      make(chan struct{}),
		wdone:     make(chan struct{}),
		rdone:     make(chan struct{}),
	}
	if c.qos > 0 {
		c.inflight = make([]bool, 1<<16)
	}
	go c.read(r)
	go c.write()
	return c, nil
}

// outstanding is the number of publishes not yet done: written for QoS
// 0, acknowledged for QoS 1 and 2. mu must be held.
func (c *pubConn) outstanding() int {
	if c.qos == 0 {
		return int(c.queued - c.written)
	}
	return c.unacked
}

// publish queues one PUBLISH once fewer than limit are outstanding,
// waiting up to the timeout for that.
func (c *pubConn) publish(topic string, payload []byte, limit int) error {
	// checkPublish passed: the packet fits MQTT's bounds.
	rl := 2 + len(topic) + len(payload)
	if c.qos > 0 {
		rl += 2
	}
	c.mu.Lock()
	if err := c.waitLocked(func() bool { return c.outstanding() < limit }); err != nil {
		c.mu.Unlock()
		return err
	}
	var id uint16
	if c.qos > 0 {
		// Fewer than 65535 are outstanding: a free id exists.
		for {
			c.lastID++
			if c.lastID != 0 && !c.inflight[c.lastID] {
				break
			}
		}
		id = c.lastID
		c.inflight[id] = true
		c.unacked++
	}
	c.out = appendPublish(c.out, c.qos, id, topic, payload, rl)
	c.queued++
	c.mu.Unlock()
	ring(c.wake)
	return nil
}

// flush waits until every publish is done (see outstanding).
func (c *pubConn) flush() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.waitLocked(func() bool { return c.outstanding() == 0 })
}

// waitLocked waits, with mu held (released while waiting), until ok or a
// failure; it fails when the broker made no progress for the timeout: no
// acknowledgement (QoS 1 and 2), no publish written (QoS 0). The
// connection's other writes (a PINGREQ every half keep-alive, PUBRELs)
// do not count: a hung broker whose socket still takes them fails as
// one that is gone.
func (c *pubConn) waitLocked(ok func() bool) error {
	var timer *time.Timer
	var mark int64
	for {
		if c.err != nil {
			return c.err
		}
		if ok() {
			return nil
		}
		if m := c.progressMark(); timer == nil || m != mark {
			mark = m
			if timer == nil {
				timer = time.NewTimer(c.timeout)
				defer timer.Stop()
			} else {
				timer.Reset(c.timeout)
			}
		}
		c.mu.Unlock()
		select {
		case <-c.progress:
			c.mu.Lock()
		case <-timer.C:
			c.mu.Lock()
			if c.err == nil && !ok() && c.progressMark() == mark {
				return fmt.Errorf("%w: no acknowledgement within %s", ErrPublish, c.timeout)
			}
		}
	}
}

// progressMark counts what the broker has done: publishes acknowledged
// (QoS 1 and 2), written (QoS 0). mu must be held.
func (c *pubConn) progressMark() int64 {
	if c.qos == 0 {
		return c.written
	}
	return c.acked
}

// fail records the first failure, closes lost and wakes the publishing
// goroutine.
func (c *pubConn) fail(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = fmt.Errorf("%w: %w", ErrPublish, err)
		close(c.lost)
	}
	c.mu.Unlock()
	ring(c.progress)
}

// write hands out's bytes to the kernel, one write for all publishes
// queued since the last, and sends PINGREQ when nothing was written for
// half the keep-alive.
func (c *pubConn) write() {
	defer close(c.wdone)
	ping := time.NewTicker(c.keepAlive / 2)
	defer ping.Stop()
	idle := true
	for {
		select {
		case <-c.done:
			return
		case <-ping.C:
			if idle {
				c.mu.Lock()
				c.out = append(c.out, packets.Pingreq<<4, 0)
				c.mu.Unlock()
			}
			idle = true
		case <-c.wake:
		}
		c.mu.Lock()
		buf, queued := c.out, c.queued
		c.out, c.spare = c.spare[:0], nil
		c.mu.Unlock()
		if len(buf) == 0 {
			c.mu.Lock()
			c.spare = buf
			c.mu.Unlock()
			continue
		}
		idle = false
		_ = c.nc.SetWriteDeadline(time.Now().Add(c.timeout))
		if _, err := c.nc.Write(buf); err != nil {
			c.fail(fmt.Errorf("write: %w", err))
			return
		}
		if cap(buf) > 1<<20 {
			buf = nil // do not keep a burst's buffer
		}
		c.mu.Lock()
		c.spare = buf[:0]
		c.written = queued
		c.mu.Unlock()
		ring(c.progress)
	}
}

// read takes the broker's acknowledgements until the connection ends.
func (c *pubConn) read(r *bufio.Reader) {
	defer close(c.rdone)
	for {
		pk, err := packets.ReadPacket(r)
		if err != nil {
			select {
			case <-c.done:
			default:
				c.fail(fmt.Errorf("read: %w", err))
			}
			return
		}
		switch p := pk.(type) {
		case *packets.PubackPacket:
			c.complete(p.MessageID)
		case *packets.PubcompPacket:
			c.complete(p.MessageID)
		case *packets.PubrecPacket:
			c.mu.Lock()
			c.out = append(c.out, packets.Pubrel<<4|0x02, 2, byte(p.MessageID>>8), byte(p.MessageID))
			c.mu.Unlock()
			ring(c.wake)
		}
	}
}

// complete ends the publish with packet id.
func (c *pubConn) complete(id uint16) {
	c.mu.Lock()
	if c.inflight != nil && c.inflight[id] {
		c.inflight[id] = false
		c.unacked--
		c.acked++
	}
	c.mu.Unlock()
	ring(c.progress)
}

// close stops the writer (waiting up to 250 ms for a write in progress),
// sends DISCONNECT when the writer stopped in time, closes the connection
// and waits for both goroutines.
func (c *pubConn) close() error {
	close(c.done)
	t := time.NewTimer(250 * time.Millisecond)
	defer t.Stop()
	select {
	case <-c.wdone:
		_ = c.nc.SetWriteDeadline(time.Now().Add(250 * time.Millisecond))
		_, _ = c.nc.Write([]byte{packets.Disconnect << 4, 0})
	case <-t.C:
	}
	err := c.nc.Close()
	<-c.wdone
	<-c.rdone
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

// appendPublish appends a PUBLISH packet with remaining length rl.
func appendPublish(b []byte, qos byte, id uint16, topic string, payload []byte, rl int) []byte {
	b = append(b, packets.Publish<<4|qos<<1)
	for {
		d := byte(rl % 128)
		rl /= 128
		if rl > 0 {
			d |= 0x80
		}
		b = append(b, d)
		if rl == 0 {
			break
		}
	}
	b = append(b, byte(len(topic)>>8), byte(len(topic)))
	b = append(b, topic...)
	if qos > 0 {
		b = append(b, byte(id>>8), byte(id))
	}
	return append(b, payload...)
}

// ring sends on a capacity-1 doorbell without blocking.
func ring(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
