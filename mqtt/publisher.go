package mqtt

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
)

// PublisherConfig configures a Publisher.
type PublisherConfig struct {
	// Broker is the broker URL, "tcp://host:port". YAML broker; default
	// tcp://127.0.0.1:1883.
	Broker string
	// ClientID is the MQTT client id; it must be unique per connection
	// (the sink appends "-<subtask>"). YAML client_id; required.
	ClientID string
	// QoS is the quality of service of every publish: 0, 1 or 2. YAML
	// qos; default 1.
	QoS byte
	// MaxInflight bounds the publishes not yet acknowledged by the broker
	// (not yet written, for QoS 0): Publish waits when it is reached. At
	// QoS 1 and 2 at most 65535 can be in flight (MQTT packet ids); a
	// larger value means 65535. YAML max_inflight; default 1024.
	MaxInflight int
	// Timeout bounds connecting and waiting for one acknowledgement.
	// YAML timeout; default 30s.
	Timeout time.Duration
	// Logger; nil discards.
	Logger *slog.Logger
}

// maxPacketIDs is the number of MQTT packet ids: the most QoS 1 and 2
// publishes that can be in flight on one connection.
const maxPacketIDs = 65535

// DefaultPublisherConfig returns QoS 1 to tcp://127.0.0.1:1883 with 1024
// publishes in flight; ClientID must still be set.
func DefaultPublisherConfig() PublisherConfig {
	return PublisherConfig{
		Broker:      "tcp://" + DefaultBrokerAddress,
		QoS:         1,
		MaxInflight: 1024,
		Timeout:     30 * time.Second,
	}
}

// Validate reports every problem with c at once, naming the YAML keys.
func (c PublisherConfig) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...))
	}
	if c.Broker == "" {
		bad("sink.broker must not be empty")
	}
	if c.ClientID == "" {
		bad("sink.client_id must not be empty")
	}
	if c.QoS > 2 {
		bad("sink.qos (%d) must be 0, 1 or 2", c.QoS)
	}
	if c.MaxInflight < 1 {
		bad("sink.max_inflight (%d) must be at least 1", c.MaxInflight)
	}
	if c.Timeout <= 0 {
		bad("sink.timeout (%s) must be positive", c.Timeout)
	}
	return errors.Join(errs...)
}

// Publisher publishes to an MQTT broker, keeping at most MaxInflight
// publishes unacknowledged. It connects at the first Publish. Not safe
// for concurrent use: one goroutine (the sink's subtask) owns it.
//
// Over tcp:// (mqtt://) and ssl:// (tls://, mqtts://) it speaks MQTT
// 3.1.1 itself (pubConn): the publishes queued while the previous write
// is in the kernel go out in one write, and acknowledgements are read
// through a buffer, where paho spends a system call on every publish and
// several on every acknowledgement (BenchmarkPublisherResults). Over
// websockets it uses paho.
//
// Neither reconnects by itself: a lost connection (or no acknowledgement
// within the timeout) fails the next Publish or Flush, and every one after
// it, so a sink that goes on cannot skip what was lost; the job's restart
// (replaying from the last checkpoint) resends. Reset closes a failed
// connection for a caller that resends what was not acknowledged itself
// (a write-ahead sink's next try): the next Publish connects again.
type Publisher struct {
	cfg    PublisherConfig
	logger *slog.Logger
	conn   *pubConn // tcp and TLS brokers
	client paho.Client
	tokens []paho.Token // paho: unacknowledged publishes, oldest first
	head   int          // paho: tokens[:head] are done
	closed bool
}

// NewPublisher returns a publisher for cfg; it starts nothing.
func NewPublisher(cfg PublisherConfig) (*Publisher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Publisher{cfg: cfg, logger: logger}, nil
}

func (p *Publisher) connect() error {
	if leanScheme(p.cfg.Broker) {
		c, err := dialPubConn(p.cfg)
		if err != nil {
			return err
		}
		p.conn = c
		return nil
	}
	opts := paho.NewClientOptions().
		AddBroker(p.cfg.Broker).
		SetClientID(p.cfg.ClientID).
		SetCleanSession(true).
		SetAutoReconnect(false).
		SetConnectRetry(false).
		SetConnectTimeout(p.cfg.Timeout).
		SetWriteTimeout(p.cfg.Timeout).
		SetOrderMatters(false).
		SetDefaultPublishHandler(func(paho.Client, paho.Message) {})
	c := paho.NewClient(opts)
	tok := c.Connect()
	if !tok.WaitTimeout(p.cfg.Timeout) {
		c.Disconnect(0)
		return fmt.Errorf("%w: connect to %s: timed out after %s", ErrPublish, redactBroker(p.cfg.Broker), p.cfg.Timeout)
	}
	if err := tok.Error(); err != nil {
		return fmt.Errorf("%w: connect to %s: %w", ErrPublish, redactBroker(p.cfg.Broker), err)
	}
	p.client = c
	return nil
}

