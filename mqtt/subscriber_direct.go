package mqtt

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/mochi-mqtt/server/v2/packets"
)

const (
	// defaultKeepAlive is the keep-alive the direct reader asks for, as
	// paho's default: it sends a PINGREQ this often.
	defaultKeepAlive = 30 * time.Second
	// pingTimeout is how much longer than the keep-alive the direct
	// reader waits for any packet before it gives the connection up (a
	// PINGRESP answers every PINGREQ), as paho's default.
	pingTimeout = 10 * time.Second
	// connectTimeout bounds the dial and the CONNACK.
	connectTimeout = 30 * time.Second
	// firstRetry is the first wait before a reconnect after a failed
	// attempt, as paho's ConnectRetryInterval in the paho client.
	firstRetry = time.Second
	// maxBodyReuse is the largest packet body read into the reused
	// buffer; a larger one gets a buffer of its own.
	maxBodyReuse = 1 << 20
	// protocolVersion is MQTT 3.1.1, as paho speaks it.
	protocolVersion = 4
)

// directSchemes are the broker URL schemes the direct reader dials.
var directSchemes = map[string]bool{
	"tcp": true, "mqtt": true, "unix": true,
	"ssl": true, "tls": true, "mqtts": true, "mqtt+ssl": true, "tcps": true,
}

// directScheme reports whether the direct reader can dial broker.
func directScheme(broker string) bool {
	u, err := url.Parse(broker)
	return err == nil && directSchemes[u.Scheme]
}

// nextBackoff returns the wait before the reconnect after one that waited
// cur (0 for the first after an established connection ended: no wait),
// doubling up to limit.
func nextBackoff(cur, limit time.Duration) time.Duration {
	if cur <= 0 {
		return firstRetry
	}
	return min(2*cur, limit)
}

// runDirect is the direct reader (SubscriberConfig.Client "direct"): it
// connects, subscribes and reads the broker's packets until Close,
// reconnecting with backoff when a connection fails or ends. It runs on
// its own goroutine, the only one that reads the connection and appends
// to the log.
//
// The reader decodes the packets with mochi's codec from a 64 KiB
// buffered reader, appends each PUBLISH to the log in arrival order
// without waiting for the fsync (the same dedup, append and budgets as
// the paho client's handler), and hands the acker a batch of up to
// maxBatch deliveries whenever the buffer holds no further packet: the
// acker waits once for the fsync that covers the batch's last record and
// writes the batch's acknowledgements (PUBACK, or PUBREC for QoS 2)
// together, to the connection they arrived on. There is no goroutine
// hand-off per message. Before it would wait (for budget or for log
// space) the reader hands over what it holds, so that the acker can
// release it.
//
// A connection that the broker accepted and that lasted at least
// firstRetry is followed by an immediate reconnect; a failed attempt, or
// a connection that ended sooner, by a wait of firstRetry doubling up to
// MaxReconnectInterval (nextBackoff).
func (s *Subscriber) runDirect() {
	var wait time.Duration
	for {
		start := time.Now()
		up, err := s.directSession()
		s.down()
		if s.ctx.Err() != nil {
			return
		}
		switch {
		case up:
			s.logger.Warn("mqtt subscriber: connection lost; reconnecting", "error", err)
		case errors.Is(err, ErrConnectRefused):
			s.logger.Error("mqtt subscriber: connect refused; retrying", "error", err)
		default:
			s.logger.Warn("mqtt subscriber: connect failed; retrying", "error", err)
		}
		if up && time.Since(start) >= firstRetry {
			wait = 0
			continue
		}
		wait = nextBackoff(wait, s.cfg.MaxReconnectInterval)
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-s.ctx.Done():
			t.Stop()
			return
		}
	}
}

// dialDirect opens the network connection to the broker.
func (s *Subscriber) dialDirect(u *url.URL) (net.Conn, error) {
	if s.openConn != nil {
		return s.openConn(u, paho.ClientOptions{})
	}
	d := &net.Dialer{Timeout: connectTimeout}
	switch u.Scheme {
	case "unix":
		addr := u.Host
		if addr == "" {
			addr = u.Path
		}
		return d.DialContext(s.ctx, "unix", addr)
	case "ssl", "tls", "mqtts", "mqtt+ssl", "tcps":
		return (&tls.Dialer{NetDialer: d}).DialContext(s.ctx, "tcp", u.Host)
	default:
		return d.DialContext(s.ctx, "tcp", u.Host)
	}
}

