package mqtt

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/mqtt/ingestlog"
)

// The broker holds at most MaxConnections connections: one past it is
// closed as it is accepted, counted and logged, and once a client leaves
// a new one is taken again.
func TestBrokerBoundsConnections(t *testing.T) {
	l := openLog(t, t.TempDir(), ingestlog.DefaultOptions())
	logs := &testutil.Buffer{}
	cfg := DefaultBrokerConfig()
	cfg.MaxConnections = 3
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	b := startBrokerCfg(t, l, cfg, nil)

	first, _ := dialRaw(t, b.Addr(), "c0", true)
	dialRaw(t, b.Addr(), "c1", true)
	// A connection that never sends its CONNECT counts too.
	idle, err := net.Dial("tcp", b.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	testutil.Eventually(t, waitBound, "the broker to hold three connections", func() bool {
		b.tcp.mu.Lock()
		defer b.tcp.mu.Unlock()
		return len(b.tcp.conns) == 3
	})
	over, err := net.Dial("tcp", b.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer over.Close()
	over.SetReadDeadline(time.Now().Add(waitBound))
	if n, err := over.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("a connection past the bound read %d bytes, %v; want it closed (EOF)", n, err)
	}
	if n := b.ConnectionsRefused(); n != 1 {
		t.Fatalf("ConnectionsRefused %d, want 1", n)
	}
	if !strings.Contains(logs.String(), "connections at their bound") {
		t.Fatal("the refusal was not logged")
	}
	first.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Disconnect}})
	testutil.Eventually(t, waitBound, "the broker to let the first client go", func() bool {
		b.tcp.mu.Lock()
		defer b.tcp.mu.Unlock()
		return len(b.tcp.conns) == 2
	})
	dialRaw(t, b.Addr(), "c2", true)
}

// A client holds at most MaxSubscriptions topic filters: a SUBSCRIBE's
// filters past it are refused one by one in the SUBACK, its others (new
// ones within the bound, filters it holds already) granted; an
// unsubscribe makes room again.
func TestBrokerBoundsSubscriptions(t *testing.T) {
	l := openLog(t, t.TempDir(), ingestlog.DefaultOptions())
	logs := &testutil.Buffer{}
	cfg := DefaultBrokerConfig()
	cfg.MaxSubscriptions = 3
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	b := startBrokerCfg(t, l, cfg, nil)

	for _, v5 := range []bool{false, true} {
		var c *rawClient
		id, fail := "sub", byte(0x80)
		if v5 {
			id = "sub5"
			c, _ = dialRaw5(t, b.Addr(), id)
			fail = packets.ErrTopicFilterInvalid.Code
		} else {
			c, _ = dialRaw(t, b.Addr(), id, true)
		}
		pid := uint16(0)
		subscribe := func(filters ...string) []byte {
			pid++
			subs := make(packets.Subscriptions, len(filters))
			for i, f := range filters {
				subs[i] = packets.Subscription{Filter: f, Qos: 1}
			}
			c.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Subscribe}, PacketID: pid, Filters: subs})
			return c.expect(packets.Suback, pid).ReasonCodes
		}
		refusedBefore := b.SubscriptionsRefused()
		if got := subscribe("a/#", "b/+"); !bytes.Equal(got, []byte{1, 1}) {
			t.Fatalf("v5 %v: SUBACK %v, want both granted", v5, got)
		}
		// a/# is held already; c/# is the third; d and e are past the bound.
		if got := subscribe("a/#", "c/#", "d", "e", "c/#"); !bytes.Equal(got, []byte{1, 1, fail, fail, 1}) {
			t.Fatalf("v5 %v: SUBACK %v, want [1 1 %d %d 1]", v5, got, fail, fail)
		}
		if n := b.SubscriptionsRefused() - refusedBefore; n != 2 {
			t.Fatalf("v5 %v: SubscriptionsRefused grew by %d, want 2", v5, n)
		}
		cl, ok := b.server.Clients.Get(id)
		if !ok {
			t.Fatalf("no client %s", id)
		}
		if got := cl.State.Subscriptions.Len(); got != 3 {
			t.Fatalf("v5 %v: the client holds %d filters, want 3", v5, got)
		}
		pid++
		c.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Unsubscribe}, PacketID: pid,
			Filters: packets.Subscriptions{{Filter: "b/+"}}})
		c.expect(packets.Unsuback, pid)
		if got := subscribe("e"); !bytes.Equal(got, []byte{1}) {
			t.Fatalf("v5 %v: SUBACK %v after an unsubscribe, want granted", v5, got)
		}
	}
	if !strings.Contains(logs.String(), "holds its most topic filters") {
		t.Fatal("the refusal was not logged")
	}
}

// A connection that sends no CONNECT within ConnectTimeout is closed:
// before, it held its place among MaxConnections for as long as the peer
// kept it open, so that MaxConnections idle sockets locked every device
// out. A client that connects in time is not cut by it afterwards.
func TestBrokerClosesAConnectionWithoutConnect(t *testing.T) {
	l := openLog(t, t.TempDir(), ingestlog.DefaultOptions())
	cfg := DefaultBrokerConfig()
	cfg.MaxConnections = 2
	cfg.ConnectTimeout = 200 * time.Millisecond
	b := startBrokerCfg(t, l, cfg, nil)

	idle, err := net.Dial("tcp", b.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	idle.SetReadDeadline(time.Now().Add(waitBound))
	if n, err := idle.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("a connection without CONNECT read %d bytes, %v; want it closed (EOF)", n, err)
	}
	testutil.Eventually(t, waitBound, "the broker to let the idle connection go", func() bool {
		b.tcp.mu.Lock()
		defer b.tcp.mu.Unlock()
		return len(b.tcp.conns) == 0
	})
	c, _ := dialRaw(t, b.Addr(), "c0", true)
	dialRaw(t, b.Addr(), "c1", true)
	// A connected client that sends nothing for twice the connect
	// timeout keeps its connection, and is served after it.
	c.conn.SetReadDeadline(time.Now().Add(2 * cfg.ConnectTimeout))
	if _, err := c.r.ReadByte(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a connected client, quiet past the connect timeout: %v; want its own read deadline, not a close", err)
	}
	c.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Pingreq}})
	c.expect(packets.Pingresp, 0)
}
