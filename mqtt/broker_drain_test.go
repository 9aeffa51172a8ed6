package mqtt

import (
	"bytes"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
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
	acked := map[string]bool{} // PUBACK seen; a token that failed across the reconnect says nothing
	for d := range devices {
		c := connect(t, addr, fmt.Sprintf("dev-%d", d), func(o *paho.ClientOptions) {
			o.SetCleanSession(false).SetAutoReconnect(true).SetConnectRetry(true).
				SetConnectRetryInterval(20 * time.Millisecond).SetMaxReconnectInterval(50 * time.Millisecond)
		})
		wg.Go(func() {
			var toks []paho.Token
			var ps []string
			for i := range perDevice {
				p := fmt.Sprintf("d%d-%d", d, i)
				toks, ps = append(toks, c.Publish("sensors/x", 1, false, p)), append(ps, p)
				if len(toks) == window || i == perDevice-1 {
					for k, tok := range toks {
						if tok.WaitTimeout(waitBound) && tok.Error() == nil {
							mu.Lock()
							acked[ps[k]] = true
							mu.Unlock()
						}
					}
					toks, ps = toks[:0], ps[:0]
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

// A PUBLISH that reaches a draining broker is refused, but its connection
// is closed only when the broker closes every connection (after the
// linger), never right behind the acknowledgements written before it:
// the device reads those (paho v1.5.1 dropped acknowledgements it had
// read when the close came right behind them, and resent those messages
// after reconnecting, appended twice).
func TestBrokerDrainHoldsARefusedConnectionUntilClose(t *testing.T) {
	dir := t.TempDir()
	l := openLog(t, dir, ingestlog.DefaultOptions())
	b := startBrokerCfg(t, l, BrokerConfig{}, nil)
	c, _ := dialRaw(t, b.Addr(), "dev", false)
	c.publish(1, 1, "sensors/x", []byte("before"), false)
	c.expect(packets.Puback, 1)

	closed := make(chan error, 1)
	go func() { closed <- b.Close() }()
	testutil.Eventually(t, waitBound, "the broker draining", func() bool {
		b.drain.mu.Lock()
		defer b.drain.mu.Unlock()
		return b.drain.draining
	})
	c.publish(1, 2, "sensors/x", []byte("refused"), false)
	// The connection ends (EOF) only once the refused connections were
	// released, and the refused message got no PUBACK.
	for {
		pk, err := c.read()
		if err != nil {
			select {
			case <-b.drain.release:
			default:
				t.Fatalf("connection ended (%v) before the broker released the refused connections", err)
			}
			break
		}
		if pk.FixedHeader.Type == packets.Puback && pk.PacketID == 2 {
			t.Fatal("the refused PUBLISH was acknowledged")
		}
	}
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
	if got := logPayloads(t, dir); got["before"] != 1 || got["refused"] != 0 {
		t.Fatalf("log holds %v, want only \"before\" once", got)
	}
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

	closed := make(chan error, 1)
	go func() { closed <- b.Close() }()
	testutil.Eventually(t, waitBound, "the broker draining", func() bool {
		b.drain.mu.Lock()
		defer b.drain.mu.Unlock()
		return b.drain.draining
	})
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
