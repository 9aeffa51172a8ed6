package mqtt

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgedio/edged/mqtt/ingestlog"
)

// ErrSubscriberClosed is returned by Start on a closed Subscriber.
var ErrSubscriberClosed = errors.New("mqtt: subscriber closed")

// SubscriberConfig configures a Subscriber of an external broker.
type SubscriberConfig struct {
	// Broker is the broker URL, "tcp://host:port" (any scheme paho
	// accepts). Required.
	Broker string
	// Pipeline names the pipeline the subscriber feeds; it is used for
	// the default ClientID and in logs.
	Pipeline string
	// ClientID is the MQTT client id. It must be fixed across restarts:
	// the subscriber uses a persistent session (CleanSession false), so
	// the broker keeps the subscription and the unacknowledged QoS 1/2
	// messages under this id and redelivers them when it reconnects.
	// Default "edged-<Pipeline>".
	ClientID string
	// Topics are the topic filters to subscribe to. At least one.
	Topics []string
	// QoS of the subscriptions: 0, 1 or 2. Only QoS 1 and 2 are
	// at-least-once (QoS 0 messages are not redelivered). Default 1 (the
	// zero value means the default; there is no way to ask for QoS 0
	// except QoS0).
	QoS byte
	// QoS0 subscribes with QoS 0 (at-most-once), overriding QoS.
	QoS0 bool
	// MaxPending bounds the messages received but not yet acknowledged:
	// appended concurrently (sharing the log's fsyncs) and acknowledged in
	// the order they arrived. When it is reached the paho handler blocks,
	// which stops paho reading the connection: back-pressure to the
	// broker. Default 1024.
	MaxPending int
	// MaxReconnectInterval caps paho's reconnect backoff. Default 10s.
	MaxReconnectInterval time.Duration
	// Logger; nil discards.
	Logger *slog.Logger
}

func (c SubscriberConfig) withDefaults() SubscriberConfig {
	if c.ClientID == "" && c.Pipeline != "" {
		c.ClientID = "edged-" + c.Pipeline
	}
	if c.QoS == 0 {
		c.QoS = 1
	}
	if c.QoS0 {
		c.QoS = 0
	}
	if c.MaxPending <= 0 {
		c.MaxPending = 1024
	}
	if c.MaxReconnectInterval <= 0 {
		c.MaxReconnectInterval = 10 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate reports every problem with c (after defaults) at once.
func (c SubscriberConfig) Validate() error {
	c = c.withDefaults()
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...))
	}
	if c.Broker == "" {
		bad("source.mqtt.broker must not be empty")
	}
	if c.ClientID == "" {
		bad("source.mqtt.client_id must not be empty (or name the pipeline)")
	}
	if len(c.Topics) == 0 {
		bad("source.mqtt.topics must not be empty")
	}
	for i, f := range c.Topics {
		if !validFilter(f) {
			bad("source.mqtt.topics[%d] (%q) is not a valid MQTT topic filter", i, f)
		}
	}
	if c.QoS > 2 {
		bad("source.mqtt.qos (%d) must be 0, 1 or 2", c.QoS)
	}
	return errors.Join(errs...)
}

// Subscriber subscribes to an external MQTT broker (Mosquitto, ...) with
// paho and appends every message it receives to an ingest log, the
// replayable input of the pipeline's Source.
//
// Delivery is at-least-once for QoS 1 and 2: paho's automatic acks are
// disabled and a message is acknowledged (PUBACK) only after
// ingestlog.Log.Append returned, that is once the message is durable. If
// the append fails (log closed or failed, subscriber closing) the message
// is not acknowledged and an error is logged; the broker redelivers it when
// the persistent session resumes (CleanSession false, fixed ClientID), so
// the log can hold duplicates, and redelivered messages come out of order:
// consumers deduplicate by content, not by position.
//
// Messages are appended concurrently (up to MaxPending, sharing the log's
// group commits) and acknowledged in the order they arrived. A full log
// blocks the appends, which holds back the acks and, once MaxPending is
// reached, paho's reading of the connection: back-pressure to the broker
// (if that outlasts paho's keep-alive the connection drops and the
// broker redelivers later).
//
// Redeliveries are deduplicated, which makes ingestion exactly-once across
// crashes: the rule is that a message redelivered by the broker (DUP flag
// set) that is identical (same topic and payload) to one of the last K
// messages appended to the log is a duplicate of it, and is acknowledged
// without being appended again. K is 4 times MaxPending, at least 4096:
// far more than can be received but unacknowledged when edged dies. The
// hashes (xxhash of topic and payload) of the last K records are loaded
// from the tail of the log at Start, so the rule holds across restarts:
// a message appended but not acknowledged when edged was killed, which the
// broker redelivers with DUP on the resumed session, is dropped. Sensor
// readings carry timestamps, so identical payloads on the same topic are
// the same reading; a source whose distinct messages can be byte-identical
// must not rely on this (messages without DUP are never dropped). A
// redelivery of a message still being appended waits for that append and
// is dropped only if it succeeded.
//
// paho reconnects by itself (ConnectRetry, AutoReconnect, backoff up to
// MaxReconnectInterval) and the subscriber resubscribes on every connect.
// Messages the broker resends before the subscription is renewed reach
// the default publish handler, which is the same handler.
type Subscriber struct {
	cfg    SubscriberConfig
	log    *ingestlog.Log
	logger *slog.Logger

	mu      sync.Mutex // guards client, started, closed; and inflight.Add
	client  paho.Client
	started bool
	closed  bool

	ctx      context.Context // cancelled by Close: unblocks appends
	cancel   context.CancelFunc
	pending  chan *delivery // in arrival order, for the acker
	inflight sync.WaitGroup // handlers, appends and the acker
	ready    chan struct{}  // closed after the first successful subscribe
	once     sync.Once

	dmu       sync.Mutex           // guards seen and appending
	seen      *hashRing            // hashes of the last K appended messages
	appending map[uint64]*delivery // hash -> latest delivery being appended
	dropped   atomic.Uint64        // redeliveries dropped as duplicates
}

