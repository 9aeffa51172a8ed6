package mqtt

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
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
	// MaxPendingBytes bounds the payload bytes of the messages received
	// but not yet acknowledged, as MaxPending bounds their number, so that
	// large payloads do not multiply memory: with 1 MiB payloads the
	// default lets 8 be pending instead of MaxPending. A message larger
	// than the bound is let through alone. Default 8 MiB.
	MaxPendingBytes int64
	// AckDelay is how long the subscriber may wait for more messages
	// before it makes the ones it received durable and acknowledges
	// them, so that they share one fsync of the ingest log and one write
	// of acknowledgements (group commit). It does not wait while half of
	// MaxPending or MaxPendingBytes, or half of the broker's in-flight
	// window, is outstanding (the window is learned: the broker stopping
	// for a millisecond with that many unacknowledged), so it does not
	// slow a broker that waits for acknowledgements. Default
	// DefaultAckDelay (5 ms); negative: no wait (an fsync as soon as the
	// one before ends); at most MaxAckDelay. YAML source.mqtt.ack_delay.
	AckDelay time.Duration
	// RedeliveryWindow is W, the number of last fresh records a
	// redelivered (DUP) message is compared with; see Subscriber. It must
	// cover every message the broker can still redeliver: at least
	// 2 × (MaxPending + U), U the most messages the broker holds sent but
	// unacknowledged. It must stay below 65536 so that a broker that
	// allocates packet identifiers in sequence never repeats one within
	// it. YAML source.mqtt.redelivery_window; default 65535.
	RedeliveryWindow int
	// MaxMessageBytes bounds the size of a PUBLISH packet the subscriber
	// takes, in bytes: the whole packet (fixed header, topic, packet
	// identifier and payload), as MQTT 5's Maximum Packet Size counts it.
	// A larger message is not appended: a dead-letter record takes its
	// place in the log (ingestlog.Message.TooLarge: its topic, packet
	// identifier, size and first DeadLetterKeep payload bytes), TooLarge
	// counts it, a warning names it, and it is acknowledged once that
	// record is durable, so that the broker does not redeliver it. The
	// direct reader checks the packet's remaining length before it
	// allocates anything for it and discards the rest of the packet
	// through its read buffer, so a peer claiming 256 MB costs no more
	// memory than the bound; paho reads every packet whole before the
	// check (its memory is not bounded by this). Neither can advertise the
	// bound to the broker: both speak MQTT 3.1.1, which has no Maximum
	// Packet Size. It must not exceed what one record of the ingest log
	// holds (ingestlog.Log.MaxMessageBytes: about 64 MiB with the
	// default 64 MiB segments); a message that the log cannot hold is a
	// dead letter in the same way. YAML source.mqtt.max_message_bytes;
	// default DefaultMaxMessageBytes (8 MiB), or what one record of the
	// log holds if that is less.
	MaxMessageBytes int64
	// MaxReconnectInterval caps the reconnect backoff. Default 10s.
	MaxReconnectInterval time.Duration
	// Client chooses what reads the broker's connection: ClientDirect
	// (one goroutine reads and decodes the packets in batches, see
	// directSession) or ClientPaho (the paho client). Empty means
	// ClientDirect for the brokers it can dial (tcp://, mqtt://, ssl://,
	// tls://, mqtts://, tcps://, mqtt+ssl://, unix://) and ClientPaho for
	// the others (ws://, wss://). YAML source.mqtt.client.
	Client string
	// Logger; nil discards.
	Logger *slog.Logger
}

// The values of SubscriberConfig.Client.
const (
	// ClientDirect reads the broker's connection on one goroutine and
	// hands the messages to the log in batches.
	ClientDirect = "direct"
	// ClientPaho reads the broker's connection with the paho client.
	ClientPaho = "paho"
)

// DefaultMaxPendingBytes is SubscriberConfig.MaxPendingBytes by default.
const DefaultMaxPendingBytes = 8 << 20

// DefaultMaxMessageBytes is SubscriberConfig.MaxMessageBytes (and
// BrokerConfig.MaxMessageBytes) by default: 8 MiB, the default budget of
// payload bytes pending (DefaultMaxPendingBytes), well within a 64 MiB
// ingest-log segment.
const DefaultMaxMessageBytes = 8 << 20

// MaxPacketBytes is the largest MQTT packet: a fixed header byte, a
// four-byte remaining length and 268435455 bytes.
const MaxPacketBytes = 1 + 4 + 268435455

