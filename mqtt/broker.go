package mqtt

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/edgedio/edged/mqtt/ingestlog"
)

// DefaultBrokerAddress is where the embedded broker listens by default.
const DefaultBrokerAddress = "127.0.0.1:1883"

// maxInflight is what the broker's in-flight limits are raised to: with
// mochi's defaults (8192) it drops QoS 1 messages for a subscriber that
// has that many in flight.
const maxInflight = 65535

// sysTopicInterval is how often, in seconds, the broker publishes its
// $SYS topics (as Mosquitto's default sys_interval). mochi's default of
// one second stops the world every second to read the runtime's memory
// statistics and makes about 40 KB of garbage per second on an idle node.
const sysTopicInterval = 10

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
	// DataDir is the directory where the broker keeps its session journal
	// (sessions.journal): persistent sessions, their subscriptions, the
	// QoS 1/2 messages queued or in flight for them, and the packet ids of
	// inbound QoS 2 messages not yet released. YAML data_dir; empty (the
	// default) keeps sessions in memory only, so they end with the
	// process and QoS 2 from devices is exactly-once only while it runs.
	DataDir string
	// SessionMaxBytes bounds the memory of the messages stored for
	// persistent sessions: each counts its topic and payload, mochi's copy
	// of the payload for each recipient session, and about 0.5 KiB per
	// message and 1 KiB per recipient of bookkeeping (the store's record,
	// mochi's inflight packet). When a publish would pass it, the
	// publisher gets no PUBACK until subscribers acknowledge enough (or
	// their sessions end): back-pressure, nothing is dropped. YAML
	// session_max_bytes; default 64 MiB; 0 means no bound.
	SessionMaxBytes int64
	// MaxMessageBytes bounds the size of a packet the broker reads, in
	// bytes (mochi's Capabilities.MaximumPacketSize, which counts the
	// fixed header byte and the remaining length). mochi checks it before
	// it allocates anything for the packet and closes the connection of a
	// client that sends a larger one (MQTT 5: Reason Code 0x95, Packet too
	// large, is the reason it may give); PacketsTooLarge counts them. MQTT
	// 5 clients are told the bound in CONNACK (Maximum Packet Size), so a
	// compliant one never sends such a packet; an MQTT 3.1.1 device cannot
	// be told, so its PUBLISH over the bound is cut to a dead-letter record
	// instead (see cutReader) and acknowledged once that is durable;
	// PacketsTooLarge and DeadLetters count it. A message within the
	// bound that does not fit in one record of an ingest log it goes to
	// (ingestlog.Log.MaxMessageBytes) is appended there as a dead-letter
	// record (ingestlog.Message.TooLarge) and acknowledged once that is
	// durable; DeadLetters counts them. YAML max_message_bytes; 0 (or
	// unset) means DefaultMaxMessageBytes (8 MiB); at most MaxPacketBytes.
	MaxMessageBytes int64
	// RetainedMaxBytes bounds the memory of the retained messages the
	// broker keeps (in memory, not persisted): each counts its topic and
	// payload and the library's bookkeeping (retainedCost). A retained
	// message that would pass it is routed and ingested as any other but
	// not retained, and the retained message of its topic, if any, is
	// cleared (RetainedRefused counts them): a device that retains a
	// message on every new topic cannot fill the node's memory. Default
	// DefaultRetainedMaxBytes (16 MiB) when 0.
	RetainedMaxBytes int64
	// MaxConnections bounds the connections the broker holds at once,
	// connected clients and connections that have not sent their CONNECT
	// yet: each costs the node a few hundred kilobytes while it lasts. A
	// connection past it is closed as soon as it is accepted, and the
	// device reconnects later (ConnectionsRefused counts them). Default
	// DefaultMaxConnections (1000) when 0.
	MaxConnections int
	// ConnectTimeout bounds how long a connection may take to send its
	// CONNECT once accepted: past it the broker closes the connection, so
	// that connections that never send one (a port scan, a stuck or
	// hostile peer) cannot hold MaxConnections and lock every device out.
	// Default DefaultConnectTimeout (10s) when 0.
	ConnectTimeout time.Duration
	// MaxSubscriptions bounds the topic filters one client holds (its
	// session's subscriptions): a SUBSCRIBE's filter past it gets a
	// failure code in the SUBACK (0x80 to MQTT 3.1.1, 0x8F to MQTT 5),
	// its other filters are granted (SubscriptionsRefused counts the
	// refused ones). Default DefaultMaxSubscriptions (1000) when 0.
	MaxSubscriptions int
	// DrainTimeout bounds how long Close waits for the publishes in
	// flight to be appended and acknowledged before it disconnects the
	// clients. YAML drain_timeout; default 5s.
	DrainTimeout time.Duration
	// Logger receives the broker's logs (mochi's included, at Warn and
	// above by default); nil discards them.
	Logger *slog.Logger
}

