package mqtt

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	pahopackets "github.com/eclipse/paho.mqtt.golang/packets"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/mqtt/ingestlog"
)

// QoS 1 devices publish under load while the broker is stopped
// gracefully and started again on the same address and log: no message
// the first broker appended is appended again (no device resent a message
// whose append finished: the drain let every such PUBACK through), every
// acknowledged message is in the log, and Close found publishes in
// flight. (paho itself may send one message twice after a reconnect, from
// its store and from its send queue; those duplicates are both appended
// by the second broker and are QoS 1's at-least-once, not the drain's.)
func TestBrokerGracefulStopNoResend(t *testing.T) {
	testutil.Burn(t, 1)
	const devices, perDevice, window = 4, 120, 20
	dir := t.TempDir()
	opts := ingestlog.DefaultOptions()
	opts.SyncInterval = 30 * time.Millisecond // appends spend time in flight
	l := openLog(t, dir, opts)
	b := startBrokerCfg(t, l, BrokerConfig{}, nil)
	addr := b.Addr()

	var wg sync.WaitGroup
	var mu sync.Mutex
	acked := map[string]bool{} // PUBACK seen (see ackStore)
	ack := func(p string) {
		mu.Lock()
		acked[p] = true
		mu.Unlock()
	}
	for d := range devices {
		c := connect(t, addr, fmt.Sprintf("dev-%d", d), func(o *paho.ClientOptions) {
			o.SetCleanSession(false).SetAutoReconnect(true).SetConnectRetry(true).
				SetConnectRetryInterval(20 * time.Millisecond).SetMaxReconnectInterval(50 * time.Millisecond).
				SetStore(ackStore{Store: paho.NewMemoryStore(), acked: ack})
		})
		wg.Go(func() {
			var toks []paho.Token
			for i := range perDevice {
				toks = append(toks, c.Publish("sensors/x", 1, false, fmt.Sprintf("d%d-%d", d, i)))
				if len(toks) == window || i == perDevice-1 {
					for _, tok := range toks {
						tok.WaitTimeout(waitBound)
					}
					toks = toks[:0]
				}
			}
		})
	}
	testutil.Eventually(t, waitBound, "devices publishing", func() bool {
		return l.Stats().Appends > devices*perDevice/4 && b.drain.busyCount() > 0
	})
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	b.drain.mu.Lock()
	atStart := b.drain.atStart
	b.drain.mu.Unlock()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	before := logPayloads(t, dir)
	l = openLog(t, dir, opts)
	b2 := startBrokerCfg(t, l, BrokerConfig{Address: addr}, nil)
	wg.Wait()
	if err := b2.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	got := logPayloads(t, dir)
	for d := range devices {
		for i := range perDevice {
			p := fmt.Sprintf("d%d-%d", d, i)
			if n := got[p]; n == 0 && acked[p] {
				t.Errorf("%s acknowledged but not in the log", p)
			}
			if n := before[p]; n > 1 || (n == 1 && got[p] > 1) {
				t.Errorf("%s appended by the first broker, in the log %d times", p, got[p])
			}
		}
	}
	if atStart == 0 {
		t.Fatal("no publish was in flight when Close began: the drain was not exercised")
	}
	t.Logf("in flight at Close: %d connections; %d of %d acknowledged", atStart, len(acked), devices*perDevice)
}

// ackStore is a paho store that tells which messages got their PUBACK:
// paho v1.5.1 deletes a publish from its store when the PUBACK comes, and
// only then. (A token says nothing: when paho resends the messages of its
// store after a reconnect, it completes their first tokens, without an
// error, as it claims their packet ids again.) It also stores a copy of
// each packet: paho sets the Dup flag of the packets it loads from its
// store when it reconnects, while its sending goroutine may be writing
// the same packet (one published during the reconnect, which the store
// would hold by pointer), a data race.
type ackStore struct {
	paho.Store
	acked func(payload string)
}