// DeadLetterKeep is how many bytes of the payload of a message too large
// to keep its dead-letter record holds.
const DeadLetterKeep = 256

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
	if c.MaxPendingBytes <= 0 {
		c.MaxPendingBytes = DefaultMaxPendingBytes
	}
	if c.RedeliveryWindow <= 0 {
		c.RedeliveryWindow = 65535
	}
	if c.AckDelay == 0 {
		c.AckDelay = DefaultAckDelay
	}
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if c.MaxReconnectInterval <= 0 {
		c.MaxReconnectInterval = 10 * time.Second
	}
	if c.Client == "" {
		c.Client = ClientPaho
		if directScheme(c.Broker) {
			c.Client = ClientDirect
		}
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
	if c.AckDelay > MaxAckDelay {
		bad("source.mqtt.ack_delay (%v) must not exceed %v", c.AckDelay, MaxAckDelay)
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
	switch c.Client {
	case ClientPaho:
	case ClientDirect:
		if c.Broker != "" && !directScheme(c.Broker) {
			bad("source.mqtt.client (direct) dials tcp://, mqtt://, ssl://, tls://, mqtts://, tcps://, mqtt+ssl:// and unix:// brokers, not %q: use client: paho", c.Broker)
		}
	default:
		bad("source.mqtt.client (%q) must be %q or %q", c.Client, ClientPaho, ClientDirect)
	}
	if m := c.MaxMessageBytes; m < minMessageBytes || m > MaxPacketBytes {
		bad("source.mqtt.max_message_bytes (%d) must be between %d and %d", m, minMessageBytes, MaxPacketBytes)
	}
	if w := c.RedeliveryWindow; w <= 2*c.MaxPending || w >= 1<<16 {
		bad("source.mqtt.redelivery_window (%d) must exceed twice source.mqtt.max_pending (%d) and stay below 65536", w, c.MaxPending)
	}
	return errors.Join(errs...)
}

// minMessageBytes is the smallest SubscriberConfig.MaxMessageBytes: room
// for a PUBLISH with a short topic and payload.
const minMessageBytes = 64

// publishSize returns the size of an MQTT 3.1.1 PUBLISH packet with a
// topic of topicLen bytes and a payload of payloadLen bytes at qos.
// PublishSize returns the size in bytes of an MQTT 3.1.1 PUBLISH packet
// with a topic of topicLen bytes and a payload of payloadLen at qos: what
// a broker's packet limit (max_message_bytes) is compared with.
func PublishSize(topicLen, payloadLen int, qos byte) int64 {
	return publishSize(topicLen, payloadLen, qos)
}

func publishSize(topicLen, payloadLen int, qos byte) int64 {
	n := int64(2 + topicLen + payloadLen)
	if qos > 0 {
		n += 2
	}
	return 1 + int64(lengthBytes(n)) + n
}

// lengthBytes returns how many bytes MQTT's variable byte integer takes
// for n.
func lengthBytes(n int64) int {
	switch {
	case n < 128:
		return 1
	case n < 16384:
		return 2
	case n < 2097152:
		return 3
	}
	return 4
}

// Subscriber subscribes to an external MQTT broker (Mosquitto, ...) and
// appends every message it receives to an ingest log, the replayable
// input of the pipeline's Source. What reads the connection is the direct
// reader (runDirect) or paho (SubscriberConfig.Client); the append, the
// redelivery table, the budgets and the acker below are the same for
// both, and what is said of paho's handler holds for the direct reader's
// loop (which hands the acker batches instead of single messages).
//
// Delivery is at-least-once for QoS 1 and 2: paho's automatic acks are
// disabled and a message is acknowledged (PUBACK) only once it is durable
// in the log (ingestlog.Log.WaitDurable). If the append fails (log closed
// or failed, subscriber closing) the message is not acknowledged and an
// error is logged; the broker redelivers it when the persistent session
// resumes (CleanSession false, fixed ClientID). A message larger than
// MaxMessageBytes is the exception: a dead-letter record takes its place
// in the log and is acknowledged like a message (see MaxMessageBytes).
//
// Messages are written to the log on paho's goroutine in the order they
// arrived, without waiting for the fsync (ingestlog.Log.AppendNoWait), so
// the log keeps the broker's order; the acker acknowledges them in that
// order, each once the log's group commit made it durable (messages share
// fsyncs). At most MaxPending (plus the one the acker is
// waiting on), and at most MaxPendingBytes of payload, are received but
// not yet acknowledged: then the paho handler blocks, which stops paho reading the
// connection (back-pressure to the broker; if that outlasts paho's
// keep-alive the connection drops and the broker redelivers later). A
// full log blocks the appends, so it holds back the acks too.
//
// # Redeliveries
//
// A message appended but not acknowledged when edged died, or when the
// connection dropped, is redelivered by the broker on the resumed session,
// with the DUP flag and its original packet identifier (MQTT 3.1.1 4.4),
// possibly out of order. The subscriber records each message's packet
// identifier in the log with it (ingestlog.Message.PacketID) and keeps,
// per packet identifier, the xxhash of topic and payload of the latest
// record appended under it, if it is among the last W fresh records
// (W = DedupWindow()); the table is reloaded from the log's last W records
// at Start. Fresh records are those of messages without DUP and those
// reloaded: a DUP message appended (not found) does not age the others,
// so that a redelivery reaching back beyond the window appends only its
// part outside the window, not (by pushing each next one out) all of it.
// The rule: a message with DUP whose packet identifier and content both
// equal those of the latest record under that identifier within the
// window is that record's redelivery; it is acknowledged and not appended again (Dropped counts
// them). So is a QoS 2 message, with DUP or without, whose packet
// identifier and content equal those of a record whose QoS 2 exchange is
// open (no PUBREL since it arrived; the direct reader only, which sees
// the PUBREL): until the PUBREL the identifier names that message (MQTT
// 3.1.1 4.3.3), and Mosquitto restarted from its persistence file resends
// such messages without DUP. Every other message is appended: a message
// without DUP is never dropped, and neither is a DUP message whose content equals an earlier
// message's under another packet identifier (a sensor that sends "ON"
// twice keeps both). A redelivery of a message still being appended waits
// for that append and is dropped only if it succeeded.
//
// A redelivery whose record is more than W/2 fresh records back is not
// just dropped but noted: a redelivery note (ingestlog.Message.Note, the
// same packet identifier, topic and payload; no message: the Source skips
// it) is appended, and acknowledged once durable, which makes it the
// latest record under that identifier, as young as the newest. A note is
// not fresh: it ages no other record. The broker resends a message on
// every session until an acknowledgement of it reaches it, and with edged
// killed again and again before that, its record would otherwise fall
// out of the window and its next resend be logged again. With the notes
// it stays in the window as long as each session appends fewer than W/2
// fresh records between two resends of it. loadTail reads the log's last
// 2·W records, so that the notes in them do not push fresh records out of
// what it reloads.
//
// Why W is enough. Let U be the most messages the broker holds sent to
// this client but unacknowledged, at any time; it can redeliver only
// those, and U < 65536 since each needs its own packet identifier. Let a
// record at offset o hold message M, later redelivered with DUP. Acks go
// to the broker in arrival order, so when a connection ends with M
// unacknowledged, no message that arrived after M on it is acknowledged
// either: they are held with M, and stay so on the next connection while
// M is. The rule assumes the broker resends what it holds on reconnect, in
// the original order, before new messages (MQTT 3.1.1 4.4 and 4.6 ask for
// the resend and the order; the measurement below is consistent with
// Mosquitto doing so). So the records appended after o, until
// M's redelivery is checked, counting fresh records only, are at most:
// messages held with M (at most U−1 that arrived after it, and at most
// U−1 older ones whose first append never completed); at
// most MaxPending that arrived before M but were appended after it
// (appends are concurrent); and at most MaxPending that arrive after the
// redelivery and are appended before it is checked. That is below
// 2·(U + MaxPending) ≤ W. With the default W (65535) and MaxPending
// (1024), the rule covers U up to 31743.
//
// U is not the broker's configured in-flight limit. Measured with
// Mosquitto 2.0.11, max_inflight_messages 1000, a subscriber reset while
// receiving got up to 2,773 distinct DUP redeliveries on the next
// connection, and a redelivery matched a record 1,453 appends back (more
// than MaxPending): acks the client has written but the broker has not
// yet read are discarded when the connection is reset (a killed process's
// socket with unread input is reset), and the broker's limit does not
// bound what it holds across that. The old 4,096-entry content window was
// outgrown that way. In the kill test against Mosquitto (five SIGKILLs
// about 1.5 s apart) a resumed session was resent 43,943 and 53,571
// messages, reaching back to records appended several runs earlier,
// beyond the former default W of 32768 (a window that the appended part
// of such a redelivery also used to age, so that all of it was appended
// again). paho v1 speaks MQTT 3.1.1, which has no Receive
// Maximum to negotiate.
//
// What could still go wrong: the rule drops a DUP message wrongly only if
// it was never appended and the broker had given its packet identifier,
// after acknowledgement, to an earlier message with the same topic and
// payload that is still the latest record under that identifier within
// the window. Mosquitto and mochi
// allocate identifiers in sequence per client, so one comes back only
// after 65535 others: the earlier message is at least 65535 − L records
// back, L the messages sent in between that were never appended (lost in
// flight at crashes), which is beyond W unless L exceeds 65535 − W (0 by
// default: with the default W this can happen after a crash lost
// messages in flight). With a broker that reuses identifiers early, equal
// readings redelivered after a crash could be lost; timestamped readings
// cannot. A broker holding more than W/2 − MaxPending unacknowledged
// messages, or sending more than that many new messages before its
// resends, can redeliver one older than the window, which is then
// appended twice (a duplicate, never a loss). Records without a packet
// identifier (from an older log) never match.
//
// paho reconnects by itself (ConnectRetry, AutoReconnect, backoff up to
// MaxReconnectInterval), as the direct reader does (runDirect). On every
// connect the subscriber subscribes to what the session lacks (all on a
// new session, see subscription: a resumed one is not subscribed again,
// so that the broker does not resend its retained messages).
// Messages the broker resends before a subscription is made reach the
// default publish handler, which is the same handler.
type Subscriber struct {
	cfg    SubscriberConfig
	log    *ingestlog.Log
	logger *slog.Logger

	mu      sync.Mutex // guards client, dconn, started, closed; and inflight.Add
	client  paho.Client
	dconn   *directConn      // the direct reader's current connection, if any
	store   *subscriberStore // paho's store; set by Start
	started bool
	closed  bool

	ctx      context.Context // cancelled by Close: unblocks appends
	cancel   context.CancelFunc
	tryCtx   context.Context // already cancelled: an append that would wait for space fails instead
	pending  chan *batch     // in arrival order, for the acker
	budget   *byteBudget     // payload bytes received, not yet acknowledged
	slots    *byteBudget     // messages received, not yet acknowledged (MaxPending)
	batches  sync.Pool       // of *batch
	inflight sync.WaitGroup  // handlers, the direct reader and the acker
	ready    chan struct{}   // closed after the first successful subscribe (or resumed session)
	once     sync.Once
	subs     *subscriptions               // what the broker's session holds
	pconn    atomic.Pointer[bufferedConn] // paho's latest connection (plain TCP only)

	// seen is the latest record per packet id, within the last W fresh
	// ones; filled by loadTail before Start, then used by paho's
	// goroutine (handle) only.
	seen     *keyRing
	dropped  atomic.Uint64 // redeliveries dropped as duplicates (noted or not)
	notes    atomic.Uint64 // redeliveries noted in the log (ingestlog.Message.Note)
	tooLarge atomic.Uint64 // messages too large to keep, appended as dead-letter records
	dups     atomic.Uint64 // deliveries with DUP received
	maxAge   atomic.Int64  // most records appended after one a dropped redelivery matched
	maxUnack atomic.Int64  // most deliveries received but not acknowledged at once
	unacked  atomic.Int64  // deliveries received but not acknowledged now
	linger   ackLinger     // used by the acker only
	// pauses counts the broker's pauses (ackQuiet of nothing) that the
	// acker waited through, taking the broker for slow (ackLinger).
	pauses atomic.Int64
	// lingering is set while the acker waits for more messages
	// (lingerFor): the direct reader may then let them gather in the
	// socket before it reads (gatherFor).
	lingering atomic.Bool
	// gathered is when the direct reader's last gathering pause ends or
	// ended (UnixNano), 0 if it made none: a quiet connection is only
	// quiet once the reader has been reading it for ackQuiet.
	gathered atomic.Int64
	gathers  atomic.Int64 // gathering pauses the direct reader made
	// gatherPause is the direct reader's gathering pause:
	// min(ackQuiet, AckDelay/4); 0: none.
	gatherPause time.Duration
	// lastOff is the offset of the last record written, if wrote; used by
	// paho's goroutine (handle) only.
	lastOff  uint64
	wrote    bool
	openConn paho.OpenConnectionFunc // tests: how to dial the broker (wrapped in a bufferedConn); nil dials TCP

	// The direct reader's connections (tests and logs).
	keepAlive time.Duration // 0: defaultKeepAlive; tests shorten it
	connects  atomic.Uint64 // connections accepted by the broker (CONNACK 0)
	pings     atomic.Uint64 // PINGRESPs received

	// connected is true from the broker's acceptance of a connection
	// (CONNACK 0) until that connection ends; lostAt is when the last
	// accepted connection ended (UnixNano; 0 before the first ended).
	connected atomic.Bool
	lostAt    atomic.Int64
}

// Broker returns the broker's URL (SubscriberConfig.Broker) with its
// password, if any, replaced by "xxxxx", as the subscriber logs it.
func (s *Subscriber) Broker() string { return redactBroker(s.cfg.Broker) }

// redactBroker returns the broker URL raw with its password replaced by
// "xxxxx": the URL names the broker in logs and in the API, which must
// not show the password.
func redactBroker(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.User == nil {
		return raw
	}
	return u.Redacted()
}

// Connected reports whether the subscriber holds a connection the broker
// accepted (CONNACK 0) and that has not ended: false from the start until
// the first connection, and from a lost connection until the broker
// accepts the next.
func (s *Subscriber) Connected() bool { return s.connected.Load() }

// Connects returns how many connections the broker accepted (CONNACK 0):
// 1 after the first, one more after each reconnect.
func (s *Subscriber) Connects() uint64 { return s.connects.Load() }

// up records a connection the broker accepted and returns the log
// attributes of the connected line: how long the subscriber was without
// a connection, once one had been lost.
func (s *Subscriber) up() []any {
	s.connects.Add(1)
	s.connected.Store(true)
	if at := s.lostAt.Load(); at != 0 {
		return []any{"down_for", time.Since(time.Unix(0, at)).Round(time.Millisecond)}
	}
	return nil
}

// down records the end of a connection the broker had accepted.
func (s *Subscriber) down() {
	if s.connected.Swap(false) {
		s.lostAt.Store(time.Now().UnixNano())
	}
}

// DedupWindow returns W, the number of last appended records a
// redelivery is compared with: RedeliveryWindow.
func (c SubscriberConfig) DedupWindow() int {
	return c.withDefaults().RedeliveryWindow
}

// Dropped returns how many redelivered messages were acknowledged without
// being appended because they are redeliveries of records in the log.
func (s *Subscriber) Dropped() uint64 { return s.dropped.Load() }

// Pipeline returns the name of the pipeline whose log the subscriber
// appends to (SubscriberConfig.Pipeline).
func (s *Subscriber) Pipeline() string { return s.cfg.Pipeline }

// TooLarge returns how many messages were larger than
// SubscriberConfig.MaxMessageBytes (or than an ingest-log record can be)
// and were appended as dead-letter records instead
// (ingestlog.Message.TooLarge), then acknowledged.
func (s *Subscriber) TooLarge() uint64 { return s.tooLarge.Load() }

// Redelivered returns how many messages arrived with the DUP flag, dropped
// or not.
func (s *Subscriber) Redelivered() uint64 { return s.dups.Load() }

// Notes returns how many of the dropped redeliveries (Dropped) were noted
// in the log again (ingestlog.Message.Note) because the record they
// repeat was past the middle of the window.
func (s *Subscriber) Notes() uint64 { return s.notes.Load() }

// MaxRedeliveryAge returns the most records that had been appended after
// the record a dropped redelivery matched: how much of the window
// (DedupWindow) redeliveries have needed.
func (s *Subscriber) MaxRedeliveryAge() int64 { return s.maxAge.Load() }

// MaxUnacknowledged returns the most messages that were received but not
// yet acknowledged at one time (at most MaxPending plus the one the paho
// handler holds).
func (s *Subscriber) MaxUnacknowledged() int64 { return s.maxUnack.Load() }

// raise sets a to v if v is greater.
func raise(a *atomic.Int64, v int64) {
	for {
		cur := a.Load()
		if v <= cur || a.CompareAndSwap(cur, v) {
			return
		}
	}
}

// msgKey identifies a message for redelivery detection: the packet
// identifier it arrived with and the hash of its topic and payload.
type msgKey struct {
	id   uint16
	hash uint64
}

// keyOf returns the identity of a message. A message without a packet
// identifier (QoS 0) is never redelivered, so it is never looked up: its
// identity is the zero msgKey, and its topic and payload are not hashed.
func keyOf(id uint16, topic string, payload []byte) msgKey {
	if id == 0 {
		return msgKey{}
	}
	var d xxhash.Digest
	d.Reset()
	d.WriteString(topic)
	d.Write([]byte{0}) // topics contain no NUL: separates topic from payload
	d.Write(payload)
	return msgKey{id: id, hash: d.Sum64()}
}

// tooLargeKey returns the identity of a message too large to keep, of
// size bytes, whose first payload bytes are kept: computed from what its
// dead-letter record holds, so that it is the same for the redelivery
// and for the record read back at Start.
func tooLargeKey(id uint16, topic string, kept []byte, size int64) msgKey {
	k := keyOf(id, topic, kept)
	k.hash ^= xxhash.Sum64(binary.LittleEndian.AppendUint64([]byte{0xff}, uint64(size)))
	return k
}

// recordKey returns the identity of a message read back from the log.
func recordKey(rec ingestlog.Record) msgKey {
	if rec.TooLarge > 0 {
		return tooLargeKey(rec.PacketID, rec.Topic, rec.Payload, rec.TooLarge)
	}
	return keyOf(rec.PacketID, rec.Topic, rec.Payload)
}

// keyRing remembers, for each packet identifier, the content hash of the
// latest record appended under it, and how many fresh records were
// appended after it: a key is found while fewer than W fresh records
// came after it. A fresh record is one appended from a message without
// DUP (a new packet identifier from the broker) or read from the log at
// Start; a DUP message appended because it was not found does not count,
// so that a long redelivery outside the window does not push the records
// it redelivers next out of the window (which would append them all
// again). A newer record under the same packet identifier replaces the
// older one: a broker reuses an identifier only once the message it named
// is acknowledged, so that one is never redelivered again.
//
// It is a table indexed by packet identifier (1 MiB: 65536 entries of 16
// bytes), not a map: add runs once per message on paho's goroutine, and
// the table is smaller than a map holding as many identifiers.
type keyRing struct {
	w     uint64
	fresh uint64      // fresh records ever added
	ids   []ringEntry // by packet identifier
}

type ringEntry struct {
	hash uint64
	// at is fresh when it was added, plus 1 (0: no record), with
	// ringUnreleased set while the record is a QoS 2 message whose
	// PUBREL has not arrived (see unreleased).
	at uint64
}

// ringUnreleased marks a ringEntry whose QoS 2 exchange is open: the
// message was received, and the broker has not released its packet
// identifier with a PUBREL.
const ringUnreleased = 1 << 63

func newKeyRing(w int) *keyRing {
	return &keyRing{w: uint64(w), ids: make([]ringEntry, 1<<16)}
}

// add records k as the latest record under its packet identifier; fresh
// says whether it counts towards the window, unreleased whether it is a
// QoS 2 message whose PUBREL is still to come.
func (r *keyRing) add(k msgKey, fresh, unreleased bool) {
	if fresh {
		r.fresh++
	}
	e := ringEntry{hash: k.hash, at: r.fresh + 1}
	if unreleased {
		e.at |= ringUnreleased
	}
	r.ids[k.id] = e
}

// has reports whether k is the latest record under its packet identifier
// and within the window, and how many fresh records were added after it.
func (r *keyRing) has(k msgKey) (age int, ok bool) {
	e := r.ids[k.id]
	at := e.at &^ ringUnreleased
	if at == 0 || e.hash != k.hash || r.fresh-(at-1) >= r.w {
		return 0, false
	}
	return int(r.fresh - (at - 1)), true
}

// unreleased is has for a record whose QoS 2 exchange is still open:
// until the broker's PUBREL, a PUBLISH under the same packet identifier
// is the same message (MQTT 3.1.1 4.3.3), with DUP or without.
func (r *keyRing) unreleased(k msgKey) (age int, ok bool) {
	if r.ids[k.id].at&ringUnreleased == 0 {
		return 0, false
	}
	return r.has(k)
}

// release closes the QoS 2 exchange under packet identifier id: the
// broker sent its PUBREL, and may give id to a new message from then on.
func (r *keyRing) release(id uint16) { r.ids[id].at &^= ringUnreleased }

// releaseAll closes every open QoS 2 exchange: the broker did not resume
// the session, so it holds none of them.
func (r *keyRing) releaseAll() {
	for i := range r.ids {
		r.ids[i].at &^= ringUnreleased
	}
}

// loadTail fills s.seen with the identities of the records of the log's
// last 2·W: the last W fresh ones among them, and the redelivery notes
// after the first of those. Notes, which do not age the others (see
// Subscriber), are why it reads back 2·W rather than W.
func (s *Subscriber) loadTail() error {
	w := s.cfg.DedupWindow()
	s.seen = newKeyRing(w)
	st := s.log.Stats()
	from := st.FirstOffset
	if st.NextOffset > from+2*uint64(w) {
		from = st.NextOffset - 2*uint64(w)
	}
	r, err := s.log.Reader(from)
	if err != nil {
		return fmt.Errorf("mqtt: subscriber: read the ingest log's tail for deduplication: %w", err)
	}
	defer r.Close()
	n, withID, notes := 0, 0, 0
	for {
		rec, ok, err := r.TryNext()
		if err != nil {
			return fmt.Errorf("mqtt: subscriber: read the ingest log's tail for deduplication: %w", err)
		}
		if !ok {
			break
		}
		s.seen.add(recordKey(rec), !rec.Note, false)
		n++
		if rec.PacketID != 0 {
			withID++
		}
		if rec.Note {
			notes++
		}
	}
	s.logger.Info("mqtt subscriber: redelivery window loaded", "records", n, "with_packet_id", withID,
		"redelivery_notes", notes, "from", from, "window", w)
	return nil
}

// delivery is one received message on its way to the log and the ack.
type delivery struct {
	msg   paho.Message // paho's message, acknowledged with its Ack; nil from the direct reader
	topic string       // for logs; the direct reader sets it only for a delivery it logs
	id    uint16       // packet identifier; 0 for QoS 0
	qos   byte
	dup   bool
	key   msgKey
	size  int64 // payload bytes, held in the budget until acknowledged
	// off is the offset to wait for before the acknowledgement: the
	// record's own, or for a dropped redelivery the last record written
	// before it (its original may be that recent); has says there is one.
	off     uint64
	has     bool
	err     error // of the append
	dropped bool  // a redelivery of a record in the log: acked, not appended
	// note marks a redelivery of a record far back in the window: it is
	// appended as a redelivery note (ingestlog.Message.Note), not as a
	// message, and acknowledged once that is durable.
	note bool
	// tooLarge is, for a message too large to keep, the size of its
	// PUBLISH packet: a dead-letter record with its first payload bytes
	// takes its place.
	tooLarge int64
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
	if cfg.MaxMessageBytes == 0 {
		cfg.MaxMessageBytes = min(DefaultMaxMessageBytes, log.MaxMessageBytes())
	}
	cfg = cfg.withDefaults()
	if lm := log.MaxMessageBytes(); cfg.MaxMessageBytes > lm {
		return nil, fmt.Errorf("%w: source.mqtt.max_message_bytes (%d) must not exceed what one ingest-log record holds (%d)",
			ErrInvalidConfig, cfg.MaxMessageBytes, lm)
	}
	tryCtx, cancel := context.WithCancel(context.Background())
	cancel()
	logger := cfg.Logger.With("component", "mqtt-subscriber", "broker", redactBroker(cfg.Broker), "client_id", cfg.ClientID)
	return &Subscriber{
		cfg:         cfg,
		log:         log,
		logger:      logger,
		subs:        newSubscriptions(log.Dir(), cfg, logger),
		tryCtx:      tryCtx,
		pending:     make(chan *batch, cfg.MaxPending),
		budget:      newByteBudget(cfg.MaxPendingBytes),
		slots:       newByteBudget(int64(cfg.MaxPending)),
		linger:      ackLinger{delay: max(cfg.AckDelay, 0), still: ackQuiet},
		gatherPause: min(ackQuiet, max(cfg.AckDelay, 0)/4),
		ready:       make(chan struct{}),
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
	s.inflight.Go(s.acker)
	s.logger.Info("mqtt subscriber connecting", "topics", s.cfg.Topics, "qos", s.cfg.QoS, "client", s.cfg.Client)
	if s.cfg.Client == ClientDirect {
		s.inflight.Go(s.runDirect)
		return nil
	}
	s.store = newSubscriberStore()

	o := paho.NewClientOptions().AddBroker(s.cfg.Broker).SetClientID(s.cfg.ClientID).
		SetCleanSession(false).
		SetAutoAckDisabled(true).
		SetOrderMatters(true). // the handler only queues; order kept for acks
		SetStore(s.store).
		SetConnectRetry(true).
		SetConnectRetryInterval(time.Second).
		SetAutoReconnect(true).
		SetMaxReconnectInterval(s.cfg.MaxReconnectInterval).
		SetDefaultPublishHandler(s.handle).
		SetOnConnectHandler(s.onConnect).
		SetCustomOpenConnectionFn(bufferedDial(s.cfg.Broker, s.openConn, &s.pconn)).
		SetConnectionLostHandler(func(_ paho.Client, err error) {
			s.down()
			s.logger.Warn("mqtt subscriber: connection lost; reconnecting", "error", err)
		})
	s.client = paho.NewClient(o)
	s.client.Connect() // with ConnectRetry it retries in the background
	return nil
}

// Ready returns a channel closed once the subscriber has subscribed for
// the first time.
func (s *Subscriber) Ready() <-chan struct{} { return s.ready }

// onConnect subscribes to what the session lacks (subscriptions.plan);
// paho calls it on its own goroutine after every successful connect.
// paho does not tell whether the session was resumed: the bufferedConn
// read it from the CONNACK. A connection paho dialed itself (TLS,
// WebSocket) counts as a new session, so every filter is subscribed to
// again there, and the broker resends its retained messages.
func (s *Subscriber) onConnect(c paho.Client) {
	present := false
	if bc := s.pconn.Load(); bc != nil {
		present = bc.sessionPresent()
	}
	if attrs := s.up(); attrs != nil {
		s.logger.Info("mqtt subscriber connected again", append(attrs, "session_present", present)...)
	}
	p := s.subs.plan(present)
	if len(p.unsub) > 0 {
		tok := c.Unsubscribe(p.unsub...)
		if !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
			s.logger.Error("mqtt subscriber: unsubscribe failed", "topics", p.unsub, "error", tok.Error())
		} else {
			s.unsubscribed(p.unsub)
		}
	}
	if len(p.sub) > 0 {
		filters := make(map[string]byte, len(p.sub))
		for _, t := range p.sub {
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
		granted := tok.(*paho.SubscribeToken).Result()
		codes := make([]byte, len(p.sub))
		for i, t := range p.sub {
			q, ok := granted[t]
			if !ok {
				q = 0x80
			}
			codes[i] = q
		}
		_ = s.subscribed(p.sub, codes) // logged; a refusal is retried on the next connection
		return
	}
	s.resumed()
}

// handle runs on paho's goroutine for every message, in arrival order.
// It writes the message to the log in that order (without waiting for the
// fsync), so the log keeps the broker's order; the acker waits for
// durability before it acknowledges.
func (s *Subscriber) handle(_ paho.Client, m paho.Message) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return // not acknowledged: redelivered on the next session
	}
	s.inflight.Add(1)
	s.mu.Unlock()
	defer s.inflight.Done()
	d := delivery{msg: m, topic: m.Topic(), id: m.MessageID(), qos: m.Qos(), dup: m.Duplicate()}
	payload := s.classify(&d, m.Topic(), m.Payload(), 0)
	if !s.acquire(s.ctx, d.size) { // blocks when MaxPending messages or MaxPendingBytes are unacknowledged
		return
	}
	if !s.dedup(&d) {
		if err := s.appendRecord(s.ctx, &d, m.Topic(), payload, m.Retained()); err != nil {
			d.err = err
		}
	}
	b := s.newBatch(pahoAcks{})
	b.ds = append(b.ds, d)
	s.handOff(b)
}