// Defaults of BrokerConfig.
const (
	// DefaultSessionMaxBytes is BrokerConfig.SessionMaxBytes by default.
	DefaultSessionMaxBytes = 64 << 20
	// DefaultDrainTimeout is BrokerConfig.DrainTimeout by default.
	DefaultDrainTimeout = 5 * time.Second
	// sessionCompactBytes is the journal size that first triggers a
	// rewrite; it grows to twice the live state.
	sessionCompactBytes = 64 << 20
	// topicAliasMaximum is the highest topic alias an MQTT 5 client may
	// set (Mosquitto's default max_topic_alias): each costs the broker a
	// topic of up to 64 KiB for the connection's life.
	topicAliasMaximum = 10
)

// DefaultBrokerConfig returns a broker on 127.0.0.1:1883 ingesting every
// topic.
func DefaultBrokerConfig() BrokerConfig {
	return BrokerConfig{Address: DefaultBrokerAddress, Filters: []string{"#"},
		SessionMaxBytes: DefaultSessionMaxBytes, DrainTimeout: DefaultDrainTimeout, MaxMessageBytes: DefaultMaxMessageBytes}
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
	if c.SessionMaxBytes < 0 {
		errs = append(errs, fmt.Errorf("%w: broker.session_max_bytes (%d) must not be negative", ErrInvalidConfig, c.SessionMaxBytes))
	}
	if c.RetainedMaxBytes < 0 {
		errs = append(errs, fmt.Errorf("%w: broker.retained_max_bytes (%d) must not be negative", ErrInvalidConfig, c.RetainedMaxBytes))
	}
	if c.MaxConnections < 0 {
		errs = append(errs, fmt.Errorf("%w: broker.max_connections (%d) must not be negative", ErrInvalidConfig, c.MaxConnections))
	}
	if c.MaxSubscriptions < 0 {
		errs = append(errs, fmt.Errorf("%w: broker.max_subscriptions (%d) must not be negative", ErrInvalidConfig, c.MaxSubscriptions))
	}
	if c.DrainTimeout < 0 {
		errs = append(errs, fmt.Errorf("%w: broker.drain_timeout (%s) must not be negative", ErrInvalidConfig, c.DrainTimeout))
	}
	if m := c.MaxMessageBytes; m != 0 && (m < minMessageBytes || m > MaxPacketBytes) {
		errs = append(errs, fmt.Errorf("%w: broker.max_message_bytes (%d) must be between %d and %d (0: the default, %d)",
			ErrInvalidConfig, m, minMessageBytes, MaxPacketBytes, DefaultMaxMessageBytes))
	}
	return errors.Join(errs...)
}