func (s ackStore) Put(key string, m pahopackets.ControlPacket) {
	var buf bytes.Buffer
	if err := m.Write(&buf); err == nil {
		if c, err := pahopackets.ReadPacket(&buf); err == nil {
			m = c
		}
	}
	s.Store.Put(key, m)
}

func (s ackStore) Del(key string) {
	if strings.HasPrefix(key, "o.") {
		if pub, ok := s.Store.Get(key).(*pahopackets.PublishPacket); ok {
			s.acked(string(pub.Payload))
		}
	}
	s.Store.Del(key)
}

// A PUBLISH that reaches a draining broker is refused, and its connection
// ends after the acknowledgements written before it: the device reads
// them, then the end of the stream (no PUBACK for the refused message,
// no reset). The broker goes on reading what the device sends after
// that, and the stop ends when the device closes, not at the linger
// bound.
func TestBrokerDrainEndsARefusedConnectionAfterItsAcknowledgements(t *testing.T) {
	dir := t.TempDir()
	l := openLog(t, dir, ingestlog.DefaultOptions())
	// The stop must not depend on the linger bound.
	b := startBrokerWith(t, l, BrokerConfig{}, func(b *Broker) { b.lingerTimeout = time.Hour })
	c, _ := dialRaw(t, b.Addr(), "dev", false)
	c.publish(1, 1, "sensors/x", []byte("before"), false)
	c.expect(packets.Puback, 1)

	// An acknowledgement held for the length of the test's PUBLISH: the
	// drain waits for it, so the PUBLISH meets the broker draining, not
	// closed (with nothing in flight the drain ends at once and the
	// broker could close the connection before it reads the PUBLISH).
	b.drain.hold(1)
	closed := closeDraining(t, b)
	c.publish(1, 2, "sensors/x", []byte("refused"), false)
	for {
		pk, err := c.read()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				t.Fatalf("connection ended with %v, want the end of the stream (io.EOF)", err)
			}
			break
		}
		if pk.FixedHeader.Type == packets.Puback && pk.PacketID == 2 {
			t.Fatal("the refused PUBLISH was acknowledged")
		}
	}
	b.drain.hold(-1)
	// Still read by the broker (a write to a closed socket would be
	// answered with a reset).
	c.publish(1, 3, "sensors/x", []byte("after the end"), false)
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) before the device closed its connection", err)
	default:
	}
	c.conn.Close()
	if err := testutil.Receive(t, waitBound, "Close returns", closed); err != nil {
		t.Fatal(err)
	}
	b.drain.mu.Lock()
	refused := b.drain.refused
	b.drain.mu.Unlock()
	if refused != 1 {
		t.Fatalf("%d PUBLISH packets refused, want 1", refused)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if got := logPayloads(t, dir); got["before"] != 1 || len(got) != 1 {
		t.Fatalf("log holds %v, want only \"before\" once", got)
	}
}

// publishUntilEnd publishes QoS 1 messages "m-<i>" (packet id i+1) on
// conn as fast as the broker acknowledges them, at most window
// unacknowledged, and reads the PUBACKs, until the broker ends the
// connection; then it closes conn, as a device does when its broker goes.
// It returns the packet ids acknowledged and the error that ended the
// reading (io.EOF when the broker ended the stream cleanly).
func publishUntilEnd(conn net.Conn, window, max int) (acked map[uint16]bool, end error) {
	r := bufio.NewReader(conn)
	slots := make(chan struct{}, window)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		var buf bytes.Buffer
		for i := range max {
			select {
			case slots <- struct{}{}:
			case <-done:
				return
			}
			buf.Reset()
			pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1},
				ProtocolVersion: 4, PacketID: uint16(i + 1), TopicName: "sensors/x", Payload: fmt.Appendf(nil, "m-%d", i)}
			if err := pk.PublishEncode(&buf); err != nil {
				panic(err)
			}
			if _, err := conn.Write(buf.Bytes()); err != nil {
				return // the connection ended
			}
		}
	})
	acked = map[uint16]bool{}
	for {
		conn.SetReadDeadline(time.Now().Add(waitBound))
		var fh packets.FixedHeader
		hb, err := r.ReadByte()
		if err == nil {
			err = fh.Decode(hb)
		}
		var n int
		if err == nil {
			n, _, err = packets.DecodeLength(r)
		}
		body := make([]byte, n)
		if err == nil {
			_, err = io.ReadFull(r, body)
		}
		if err != nil {
			end = err
			break
		}
		if fh.Type == packets.Puback {
			pk := packets.Packet{FixedHeader: fh, ProtocolVersion: 4}
			if err := pk.PubackDecode(body); err != nil {
				end = err
				break
			}
			acked[pk.PacketID] = true
			<-slots
		}
	}
	close(done)
	conn.Close()
	wg.Wait()
	return acked, end
}