// directSession runs one connection: dial, CONNECT, CONNACK, SUBSCRIBE,
// then the read loop until the connection fails or the subscriber
// closes. up reports whether the broker accepted the connection.
func (s *Subscriber) directSession() (up bool, err error) {
	u, err := url.Parse(s.cfg.Broker)
	if err != nil {
		return false, fmt.Errorf("broker URL %q: %w", s.cfg.Broker, err)
	}
	nc, err := s.dialDirect(u)
	if err != nil {
		return false, fmt.Errorf("dial %s: %w", u.Redacted(), err)
	}
	keepAlive := s.keepAlive
	if keepAlive <= 0 {
		keepAlive = defaultKeepAlive
	}
	dc := newDirectConn(nc, keepAlive+pingTimeout, s.cfg.MaxMessageBytes, s.gatherFor)
	defer dc.close()
	s.mu.Lock()
	if s.ctx.Err() != nil {
		s.mu.Unlock()
		return false, s.ctx.Err()
	}
	s.dconn = dc
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.dconn = nil
		s.mu.Unlock()
	}()

	if err := dc.connect(s.cfg.ClientID, u.User, keepAlive); err != nil {
		return false, err
	}
	fh, body, err := dc.readPacket()
	if err != nil {
		return false, fmt.Errorf("read CONNACK: %w", err)
	}
	if fh.Type != packets.Connack {
		return false, fmt.Errorf("%w: %s before CONNACK", ErrMalformedPacket, packets.PacketNames[fh.Type])
	}
	ack := packets.Packet{FixedHeader: fh, ProtocolVersion: protocolVersion}
	if err := ack.ConnackDecode(body); err != nil {
		return false, fmt.Errorf("%w: CONNACK: %w", ErrMalformedPacket, err)
	}
	if ack.ReasonCode != 0 {
		return false, fmt.Errorf("%w: %s (return code %d)", ErrConnectRefused, connackReason(ack.ReasonCode), ack.ReasonCode)
	}
	s.logger.Info("mqtt subscriber connected", append(s.up(), "session_present", ack.SessionPresent)...)
	if !ack.SessionPresent {
		s.seen.releaseAll() // a new session: the broker holds no open QoS 2 exchange
	}
	// Unsubscribe first: the SUBACK, which makes the subscriber ready,
	// then comes last.
	p := s.subs.plan(ack.SessionPresent)
	dc.plan = p
	if len(p.unsub) > 0 {
		if err := dc.unsubscribe(p.unsub); err != nil {
			return true, err
		}
	}
	if len(p.sub) > 0 {
		if err := dc.subscribe(p.sub, s.cfg.QoS); err != nil {
			return true, err
		}
	}
	if len(p.sub) == 0 && len(p.unsub) == 0 {
		s.resumed()
	}
	var pinger sync.WaitGroup
	stop := make(chan struct{})
	pinger.Go(func() { dc.ping(keepAlive, stop) })
	defer func() {
		close(stop)
		pinger.Wait()
	}()
	return true, s.readLoop(dc)
}

// connackReason names a CONNACK return code of MQTT 3.1.1.
func connackReason(code byte) string {
	switch code {
	case 1:
		return "unacceptable protocol version"
	case 2:
		return "client identifier rejected"
	case 3:
		return "server unavailable"
	case 4:
		return "bad user name or password"
	case 5:
		return "not authorized"
	}
	return "unknown return code"
}

// inbound is a packet from the broker as the read loop handles it.
type inbound struct {
	fh      packets.FixedHeader
	topic   string // PUBLISH; aliases the packet's bytes
	payload []byte // PUBLISH; aliases the packet's bytes
	id      uint16 // PUBLISH (QoS 1, 2), PUBREL, SUBACK
	codes   []byte // SUBACK
}