// Broker is the MQTT broker edged embeds (mochi-mqtt, MQTT 3.1.1 and 5)
// with an allow-all auth hook and one TCP listener.
//
// Every PUBLISH whose topic matches one of BrokerConfig.Filters is
// written to the ingest log inside mochi's OnPublish hook, which runs on
// the publishing client's connection goroutine before the broker writes
// the PUBACK (PUBREC for QoS 2). The hook does not wait for the fsync:
// the connection's ackGate holds the PUBACK, and every byte written to
// the connection after it, until the log says the record is durable, and
// then sends what it held in order. So a device's QoS 1 message is
// acknowledged only once it is durable in the log, while the connection
// goes on reading and appending the device's next messages during the
// fsync (pipelining); every connection's records written before an fsync
// starts share it (group commit). A full log (ingestlog.Options.MaxBytes)
// blocks the hook: the device waits for its PUBACK, which is
// back-pressure over TCP, per device; a full log that sheds
// (ingestlog.Log.ShedWhenFull: its pipeline does not run) does not store
// the message, and the others' logs take it as usual. Messages of one connection are
// appended, and acknowledged, in the order they arrive. If the append or
// the fsync fails (the log failed or was closed, or the broker is
// closing), the broker sends no PUBACK for it or any later message of the
// connection and drops the connection, so the device resends on
// reconnect (at-least-once). mochi routes a message to subscribers right
// after writing its PUBACK, so a subscriber may get it before it is
// durable (and, if the broker crashes before the fsync, again when the
// device resends it).
//
// QoS 2 from a device with a persistent session (clean_session=false;
// MQTT 5: session expiry above 0) is exactly-once into the log when
// BrokerConfig.DataDir is set: before the append, the broker records the
// (client id, packet id) durably in its session journal, with a receive
// time unique to the message (the record's Received) and the log's next
// offset; a resend of that packet id before PUBREL, on the same
// connection, a later one, or after a crash of the broker, is answered
// with PUBREC without a second append; PUBREL forgets the id durably
// before the PUBCOMP goes out. After a crash, Start looks for each
// remembered message in the log from the recorded offset (by its receive
// time and topic) to tell whether the append happened. A clean session
// gets mochi's in-memory QoS 2 handling: exactly-once while the broker
// runs, since a clean session's client does not resend after a reconnect.
//
// QoS 2 from a persistent session, and connections of listeners added
// through Server, append synchronously instead: one message per fsync
// per connection, many connections sharing each fsync.
//
// Matching messages are also routed to subscribers as usual. With
// BrokerConfig.DataDir set, persistent sessions survive a restart or a
// crash of the broker (see sessionHook).
//
// Close drains: it refuses new connections and new PUBLISH packets (the
// connection that sent one gets no acknowledgement for it, so its device
// resends it to the next broker, and nothing was appended), waits up to
// BrokerConfig.DrainTimeout for the publishes being processed to be
// appended and acknowledged, then disconnects the clients. Every
// connection of the broker's listener ends with a lingering close: after
// the last bytes written to it (its PUBACKs), the broker ends its side
// (TCP FIN) and reads and discards what the device still sends until the
// device closes too, or lingerTimeout passes; only then does it close the
// socket. Closing a socket with unread data in it makes the kernel reset
// the connection, and a reset may make the device lose acknowledgements
// it had not read yet.
type Broker struct {
	cfg    BrokerConfig
	log    *ingestlog.Log
	routes []route // further filters and logs, added before Start
	logger *slog.Logger
	server *mochi.Server
	tcp    *gatedListener
	drain  *drainHook
	store  *sessionStore // nil without DataDir; set by Start

	// qos2Stage, when set, runs at each stage of a QoS 2 append
	// ("receipt": the receipt is durable, "appended": the append
	// returned, "released": the PUBREL's release is durable, before the
	// PUBCOMP); an error aborts the publish as a failed append would, or
	// drops the connection without a PUBCOMP (tests).
	qos2Stage func(stage, client string, pid uint16) error
	// durableWait, when set, replaces ingestlog.Log.WaitDurable for the
	// acknowledgement gates (tests).
	durableWait func(l *ingestlog.Log, off uint64) error
	// journalFS, when set, is what the session store writes its journal
	// through (tests inject failures).
	journalFS journalFS
	flushers  sync.WaitGroup // the ackGate flushers and expireLoop
	// ownExpiry is set when the broker runs the expiry of queued
	// messages itself (stopLibraryExpiry, expireLoop).
	ownExpiry bool
	// lingerTimeout bounds a lingering close (see ackGate.Close):
	// drainLinger, or a test's value set before connections come.
	lingerTimeout time.Duration
	lingerers     sync.WaitGroup // the ackGate lingering closes
	stopping      atomic.Bool    // set by Close: connections end with a lingering close

	tooLarge      atomic.Uint64 // packets over MaxMessageBytes: refused (connection closed) or cut (dead letters)
	retained      *retainedHook
	subscriptions *subscriptionsHook
	cutMark       [cutMarkLen]byte
	deadLetters   atomic.Uint64 // messages appended as dead-letter records

	// paused, when set, is why the broker refuses readings for its
	// ingest logs (PauseIngest); refused counts them, and pauseLogged is
	// set once the first refusal of the pause was logged.
	paused      atomic.Pointer[string]
	refused     atomic.Uint64
	pauseLogged atomic.Bool

	mu      sync.Mutex // guards started, closed, cancel
	started bool
	closed  bool
	cancel  context.CancelFunc
	ctx     context.Context // cancelled by Close; bounds blocked appends
}

