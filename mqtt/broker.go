package mqtt

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/edgedio/edged/mqtt/ingestlog"
)

// DefaultBrokerAddress is where the embedded broker listens by default.
const DefaultBrokerAddress = "127.0.0.1:1883"

// maxInflight is what the broker's in-flight limits are raised to: with
// mochi's defaults (8192) it drops QoS 1 messages for a subscriber that
// has that many in flight.
const maxInflight = 65535

// BrokerConfig configures the embedded broker.
type BrokerConfig struct {
	// Address is the TCP address the broker listens on, "host:port"; port
	// 0 picks a free one (see Broker.Addr). YAML address; default
	// 127.0.0.1:1883.
	Address string
	// Filters are the MQTT topic filters whose messages are appended to
	// the ingest log. YAML filters; default ["#"] (every topic except
	// $-topics).
	Filters []string
	// Logger receives the broker's logs (mochi's included, at Warn and
	// above by default); nil discards them.
	Logger *slog.Logger
}

// DefaultBrokerConfig returns a broker on 127.0.0.1:1883 ingesting every
// topic.
func DefaultBrokerConfig() BrokerConfig {
	return BrokerConfig{Address: DefaultBrokerAddress, Filters: []string{"#"}}
}

// Validate reports every problem with c at once, naming the YAML keys.
func (c BrokerConfig) Validate() error {
	var errs []error
	if c.Address == "" {
		errs = append(errs, fmt.Errorf("%w: broker.address must not be empty", ErrInvalidConfig))
	}
	for i, f := range c.Filters {
		if !validFilter(f) {
			errs = append(errs, fmt.Errorf("%w: broker.filters[%d] (%q) is not a valid MQTT topic filter", ErrInvalidConfig, i, f))
		}
	}
	return errors.Join(errs...)
}

// Broker is the MQTT broker edged embeds (mochi-mqtt, MQTT 3.1.1 and 5)
// with an allow-all auth hook and one TCP listener.
//
// Every PUBLISH whose topic matches one of BrokerConfig.Filters is
// appended to the ingest log inside mochi's OnPublish hook, which runs on
// the publishing client's connection goroutine before the broker sends
// the PUBACK (PUBREC for QoS 2). So a device's QoS 1 message is
// acknowledged only once it is durable in the log, and a full log
// (ingestlog.Options.MaxBytes) blocks the hook: the device waits for its
// PUBACK, which is back-pressure over TCP, per device. Messages of one
// connection are appended in the order they arrive. If the append fails
// (the log failed or was closed, or the broker is closing), the broker
// sends no PUBACK and drops the connection, so the device resends on
// reconnect (at-least-once).
//
// Because the hook is synchronous, one connection gets at most one
// message per log fsync (ingestlog group commit window plus the fsync);
// many devices share each fsync.
//
// Matching messages are also routed to subscribers as usual.
type Broker struct {
	cfg    BrokerConfig
	log    *ingestlog.Log
	routes []route // further filters and logs, added before Start
	logger *slog.Logger
	server *mochi.Server
	tcp    *listeners.TCP

	mu      sync.Mutex // guards started, closed, cancel
	started bool
	closed  bool
	cancel  context.CancelFunc
	ctx     context.Context // cancelled by Close; bounds blocked appends
}

// NewBroker returns a broker appending matching messages to log (nil: a
// plain broker that ingests nothing). It starts nothing; the caller keeps
// ownership of log and closes it after the Broker.
func NewBroker(cfg BrokerConfig, log *ingestlog.Log) (*Broker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	caps := mochi.NewDefaultServerCapabilities()
	caps.MaximumInflight = maxInflight
	caps.MaximumClientWritesPending = maxInflight
	server := mochi.New(&mochi.Options{
		Capabilities: caps,
		Logger:       logger.With("component", "mochi"),
		InlineClient: false,
	})
	ctx, cancel := context.WithCancel(context.Background())
	b := &Broker{cfg: cfg, log: log, logger: logger, server: server, ctx: ctx, cancel: cancel}
	if err := server.AddHook(new(auth.AllowHook), nil); err != nil {
		cancel()
		return nil, fmt.Errorf("mqtt: broker auth hook: %w", err)
	}
	if log != nil {
		if err := server.AddHook(&ingestHook{b: b}, nil); err != nil {
			cancel()
			return nil, fmt.Errorf("mqtt: broker ingest hook: %w", err)
		}
	}
	b.tcp = listeners.NewTCP(listeners.Config{ID: "tcp", Address: cfg.Address})
	return b, nil
}