// classify sets d's identity and size for a message on topic with
// payload and returns the payload to append: the message's own, or, for
// a message too large to keep, its first DeadLetterKeep bytes, with
// d.tooLarge set to the size of its PUBLISH packet. tooLarge is that
// size for a message the direct reader did not read whole (payload holds
// its first bytes then), 0 otherwise. A message is too large to keep
// when its PUBLISH packet is larger than MaxMessageBytes or its topic
// and payload do not fit in one record of the log.
func (s *Subscriber) classify(d *delivery, topic string, payload []byte, tooLarge int64) []byte {
	if size := publishSize(len(topic), len(payload), d.qos); tooLarge == 0 &&
		(size > s.cfg.MaxMessageBytes || int64(len(topic)+len(payload)) > s.log.MaxMessageBytes()) {
		tooLarge = size
	}
	if tooLarge == 0 {
		d.key, d.size = keyOf(d.id, topic, payload), int64(len(payload))
		return payload
	}
	payload = payload[:deadLetterKeep(s.log, topic, payload)]
	d.tooLarge = tooLarge
	d.key, d.size = tooLargeKey(d.id, topic, payload, tooLarge), int64(len(payload))
	return payload
}

// acquire takes a message's place and size bytes of the budgets of
// messages received but not acknowledged, waiting until they are free
// or ctx is done; it reports whether it took them.
func (s *Subscriber) acquire(ctx context.Context, size int64) bool {
	if !s.slots.acquire(ctx, 1) {
		return false
	}
	if !s.budget.acquire(ctx, size) {
		s.slots.release(1)
		return false
	}
	return true
}