// NewBroker returns a broker appending matching messages to log (nil: a
// plain broker that ingests nothing). It starts nothing and opens no
// file; the caller keeps ownership of log and closes it after the Broker.
func NewBroker(cfg BrokerConfig, log *ingestlog.Log) (*Broker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if cfg.DrainTimeout == 0 {
		cfg.DrainTimeout = DefaultDrainTimeout
	}
	if cfg.MaxMessageBytes == 0 {
		cfg.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if cfg.RetainedMaxBytes == 0 {
		cfg.RetainedMaxBytes = DefaultRetainedMaxBytes
	}
	if cfg.MaxConnections == 0 {
		cfg.MaxConnections = DefaultMaxConnections
	}
	if cfg.MaxSubscriptions == 0 {
		cfg.MaxSubscriptions = DefaultMaxSubscriptions
	}
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = DefaultConnectTimeout
	}
	caps := mochi.NewDefaultServerCapabilities()
	caps.MaximumInflight = maxInflight
	caps.MaximumClientWritesPending = maxInflight
	caps.MaximumPacketSize = uint32(cfg.MaxMessageBytes)
	caps.TopicAliasMaximum = topicAliasMaximum
	server := mochi.New(&mochi.Options{
		Capabilities:           caps,
		Logger:                 logger.With("component", "mochi"),
		InlineClient:           false,
		SysTopicResendInterval: sysTopicInterval,
	})
	ctx, cancel := context.WithCancel(context.Background())
	b := &Broker{cfg: cfg, log: log, logger: logger, server: server, ctx: ctx, cancel: cancel, lingerTimeout: drainLinger,
		cutMark: newCutMark()}
	if b.ownExpiry = stopLibraryExpiry(server); !b.ownExpiry {
		logger.Warn("mqtt broker: the broker library's expiry pass could not be replaced; an offline persistent session slows the broker")
	}
	b.drain = newDrainHook()
	b.retained = newRetainedHook(cfg.RetainedMaxBytes, server.Topics, logger)
	b.subscriptions = &subscriptionsHook{max: cfg.MaxSubscriptions, logger: logger}
	for _, h := range []mochi.Hook{b.drain, new(allowHook), &ingestHook{b: b}, b.retained, b.subscriptions, newPacketIDHook(server.Info), new(receiveQuotaHook)} {
		if err := server.AddHook(h, nil); err != nil {
			cancel()
			return nil, fmt.Errorf("mqtt: broker hook %s: %w", h.ID(), err)
		}
	}
	b.tcp = &gatedListener{b: b, address: cfg.Address}
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
// before Start; the caller keeps ownership of log. QoS 2 receipts name
// routes by the order they were added, so keep that order across
// restarts.
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
	b.routes = append(b.routes, route{filters: filters, log: log})
	return nil
}

// Server returns the mochi server, for adding hooks or listeners before
// Start.
func (b *Broker) Server() *mochi.Server { return b.server }

// Start opens the session journal (with BrokerConfig.DataDir) and
// settles the QoS 2 receipts a crash left open, binds the listener and
// starts serving; it returns once the broker accepts connections.
// Closing ctx closes the broker, like Close.
func (b *Broker) Start(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return ErrBrokerClosed
	}
	if b.started {
		return ErrBrokerStarted
	}
	if b.cfg.DataDir != "" {
		fs := b.journalFS
		if fs == nil {
			fs = osFS{}
		}
		st, err := openSessionStoreFS(b.cfg.DataDir, b.cfg.SessionMaxBytes, sessionCompactBytes, b.logger, fs)
		if err != nil {
			return err
		}
		b.store = st
		if err := b.resolveReceipts(); err != nil {
			st.close()
			return err
		}
		if err := b.server.AddHook(newSessionHook(b, st), nil); err != nil {
			st.close()
			return fmt.Errorf("mqtt: broker session hook: %w", err)
		}
		stats := st.Stats()
		b.logger.Info("mqtt broker sessions restored", "dir", b.cfg.DataDir, "sessions", stats.Sessions,
			"messages", stats.Messages, "qos2_receipts", stats.Receipts)
	}
	if err := b.server.AddListener(b.tcp); err != nil {
		b.closeStore()
		return fmt.Errorf("mqtt: broker listen on %s: %w", b.cfg.Address, err)
	}
	if err := b.server.Serve(); err != nil {
		b.closeStore()
		return fmt.Errorf("mqtt: broker serve: %w", err)
	}
	b.started = true
	if b.ownExpiry {
		b.flushers.Add(1)
		go b.expireLoop()
	}
	stop := context.AfterFunc(ctx, func() { b.Close() })
	go func() { // ends the AfterFunc registration when the broker closes first
		<-b.ctx.Done()
		stop()
	}()
	b.logger.Info("mqtt broker started", "address", b.Addr())
	return nil
}

func (b *Broker) closeStore() {
	if b.store != nil {
		b.store.close()
	}
}

// PacketsTooLarge returns how many packets larger than
// BrokerConfig.MaxMessageBytes the broker had: refused, closing their
// clients' connections, or (an MQTT 3.1.1 PUBLISH) cut to a dead letter.
func (b *Broker) PacketsTooLarge() uint64 { return b.tooLarge.Load() }