// A device keeps publishing QoS 1 messages while the broker stops: it
// reads the PUBACK of every message the broker appended (every record of
// the log), then the end of the stream, not a reset (the broker ends its
// side after the last PUBACK and reads what the device still sends until
// the device closes, so no unread data turns the close into a reset that
// drops acknowledgements on their way). A device that closes when it
// sees the end does not make the stop wait for the linger bound.
func TestBrokerStopEndsAPublishingConnectionAfterItsAcknowledgements(t *testing.T) {
	testutil.Burn(t, 1)
	const window, max = 256, 65535
	dir := t.TempDir()
	l := openLog(t, dir, ingestlog.DefaultOptions())
	// The stop must not depend on the linger bound.
	b := startBrokerWith(t, l, BrokerConfig{}, func(b *Broker) { b.lingerTimeout = time.Hour })
	c, _ := dialRaw(t, b.Addr(), "dev", false)
	type result struct {
		acked map[uint16]bool
		end   error
	}
	res := make(chan result, 1)
	go func() {
		acked, end := publishUntilEnd(c.conn, window, max)
		res <- result{acked, end}
	}()
	testutil.Eventually(t, waitBound, "the device publishing", func() bool { return l.Stats().Appends >= 500 })
	closed := closing(b)
	r := testutil.Receive(t, waitBound, "the device's connection to end", res)
	if err := testutil.Receive(t, waitBound, "Close returns", closed); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(r.end, io.EOF) {
		t.Errorf("the connection ended with %v, want the end of the stream (io.EOF)", r.end)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	logged := logPayloads(t, dir)
	for i := range max {
		p := fmt.Sprintf("m-%d", i)
		switch n, ack := logged[p], r.acked[uint16(i+1)]; {
		case n > 1:
			t.Errorf("%s in the log %d times", p, n)
		case n == 1 && !ack:
			t.Errorf("%s in the log but its PUBACK never reached the device", p)
		case n == 0 && ack:
			t.Errorf("%s acknowledged but not in the log", p)
		}
	}
	b.drain.mu.Lock()
	refused := b.drain.refused
	b.drain.mu.Unlock()
	t.Logf("%d messages logged and acknowledged; %d PUBLISH refused", len(logged), refused)
}

// A device that connects while the broker drains is refused, and the
// drain does not wait for its CONNECT (mochi reports no end of processing
// for a CONNECT it refuses): the stop ends once the publishes in flight
// are acknowledged, not at the drain timeout.
func TestBrokerDrainIsNotHeldByARefusedConnect(t *testing.T) {
	dir := t.TempDir()
	l := openLog(t, dir, ingestlog.DefaultOptions())
	release := make(chan struct{})
	b := startBrokerWith(t, l, BrokerConfig{DrainTimeout: time.Hour}, func(b *Broker) {
		b.durableWait = func(lg *ingestlog.Log, off uint64) error {
			<-release
			return lg.WaitDurable(off)
		}
	})
	c, _ := dialRaw(t, b.Addr(), "dev", true)
	c.publish(1, 1, "sensors/x", []byte("held"), false) // its PUBACK waits for release
	testutil.Eventually(t, waitBound, "the PUBACK held", func() bool { return b.drain.busyCount() > 0 })

	closed := closeDraining(t, b)
	late, err := net.Dial("tcp", b.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer late.Close()
	var buf bytes.Buffer
	pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Connect}, ProtocolVersion: 4,
		Connect: packets.ConnectParams{ProtocolName: []byte("MQTT"), ClientIdentifier: "late", Clean: true, Keepalive: 60}}
	if err := pk.ConnectEncode(&buf); err != nil {
		t.Fatal(err)
	}
	if _, err := late.Write(buf.Bytes()); err != nil {
		t.Fatal(err)
	}
	late.SetReadDeadline(time.Now().Add(waitBound))
	if n, err := late.Read(make([]byte, 64)); err == nil {
		t.Fatalf("the broker answered a CONNECT while draining (%d bytes)", n)
	}
	late.Close()

	close(release)
	c.expect(packets.Puback, 1)
	if err := testutil.Receive(t, waitBound, "Close returns", closed); err != nil {
		t.Fatal(err)
	}
}

