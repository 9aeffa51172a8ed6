package mqtt

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgedio/edged/internal/mqtttest"
	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/mqtt/ingestlog"
)

// killable dials the broker for a Subscriber and can cut its connection
// the way a killed process's does: no DISCONNECT, a reset.
type killable struct {
	mu   sync.Mutex
	conn *net.TCPConn
}

func (k *killable) dial(uri *url.URL, _ paho.ClientOptions) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", uri.Host, 10*time.Second)
	if err != nil {
		return nil, err
	}
	k.mu.Lock()
	k.conn = c.(*net.TCPConn)
	k.mu.Unlock()
	return c, nil
}

// kill stops sub as a SIGKILL would: it acknowledges nothing more (the
// acker stops first), the connection is reset under it, and what it was
// appending finishes (the log's fsyncs happen in the kernel). The log is
// closed and reopened: it holds exactly what was durable.
func (k *killable) kill(t *testing.T, sub *Subscriber, dir string, l *ingestlog.Log) *ingestlog.Log {
	t.Helper()
	sub.cancel()
	k.mu.Lock()
	if k.conn != nil {
		k.conn.SetLinger(0)
		k.conn.Close()
	}
	k.mu.Unlock()
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return openLog(t, dir, ingestlog.DefaultOptions())
}

// publishReadings publishes n QoS 1 messages: every tenth is "ON" to
// lamps/1 (equal content, distinct messages), the others {"seq":i} to
// sensors/<i%7>, with at most 256 unacknowledged.
func publishReadings(c paho.Client, n int) error {
	var toks []paho.Token
	wait := func(tok paho.Token) error {
		if !tok.WaitTimeout(waitBound) {
			return fmt.Errorf("publish timed out")
		}
		return tok.Error()
	}
	for i := range n {
		topic, payload := fmt.Sprintf("sensors/%d", i%7), fmt.Sprintf(`{"seq":%d}`, i)
		if i%10 == 0 {
			topic, payload = "lamps/1", "ON"
		}
		toks = append(toks, c.Publish(topic, 1, false, payload))
		if len(toks) == 256 {
			if err := wait(toks[0]); err != nil {
				return err
			}
			toks = toks[1:]
		}
	}
	for _, tok := range toks {
		if err := wait(tok); err != nil {
			return err
		}
	}
	return nil
}

// startMosquitto starts a Mosquitto broker with conf added to its config
// (mqtttest.StartMosquitto) and returns its address.
func startMosquitto(t *testing.T, conf string) string {
	addr, _ := mqtttest.StartMosquitto(t, conf)
	return addr
}

// Against a real Mosquitto (max_inflight_messages 1000), under CPU
// contention, the subscriber is killed five times while 30,000 QoS 1
// readings are published; each time a new one resumes the session on the
// reopened log and Mosquitto redelivers what was not acknowledged, with
// DUP. Every reading is in the log exactly once, and so is every one of
// the repeated "ON" messages.
func TestSubscriberMosquittoKillsExactlyOnce(t *testing.T) {
	forEachClient(t, testSubscriberMosquittoKillsExactlyOnce)
}

func testSubscriberMosquittoKillsExactlyOnce(t *testing.T, client string) {
	if testing.Short() {
		t.Skip("kills against a real broker")
	}
	// The window is smaller than the default, but several times the
	// backlog measured here, so that a redelivery beyond it would show.
	const n, kills, inflight, window = 30_000, 5, 1000, 8192
	mq := startMosquitto(t, fmt.Sprintf("max_inflight_messages %d\nmax_queued_messages 1000000\n", inflight))
	testutil.Burn(t, 2)
	dir := t.TempDir()
	l := openLog(t, dir, ingestlog.DefaultOptions())
	k := &killable{}
	start := func() *Subscriber {
		cfg := SubscriberConfig{Broker: "tcp://" + mq, ClientID: "edged-kill", Topics: []string{"sensors/#", "lamps/#"},
			RedeliveryWindow: window, Client: client}
		s, err := NewSubscriber(cfg, l)
		if err != nil {
			t.Fatal(err)
		}
		s.openConn = k.dial
		if err := s.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		testutil.Eventually(t, waitBound, "subscribed", func() bool {
			select {
			case <-s.Ready():
				return true
			default:
				return false
			}
		})
		return s
	}
	sub := start()
	pub := connect(t, mq, "publisher")
	published := make(chan error, 1)
	go func() { published <- publishReadings(pub, n) }()

	var redelivered, dropped uint64
	var maxAge int64
	for i := range kills {
		target := uint64((i + 1) * n / (kills + 1))
		testutil.Eventually(t, waitBound, fmt.Sprintf("%d records before kill %d", target, i+1), func() bool {
			return l.Stats().NextOffset >= target
		})
		l = k.kill(t, sub, dir, l)
		t.Logf("kill %d at %d records: %d DUP deliveries received, %d dropped as redeliveries (matched up to %d records back), at most %d unacknowledged",
			i+1, l.Stats().NextOffset, sub.Redelivered(), sub.Dropped(), sub.MaxRedeliveryAge(), sub.MaxUnacknowledged())
		maxAge = max(maxAge, sub.MaxRedeliveryAge())
		redelivered += sub.Redelivered()
		dropped += sub.Dropped()
		sub = start()
	}
	if err := <-published; err != nil {
		t.Fatal(err)
	}

	r, err := l.Reader(0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	seen := make(map[int]int, n)
	ons := 0 // "ON" records: equal content, distinct messages
	count := func(rec ingestlog.Record) {
		if rec.Topic == "lamps/1" {
			ons++
			return
		}
		var seq int
		if _, err := fmt.Sscanf(string(rec.Payload), `{"seq":%d}`, &seq); err != nil {
			t.Fatalf("record %d: %q", rec.Offset, rec.Payload)
		}
		seen[seq]++
	}
	readAll := func() {
		for {
			rec, ok, err := r.TryNext()
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				return
			}
			count(rec)
		}
	}
	testutil.Eventually(t, waitBound, fmt.Sprintf("all %d sequenced readings in the log", n-n/10), func() bool {
		readAll()
		return len(seen) == n-n/10
	})
	// The ON messages were published before the last readings; a lost
	// one never comes, so wait for them without failing here.
	testutil.Within(10*time.Second, func() bool {
		readAll()
		return ons >= n/10
	})
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	redelivered += sub.Redelivered()
	dropped += sub.Dropped()
	for {
		rec, ok, err := r.TryNext()
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		count(rec)
	}
	if ons != n/10 {
		t.Errorf("%d ON messages logged, %d published", ons, n/10)
	}
	twice := 0
	for seq, c := range seen {
		if c != 1 {
			twice++
			if twice <= 5 {
				t.Errorf("reading %d logged %d times", seq, c)
			}
		}
	}
	if twice > 0 || t.Failed() {
		t.Fatalf("%d of %d readings logged more than once", twice, n)
	}
	if dropped == 0 {
		t.Fatalf("no redelivery was dropped in %d kills (%d DUP deliveries): the path under test was not reached", kills, redelivered)
	}
	t.Logf("%d readings exactly once; %d DUP deliveries, %d dropped as redeliveries of logged messages, matched up to %d records back (window %d)",
		n, redelivered, dropped, maxAge, window)
}