// tryAcquire is acquire without waiting.
func (s *Subscriber) tryAcquire(size int64) bool {
	if !s.slots.tryAcquire(1) {
		return false
	}
	if !s.budget.tryAcquire(size) {
		s.slots.release(1)
		return false
	}
	return true
}

// handOff gives b, whose deliveries hold their places in the budgets, to
// the acker. If the subscriber closes first, b's deliveries stay
// unacknowledged (redelivered on the next session).
func (s *Subscriber) handOff(b *batch) {
	n := int64(len(b.ds))
	// Counted before the acker can see b: its linger (ackLinger) weighs
	// what is outstanding.
	raise(&s.maxUnack, s.unacked.Add(n))
	select {
	case s.pending <- b: // the common case: the acker keeps up
	default:
		select {
		case s.pending <- b:
		case <-s.ctx.Done():
			s.unacked.Add(-n)
			var size int64
			for i := range b.ds {
				size += min(b.ds[i].size, s.budget.max)
			}
			s.release(n, size)
			s.putBatch(b)
			return
		}
	}
}

// release gives back the places of n messages of size bytes in all.
func (s *Subscriber) release(n, size int64) {
	s.budget.release(size)
	s.slots.release(n)
}

// dedup reports whether d is the redelivery of a record in the log
// (see Subscriber), and marks it dropped then; a redelivery to note
// instead (d.note) is counted as dropped but reported false, to be
// appended as a note. It sets d.off to the last
// record written before d. Called in arrival order, one at a time, on the
// goroutine that reads the broker's messages.
func (s *Subscriber) dedup(d *delivery) bool {
	d.off, d.has = s.lastOff, s.wrote
	if d.id == 0 {
		return false
	}
	var age int
	var dup bool
	switch {
	case d.dup:
		s.dups.Add(1)
		age, dup = s.seen.has(d.key)
	case d.qos == 2:
		// A QoS 2 PUBLISH under a packet identifier whose exchange is
		// open (received, no PUBREL yet) is that message again, DUP or
		// not: Mosquitto restarted from its persistence file resends
		// QoS 2 messages without DUP.
		age, dup = s.seen.unreleased(d.key)
	}
	if !dup {
		return false
	}
	raise(&s.maxAge, int64(age))
	s.dropped.Add(1)
	if d.dup && uint64(age) > s.seen.w/2 {
		// The record it repeats is past the middle of the window: note
		// it again at the log's tail, so that the next resend of it,
		// here or after a restart, still finds it (counted in s.notes
		// once appendRecord wrote the note).
		d.note = true
		return false
	}
	d.dropped = true
	return true
}