// Publish sends payload to topic, waiting first for the oldest
// outstanding publish if MaxInflight are outstanding. It does not wait
// for this publish's acknowledgement: Flush does.
func (p *Publisher) Publish(topic string, payload []byte) error {
	if p.closed {
		return ErrPublisherClosed
	}
	if err := checkPublish(topic, payload, p.cfg.QoS); err != nil {
		return err
	}
	if p.client == nil && p.conn == nil {
		if err := p.connect(); err != nil {
			return err
		}
	}
	if p.conn != nil {
		limit := p.cfg.MaxInflight
		if p.cfg.QoS > 0 {
			limit = min(limit, maxPacketIDs)
		}
		return p.conn.publish(topic, payload, limit)
	}
	for len(p.tokens)-p.head >= p.cfg.MaxInflight {
		if err := p.waitOldest(); err != nil {
			return err
		}
	}
	if p.head > 0 && p.head == len(p.tokens) {
		p.tokens, p.head = p.tokens[:0], 0
	}
	p.tokens = append(p.tokens, p.client.Publish(topic, p.cfg.QoS, false, payload))
	return nil
}

func (p *Publisher) waitOldest() error {
	tok := p.tokens[p.head]
	p.tokens[p.head] = nil
	p.head++
	if !tok.WaitTimeout(p.cfg.Timeout) {
		return fmt.Errorf("%w: no acknowledgement from %s within %s", ErrPublish, redactBroker(p.cfg.Broker), p.cfg.Timeout)
	}
	if err := tok.Error(); err != nil {
		return fmt.Errorf("%w: %w", ErrPublish, err)
	}
	return nil
}

// Flush waits until every publish so far is acknowledged by the broker
// (for QoS 1 and 2) or written (QoS 0), and returns the first failure.
func (p *Publisher) Flush() error {
	if p.conn != nil {
		return p.conn.flush()
	}
	var first error
	for p.head < len(p.tokens) {
		if err := p.waitOldest(); err != nil && first == nil {
			first = err
		}
	}
	p.tokens, p.head = p.tokens[:0], 0
	return first
}

// Reset closes the connection, without waiting for its outstanding
// publishes (their acknowledgements are forgotten), so that the next
// Publish connects again: for a caller that publishes again whatever was
// not acknowledged before a failure.
func (p *Publisher) Reset() {
	if p.conn != nil {
		if cerr := p.conn.close(); cerr != nil {
			p.logger.Debug("mqtt publisher: close after a failure", "err", cerr)
		}
		p.conn = nil
	}
	if p.client != nil {
		p.client.Disconnect(0)
		p.client = nil
	}
	p.tokens, p.head = nil, 0
}

// Lost returns a channel closed when the connection fails (the broker
// closed or reset it, a write failed, an acknowledgement timed out),
// also while nothing is being published: the broker may have lost what
// it acknowledged on it (a broker killed between two saves of its
// persistence). It is nil while there is no connection (before the
// first Publish, after Reset) and over websockets, whose connection
// paho keeps. Called on the Publisher's goroutine.
func (p *Publisher) Lost() <-chan struct{} {
	if p.conn == nil {
		return nil
	}
	return p.conn.lost
}

// checkPublish refuses what no broker takes: a topic longer than MQTT's
// 65535 bytes, a packet larger than its 256 MiB.
func checkPublish(topic string, payload []byte, qos byte) error {
	if len(topic) > 0xffff {
		return fmt.Errorf("%w: topic of %d bytes", ErrPublish, len(topic))
	}
	rl := 2 + len(topic) + len(payload)
	if qos > 0 {
		rl += 2
	}
	if rl > 268_435_455 {
		return fmt.Errorf("%w: payload of %d bytes exceeds the MQTT packet size", ErrPublish, len(payload))
	}
	return nil
}

// Outstanding returns the number of publishes not yet waited for.
func (p *Publisher) Outstanding() int {
	if p.conn != nil {
		p.conn.mu.Lock()
		defer p.conn.mu.Unlock()
		return p.conn.outstanding()
	}
	return len(p.tokens) - p.head
}

// Close disconnects, after waiting up to 250 ms for work in progress; it
// does not wait for acknowledgements (call Flush first). Closing twice is
// a no-op.
func (p *Publisher) Close() error {
	if p.closed {
		return nil
	}
	p.closed = true
	var err error
	if p.conn != nil {
		err = p.conn.close()
		p.conn = nil
	}
	if p.client != nil {
		p.client.Disconnect(250)
		p.client = nil
	}
	p.tokens, p.head = nil, 0
	return err
}