// decodeInbound decodes a packet a broker sends a subscriber: PUBLISH,
// PUBREL, SUBACK, UNSUBACK, PINGRESP or DISCONNECT; anything else, or a packet
// that does not decode, is ErrMalformedPacket. The result aliases body.
// It never panics.
func decodeInbound(fh packets.FixedHeader, body []byte) (inbound, error) {
	in := inbound{fh: fh}
	pk := packets.Packet{FixedHeader: fh, ProtocolVersion: protocolVersion}
	var err error
	switch fh.Type {
	case packets.Publish:
		err = pk.PublishDecode(body)
		if errors.Is(err, packets.ErrMalformedTopic) {
			// A topic that is not valid UTF-8 (or holds a NUL), which
			// a broker that does not check its publishers passes on:
			// taken as it is, as paho does. Refusing it would drop
			// the connection, and the broker would send it again on
			// every session: the subscription would never get past it.
			pk.TopicName, pk.PacketID, pk.Payload, err = rawPublish(fh, body)
		}
		if err == nil && fh.Qos > 0 && pk.PacketID == 0 {
			err = errors.New("QoS > 0 without a packet identifier")
		}
		in.topic, in.payload, in.id = pk.TopicName, pk.Payload, pk.PacketID
	case packets.Pubrel:
		err = pk.PubrelDecode(body)
		in.id = pk.PacketID
	case packets.Suback:
		err = pk.SubackDecode(body)
		in.id, in.codes = pk.PacketID, pk.ReasonCodes
	case packets.Unsuback:
		err = pk.UnsubackDecode(body)
		in.id = pk.PacketID
	case packets.Pingresp, packets.Disconnect:
		if len(body) != 0 {
			err = errors.New("unexpected body")
		}
	default:
		err = errors.New("not a packet a broker sends a subscriber")
	}
	if err != nil {
		name, ok := packets.PacketNames[fh.Type]
		if !ok {
			name = "packet type " + fmt.Sprint(fh.Type)
		}
		return inbound{}, fmt.Errorf("%w: %s: %w", ErrMalformedPacket, name, err)
	}
	return in, nil
}

// rawPublish splits an MQTT 3.1.1 PUBLISH body whose topic name mochi's
// codec refused for its content (not valid UTF-8, a NUL) into the topic,
// taken byte for byte, the packet identifier and the payload. The
// framing must still hold: a topic length beyond the body is malformed.
func rawPublish(fh packets.FixedHeader, body []byte) (string, uint16, []byte, error) {
	if len(body) < 2 {
		return "", 0, nil, errors.New("no topic length")
	}
	end := 2 + (int(body[0])<<8 | int(body[1]))
	if end > len(body) {
		return "", 0, nil, fmt.Errorf("topic length %d beyond the packet's %d bytes", end-2, len(body))
	}
	topic := body[2:end]
	var id uint16
	if fh.Qos > 0 {
		if end+2 > len(body) {
			return "", 0, nil, errors.New("no packet identifier")
		}
		id = uint16(body[end])<<8 | uint16(body[end+1])
		end += 2
	}
	return string(topic), id, body[end:], nil
}

// readLoop reads the broker's packets until the connection fails or the
// subscriber closes; see runDirect.
func (s *Subscriber) readLoop(dc *directConn) error {
	var b *batch
	handOff := func() {
		if b != nil {
			s.handOff(b)
			b = nil
		}
	}
	defer handOff()
	for {
		if dc.r.Buffered() == 0 {
			// The next read waits for the network: let the acker have
			// what was read, and send the PUBCOMPs.
			handOff()
			if err := dc.flush(); err != nil {
				return err
			}
		}
		fh, body, err := dc.readPacket()
		var in inbound
		var tooLarge int64 // the size of a PUBLISH larger than MaxMessageBytes
		switch {
		case errors.Is(err, errPacketTooLarge) && fh.Type == packets.Publish:
			// Not read: its head is read and the rest discarded, and a
			// dead-letter record takes its place.
			if in, tooLarge, err = dc.readTooLarge(fh, DeadLetterKeep); err != nil {
				return err
			}
		case err != nil:
			return err
		default:
			if in, err = decodeInbound(fh, body); err != nil {
				return err
			}
		}
		switch fh.Type {
		case packets.Publish:
			if s.ctx.Err() != nil {
				return s.ctx.Err() // not acknowledged: redelivered on the next session
			}
			d := delivery{id: in.id, qos: fh.Qos, dup: fh.Dup}
			in.payload = s.classify(&d, in.topic, in.payload, tooLarge)
			if !s.tryAcquire(d.size) {
				handOff()
				if !s.acquire(s.ctx, d.size) {
					return s.ctx.Err()
				}
			}
			if s.dedup(&d) {
				d.topic = strings.Clone(in.topic)
			} else {
				err := s.appendRecord(s.tryCtx, &d, in.topic, in.payload, fh.Retain)
				if err != nil && s.wouldBlock(err) {
					handOff() // the log waits for space: let the acker release what it holds
					err = s.appendRecord(s.ctx, &d, in.topic, in.payload, fh.Retain)
				}
				if err != nil {
					d.err, d.topic = err, strings.Clone(in.topic)
				}
			}
			if b == nil {
				b = s.newBatch(dc)
			}
			b.ds = append(b.ds, d)
			if len(b.ds) >= maxBatch {
				handOff()
			}
		case packets.Pubrel:
			s.seen.release(in.id)
			dc.queue(packets.Pubcomp, in.id)
		case packets.Suback:
			if err := s.subscribed(dc.plan.sub, in.codes); err != nil {
				return err
			}
		case packets.Unsuback:
			s.unsubscribed(dc.plan.unsub)
			if len(dc.plan.sub) == 0 {
				s.resumed()
			}
		case packets.Pingresp:
			s.pings.Add(1)
		case packets.Disconnect:
			return errors.New("the broker sent DISCONNECT")
		}
	}
}