// RetainedRefused returns how many retained messages the broker routed
// without retaining them, since they would have passed
// BrokerConfig.RetainedMaxBytes.
func (b *Broker) RetainedRefused() uint64 { return b.retained.refused.Load() }

// ConnectionsRefused returns how many connections the broker closed as
// it accepted them, since it held BrokerConfig.MaxConnections.
func (b *Broker) ConnectionsRefused() uint64 { return b.tcp.refused.Load() }

// SubscriptionsRefused returns how many topic filters the broker refused
// to clients that held BrokerConfig.MaxSubscriptions.
func (b *Broker) SubscriptionsRefused() uint64 { return b.subscriptions.refused.Load() }

// DeadLetters returns how many messages were appended as dead-letter
// records (ingestlog.Message.TooLarge), one per log: over
// BrokerConfig.MaxMessageBytes (cut) or too large for a record of the log.
func (b *Broker) DeadLetters() uint64 { return b.deadLetters.Load() }

// Addr returns the address the broker listens on (with the real port
// once started).
func (b *Broker) Addr() string { return b.tcp.Address() }

// SessionStats returns the counters of the session journal (zero without
// BrokerConfig.DataDir or before Start).
func (b *Broker) SessionStats() SessionStats {
	b.mu.Lock()
	st := b.store
	b.mu.Unlock()
	if st == nil {
		return SessionStats{}
	}
	return st.Stats()
}

// Close drains the broker and stops it: it refuses new connections and
// PUBLISH packets, waits up to BrokerConfig.DrainTimeout for the packets
// being processed (appends and their PUBACK/PUBREC), then unblocks the
// appends still waiting for log space (their devices get no PUBACK),
// disconnects every client with a lingering close (at most drainLinger
// from when it begins to disconnect them, less when the devices close
// first), stops the listener, waits for the connection goroutines and
// closes the session journal. Closing twice is a no-op.
func (b *Broker) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	started := b.started
	b.mu.Unlock()
	if !started {
		b.cancel()
		return nil
	}
	b.stopping.Store(true)
	if !b.drain.drain(b.cfg.DrainTimeout) {
		b.logger.Warn("mqtt broker: drain timed out; closing with publishes in flight (their devices resend)",
			"timeout", b.cfg.DrainTimeout, "busy", b.drain.busyCount())
	}
	b.cancel()
	err := b.server.Close()
	b.lingerers.Wait()
	b.flushers.Wait()
	if b.store != nil {
		err = errors.Join(err, b.store.close())
	}
	return err
}

// drainLinger bounds a lingering close: how long the broker, having
// ended its side of a connection after the last acknowledgements, goes on
// reading (and discarding) what the device sends before it closes the
// socket even though the device has not closed its side. A device that
// reads to the end of the stream and then closes (as MQTT clients do when
// their broker goes) ends the wait sooner; a device that keeps sending
// past it sees the connection reset.
const drainLinger = 300 * time.Millisecond

// crash stops the broker as a kill -9 would: no drain, and journal
// records not yet synced are lost. For tests.
func (b *Broker) crash() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	if b.store != nil {
		b.store.crash()
	}
	b.cancel()
	b.server.Close()
	b.flushers.Wait()
}

// allowHook lets every client connect and read and write every topic: the
// embedded broker authenticates no one (node.broker is a loopback or LAN
// address the device's owner chooses). It is mochi's auth.AllowHook
// without its package, whose ledger links a second YAML library into
// edged (about 0.4 MB of code and tables the process maps at start-up).
type allowHook struct{ mochi.HookBase }

func (*allowHook) ID() string { return "allow-all-auth" }

func (*allowHook) Provides(b byte) bool {
	return b == mochi.OnConnectAuthenticate || b == mochi.OnACLCheck
}

func (*allowHook) OnConnectAuthenticate(*mochi.Client, packets.Packet) bool { return true }

func (*allowHook) OnACLCheck(*mochi.Client, string, bool) bool { return true }

// ingestHook appends matching PUBLISH packets to the ingest log before
// mochi acknowledges them, and keeps the QoS 2 receipts.
type ingestHook struct {
	mochi.HookBase
	b *Broker
}

func (h *ingestHook) ID() string { return "edged-ingest" }

func (h *ingestHook) Provides(b byte) bool {
	switch b {
	case mochi.OnPublish, mochi.OnPacketRead, mochi.OnPacketEncode, mochi.OnDisconnect, mochi.OnWillSent:
		return true
	}
	return false
}