// route sends the messages matching filters to log.
type route struct {
	filters []string
	log     *ingestlog.Log
}

// AddRoute makes the broker also append the messages matching filters to
// log (one log per pipeline reading MQTT: each source truncates its own
// log). A message matching several routes is appended to each. Call it
// before Start; the caller keeps ownership of log.
func (b *Broker) AddRoute(filters []string, log *ingestlog.Log) error {
	for i, f := range filters {
		if !validFilter(f) {
			return fmt.Errorf("%w: route filters[%d] (%q) is not a valid MQTT topic filter", ErrInvalidConfig, i, f)
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.started {
		return ErrBrokerStarted
	}
	if b.log == nil && len(b.routes) == 0 {
		if err := b.server.AddHook(&ingestHook{b: b}, nil); err != nil {
			return fmt.Errorf("mqtt: broker ingest hook: %w", err)
		}
	}
	b.routes = append(b.routes, route{filters: filters, log: log})
	return nil
}

// Server returns the mochi server, for adding hooks or listeners before
// Start.
func (b *Broker) Server() *mochi.Server { return b.server }

// Start binds the listener and starts serving; it returns once the
// broker accepts connections. Closing ctx closes the broker, like Close.
func (b *Broker) Start(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return ErrBrokerClosed
	}
	if b.started {
		return ErrBrokerStarted
	}
	if err := b.server.AddListener(b.tcp); err != nil {
		return fmt.Errorf("mqtt: broker listen on %s: %w", b.cfg.Address, err)
	}
	if err := b.server.Serve(); err != nil {
		return fmt.Errorf("mqtt: broker serve: %w", err)
	}
	b.started = true
	stop := context.AfterFunc(ctx, func() { b.Close() })
	go func() { // ends the AfterFunc registration when the broker closes first
		<-b.ctx.Done()
		stop()
	}()
	b.logger.Info("mqtt broker started", "address", b.Addr())
	return nil
}

// Addr returns the address the broker listens on (with the real port
// once started).
func (b *Broker) Addr() string { return b.tcp.Address() }

// Close unblocks the appends waiting for log space (their devices get no
// PUBACK), disconnects every client, stops the listener and waits for
// the connection goroutines. Closing twice is a no-op.
func (b *Broker) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	started := b.started
	b.mu.Unlock()
	b.cancel()
	if !started {
		return nil
	}
	return b.server.Close()
}

// ingestHook appends matching PUBLISH packets to the ingest log before
// mochi acknowledges them.
type ingestHook struct {
	mochi.HookBase
	b *Broker
}

func (h *ingestHook) ID() string { return "edged-ingest" }

func (h *ingestHook) Provides(b byte) bool { return b == mochi.OnPublish }

// OnPublish runs on the publisher's connection goroutine, before the
// PUBACK is sent.
func (h *ingestHook) OnPublish(cl *mochi.Client, pk packets.Packet) (packets.Packet, error) {
	b := h.b
	msg := ingestlog.Message{
		Topic:    pk.TopicName,
		Payload:  pk.Payload,
		QoS:      pk.FixedHeader.Qos,
		Retain:   pk.FixedHeader.Retain,
		Received: time.Now(),
	}
	var err error
	if b.log != nil && b.matches(pk.TopicName) {
		_, err = b.log.Append(b.ctx, msg)
	}
	for _, r := range b.routes {
		if err != nil {
			break
		}
		for _, f := range r.filters {
			if MatchTopic(f, pk.TopicName) {
				_, err = r.log.Append(b.ctx, msg)
				break
			}
		}
	}
	if err == nil {
		return pk, nil
	}
	// No PUBACK: drop the connection so the device resends on reconnect.
	if b.ctx.Err() == nil {
		b.logger.Error("mqtt broker: ingest append failed; disconnecting client",
			"client", cl.ID, "topic", pk.TopicName, "error", err)
	}
	cl.Stop(fmt.Errorf("mqtt: ingest append: %w", err))
	return pk, packets.ErrRejectPacket
}

func (b *Broker) matches(topic string) bool {
	for _, f := range b.cfg.Filters {
		if MatchTopic(f, topic) {
			return true
		}
	}
	return false
}
