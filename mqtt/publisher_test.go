package mqtt

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.mqtt.golang/packets"

	"github.com/edgedio/edged/internal/testutil"
)

// Every QoS reaches the broker through the publisher's own MQTT client:
// Flush returns once all are acknowledged (written, for QoS 0), in order
// per topic.
func TestPublisherQoSLevels(t *testing.T) {
	b := startBroker(t, nil)
	for _, qos := range []byte{0, 1, 2} {
		t.Run(fmt.Sprintf("qos=%d", qos), func(t *testing.T) {
			const n = 3000
			topic := fmt.Sprintf("pubq%d", qos)
			sub := subscribe(t, b.Addr(), "consumer-"+topic, topic)
			cfg := publisherConfig(b, "pub-"+topic)
			cfg.QoS = qos
			pub, err := NewPublisher(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer pub.Close()
			for i := range n {
				if err := pub.Publish(topic, fmt.Appendf(nil, "%d", i)); err != nil {
					t.Fatal(err)
				}
				if out := pub.Outstanding(); out > cfg.MaxInflight {
					t.Fatalf("%d outstanding, max_inflight %d", out, cfg.MaxInflight)
				}
			}
			if err := pub.Flush(); err != nil {
				t.Fatal(err)
			}
			if out := pub.Outstanding(); out != 0 {
				t.Fatalf("%d outstanding after Flush", out)
			}
			if pub.conn == nil {
				t.Fatal("tcp:// broker not served by the publisher's own client")
			}
			msgs := sub.waitFor(t, n)
			for i, m := range msgs[:n] {
				if string(m) != fmt.Sprint(i) {
					t.Fatalf("message %d is %q", i, m)
				}
			}
		})
	}
}

// fakeBroker accepts connections, one at a time, answers CONNACK with
// code, then hands every packet read to onPacket (which may answer on w;
// false ends the connection).
type fakeBroker struct {
	ln       net.Listener
	mu       sync.Mutex
	received int
	wg       sync.WaitGroup
}

func startFakeBroker(t *testing.T, code byte, onPacket func(pk packets.ControlPacket, w net.Conn) bool) *fakeBroker {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeBroker{ln: ln}
	f.wg.Add(1)
	serve := func(c net.Conn) {
		defer c.Close()
		r := bufio.NewReader(c)
		if _, err := packets.ReadPacket(r); err != nil {
			return
		}
		ack := packets.NewControlPacket(packets.Connack).(*packets.ConnackPacket)
		ack.ReturnCode = code
		if ack.Write(c) != nil || code != packets.Accepted {
			return
		}
		for {
			pk, err := packets.ReadPacket(r)
			if err != nil {
				return
			}
			if _, ok := pk.(*packets.PublishPacket); ok {
				f.mu.Lock()
				f.received++
				f.mu.Unlock()
			}
			if onPacket != nil && !onPacket(pk, c) {
				return
			}
		}
	}
	go func() {
		defer f.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			serve(c)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		f.wg.Wait()
	})
	return f
}

func (f *fakeBroker) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.received
}

func fakeConfig(f *fakeBroker, inflight int, timeout time.Duration) PublisherConfig {
	cfg := DefaultPublisherConfig()
	cfg.Broker = "tcp://" + f.ln.Addr().String()
	cfg.ClientID = "fake"
	cfg.MaxInflight = inflight
	cfg.Timeout = timeout
	return cfg
}