// OnWillSent appends a device's will message, which the broker published
// when the device's connection ended without DISCONNECT, to the ingest
// logs whose pipelines read its topic, as a device's own publish: a
// pipeline sees the "device offline" message its subscribers see. Nobody
// waits for an acknowledgement: a failed append is logged.
func (h *ingestHook) OnWillSent(cl *mochi.Client, pk packets.Packet) {
	b := h.b
	if b.log == nil && len(b.routes) == 0 {
		return
	}
	msg := messageOf(pk)
	for _, tg := range b.targets(pk.TopicName) {
		m := fit(tg.log, msg)
		off, err := tg.log.Append(b.ctx, m)
		if errors.Is(err, ingestlog.ErrShed) {
			continue // a full log of a pipeline that does not run: counted there
		}
		if err != nil {
			if b.ctx.Err() == nil {
				b.logger.Error("mqtt broker: appending a will message failed; it is lost", "client", cl.ID, "topic", pk.TopicName, "error", err)
			}
			return
		}
		b.appended(tg.log, m, 0, off)
	}
}

// OnPacketEncode tells an MQTT 5 client the broker's Maximum Packet Size
// and Topic Alias Maximum in CONNACK (mochi enforces them but does not
// advertise them; without the latter a client may send no alias).
func (h *ingestHook) OnPacketEncode(cl *mochi.Client, pk packets.Packet) packets.Packet {
	if pk.FixedHeader.Type == packets.Connack && cl.Properties.ProtocolVersion == 5 {
		pk.Properties.MaximumPacketSize = uint32(h.b.cfg.MaxMessageBytes)
		pk.Properties.TopicAliasMaximum = topicAliasMaximum
	}
	return pk
}

// OnDisconnect counts and logs a connection closed for a packet larger
// than BrokerConfig.MaxMessageBytes.
func (h *ingestHook) OnDisconnect(cl *mochi.Client, err error, _ bool) {
	if !errors.Is(err, packets.ErrPacketTooLarge) {
		return
	}
	h.b.tooLarge.Add(1)
	h.b.logger.Warn("mqtt broker: packet larger than max_message_bytes; connection closed (MQTT 5: reason 0x95, packet too large) without reading it",
		"client", cl.ID, "max_message_bytes", h.b.cfg.MaxMessageBytes)
}

// fit returns msg, or, if it does not fit in one record of l, the
// dead-letter record that takes its place there: its topic and first
// DeadLetterKeep payload bytes, TooLarge its PUBLISH packet's size.
func fit(l *ingestlog.Log, msg ingestlog.Message) ingestlog.Message {
	if msg.TooLarge != 0 { // already a dead letter (a cut PUBLISH)
		msg.Payload = msg.Payload[:deadLetterKeep(l, msg.Topic, msg.Payload)]
		return msg
	}
	if int64(len(msg.Topic)+len(msg.Payload)) <= l.MaxMessageBytes() {
		return msg
	}
	msg.TooLarge = publishSize(len(msg.Topic), len(msg.Payload), msg.QoS)
	msg.Payload = msg.Payload[:deadLetterKeep(l, msg.Topic, msg.Payload)]
	return msg
}

// deadLetterKeep returns how many of payload's first bytes the
// dead-letter record of a message on topic keeps in l: DeadLetterKeep at
// most, fewer when the topic leaves less room in one record (a log with
// small segments), so that the record always fits.
func deadLetterKeep(l *ingestlog.Log, topic string, payload []byte) int {
	room := max(l.MaxMessageBytes()-int64(len(topic)), 0)
	return int(min(int64(len(payload)), DeadLetterKeep, room))
}

// appended counts and logs msg, appended to l at off, if it is a
// dead-letter record (see fit).
func (b *Broker) appended(l *ingestlog.Log, msg ingestlog.Message, pid uint16, off uint64) {
	if msg.TooLarge == 0 {
		return
	}
	b.deadLetters.Add(1)
	b.logger.Warn("mqtt broker: message too large (over max_message_bytes, or over an ingest-log record); its payload discarded, recorded as a dead letter with its first bytes, acknowledged once durable",
		"topic", msg.Topic, "message_bytes", msg.TooLarge, "packet_id", pid, "max_message_bytes", b.cfg.MaxMessageBytes,
		"max_record_bytes", l.MaxMessageBytes(), "offset", off)
}

// PauseIngest makes the broker refuse readings for its ingest logs, for
// why (logged with the first refusal): a PUBLISH to a topic a pipeline
// reads ends its connection without an acknowledgement, so the device
// keeps it and resends it, to this broker or another. Other topics are
// served as before. ResumeIngest ends the pause.
func (b *Broker) PauseIngest(why string) {
	b.pauseLogged.Store(false)
	b.paused.Store(&why)
	b.logger.Info("mqtt broker: refusing readings", "why", why)
}