// subscribed handles the SUBACK of a SUBSCRIBE of filters (codes in
// their order): every refused filter is logged, and the session's
// record updated; if the session then holds no filter, the subscription
// failed (ErrSubscribeRefused: the connection is given up and retried).
func (s *Subscriber) subscribed(filters []string, codes []byte) error {
	granted := 0
	for i, c := range codes {
		if c >= 0x80 {
			topic := ""
			if i < len(filters) {
				topic = filters[i]
			}
			s.logger.Error("mqtt subscriber: subscription refused", "topic", topic, "return_code", c)
			continue
		}
		granted++
	}
	held, err := s.subs.subscribed(filters, codes)
	if err != nil {
		s.logger.Warn("mqtt subscriber: the next session may subscribe again (the broker resends its retained messages)", "error", err)
	}
	if granted == 0 && held == 0 {
		err := fmt.Errorf("%w: %v (return codes %v)", ErrSubscribeRefused, filters, codes)
		s.logger.Error("mqtt subscriber: subscribe failed", "error", err)
		return err
	}
	s.logger.Info("mqtt subscriber subscribed", "topics", filters, "granted", granted)
	s.once.Do(func() { close(s.ready) })
	return nil
}

// unsubscribed handles the UNSUBACK of an UNSUBSCRIBE of filters, which
// the configuration no longer lists.
func (s *Subscriber) unsubscribed(filters []string) {
	if err := s.subs.unsubscribed(filters); err != nil {
		s.logger.Warn("mqtt subscriber: recording the unsubscription failed", "error", err)
	}
	s.logger.Info("mqtt subscriber unsubscribed from topics no longer configured", "topics", filters)
}

// resumed is called when a connection subscribes to nothing: the resumed
// session holds every configured filter, so the subscriber is ready
// without a SUBACK (once the UNSUBACK came, if it unsubscribed).
func (s *Subscriber) resumed() {
	if s.subs.held() > 0 {
		s.logger.Info("mqtt subscriber subscribed: the resumed session holds every topic, so not subscribing again (the broker does not resend its retained messages)",
			"topics", s.cfg.Topics)
		s.once.Do(func() { close(s.ready) })
	}
}

// directConn is a connection of the direct reader. The read loop reads
// it (r); the acker, the read loop and the pinger write to it, through
// w under wmu. A write error closes the connection, so the read loop
// ends and the subscriber reconnects.
type directConn struct {
	c    net.Conn
	r    *bufio.Reader
	plan subscriptionPlan // what the connection subscribed and unsubscribed

	wmu  sync.Mutex   // guards w, werr, enc
	w    bytes.Buffer // packets queued, not yet written
	werr error        // sticky write error
	enc  packets.Packet

	big  []byte // reused for packet bodies larger than r's buffer
	once sync.Once
	// maxPacket bounds the packets read whole (SubscriberConfig.
	// MaxMessageBytes): readPacket refuses a larger one before it
	// allocates anything for it.
	maxPacket int64
	// timeout bounds each write as the read deadline bounds reads: a
	// broker that stops reading (its window shut, the connection open)
	// ends the connection instead of holding every writer.
	timeout time.Duration
}