// appendRecord writes d's message to the log without waiting for the
// fsync and records it in the redelivery table; for a message too large
// to keep (d.tooLarge, see classify) it writes the dead-letter record,
// counts it and logs it; for a redelivery to note (d.note) it writes the
// note. It returns the append's error and then changes
// nothing: with s.tryCtx an append that would wait for log space fails
// at once (wouldBlock). Called like dedup.
func (s *Subscriber) appendRecord(ctx context.Context, d *delivery, topic string, payload []byte, retain bool) error {
	off, err := s.log.AppendNoWait(ctx, ingestlog.Message{
		Topic:    topic,
		Payload:  payload,
		QoS:      d.qos,
		Retain:   retain,
		Received: time.Now(),
		PacketID: d.id,
		TooLarge: d.tooLarge,
		Note:     d.note,
	})
	if err != nil {
		return err
	}
	if d.note {
		s.notes.Add(1)
	}
	if d.tooLarge > 0 && !d.note {
		s.tooLarge.Add(1)
		s.logger.Warn("mqtt subscriber: message larger than source.mqtt.max_message_bytes (or than an ingest-log record); recorded as a dead letter with its first bytes, acknowledged once durable",
			"topic", topic, "message_bytes", d.tooLarge, "packet_id", d.id, "qos", d.qos,
			"max_message_bytes", s.cfg.MaxMessageBytes, "offset", off)
	}
	d.off, d.has = off, true
	s.lastOff, s.wrote = off, true
	s.seen.add(d.key, !d.dup, d.qos == 2 && s.cfg.Client == ClientDirect)
	return nil
}

