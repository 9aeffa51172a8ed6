package pipeline

import (
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Defaults of MemoryConfig (YAML node.memory).
const (
	// DefaultMemoryLimit is node.memory.limit by default: the Go
	// runtime's soft memory limit.
	DefaultMemoryLimit = 56 << 20
	// DefaultGCPercent is node.memory.gc_percent by default (the Go
	// runtime's own default).
	DefaultGCPercent = 100
	// DefaultBatchSize is node.memory.batch_size by default.
	DefaultBatchSize = 256
	// DefaultCredits is node.memory.credits by default.
	DefaultCredits = 8
	// DefaultMQTTPendingBytes is node.memory.mqtt_pending_bytes by
	// default.
	DefaultMQTTPendingBytes = 8 << 20
	// DefaultBrokerSessionBytes is node.memory.broker_session_bytes by
	// default.
	DefaultBrokerSessionBytes = 16 << 20
	// DefaultBrokerRetainedBytes is node.memory.broker_retained_bytes by
	// default.
	DefaultBrokerRetainedBytes = 16 << 20
	// DefaultBrokerConnections is node.memory.broker_connections by
	// default.
	DefaultBrokerConnections = 1000
	// DefaultBrokerClientSubscriptions is
	// node.memory.broker_client_subscriptions by default.
	DefaultBrokerClientSubscriptions = 1000
	// DefaultIdleRelease is node.memory.idle_release by default.
	DefaultIdleRelease = Interval(5 * time.Second)
)

// Bounds of MemoryConfig.
const (
	// MinMemoryLimit is the smallest node.memory.limit accepted: below it
	// the runtime would collect garbage without pause even when idle.
	MinMemoryLimit = 16 << 20
	// MaxCredits is the largest node.memory.credits accepted: each credit
	// is a batch buffer that every channel between two tasks holds from
	// the start, idle or not (about 180 bytes each before any record).
	MaxCredits = 1024
	// MinMQTTPendingBytes is the smallest node.memory.mqtt_pending_bytes
	// accepted.
	MinMQTTPendingBytes = 64 << 10
	// MinIdleRelease is the shortest node.memory.idle_release accepted.
	MinIdleRelease = Interval(time.Second)
	// IdleAllocBytes is how little a node may allocate per
	// node.memory.idle_release period and still count as idle: below the
	// Go runtime's smallest heap goal (4 MiB), so that an idle node's
	// garbage would otherwise wait for several periods before a
	// collection frees it, and far below what a node under load
	// allocates (megabytes per second).
	IdleAllocBytes = 4 << 20
)

// MemoryConfig is the YAML `node.memory` block: what bounds the memory of
// the node, so that it is set by configuration rather than by the load.
// Every field's zero value (the block or the key left out) means its
// default; WithDefaults fills them in.
//
// The peak RSS of the node is about the memory the Go runtime manages
// (which the limit bounds) plus the pages of the binary it has touched
// (about 19 MB on linux/amd64 once started; an idle node unmaps them, see
// IdleRelease, and keeps about 11 MB). The heap holds the keyed state and
// the records in flight: at most credits × batch_size records per channel between two tasks,
// mqtt_pending_bytes of payloads per pipeline reading an external broker,
// broker_session_bytes of messages queued by the embedded broker, and a
// 64 KiB read-ahead buffer per ingest log reader. The limit makes the
// garbage collector keep the heap's garbage within it; it cannot shrink
// the live data, so the state of a pipeline with many keys needs a limit
// above it.
type MemoryConfig struct {
	// Limit is the Go runtime's soft memory limit in bytes
	// (runtime/debug.SetMemoryLimit): as the memory the runtime manages
	// nears it, the garbage collector runs more often, instead of letting
	// the heap grow to twice the live data (gc_percent 100). A soft
	// limit: live data above it is kept, at the cost of more frequent
	// collections (the runtime spends at most about half the CPU on
	// them). A size: bytes, or with a unit (KiB, MiB, GiB; KB, MB, GB).
	// Default 56 MiB; "off" sets no limit; at least 16 MiB. The
	// GOMEMLIMIT environment variable, when set, takes precedence.
	Limit ByteSize `yaml:"limit"`
	// GCPercent is the garbage collector's target percentage
	// (runtime/debug.SetGCPercent, as GOGC): a collection starts when the
	// heap has grown by this percentage of the live data since the last
	// one. Default 100; -1 turns the proportional trigger off, leaving
	// only the limit (which must then be set); otherwise at least 10.
	// The GOGC environment variable, when set, takes precedence.
	GCPercent int `yaml:"gc_percent"`
	// BatchSize is the number of records per batch between two tasks;
	// default 256 (the runtime's own default is 512: the batch buffers
	// bound the records in flight under load; a buffer takes its memory
	// when records first go through it, so an idle channel holds none);
	// at least 1.
	BatchSize int `yaml:"batch_size"`
	// Credits is the number of batches in flight per channel between two
	// tasks (flow control: a sender waits for a free batch buffer);
	// default 8 (the runtime's own default is 16: half the batch buffers,
	// with no throughput lost on the MQTT pipelines measured); at least 1.
	Credits int `yaml:"credits"`
	// MQTTPendingBytes bounds, per pipeline reading an external broker,
	// the payload bytes received but not yet acknowledged (appended to
	// the ingest log, waiting for its fsync); past it, the subscriber
	// stops reading the connection (back-pressure to the broker). A
	// message larger than the bound is let through alone. With
	// source.mqtt.max_pending it bounds the payloads the subscriber
	// holds. Default 8 MiB; at least 64 KiB.
	MQTTPendingBytes ByteSize `yaml:"mqtt_pending_bytes"`
	// BrokerSessionBytes bounds the memory of the messages the embedded
	// broker keeps for persistent sessions (its session_max_bytes; each
	// message counts its topic and payload, the broker library's copy
	// for each session and their bookkeeping): past it, publishers get
	// no PUBACK until subscribers acknowledge enough (back-pressure,
	// nothing is dropped). Default 16 MiB; "off" sets no bound.
	BrokerSessionBytes ByteSize `yaml:"broker_session_bytes"`
	// BrokerRetainedBytes bounds the memory of the retained messages the
	// embedded broker keeps (each counts its topic, its payload and the
	// broker library's bookkeeping, about 1 KiB and 640 bytes per topic
	// level): a retained
	// message past it is routed and ingested but not retained, and the
	// one it would have replaced is cleared (mqtt.BrokerConfig.
	// RetainedMaxBytes). Default 16 MiB; "off" sets no bound.
	BrokerRetainedBytes ByteSize `yaml:"broker_retained_bytes"`
	// BrokerConnections bounds the connections the embedded broker holds
	// at once (connected devices and connections that have not sent
	// their CONNECT yet; each costs a few hundred kilobytes of heap while
	// it lasts): one past it is closed as it is accepted
	// (mqtt.BrokerConfig.MaxConnections). Default 1000; at least 1.
	BrokerConnections int `yaml:"broker_connections"`
	// BrokerClientSubscriptions bounds the topic filters one client of
	// the embedded broker holds: a filter past it is refused in the
	// SUBACK (mqtt.BrokerConfig.MaxSubscriptions). Default 1000; at
	// least 1.
	BrokerClientSubscriptions int `yaml:"broker_client_subscriptions"`
	// IdleRelease is how often an idle node returns the memory its
	// garbage took to the operating system: at the end of each such
	// period in which the node allocated less than IdleAllocBytes, and
	// allocated anything since the last return, it runs a garbage
	// collection and returns every free page of the heap
	// (runtime/debug.FreeOSMemory). Without it an idle node's heap grows
	// with its little garbage up to the collector's smallest goal (4 MiB)
	// and the runtime keeps the freed pages. When the node starts, and at
	// the first such period after start-up or after load, it also unmaps
	// the pages of its executable from the process (package
	// initialisers, start-up and load code that an idle node does not
	// run): they stay in the kernel's page cache, and what the node runs
	// again maps back on first touch. A node under load allocates more
	// than IdleAllocBytes per period and does neither. A duration (at
	// least 1s); default 5s; "off" turns both off.
	IdleRelease Interval `yaml:"idle_release"`
}

// Interval is a period that can be turned off. In YAML it is a duration
// ("5s", "1m") or "off" (IntervalOff).
type Interval time.Duration

// IntervalOff is the value of "off".
const IntervalOff Interval = -1

// UnmarshalText parses a duration or "off".
func (i *Interval) UnmarshalText(text []byte) error {
	s := strings.TrimSpace(string(text))
	if strings.EqualFold(s, "off") {
		*i = IntervalOff
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return fmt.Errorf("a period is a positive duration (as 5s or 1m) or \"off\"")
	}
	*i = Interval(d)
	return nil
}

// String formats i as a duration, or "off".
func (i Interval) String() string {
	if i == IntervalOff {
		return "off"
	}
	return time.Duration(i).String()
}

// ByteSize is a number of bytes. In YAML it is an integer (bytes) or a
// number with a unit: B, KiB, MiB, GiB (powers of 1024) or KB, MB, GB
// (powers of 1000), as "64MiB" or "64 MiB"; "off" is ByteSizeOff.
type ByteSize int64

// ByteSizeOff is the value of "off": no bound.
const ByteSizeOff ByteSize = -1

var byteUnits = map[string]int64{
	"": 1, "b": 1,
	"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30,
	"kb": 1e3, "mb": 1e6, "gb": 1e9,
}

// UnmarshalText parses a size as described at ByteSize.
func (b *ByteSize) UnmarshalText(text []byte) error {
	s := strings.TrimSpace(string(text))
	if strings.EqualFold(s, "off") {
		*b = ByteSizeOff
		return nil
	}
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	if i == 0 {
		return fmt.Errorf("a size is a whole number of bytes with an optional unit (B, KiB, MiB, GiB, KB, MB, GB) or \"off\"")
	}
	n, err := strconv.ParseInt(s[:i], 10, 64)
	unit, ok := byteUnits[strings.ToLower(strings.TrimSpace(s[i:]))]
	if err != nil || !ok || n > (1<<62)/unit {
		return fmt.Errorf("a size is a whole number of bytes with an optional unit (B, KiB, MiB, GiB, KB, MB, GB) or \"off\"")
	}
	*b = ByteSize(n * unit)
	return nil
}

// String formats b with the largest binary unit that divides it.
func (b ByteSize) String() string {
	switch {
	case b == ByteSizeOff:
		return "off"
	case b != 0 && b%(1<<30) == 0:
		return fmt.Sprintf("%dGiB", b>>30)
	case b != 0 && b%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", b>>20)
	case b != 0 && b%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", b>>10)
	}
	return fmt.Sprintf("%dB", int64(b))
}

// DefaultMemoryConfig returns the defaults of node.memory.
func DefaultMemoryConfig() MemoryConfig {
	return MemoryConfig{}.WithDefaults()
}

// WithDefaults returns m with every field left at zero set to its
// default.
func (m MemoryConfig) WithDefaults() MemoryConfig {
	if m.Limit == 0 {
		m.Limit = DefaultMemoryLimit
	}
	if m.GCPercent == 0 {
		m.GCPercent = DefaultGCPercent
	}
	if m.BatchSize == 0 {
		m.BatchSize = DefaultBatchSize
	}
	if m.Credits == 0 {
		m.Credits = DefaultCredits
	}
	if m.MQTTPendingBytes == 0 {
		m.MQTTPendingBytes = DefaultMQTTPendingBytes
	}
	if m.BrokerSessionBytes == 0 {
		m.BrokerSessionBytes = DefaultBrokerSessionBytes
	}
	if m.BrokerRetainedBytes == 0 {
		m.BrokerRetainedBytes = DefaultBrokerRetainedBytes
	}
	if m.BrokerConnections == 0 {
		m.BrokerConnections = DefaultBrokerConnections
	}
	if m.BrokerClientSubscriptions == 0 {
		m.BrokerClientSubscriptions = DefaultBrokerClientSubscriptions
	}
	if m.IdleRelease == 0 {
		m.IdleRelease = DefaultIdleRelease
	}
	return m
}

// validate adds a Problem for every bad node.memory key.
func (m MemoryConfig) validate(p *problems) {
	m.WithDefaults().check(p)
}

// unmarshalNode decodes the node.memory block and refuses a key given as
// 0: left at zero it would take its default as a key left out does
// (limit: 0 a limit of 56 MiB, gc_percent: 0 a percentage of 100), where
// the user asked for something else.
func (m *MemoryConfig) unmarshalNode(d *nodeDecoder, n *yaml.Node, path string) {
	type plain MemoryConfig
	before := len(*d.probs)
	d.decode(n, reflect.ValueOf((*plain)(m)).Elem(), path)
	if n.Kind != yaml.MappingNode {
		return
	}
	bad := map[string]bool{} // keys whose value did not decode: said already
	for _, q := range (*d.probs)[before:] {
		bad[q.Path] = true
	}
	// given is m with the defaults of the keys left out: a key given as
	// 0 stays 0 there, and check says what it must be.
	given := m.WithDefaults()
	decoded, gv := reflect.ValueOf(m).Elem(), reflect.ValueOf(&given).Elem()
	var zeros []string
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i].Value, n.Content[i+1]
		for f := range decoded.NumField() {
			if decoded.Type().Field(f).Tag.Get("yaml") == k && decoded.Field(f).IsZero() && !isNull(val) && !bad[join(path, k)] {
				gv.Field(f).SetZero()
				zeros = append(zeros, join(path, k))
			}
		}
	}
	if len(zeros) == 0 {
		return
	}
	var q problems
	given.check(&q)
	for _, x := range q {
		if slices.Contains(zeros, x.Path) {
			*d.probs = append(*d.probs, x)
		}
	}
}