// Devices that never close their connections do not hold a stop past
// the linger bound: one that neither reads nor sends, one that keeps
// sending without reading, a subscriber that reads nothing of what is
// routed to it (the broker's write to it blocks), and one that never
// sends its CONNECT. Close lingers for them (it does not close while
// they may still read what was written), then closes.
func TestBrokerStopIsBoundedForDevicesThatNeverClose(t *testing.T) {
	const bound = 200 * time.Millisecond
	l := openLog(t, t.TempDir(), ingestlog.DefaultOptions())
	b := startBrokerWith(t, l, BrokerConfig{}, func(b *Broker) { b.lingerTimeout = bound })
	quiet, _ := dialRaw(t, b.Addr(), "quiet", true)
	quiet.publish(1, 1, "sensors/x", []byte("quiet"), false)
	quiet.expect(packets.Puback, 1)
	sub, _ := dialRaw(t, b.Addr(), "sub", true)
	sub.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Subscribe}, PacketID: 1,
		Filters: packets.Subscriptions{{Filter: "sensors/#"}}})
	sub.expect(packets.Suback, 1)
	mute, err := net.Dial("tcp", b.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer mute.Close()
	chatty, _ := dialRaw(t, b.Addr(), "chatty", true)
	var buf bytes.Buffer
	pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish}, ProtocolVersion: 4,
		TopicName: "sensors/x", Payload: make([]byte, 4096)}
	if err := pk.PublishEncode(&buf); err != nil {
		t.Fatal(err)
	}
	sent := make(chan int, 1)
	go func() { // QoS 0: the broker answers nothing
		n := 0
		for {
			if _, err := chatty.conn.Write(buf.Bytes()); err != nil {
				sent <- n
				return
			}
			n++
		}
	}()
	// 20 MB routed to the subscriber: more than its connection buffers.
	testutil.Eventually(t, waitBound, "the chatty device publishing", func() bool { return l.Stats().Appends > 5000 })

	start := time.Now()
	closed := closing(b)
	if err := testutil.Receive(t, waitBound, "Close returns", closed); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < bound {
		t.Errorf("Close returned after %v, before the linger bound (%v): it did not wait for the devices", took, bound)
	}
	// The broker closed the chatty device's connection: its writes fail.
	n := testutil.Receive(t, waitBound, "the chatty device's writes to fail", sent)
	t.Logf("Close took %v; the chatty device wrote %d messages", time.Since(start), n)
}

// closing closes b in another goroutine; the channel gets Close's error.
func closing(b *Broker) <-chan error {
	closed := make(chan error, 1)
	go func() { closed <- b.Close() }()
	return closed
}

// closeDraining closes b in another goroutine and returns once it drains.
func closeDraining(t *testing.T, b *Broker) <-chan error {
	t.Helper()
	closed := closing(b)
	testutil.Eventually(t, waitBound, "the broker draining", func() bool {
		b.drain.mu.Lock()
		defer b.drain.mu.Unlock()
		return b.drain.draining
	})
	return closed
}