// wouldBlock reports whether err is the failure of an append with
// s.tryCtx that found no log space, while the subscriber runs.
func (s *Subscriber) wouldBlock(err error) bool {
	return errors.Is(err, context.Canceled) && s.ctx.Err() == nil
}

// batch is a run of deliveries in arrival order, handed to the acker at
// once.
type batch struct {
	ds   []delivery
	acks acknowledger // where their acknowledgements go
}

// acknowledger sends acknowledgements on the connection the deliveries
// arrived on. Called by the acker goroutine only; it may block on the
// network.
type acknowledger interface {
	// ack acknowledges d (nothing for QoS 0).
	ack(d *delivery)
	// send writes what ack queued.
	send()
}

// pahoAcks acknowledges through paho's message.
type pahoAcks struct{}

func (pahoAcks) ack(d *delivery) { d.msg.Ack() }
func (pahoAcks) send()           {}

// maxBatch is the most deliveries the direct reader hands to the acker
// at once.
const maxBatch = 256

func (s *Subscriber) newBatch(a acknowledger) *batch {
	b, _ := s.batches.Get().(*batch)
	if b == nil {
		b = &batch{ds: make([]delivery, 0, 1)}
	}
	b.acks = a
	return b
}

func (s *Subscriber) putBatch(b *batch) {
	clear(b.ds)
	b.ds, b.acks = b.ds[:0], nil
	s.batches.Put(b)
}

