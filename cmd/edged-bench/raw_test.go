package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// publishPacket is a decoded PUBLISH.
type publishPacket struct {
	qos     byte
	id      uint16
	topic   string
	payload string
}

// readPacket reads one MQTT packet: its first byte and its body.
func readPacket(r *bufio.Reader) (byte, []byte, error) {
	h, err := r.ReadByte()
	if err != nil {
		return 0, nil, err
	}
	n, mul := 0, 1
	for {
		c, err := r.ReadByte()
		if err != nil {
			return 0, nil, err
		}
		n += int(c&0x7f) * mul
		mul *= 128
		if c&0x80 == 0 {
			break
		}
	}
	body := make([]byte, n)
	_, err = io.ReadFull(r, body)
	return h, body, err
}

func decodePublish(h byte, body []byte) publishPacket {
	p := publishPacket{qos: h >> 1 & 3}
	l := int(body[0])<<8 | int(body[1])
	p.topic = string(body[2 : 2+l])
	body = body[2+l:]
	if p.qos > 0 {
		p.id = uint16(body[0])<<8 | uint16(body[1])
		body = body[2:]
	}
	p.payload = string(body)
	return p
}

func TestEncodeReadingsRoundRobinWithPacketIDs(t *testing.T) {
	msg := func(i int) (string, []byte) { return fmt.Sprintf("t/%d", i), []byte(fmt.Sprintf("p%d", i)) }
	for _, qos := range []byte{0, 1} {
		ps := encodeReadings(10, 3, qos, msg)
		if len(ps) != 3 {
			t.Fatalf("QoS %d: %d connections, want 3", qos, len(ps))
		}
		for c, p := range ps {
			r := bufio.NewReader(bytes.NewReader(p.buf))
			for j := 0; j < p.n(); j++ {
				h, body, err := readPacket(r)
				if err != nil {
					t.Fatalf("QoS %d conn %d packet %d: %v", qos, c, j, err)
				}
				got := decodePublish(h, body)
				i := c + 3*j
				want := publishPacket{qos: qos, topic: fmt.Sprintf("t/%d", i), payload: fmt.Sprintf("p%d", i)}
				if qos > 0 {
					want.id = uint16(j + 1)
				}
				if got != want {
					t.Errorf("QoS %d conn %d packet %d = %+v, want %+v", qos, c, j, got, want)
				}
			}
			if _, err := r.ReadByte(); err != io.EOF {
				t.Errorf("QoS %d conn %d: bytes after the last packet", qos, c)
			}
		}
		if n := ps[0].n() + ps[1].n() + ps[2].n(); n != 10 {
			t.Errorf("QoS %d: %d packets, want 10", qos, n)
		}
	}
}

func TestAppendVarintLengths(t *testing.T) {
	for _, n := range []int{0, 127, 128, 16383, 16384, 2097151, 2097152} {
		b := appendVarint(nil, n)
		got, mul := 0, 1
		for _, c := range b {
			got += int(c&0x7f) * mul
			mul *= 128
		}
		if got != n || b[len(b)-1]&0x80 != 0 {
			t.Errorf("appendVarint(%d) = % x", n, b)
		}
	}
}

// fakeBroker accepts one connection, answers CONNECT and acknowledges
// every QoS 1 PUBLISH after delay, recording the most packets it saw
// unacknowledged at once.
type fakeBroker struct {
	ln          net.Listener
	delay       time.Duration
	received    atomic.Int64
	maxInflight atomic.Int64
	wg          sync.WaitGroup
}

func startFakeBroker(t *testing.T, delay time.Duration) *fakeBroker {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &fakeBroker{ln: ln, delay: delay}
	b.wg.Add(1)
	go b.serve()
	t.Cleanup(func() {
		ln.Close()
		b.wg.Wait()
	})
	return b
}

func (b *fakeBroker) serve() {
	defer b.wg.Done()
	c, err := b.ln.Accept()
	if err != nil {
		return
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if h, _, err := readPacket(r); err != nil || h != 0x10 {
		return
	}
	c.Write([]byte{0x20, 2, 0, 0})
	acks := make(chan uint16, 1<<16)
	var inflight atomic.Int64
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		for id := range acks {
			time.Sleep(b.delay)
			inflight.Add(-1)
			if _, err := c.Write([]byte{0x40, 2, byte(id >> 8), byte(id)}); err != nil {
				return
			}
		}
	}()
	defer close(acks)
	for {
		h, body, err := readPacket(r)
		if err != nil || h>>4 == 14 { // error or DISCONNECT
			return
		}
		if h>>4 != 3 {
			continue
		}
		b.received.Add(1)
		if p := decodePublish(h, body); p.qos > 0 {
			if n := inflight.Add(1); n > b.maxInflight.Load() {
				b.maxInflight.Store(n)
			}
			acks <- p.id
		}
	}
}

func TestRawConnKeepsTheQoS1WindowAndWaitsForEveryAck(t *testing.T) {
	b := startFakeBroker(t, 50*time.Microsecond)
	c, err := dialRaw(b.ln.Addr().String(), "test")
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	const n, window = 3000, 16
	ps := encodeReadings(n, 1, 1, func(i int) (string, []byte) { return "t", []byte("x") })
	if err := c.send(ps[0], 1, window, 0, time.Now().Add(30*time.Second)); err != nil {
		t.Fatal(err)
	}
	if got := c.acked.Load(); got != n {
		t.Errorf("send returned after %d PUBACKs, want %d", got, n)
	}
	if got := b.received.Load(); got != n {
		t.Errorf("broker received %d, want %d", got, n)
	}
	if m := b.maxInflight.Load(); m > window || m < 2 {
		t.Errorf("at most %d unacknowledged at once, want 2..%d", m, window)
	}
}

func TestProcFiguresOfThisProcess(t *testing.T) {
	cpu0, err := cpuTime(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	// Burn CPU until /proc shows it (ticks are 10 ms).
	deadline := time.Now().Add(10 * time.Second)
	x := 0
	for {
		for i := 0; i < 1_000_000; i++ {
			x += i
		}
		cpu1, err := cpuTime(os.Getpid())
		if err != nil {
			t.Fatal(err)
		}
		if cpu1 > cpu0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("CPU time did not move from %v (%d)", cpu0, x)
		}
	}
	kb, err := rssKB(os.Getpid())
	if err != nil || kb <= 0 {
		t.Fatalf("rssKB = %d, %v", kb, err)
	}
}
