package mqtt

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgedio/edged/mqtt/ingestlog"
	"github.com/edgedio/edged/operators"
)

// waitBound bounds every wait on a condition; nothing sleeps to synchronise.
const waitBound = 60 * time.Second

func openLog(t *testing.T, dir string, opts ingestlog.Options) *ingestlog.Log {
	t.Helper()
	l, err := ingestlog.Open(dir, opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func startBroker(t *testing.T, l *ingestlog.Log, filters ...string) *Broker {
	t.Helper()
	return startBrokerWaiting(t, l, nil, filters...)
}

// startBrokerWaiting is startBroker whose acknowledgement gates wait for
// durability through wait (Broker.durableWait), when it is not nil.
func startBrokerWaiting(t *testing.T, l *ingestlog.Log, wait func(*ingestlog.Log, uint64) error, filters ...string) *Broker {
	t.Helper()
	cfg := DefaultBrokerConfig()
	cfg.Address = "127.0.0.1:0"
	if len(filters) > 0 {
		cfg.Filters = filters
	}
	b, err := NewBroker(cfg, l)
	if err != nil {
		t.Fatal(err)
	}
	b.durableWait = wait
	if err := b.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// connect returns a connected paho client of the broker at addr.
func connect(t testing.TB, addr, id string, opts ...func(*paho.ClientOptions)) paho.Client {
	t.Helper()
	o := paho.NewClientOptions().AddBroker("tcp://" + addr).SetClientID(id).
		SetAutoReconnect(false).SetCleanSession(true).
		SetDefaultPublishHandler(func(paho.Client, paho.Message) {})
	for _, f := range opts {
		f(o)
	}
	c := paho.NewClient(o)
	tok := c.Connect()
	if !tok.WaitTimeout(waitBound) || tok.Error() != nil {
		t.Fatalf("connect %s to %s: %v", id, addr, tok.Error())
	}
	t.Cleanup(func() { c.Disconnect(0) })
	return c
}

// collector gathers received messages, safe for paho's goroutines.
type collector struct {
	mu     sync.Mutex
	msgs   [][]byte
	topics []string      // of msgs
	more   chan struct{} // capacity 1, rung on each message
}

func subscribe(t *testing.T, addr, id, filter string) *collector {
	t.Helper()
	col := &collector{more: make(chan struct{}, 1)}
	c := connect(t, addr, id)
	tok := c.Subscribe(filter, 1, func(_ paho.Client, m paho.Message) {
		col.mu.Lock()
		col.msgs = append(col.msgs, append([]byte(nil), m.Payload()...))
		col.topics = append(col.topics, m.Topic())
		col.mu.Unlock()
		select {
		case col.more <- struct{}{}:
		default:
		}
	})
	if !tok.WaitTimeout(waitBound) || tok.Error() != nil {
		t.Fatalf("subscribe %s: %v", filter, tok.Error())
	}
	return col
}

// waitFor waits until the collector holds n messages and returns them.
func (c *collector) waitFor(t *testing.T, n int) [][]byte {
	t.Helper()
	msgs, _ := c.waitUntil(t, fmt.Sprintf("%d messages", n), func(msgs [][]byte) bool { return len(msgs) >= n })
	return msgs
}

// waitUntil waits until done holds for the messages received and returns
// them with their topics.
func (c *collector) waitUntil(t *testing.T, what string, done func(msgs [][]byte) bool) ([][]byte, []string) {
	t.Helper()
	deadline := time.After(waitBound)
	for {
		c.mu.Lock()
		msgs, topics := c.msgs, c.topics
		c.mu.Unlock()
		if done(msgs) {
			return msgs, topics
		}
		select {
		case <-c.more:
		case <-deadline:
			t.Fatalf("received %d messages, want %s", len(msgs), what)
		}
	}
}

func opCtx(subtask int) *operators.Context {
	return &operators.Context{UID: "mqtt-test", Subtask: subtask, Parallelism: subtask + 1}
}

// drain polls src until it has nothing more, returning what it emitted.
func drain(t *testing.T, src *Source) []Message {
	t.Helper()
	var out []Message
	col := operators.CollectorFunc[Message](func(m Message) { out = append(out, m) })
	for {
		st, err := src.Poll(col, 100)
		if err != nil {
			t.Fatal(err)
		}
		if st != operators.MoreAvailable {
			return out
		}
	}
}

func appendSeq(t *testing.T, l *ingestlog.Log, from, n int) {
	t.Helper()
	for i := from; i < from+n; i++ {
		if _, err := l.Append(context.Background(), ingestlog.Message{
			Topic: fmt.Sprintf("sensors/%d", i%5), Payload: fmt.Appendf(nil, `{"seq":%d}`, i), QoS: 1,
		}); err != nil {
			t.Fatal(err)
		}
	}
}

// readAll returns the records of l.
func readAll(t *testing.T, l *ingestlog.Log) []ingestlog.Record {
	t.Helper()
	r, err := l.Reader(l.Stats().FirstOffset)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var out []ingestlog.Record
	for {
		rec, ok, err := r.TryNext()
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return out
		}
		out = append(out, rec)
	}
}
