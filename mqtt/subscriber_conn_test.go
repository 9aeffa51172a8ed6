package mqtt

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/mqtt/ingestlog"
)

// countingConn counts the reads and writes that reach the network.
type countingConn struct {
	net.Conn
	reads, writes *atomic.Int64
}

func (c countingConn) Read(p []byte) (int, error) {
	c.reads.Add(1)
	return c.Conn.Read(p)
}

func (c countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// The subscriber reads the broker's packets through a buffer: far fewer
// reads of the connection than messages (paho alone reads each packet in
// two or three reads), and every message is still appended once.
func TestSubscriberReadsThroughBuffer(t *testing.T) {
	forEachClient(t, testSubscriberReadsThroughBuffer)
}

func testSubscriberReadsThroughBuffer(t *testing.T, client string) {
	const n = 3000
	br := startBroker(t, nil) // the "external" broker
	l := openLog(t, t.TempDir(), ingestlog.DefaultOptions())
	var reads, writes atomic.Int64
	s, err := NewSubscriber(SubscriberConfig{Broker: "tcp://" + br.Addr(), ClientID: "edged-buffered", Topics: []string{"sensors/#"}, Client: client}, l)
	if err != nil {
		t.Fatal(err)
	}
	s.openConn = func(uri *url.URL, _ paho.ClientOptions) (net.Conn, error) {
		c, err := net.DialTimeout("tcp", uri.Host, waitBound)
		if err != nil {
			return nil, err
		}
		return countingConn{Conn: c, reads: &reads, writes: &writes}, nil
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	testutil.Eventually(t, waitBound, "the subscriber subscribed", func() bool {
		select {
		case <-s.Ready():
			return true
		default:
			return false
		}
	})
	pub := connect(t, br.Addr(), "publisher")
	before := reads.Load()
	if err := publishSeq(t, pub, 0, n); err != nil {
		t.Fatal(err)
	}
	waitAppends(t, l, n)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	got := reads.Load() - before
	t.Logf("%d messages: %d reads, %d writes of the connection", n, got, writes.Load())
	if got >= n {
		t.Errorf("%d reads of the connection for %d messages: not buffered", got, n)
	}
	seen, total := readSeqs(t, l)
	if total != n || len(seen) != n {
		t.Errorf("%d records of %d distinct messages, want %d", total, len(seen), n)
	}
}

// A bufferedConn writes what it was given in order, and Close sends
// what is still buffered before closing.
func TestBufferedConnWritesInOrderAndFlushesOnClose(t *testing.T) {
	a, b := net.Pipe()
	defer b.Close()
	var got bytes.Buffer
	var wg sync.WaitGroup
	wg.Go(func() { io.Copy(&got, b) })
	c := newBufferedConn(a)
	var want bytes.Buffer
	for i := range 5000 {
		p := []byte{byte(i), byte(i >> 8), 0x40, 0x02}
		want.Write(p)
		if n, err := c.Write(p); n != len(p) || err != nil {
			t.Fatalf("write %d: %d, %v", i, n, err)
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if !bytes.Equal(got.Bytes(), want.Bytes()) {
		t.Fatalf("peer got %d bytes, want %d in order", got.Len(), want.Len())
	}
	if _, err := c.Write([]byte{1}); err == nil {
		t.Error("write after Close succeeded")
	}
}

// A write that fails is reported by a later Write, so paho learns that
// the connection is broken.
func TestBufferedConnReportsWriteError(t *testing.T) {
	a, b := net.Pipe()
	b.Close()
	c := newBufferedConn(a)
	defer c.Close()
	var err error
	testutil.Eventually(t, waitBound, "a write to a closed peer fails", func() bool {
		_, err = c.Write([]byte{0x40, 0x02, 0, 1})
		return err != nil
	})
	if !errors.Is(err, io.ErrClosedPipe) {
		t.Fatalf("error %v, want io.ErrClosedPipe", err)
	}
}

// While the log cannot take more (full until a checkpoint releases
// space), the subscriber holds at most MaxPendingBytes of payloads
// received but not acknowledged, not MaxPending messages: large payloads
// do not multiply memory. Once space is released, every message arrives.
func TestSubscriberBoundsPendingBytes(t *testing.T) {
	forEachClient(t, testSubscriberBoundsPendingBytes)
}

func testSubscriberBoundsPendingBytes(t *testing.T, client string) {
	const n, size = 40, 4 << 10
	br := startBroker(t, nil) // the "external" broker
	opts := ingestlog.DefaultOptions()
	opts.MaxBytes = 6 * size // a few payloads, then appends wait for space
	l := openLog(t, t.TempDir(), opts)
	sub := startSubscriberWith(t, SubscriberConfig{Broker: "tcp://" + br.Addr(), ClientID: "edged-bytes",
		Topics: []string{"sensors/#"}, MaxPendingBytes: 3 * size, Client: client}, l)
	pub := connect(t, br.Addr(), "publisher")
	payload := make([]byte, size)
	for i := range n {
		tok := pub.Publish("sensors/big", 1, false, append(fmt.Appendf(nil, "%04d", i), payload[4:]...))
		if !tok.WaitTimeout(waitBound) || tok.Error() != nil {
			t.Fatalf("publish: %v", tok.Error())
		}
	}
	testutil.Eventually(t, waitBound, "an append waiting for space", func() bool { return l.Stats().Blocked > 0 })
	// The paho handler holds one more message while it waits for budget.
	if got, most := sub.MaxUnacknowledged(), int64(3+1); got > most {
		t.Errorf("%d messages of %d bytes unacknowledged at once, want at most %d (MaxPendingBytes %d)", got, size, most, 3*size)
	}
	// Release space until every message is in.
	testutil.Eventually(t, waitBound, "every message appended", func() bool {
		st := l.Stats()
		if err := l.Truncate(st.DurableOffset); err != nil {
			t.Fatal(err)
		}
		return st.DurableOffset >= n
	})
}