// byteBudget bounds the bytes held at once; safe for concurrent use.
type byteBudget struct {
	max int64

	mu      sync.Mutex // guards used, waiting and freed
	used    int64
	waiting bool          // an acquire waits on freed
	freed   chan struct{} // closed by the release after a waiting acquire
}

func newByteBudget(max int64) *byteBudget {
	return &byteBudget{max: max, freed: make(chan struct{})}
}

// acquire takes n bytes (at most max), waiting until they are free or
// ctx is done; it reports whether it took them. A request of max or more
// waits until nothing is held.
func (b *byteBudget) acquire(ctx context.Context, n int64) bool {
	n = min(n, b.max)
	for {
		b.mu.Lock()
		if b.used+n <= b.max {
			b.used += n
			b.mu.Unlock()
			return true
		}
		b.waiting = true
		ch := b.freed
		b.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return false
		}
	}
}

// tryAcquire takes n bytes like acquire if they are free now, and
// reports whether it took them.
func (b *byteBudget) tryAcquire(n int64) bool {
	n = min(n, b.max)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.used+n <= b.max {
		b.used += n
		return true
	}
	return false
}

// atLeastHalf reports whether at least half of the budget is taken.
func (b *byteBudget) atLeastHalf() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used >= (b.max+1)/2
}