// check adds a Problem for every bad value of m as it is, a zero one
// included.
func (m MemoryConfig) check(p *problems) {
	const path = "node.memory."
	switch {
	case m.Limit == ByteSizeOff:
		if m.GCPercent == -1 {
			p.add(path+"gc_percent", "(-1) needs node.memory.limit: without either the heap would grow without bound")
		}
	case m.Limit < MinMemoryLimit:
		p.add(path+"limit", fmt.Sprintf("(%s) must be at least %s or off", m.Limit, ByteSize(MinMemoryLimit)))
	}
	if m.GCPercent != -1 && m.GCPercent < 10 {
		p.add(path+"gc_percent", fmt.Sprintf("(%d) must be -1 (off) or at least 10", m.GCPercent))
	}
	if m.BatchSize < 1 {
		p.add(path+"batch_size", fmt.Sprintf("(%d) must be at least 1", m.BatchSize))
	}
	if m.Credits < 1 {
		p.add(path+"credits", fmt.Sprintf("(%d) must be at least 1", m.Credits))
	} else if m.Credits > MaxCredits {
		p.add(path+"credits", fmt.Sprintf("(%d) must be at most %d: every channel holds that many batch buffers from the start", m.Credits, MaxCredits))
	}
	if m.MQTTPendingBytes < MinMQTTPendingBytes {
		p.add(path+"mqtt_pending_bytes", fmt.Sprintf("(%s) must be at least %s", m.MQTTPendingBytes, ByteSize(MinMQTTPendingBytes)))
	}
	if m.BrokerSessionBytes < 1 && m.BrokerSessionBytes != ByteSizeOff {
		p.add(path+"broker_session_bytes", fmt.Sprintf("(%d) must be positive (off: no bound)", int64(m.BrokerSessionBytes)))
	}
	if m.BrokerRetainedBytes < 1 && m.BrokerRetainedBytes != ByteSizeOff {
		p.add(path+"broker_retained_bytes", fmt.Sprintf("(%d) must be positive (off: no bound)", int64(m.BrokerRetainedBytes)))
	}
	if m.BrokerConnections < 1 {
		p.add(path+"broker_connections", fmt.Sprintf("(%d) must be at least 1", m.BrokerConnections))
	}
	if m.BrokerClientSubscriptions < 1 {
		p.add(path+"broker_client_subscriptions", fmt.Sprintf("(%d) must be at least 1", m.BrokerClientSubscriptions))
	}
	if m.IdleRelease != IntervalOff && m.IdleRelease < MinIdleRelease {
		p.add(path+"idle_release", fmt.Sprintf("(%s) must be at least %s or off", m.IdleRelease, MinIdleRelease))
	}
}