// DedupWindow returns K, the number of last appended messages a
// redelivery is compared with.
func (c SubscriberConfig) DedupWindow() int {
	return max(4*c.withDefaults().MaxPending, 4096)
}

// Dropped returns how many redelivered messages were acknowledged without
// being appended because they duplicate one of the last K appended.
func (s *Subscriber) Dropped() uint64 { return s.dropped.Load() }

// msgHash is the dedup identity of a message: topic and payload.
func msgHash(topic string, payload []byte) uint64 {
	var d xxhash.Digest
	d.Reset()
	d.WriteString(topic)
	d.Write([]byte{0}) // topics contain no NUL: separates topic from payload
	d.Write(payload)
	return d.Sum64()
}

// hashRing is a bounded multiset of the last len(ring) hashes added.
type hashRing struct {
	ring  []uint64
	n     int // hashes in ring (<= len(ring))
	next  int // where the next hash goes
	count map[uint64]int
}

func newHashRing(k int) *hashRing {
	return &hashRing{ring: make([]uint64, k), count: make(map[uint64]int, k)}
}

func (r *hashRing) add(h uint64) {
	if r.n == len(r.ring) {
		old := r.ring[r.next]
		if c := r.count[old]; c <= 1 {
			delete(r.count, old)
		} else {
			r.count[old] = c - 1
		}
	} else {
		r.n++
	}
	r.ring[r.next] = h
	r.next = (r.next + 1) % len(r.ring)
	r.count[h]++
}

func (r *hashRing) has(h uint64) bool { return r.count[h] > 0 }

// loadTail fills s.seen with the hashes of the last K records of the log.
func (s *Subscriber) loadTail() error {
	k := s.cfg.DedupWindow()
	s.seen = newHashRing(k)
	s.appending = make(map[uint64]*delivery)
	st := s.log.Stats()
	from := st.FirstOffset
	if st.NextOffset > from+uint64(k) {
		from = st.NextOffset - uint64(k)
	}
	r, err := s.log.Reader(from)
	if err != nil {
		return fmt.Errorf("mqtt: subscriber: read the ingest log's tail for deduplication: %w", err)
	}
	defer r.Close()
	n := 0
	for {
		rec, ok, err := r.TryNext()
		if err != nil {
			return fmt.Errorf("mqtt: subscriber: read the ingest log's tail for deduplication: %w", err)
		}
		if !ok {
			break
		}
		s.seen.add(msgHash(rec.Topic, rec.Payload))
		n++
	}
	s.logger.Info("mqtt subscriber: dedup window loaded", "records", n, "from", from, "window", k)
	return nil
}

// delivery is one received message on its way to the log and the ack.
type delivery struct {
	msg     paho.Message
	hash    uint64
	done    chan struct{}
	err     error // of the append; read after done
	dropped bool  // a duplicate redelivery: acked, not appended; read after done
}

// NewSubscriber returns a subscriber appending to log. It connects
// nothing until Start; the caller keeps ownership of log and closes it
// after the Subscriber.
func NewSubscriber(cfg SubscriberConfig, log *ingestlog.Log) (*Subscriber, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		return nil, fmt.Errorf("%w: subscriber needs an ingest log", ErrInvalidConfig)
	}
	cfg = cfg.withDefaults()
	return &Subscriber{
		cfg:     cfg,
		log:     log,
		logger:  cfg.Logger.With("component", "mqtt-subscriber", "broker", cfg.Broker, "client_id", cfg.ClientID),
		pending: make(chan *delivery, cfg.MaxPending),
		ready:   make(chan struct{}),
	}, nil
}