// ResumeIngest ends a pause (PauseIngest): readings are taken again.
func (b *Broker) ResumeIngest() {
	if b.paused.Swap(nil) != nil {
		b.logger.Info("mqtt broker: taking readings again")
	}
}

// IngestRefused returns how many readings the broker refused while its
// ingest was paused.
func (b *Broker) IngestRefused() uint64 { return b.refused.Load() }

// refusePaused refuses pk, a reading for an ingest log while the ingest
// is paused for why: cl's connection ends without an acknowledgement.
func (h *ingestHook) refusePaused(cl *mochi.Client, pk packets.Packet, why string) error {
	b := h.b
	b.refused.Add(1)
	if !b.pauseLogged.Swap(true) {
		b.logger.Warn("mqtt broker: refused a reading; the device keeps it and resends it (further refusals are counted, not logged)",
			"client", cl.ID, "topic", pk.TopicName, "why", why)
	}
	cl.Stop(fmt.Errorf("mqtt: readings refused: %s", why))
	return packets.ErrRejectPacket
}

// refuseAlias ends cl's connection for pk, an MQTT 5 PUBLISH whose
// topic alias is a protocol error (MQTT 5, 3.3.2.3.4); why says which:
// "unknown" (an empty topic and an alias the client never set) or "out
// of range" (0, or above topicAliasMaximum). cl gets DISCONNECT 0x94
// (Topic Alias invalid), after the acknowledgements of its earlier
// messages, and no acknowledgement of pk, so the device keeps the
// message and can resend it with its topic. It runs on cl's connection
// goroutine.
func (h *ingestHook) refuseAlias(cl *mochi.Client, pk packets.Packet, why string) {
	h.b.logger.Warn("mqtt broker: PUBLISH with an invalid topic alias; connection closed (MQTT 5: reason 0x94, topic alias invalid) without an acknowledgement",
		"client", cl.ID, "topic_alias", pk.Properties.TopicAlias, "why", why, "packet_id", pk.PacketID)
	if gate, ok := cl.Net.Conn.(*ackGate); ok {
		// The DISCONNECT must not be held behind acknowledgements that
		// wait for an fsync: the close would drop it.
		gate.settled()
	}
	_ = h.b.server.DisconnectClient(cl, packets.ErrTopicAliasInvalid) // its error is the code it sent
}

// refuseTopic ends cl's connection for pk, a PUBLISH to a topic name no
// client may publish to: one with a wildcard (MQTT 3.1.1 3.3.2-2, a
// protocol violation) or in $SYS, the broker's own topics. pk is neither
// logged nor acknowledged (MQTT 3.1.1 3.3.5: acknowledge or close): an
// MQTT 5 client gets DISCONNECT 0x90 (Topic Name invalid) after the
// acknowledgements of its earlier messages, an MQTT 3.1.1 one sees the
// connection closed after them. It runs on cl's connection
// goroutine.
func (h *ingestHook) refuseTopic(cl *mochi.Client, pk packets.Packet) {
	h.b.logger.Warn("mqtt broker: PUBLISH to a topic name no client may publish to (a wildcard, or $SYS); connection closed without an acknowledgement",
		"client", cl.ID, "topic", pk.TopicName, "qos", pk.FixedHeader.Qos, "packet_id", pk.PacketID)
	if gate, ok := cl.Net.Conn.(*ackGate); ok {
		// The DISCONNECT must not be held behind acknowledgements that
		// wait for an fsync: the close would drop it.
		gate.settled()
	}
	if cl.Properties.ProtocolVersion < 5 {
		cl.Stop(packets.ErrTopicNameInvalid) // MQTT 3.1.1 has no DISCONNECT from the server
		return
	}
	_ = h.b.server.DisconnectClient(cl, packets.ErrTopicNameInvalid) // its error is the code it sent
}