// deadlineReader sets a read deadline before every read of the
// connection: the broker must send something (PINGRESP at least) within
// timeout. With gather set, it first asks gather, given the bytes the
// read before brought, how long to let more arrive before it reads
// (Subscriber.gatherFor).
type deadlineReader struct {
	c       net.Conn
	timeout time.Duration
	gather  func(last int) time.Duration
	last    int // bytes the last read brought
}

func (d *deadlineReader) Read(p []byte) (int, error) {
	if d.gather != nil {
		if pause := d.gather(d.last); pause > 0 {
			t := time.NewTimer(pause)
			<-t.C
		}
	}
	if err := d.c.SetReadDeadline(time.Now().Add(d.timeout)); err != nil {
		return 0, err
	}
	n, err := d.c.Read(p)
	d.last = n
	return n, err
}

func newDirectConn(c net.Conn, readTimeout time.Duration, maxPacket int64, gather func(last int) time.Duration) *directConn {
	return &directConn{c: c, r: bufio.NewReaderSize(&deadlineReader{c: c, timeout: readTimeout, gather: gather}, connReadBuffer),
		timeout: readTimeout, maxPacket: maxPacket}
}

// gatherSmall is the most bytes a read may bring for the direct reader
// to let messages gather before the next one: a read that brings more
// finds the broker sending fast enough to fill reads on its own.
const gatherSmall = connReadBuffer / 8

// gatherFor returns how long the direct reader lets messages gather in
// the socket before its next read, given the bytes its last read
// brought: while the acker waits for more messages anyway (lingering,
// so the broker is not waiting for acknowledgements: see ackLinger),
// and the last read brought a few messages only (a broker slower than
// the reader, the common case when it is the bottleneck), min(ackQuiet,
// AckDelay/4), else 0. A read then brings many messages instead of one
// or two, and the reader wakes once for them instead of once per read
// (each with its read call and read deadline). A message is read at most
// the pause later: one that arrives as the acker's wait ends joins the
// next group commit, acknowledged that much later too. The acker counts
// no quiet while the reader pauses.
func (s *Subscriber) gatherFor(last int) time.Duration {
	pause := s.gatherPause
	if pause <= 0 || last >= gatherSmall || last == 0 || !s.lingering.Load() {
		return 0
	}
	s.gathered.Store(time.Now().Add(pause).UnixNano())
	s.gathers.Add(1)
	return pause
}

// errPacketTooLarge is returned by readPacket for a packet larger than
// maxPacket; the rest of the packet is still unread.
var errPacketTooLarge = errors.New("mqtt: packet larger than source.mqtt.max_message_bytes")

// readPacket reads the next packet: its fixed header and its body, which
// is valid until the next readPacket. A packet larger than maxPacket
// (header included) is not read: readPacket returns its fixed header
// and errPacketTooLarge as soon as it has decoded the remaining length,
// having allocated nothing for the body. For a PUBLISH the caller reads
// it with readTooLarge; any other packet that large is malformed.
func (dc *directConn) readPacket() (packets.FixedHeader, []byte, error) {
	var fh packets.FixedHeader
	hb, err := dc.r.ReadByte()
	if err != nil {
		return fh, nil, err
	}
	if err := fh.Decode(hb); err != nil {
		return fh, nil, fmt.Errorf("%w: fixed header 0x%02x: %w", ErrMalformedPacket, hb, err)
	}
	n, _, err := packets.DecodeLength(dc.r)
	if err != nil {
		if errors.Is(err, packets.ErrMalformedVariableByteInteger) {
			return fh, nil, fmt.Errorf("%w: remaining length: %w", ErrMalformedPacket, err)
		}
		return fh, nil, err
	}
	fh.Remaining = n
	if size := 1 + int64(lengthBytes(int64(n))) + int64(n); dc.maxPacket > 0 && size > dc.maxPacket {
		if fh.Type != packets.Publish {
			return fh, nil, fmt.Errorf("%w: %s of %d bytes: %w", ErrMalformedPacket, packets.PacketNames[fh.Type], size, errPacketTooLarge)
		}
		return fh, nil, fmt.Errorf("PUBLISH of %d bytes, at most %d: %w", size, dc.maxPacket, errPacketTooLarge)
	}
	if n <= dc.r.Size() {
		body, err := dc.r.Peek(n)
		if err != nil {
			return fh, nil, err
		}
		_, _ = dc.r.Discard(n) // Peek returned n bytes
		return fh, body, nil
	}
	body := dc.big
	if n > maxBodyReuse {
		body = nil
	}
	if cap(body) < n {
		body = make([]byte, n)
		if n <= maxBodyReuse {
			dc.big = body
		}
	}
	body = body[:n]
	if _, err := io.ReadFull(dc.r, body); err != nil {
		return fh, nil, err
	}
	return fh, body, nil
}