// release gives back n bytes taken by acquire.
func (b *byteBudget) release(n int64) {
	n = min(n, b.max)
	b.mu.Lock()
	b.used -= n
	if b.waiting {
		b.waiting = false
		close(b.freed)
		b.freed = make(chan struct{})
	}
	b.mu.Unlock()
}

// acker acknowledges the written messages in arrival order, each once
// the log has made it durable (a dropped redelivery once everything
// written before it is): it takes every batch handed over so far, waits
// once for the durability of their last record, so that they share one
// group commit, then sends their acknowledgements, those of consecutive
// batches from one connection with one write. The batches it takes are
// not counted: the messages in them are, by the subscriber's bounds on
// what is pending (MaxPending, MaxPendingBytes), which also end
// lingerFor's wait at half of them. A batch can be a single message (a
// slow broker's packets each read on their own), so a bound on batches
// would end the group commit long before those on messages do.
func (s *Subscriber) acker() {
	var bs []*batch
	delay, quiet := stoppedTimer(), stoppedTimer()
	defer delay.Stop()
	defer quiet.Stop()
	for {
		select {
		case b := <-s.pending:
			bs = append(bs[:0], b)
		more:
			for {
				select {
				case b := <-s.pending:
					bs = append(bs, b)
				default:
					break more
				}
			}
			bs = s.lingerFor(bs, delay, quiet)
			s.ackBatches(bs)
			clear(bs)
		case <-s.ctx.Done():
			return
		}
	}
}

// stoppedTimer returns a timer that has not been started.
func stoppedTimer() *time.Timer {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return t
}

// lingerFor takes more batches into bs while s.linger says to wait for
// them, for at most SubscriberConfig.AckDelay (see ackLinger), and
// returns bs. delay and quiet are the acker's timers, stopped.
func (s *Subscriber) lingerFor(bs []*batch, delay, quiet *time.Timer) []*batch {
	if !s.linger.more(time.Now(), s.unacked.Load(), s.halfPending()) {
		return bs
	}
	delay.Reset(s.linger.delay)
	quiet.Reset(s.linger.still)
	defer delay.Stop()
	defer quiet.Stop()
	s.lingering.Store(true)
	defer s.lingering.Store(false)
	for {
		select {
		case b := <-s.pending:
			bs = append(bs, b)
			if !s.linger.more(time.Now(), s.unacked.Load(), s.halfPending()) {
				s.linger.ended()
				return bs
			}
			quiet.Reset(s.linger.still)
		case <-quiet.C:
			now := time.Now()
			if read := time.Unix(0, s.gathered.Load()).Add(s.linger.still); read.After(now) {
				// The reader let messages gather meanwhile: the
				// connection was not read, so not found quiet.
				quiet.Reset(read.Sub(now))
				continue
			}
			if !s.linger.quiet(now, s.unacked.Load()) {
				s.pauses.Add(1)
				quiet.Reset(s.linger.still)
				continue
			}
			return bs
		case <-delay.C:
			s.linger.ended()
			return bs
		case <-s.ctx.Done():
			return bs
		}
	}
}

// halfPending reports whether half of the messages or of the payload
// bytes the subscriber lets be received but not acknowledged are.
func (s *Subscriber) halfPending() bool {
	return s.slots.atLeastHalf() || s.budget.atLeastHalf()
}

// ackBatches acknowledges the deliveries of bs, in order; see acker.
func (s *Subscriber) ackBatches(bs []*batch) {
	var last uint64
	wait := false
	for _, b := range bs {
		for i := range b.ds {
			if d := &b.ds[i]; d.err == nil && d.has {
				last, wait = max(last, d.off), true
			}
		}
	}
	var werr error
	if wait {
		werr = s.log.WaitDurableContext(s.ctx, last) // a closing subscriber does not wait for a full card
	}
	for i, b := range bs {
		a := b.acks
		s.ackBatch(b, werr)
		if i == len(bs)-1 || bs[i+1].acks != a {
			a.send() // one write for the acks of consecutive batches of a connection
		}
	}
}

// ackBatch queues the acknowledgements of b's deliveries (the caller
// sends them) and releases their budget; werr is the error of the wait
// for the durability of the last record of the batches acknowledged with
// b.
func (s *Subscriber) ackBatch(b *batch, werr error) {
	var size int64
	for i := range b.ds {
		d := &b.ds[i]
		size += min(d.size, s.budget.max)
		if d.err == nil && d.has && werr != nil {
			d.err = s.log.WaitDurableContext(s.ctx, d.off) // the earlier ones may be durable
		}
		if d.err != nil {
			if s.ctx.Err() == nil {
				s.logger.Error("mqtt subscriber: ingest append failed; message left unacknowledged for redelivery",
					"topic", d.topic, "error", d.err)
			}
			continue
		}
		if d.dropped {
			s.logger.Debug("mqtt subscriber: dropped a redelivery of a logged message", "topic", d.topic,
				"packet_id", d.id)
			if s.dropped.Load() == 1 {
				s.logger.Info("mqtt subscriber: dropping redeliveries (DUP, same packet id and content as one of the last W records)",
					"window", s.cfg.DedupWindow())
			}
		}
		b.acks.ack(d)
	}
	s.unacked.Add(-int64(len(b.ds)))
	s.release(int64(len(b.ds)), size)
	s.putBatch(b)
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
	client, started := s.client, s.started
	s.mu.Unlock()
	if !started {
		return nil
	}
	s.cancel()
	if client != nil {
		client.Disconnect(250)
	}
	s.mu.Lock()
	dc := s.dconn
	s.mu.Unlock()
	if dc != nil {
		dc.disconnect() // the direct reader sees the connection end
	}
	s.inflight.Wait()
	s.connected.Store(false)
	s.logger.Info("mqtt subscriber closed", "redeliveries_dropped", s.dropped.Load(), "redeliveries_noted", s.notes.Load(),
		"max_redelivery_age", s.maxAge.Load(), "window", s.cfg.DedupWindow(),
		"max_unacknowledged", s.maxUnack.Load(), "ack_waits_through_pauses", s.pauses.Load(), "read_gathering_pauses", s.gathers.Load())
	return nil
}