// Start connects to the broker in the background (retrying until it
// succeeds or Close) and returns at once; Ready reports the first
// subscription. Cancelling ctx aborts appends waiting for log space (their
// messages stay unacknowledged); Close must still be called.
func (s *Subscriber) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrSubscriberClosed
	}
	if s.started {
		return errors.New("mqtt: subscriber already started")
	}
	if err := s.loadTail(); err != nil {
		return err
	}
	s.started = true
	s.ctx, s.cancel = context.WithCancel(ctx)

	o := paho.NewClientOptions().AddBroker(s.cfg.Broker).SetClientID(s.cfg.ClientID).
		SetCleanSession(false).
		SetAutoAckDisabled(true).
		SetOrderMatters(true). // the handler only queues; order kept for acks
		SetConnectRetry(true).
		SetConnectRetryInterval(time.Second).
		SetAutoReconnect(true).
		SetMaxReconnectInterval(s.cfg.MaxReconnectInterval).
		SetDefaultPublishHandler(s.handle).
		SetOnConnectHandler(s.onConnect).
		SetConnectionLostHandler(func(_ paho.Client, err error) {
			s.logger.Warn("mqtt subscriber: connection lost; reconnecting", "error", err)
		})
	s.client = paho.NewClient(o)
	s.inflight.Go(s.acker)
	s.client.Connect() // with ConnectRetry it retries in the background
	s.logger.Info("mqtt subscriber connecting", "topics", s.cfg.Topics, "qos", s.cfg.QoS)
	return nil
}

// Ready returns a channel closed once the subscriber has subscribed for
// the first time.
func (s *Subscriber) Ready() <-chan struct{} { return s.ready }

// onConnect (re)subscribes; paho calls it on its own goroutine after every
// successful connect.
func (s *Subscriber) onConnect(c paho.Client) {
	filters := make(map[string]byte, len(s.cfg.Topics))
	for _, t := range s.cfg.Topics {
		filters[t] = s.cfg.QoS
	}
	// nil callback: messages go to the default handler, like the ones the
	// broker resends before this subscription is made.
	tok := c.SubscribeMultiple(filters, nil)
	if !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		err := tok.Error()
		if err == nil {
			err = errors.New("timed out")
		}
		// A persistent session keeps an earlier subscription; a first one
		// is retried on the next reconnect.
		s.logger.Error("mqtt subscriber: subscribe failed", "error", err)
		return
	}
	s.logger.Info("mqtt subscriber subscribed", "topics", s.cfg.Topics)
	s.once.Do(func() { close(s.ready) })
}

// handle runs on paho's goroutine for every message, in arrival order.
func (s *Subscriber) handle(_ paho.Client, m paho.Message) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return // not acknowledged: redelivered on the next session
	}
	s.inflight.Add(1)
	s.mu.Unlock()
	defer s.inflight.Done()
	d := &delivery{msg: m, hash: msgHash(m.Topic(), m.Payload()), done: make(chan struct{})}
	select {
	case s.pending <- d: // blocks when MaxPending are unacknowledged
	case <-s.ctx.Done():
		return
	}
	// Register d as the latest append of its hash; a redelivery waits for
	// the one before it (still being appended) before deciding.
	s.dmu.Lock()
	prev := s.appending[d.hash]
	s.appending[d.hash] = d
	s.dmu.Unlock()
	s.inflight.Go(func() {
		defer close(d.done)
		defer func() {
			s.dmu.Lock()
			if s.appending[d.hash] == d {
				delete(s.appending, d.hash)
			}
			if d.err == nil && !d.dropped {
				s.seen.add(d.hash)
			}
			s.dmu.Unlock()
		}()
		if m.Duplicate() {
			if prev != nil {
				select {
				case <-prev.done:
				case <-s.ctx.Done():
					d.err = s.ctx.Err()
					return
				}
			}
			s.dmu.Lock()
			dup := s.seen.has(d.hash)
			s.dmu.Unlock()
			if dup {
				d.dropped = true
				s.dropped.Add(1)
				return
			}
		}
		_, d.err = s.log.Append(s.ctx, ingestlog.Message{
			Topic:    m.Topic(),
			Payload:  m.Payload(),
			QoS:      m.Qos(),
			Retain:   m.Retained(),
			Received: time.Now(),
		})
	})
}

// acker acknowledges the appended messages in arrival order.
func (s *Subscriber) acker() {
	for {
		select {
		case d := <-s.pending:
			select {
			case <-d.done:
			case <-s.ctx.Done():
				return
			}
			if d.err != nil {
				if s.ctx.Err() == nil {
					s.logger.Error("mqtt subscriber: ingest append failed; message left unacknowledged for redelivery",
						"topic", d.msg.Topic(), "error", d.err)
				}
				continue
			}
			if d.dropped {
				s.logger.Debug("mqtt subscriber: dropped a redelivered duplicate", "topic", d.msg.Topic())
				if s.dropped.Load() == 1 {
					s.logger.Info("mqtt subscriber: dropping redelivered duplicates (a redelivery identical to one of the last K messages ingested)", "window", s.cfg.DedupWindow())
				}
			}
			d.msg.Ack()
		case <-s.ctx.Done():
			return
		}
	}
}

// Close disconnects from the broker and waits for the handlers, appends
// and acks in progress; messages not yet acknowledged are redelivered by
// the broker on the next session. Closing twice is a no-op.
func (s *Subscriber) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	client := s.client
	s.mu.Unlock()
	if client == nil {
		return nil
	}
	s.cancel()
	client.Disconnect(250)
	s.inflight.Wait()
	s.logger.Info("mqtt subscriber closed", "duplicates_dropped", s.dropped.Load())
	return nil
}