// OnPublish runs on the publisher's connection goroutine, before the
// PUBACK is sent.
func (h *ingestHook) OnPublish(cl *mochi.Client, pk packets.Packet) (packets.Packet, error) {
	b := h.b
	if pk.TopicName == "" {
		// mochi put the topic of pk's alias here, and accepts an alias
		// the client never set, leaving the topic empty: it would
		// acknowledge the message and route it nowhere.
		h.refuseAlias(cl, pk, "unknown")
		return pk, packets.ErrRejectPacket
	}
	size, retain, kept, cut := b.uncut(pk.Payload)
	if b.log == nil && len(b.routes) == 0 {
		if cut {
			b.tooLarge.Add(1)
			b.logger.Warn("mqtt broker: message larger than max_message_bytes on a topic no pipeline reads; dropped, acknowledged",
				"client", cl.ID, "topic", pk.TopicName, "message_bytes", size, "packet_id", pk.PacketID, "max_message_bytes", b.cfg.MaxMessageBytes)
			return pk, packets.CodeSuccessIgnore
		}
		return pk, nil
	}
	if why := b.paused.Load(); why != nil && len(b.targets(pk.TopicName)) > 0 {
		return pk, h.refusePaused(cl, pk, *why)
	}
	msg := messageOf(pk)
	if cut {
		// A PUBLISH over max_message_bytes, cut by the connection's
		// cutReader: its dead letter, acknowledged once durable; mochi
		// neither retains nor routes it.
		msg.TooLarge, msg.Retain, msg.Payload = size, retain, kept
		b.tooLarge.Add(1)
		if len(b.targets(pk.TopicName)) == 0 {
			b.logger.Warn("mqtt broker: message larger than max_message_bytes on a topic no pipeline reads; dropped, acknowledged",
				"client", cl.ID, "topic", pk.TopicName, "message_bytes", size, "packet_id", pk.PacketID, "max_message_bytes", b.cfg.MaxMessageBytes)
		}
		pkx, err := h.publishMessage(cl, pk, msg)
		if err == nil {
			err = packets.CodeSuccessIgnore
		}
		return pkx, err
	}
	return h.publishMessage(cl, pk, msg)
}

// publishMessage appends msg, received in pk from cl, to the logs of the
// pipelines that read its topic; see OnPublish.
func (h *ingestHook) publishMessage(cl *mochi.Client, pk packets.Packet, msg ingestlog.Message) (packets.Packet, error) {
	b := h.b
	if pk.FixedHeader.Qos == 2 && b.store != nil && persistent(cl) && b.store.hasClient(cl.ID) {
		return h.publishQoS2(cl, pk, msg)
	}
	targets := b.targets(pk.TopicName)
	var err error
	if len(targets) > 0 && b.store != nil {
		// A QoS 2 message's "in the log" record goes to disk before the
		// log gets a later record (see sessionStore.routeDone).
		err = b.store.syncAppended()
	}
	gate, _ := cl.Net.Conn.(*ackGate)
	for _, tg := range targets {
		if err != nil {
			break
		}
		m := fit(tg.log, msg)
		var off uint64
		if gate == nil { // a listener added through Server: wait here
			if off, err = tg.log.Append(b.ctx, m); err == nil {
				b.appended(tg.log, m, pk.PacketID, off)
			}
		} else if off, err = tg.log.AppendNoWait(b.ctx, m); err == nil {
			b.appended(tg.log, m, pk.PacketID, off)
			gate.appended(tg.key, off)
		}
		if errors.Is(err, ingestlog.ErrShed) {
			// The full log of a pipeline that does not run
			// (ingestlog.Log.ShedWhenFull): not stored there, counted
			// by the log; the other pipelines' logs take it.
			err = nil
		}
	}
	if err == nil {
		return pk, nil
	}
	return pk, h.fail(cl, pk, err)
}

// messageOf returns the ingest-log message of a PUBLISH received now.
func messageOf(pk packets.Packet) ingestlog.Message {
	return ingestlog.Message{
		Topic:    pk.TopicName,
		Payload:  pk.Payload,
		QoS:      pk.FixedHeader.Qos,
		Retain:   pk.FixedHeader.Retain,
		Received: time.Now(),
	}
}

// waitDurable returns once the record at off of l is durable.
func (b *Broker) waitDurable(l *ingestlog.Log, off uint64) error {
	if b.durableWait != nil {
		return b.durableWait(l, off)
	}
	return l.WaitDurableContext(b.ctx, off) // a stopping broker does not wait for a full card
}

// fail drops cl's connection without an acknowledgement for pk, so the
// device resends it on reconnect.
func (h *ingestHook) fail(cl *mochi.Client, pk packets.Packet, err error) error {
	b := h.b
	if b.ctx.Err() == nil {
		b.logger.Error("mqtt broker: ingest append failed; disconnecting client",
			"client", cl.ID, "topic", pk.TopicName, "error", err)
	}
	cl.Stop(fmt.Errorf("mqtt: ingest append: %w", err))
	return packets.ErrRejectPacket
}

func (b *Broker) matches(topic string) bool {
	for _, f := range b.cfg.Filters {
		if MatchTopic(f, topic) {
			return true
		}
	}
	return false
}

func (r route) matches(topic string) bool {
	for _, f := range r.filters {
		if MatchTopic(f, topic) {
			return true
		}
	}
	return false
}