// A broker that takes publishes but never acknowledges them: exactly
// MaxInflight are sent, and the next Publish fails after Timeout instead
// of sending more.
func TestPublisherBoundsInflight(t *testing.T) {
	f := startFakeBroker(t, packets.Accepted, nil)
	pub, err := NewPublisher(fakeConfig(f, 8, 300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	for i := range 8 {
		if err := pub.Publish("t", []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	testutil.Eventually(t, waitBound, "8 publishes at the broker", func() bool { return f.count() == 8 })
	err = pub.Publish("t", []byte("ninth"))
	if !errors.Is(err, ErrPublish) || !strings.Contains(err.Error(), "no acknowledgement") {
		t.Fatalf("ninth publish: %v, want no acknowledgement", err)
	}
	if got := f.count(); got != 8 {
		t.Fatalf("broker got %d publishes, want 8", got)
	}
}

// A broker that hangs with its connection open (it reads everything, the
// PINGREQs the publisher sends while it waits included, and answers
// nothing) fails a flush after the timeout: the publisher's own pings are
// no acknowledgement.
func TestPublisherHungBrokerTimesOutDespitePings(t *testing.T) {
	saved := pubKeepAlive
	pubKeepAlive = 60 * time.Millisecond // a PINGREQ every 30 ms of quiet
	t.Cleanup(func() { pubKeepAlive = saved })
	var pings atomic.Int32
	f := startFakeBroker(t, packets.Accepted, func(pk packets.ControlPacket, _ net.Conn) bool {
		if _, ok := pk.(*packets.PingreqPacket); ok {
			pings.Add(1)
		}
		return true
	})
	pub, err := NewPublisher(fakeConfig(f, 8, 300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	if err := pub.Publish("t", []byte("x")); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- pub.Flush() }()
	var ferr error
	select {
	case ferr = <-done:
	case <-time.After(waitBound):
		t.Fatalf("the flush still waits after %v (%d PINGREQs meanwhile): the pings reset the timeout", waitBound, pings.Load())
	}
	if !errors.Is(ferr, ErrPublish) || !strings.Contains(ferr.Error(), "no acknowledgement within 300ms") {
		t.Fatalf("flush: %v, want no acknowledgement within 300ms", ferr)
	}
	if n := pings.Load(); n < 3 {
		t.Fatalf("%d PINGREQs while the flush waited: the test did not reach the path it names", n)
	}
}

// QoS 2: PUBREC is answered with PUBREL, and only PUBCOMP completes the
// publish.
func TestPublisherQoS2Handshake(t *testing.T) {
	var mu sync.Mutex
	var rels []uint16
	f := startFakeBroker(t, packets.Accepted, func(pk packets.ControlPacket, w net.Conn) bool {
		switch p := pk.(type) {
		case *packets.PublishPacket:
			rec := packets.NewControlPacket(packets.Pubrec).(*packets.PubrecPacket)
			rec.MessageID = p.MessageID
			return rec.Write(w) == nil
		case *packets.PubrelPacket:
			mu.Lock()
			rels = append(rels, p.MessageID)
			mu.Unlock()
			comp := packets.NewControlPacket(packets.Pubcomp).(*packets.PubcompPacket)
			comp.MessageID = p.MessageID
			return comp.Write(w) == nil
		}
		return true
	})
	cfg := fakeConfig(f, 4, waitBound)
	cfg.QoS = 2
	pub, err := NewPublisher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	for i := range 10 {
		if err := pub.Publish("t", []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := pub.Flush(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(rels) != 10 {
		t.Fatalf("%d PUBRELs, want 10", len(rels))
	}
}

// A broker that refuses the connection fails the publish; one that drops
// it fails the flush and every publish after it, until Reset: the publish
// after it connects again.
func TestPublisherConnectionFailures(t *testing.T) {
	refused := startFakeBroker(t, packets.ErrRefusedNotAuthorised, nil)
	pub, err := NewPublisher(fakeConfig(refused, 8, waitBound))
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish("t", nil); !errors.Is(err, ErrPublish) || !strings.Contains(err.Error(), "not Authorized") {
		t.Fatalf("publish to a refusing broker: %v", err)
	}
	pub.Close()

	dropping := startFakeBroker(t, packets.Accepted, func(packets.ControlPacket, net.Conn) bool { return false })
	pub, err = NewPublisher(fakeConfig(dropping, 8, waitBound))
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	if err := pub.Publish("t", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := pub.Flush(); !errors.Is(err, ErrPublish) {
		t.Fatalf("flush after the broker dropped the connection: %v", err)
	}
	// The failure sticks: a sink that went on would skip what was lost.
	if err := pub.Publish("t", []byte("y")); !errors.Is(err, ErrPublish) {
		t.Fatalf("publish after the failure: %v", err)
	}
	// Reset closes the connection: the next publish connects again (the
	// broker takes it, and drops that connection too).
	pub.Reset()
	if err := pub.Publish("t", []byte("y")); err != nil {
		t.Fatalf("publish after Reset: %v, want a new connection", err)
	}
	testutil.Eventually(t, waitBound, "the publish after the failure at the broker", func() bool { return dropping.count() == 2 })
	if err := pub.Flush(); !errors.Is(err, ErrPublish) {
		t.Fatalf("flush after the broker dropped the new connection: %v", err)
	}
}

// A connection the broker ends while nothing is being published closes
// Lost at once: the broker may have lost what it acknowledged on it. A
// Reset forgets it (nil until the next publish connects again), and the
// new connection's Lost is open.
func TestPublisherLostWhileIdle(t *testing.T) {
	end := make(chan struct{})
	f := startFakeBroker(t, packets.Accepted, func(pk packets.ControlPacket, w net.Conn) bool {
		p, ok := pk.(*packets.PublishPacket)
		if !ok {
			return true
		}
		ack := packets.NewControlPacket(packets.Puback).(*packets.PubackPacket)
		ack.MessageID = p.MessageID
		if ack.Write(w) != nil {
			return false
		}
		if string(p.Payload) == "x" {
			<-end // the broker goes away after the first publish
			return false
		}
		return true
	})
	pub, err := NewPublisher(fakeConfig(f, 8, waitBound))
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	if pub.Lost() != nil {
		t.Fatal("Lost is not nil before the first publish connects")
	}
	if err := pub.Publish("t", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := pub.Flush(); err != nil {
		t.Fatal(err)
	}
	lost := pub.Lost()
	select {
	case <-lost:
		t.Fatal("Lost closed while the connection is up")
	default:
	}
	close(end)
	select {
	case <-lost:
	case <-time.After(waitBound):
		t.Fatal("Lost not closed after the broker ended the connection")
	}
	pub.Reset()
	if pub.Lost() != nil {
		t.Fatal("Lost is not nil after Reset")
	}
	if err := pub.Publish("t", []byte("y")); err != nil {
		t.Fatal(err)
	}
	if err := pub.Flush(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-pub.Lost():
		t.Fatal("the new connection's Lost is closed")
	default:
	}
}