// readTooLarge reads the PUBLISH that readPacket refused as too large
// (fh): its topic, its packet identifier and the first keep bytes of its
// payload, and discards the rest of the packet through the read buffer,
// so that memory stays within the buffer, the topic (at most 64 KiB)
// and keep bytes, whatever the packet's size. It returns them as an
// inbound (payload holds the kept bytes) with the packet's size. The
// topic is taken byte for byte, as rawPublish does. A packet whose
// framing does not hold is ErrMalformedPacket; a read error ends the
// connection as any other.
func (dc *directConn) readTooLarge(fh packets.FixedHeader, keep int) (inbound, int64, error) {
	rest := int64(fh.Remaining)
	malformed := func(what string) error {
		return fmt.Errorf("%w: PUBLISH of %d bytes: %s", ErrMalformedPacket, rest, what)
	}
	var two [2]byte
	if rest < 2 {
		return inbound{}, 0, malformed("no topic length")
	}
	if _, err := io.ReadFull(dc.r, two[:]); err != nil {
		return inbound{}, 0, err
	}
	tl := int64(two[0])<<8 | int64(two[1])
	if 2+tl > rest {
		return inbound{}, 0, malformed(fmt.Sprintf("topic length %d beyond the packet", tl))
	}
	topic := make([]byte, tl)
	if _, err := io.ReadFull(dc.r, topic); err != nil {
		return inbound{}, 0, err
	}
	left := rest - 2 - tl
	in := inbound{fh: fh, topic: string(topic)}
	if fh.Qos > 0 {
		if left < 2 {
			return inbound{}, 0, malformed("no packet identifier")
		}
		if _, err := io.ReadFull(dc.r, two[:]); err != nil {
			return inbound{}, 0, err
		}
		in.id = uint16(two[0])<<8 | uint16(two[1])
		if in.id == 0 {
			return inbound{}, 0, malformed("QoS > 0 without a packet identifier")
		}
		left -= 2
	}
	size := 1 + int64(lengthBytes(rest)) + rest
	in.payload = make([]byte, min(left, int64(keep)))
	if _, err := io.ReadFull(dc.r, in.payload); err != nil {
		return inbound{}, 0, err
	}
	left -= int64(len(in.payload))
	for left > 0 { // through the read buffer, a buffer's worth at a time
		n, err := dc.r.Discard(int(min(left, int64(dc.r.Size()))))
		left -= int64(n)
		if err != nil {
			return inbound{}, 0, err
		}
	}
	return in, size, nil
}

// connect writes CONNECT: persistent session (clean session false), the
// keep-alive, and the user name and password of the broker URL, as paho
// takes them.
func (dc *directConn) connect(clientID string, user *url.Userinfo, keepAlive time.Duration) error {
	pk := packets.Packet{
		FixedHeader:     packets.FixedHeader{Type: packets.Connect},
		ProtocolVersion: protocolVersion,
		Connect: packets.ConnectParams{
			ProtocolName:     []byte("MQTT"),
			ClientIdentifier: clientID,
			Keepalive:        uint16(min(keepAlive/time.Second, 65535)),
			Clean:            false,
		},
	}
	if pk.Connect.Keepalive == 0 {
		pk.Connect.Keepalive = 1
	}
	if user != nil && user.Username() != "" {
		pk.Connect.UsernameFlag, pk.Connect.Username = true, []byte(user.Username())
		if pw, ok := user.Password(); ok && pw != "" {
			pk.Connect.PasswordFlag, pk.Connect.Password = true, []byte(pw)
		}
	}
	return dc.write("CONNECT", pk.ConnectEncode)
}

// write encodes a packet (what names it) with encode and writes it with
// everything queued before it.
func (dc *directConn) write(what string, encode func(*bytes.Buffer) error) error {
	dc.wmu.Lock()
	err := encode(&dc.w)
	dc.wmu.Unlock()
	if err != nil {
		return fmt.Errorf("encode %s: %w", what, err)
	}
	return dc.flush()
}

// unsubscribe writes UNSUBSCRIBE for topics (packet identifier 2; the
// SUBSCRIBE has 1).
func (dc *directConn) unsubscribe(topics []string) error {
	pk := packets.Packet{
		FixedHeader:     packets.FixedHeader{Type: packets.Unsubscribe, Qos: 1},
		ProtocolVersion: protocolVersion,
		PacketID:        2,
	}
	for _, t := range topics {
		pk.Filters = append(pk.Filters, packets.Subscription{Filter: t})
	}
	return dc.write("UNSUBSCRIBE", pk.UnsubscribeEncode)
}

// subscribe writes SUBSCRIBE for topics at qos.
func (dc *directConn) subscribe(topics []string, qos byte) error {
	pk := packets.Packet{
		FixedHeader:     packets.FixedHeader{Type: packets.Subscribe, Qos: 1},
		ProtocolVersion: protocolVersion,
		PacketID:        1,
	}
	for _, t := range topics {
		pk.Filters = append(pk.Filters, packets.Subscription{Filter: t, Qos: qos})
	}
	return dc.write("SUBSCRIBE", pk.SubscribeEncode)
}

// queue adds an acknowledgement (PUBACK, PUBREC or PUBCOMP) of packet
// identifier id to the packets to write.
func (dc *directConn) queue(typ byte, id uint16) {
	dc.wmu.Lock()
	defer dc.wmu.Unlock()
	if dc.werr != nil {
		return
	}
	dc.enc = packets.Packet{FixedHeader: packets.FixedHeader{Type: typ}, PacketID: id, ProtocolVersion: protocolVersion}
	var err error
	switch typ {
	case packets.Puback:
		err = dc.enc.PubackEncode(&dc.w)
	case packets.Pubrec:
		err = dc.enc.PubrecEncode(&dc.w)
	case packets.Pubcomp:
		err = dc.enc.PubcompEncode(&dc.w)
	}
	if err != nil {
		dc.werr = err
	}
}

// ack queues d's acknowledgement: PUBACK for QoS 1, PUBREC for QoS 2
// (the broker's PUBREL is answered by the read loop), nothing for QoS 0.
func (dc *directConn) ack(d *delivery) {
	switch d.qos {
	case 1:
		dc.queue(packets.Puback, d.id)
	case 2:
		dc.queue(packets.Pubrec, d.id)
	}
}

// send writes what ack queued (the acker's side of flush).
func (dc *directConn) send() { _ = dc.flush() }

// flush writes the queued packets with one write. After a failed write
// the connection is closed and flush returns the error again.
func (dc *directConn) flush() error {
	dc.wmu.Lock()
	defer dc.wmu.Unlock()
	if dc.werr == nil && dc.w.Len() > 0 {
		err := dc.c.SetWriteDeadline(time.Now().Add(dc.timeout))
		if err == nil {
			_, err = dc.c.Write(dc.w.Bytes())
		}
		if err != nil {
			dc.werr = err
		}
		dc.w.Reset()
	}
	if dc.werr != nil {
		_ = dc.c.Close() // the read loop ends
		return fmt.Errorf("write to the broker: %w", dc.werr)
	}
	return nil
}

// ping writes a PINGREQ every keepAlive until stop is closed.
func (dc *directConn) ping(keepAlive time.Duration, stop <-chan struct{}) {
	t := time.NewTicker(keepAlive)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Pingreq}}
			dc.wmu.Lock()
			_ = pk.PingreqEncode(&dc.w)
			dc.wmu.Unlock()
			if dc.flush() != nil {
				return
			}
		case <-stop:
			return
		}
	}
}

// disconnect writes DISCONNECT after what is queued (bounded by
// closeFlushTimeout) and closes the connection.
func (dc *directConn) disconnect() {
	_ = dc.c.SetWriteDeadline(time.Now().Add(closeFlushTimeout))
	pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Disconnect}, ProtocolVersion: protocolVersion}
	dc.wmu.Lock()
	_ = pk.DisconnectEncode(&dc.w)
	dc.wmu.Unlock()
	_ = dc.flush()
	dc.close()
}

// close closes the connection; closing twice is a no-op.
func (dc *directConn) close() {
	dc.once.Do(func() { _ = dc.c.Close() })
}

var _ acknowledger = (*directConn)(nil)
