package cluster

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/memberlist"
)

// MaxMetaSize is the largest encoded Meta gossip carries (memberlist's
// limit; it panics above it, so Encode refuses instead).
const MaxMetaSize = memberlist.MetaMaxSize

// Limits of Meta's fields. With every field at its limit the encoded Meta,
// Leaving flag included, takes 507 bytes, within MaxMetaSize; Validate also
// checks the encoded size itself (JSON escapes some characters).
const (
	// MaxNodeIDLen is the longest node id, in bytes.
	MaxNodeIDLen = 64
	// MaxTransportAddrLen is the longest transport address: a DNS name of
	// 253 bytes, a colon and a port.
	MaxTransportAddrLen = 259
	// MaxFingerprintLen is the longest fingerprint: a SHA-256 in hex.
	MaxFingerprintLen = 64
	// MaxBootLen is the longest boot id (NewMembership's are 16 hex
	// digits).
	MaxBootLen = 16
	// MaxNodesLen is the longest digest of the configured node ids.
	MaxNodesLen = 16
)

// Meta is what a node tells the others about itself through gossip.
type Meta struct {
	// ID names the node; unique in the cluster and stable across restarts.
	ID string `json:"id"`
	// Transport is the address of the node's data transport (host:port).
	Transport string `json:"tr,omitempty"`
	// Capacity is the node's relative weight in placement (0 means 1).
	Capacity int `json:"cap,omitempty"`
	// Fingerprint identifies the pipelines' job graphs the node runs; nodes
	// with another fingerprint are running other code or config.
	Fingerprint string `json:"fp,omitempty"`
	// Nodes is a digest of the node ids the node's config names (itself
	// and its peers): nodes with another digest disagree on who the
	// cluster's members are, and so on its size and majority.
	Nodes string `json:"nodes,omitempty"`
	// Leaving is set by a node that is leaving gracefully, just before it
	// leaves, so that the others can tell a leave from a crash (memberlist
	// reports both alike).
	Leaving bool `json:"leaving,omitempty"`
	// Boot identifies this run of the node: NewMembership sets a random
	// one when it is empty. A node that restarts comes back with another,
	// so the others see the restart (failed, then joined) even when gossip
	// took the new run for the old one.
	Boot string `json:"boot,omitempty"`
}

// Encode returns the gossip form of m, or ErrMetaTooLarge past
// MaxMetaSize.
func (m Meta) Encode() ([]byte, error) {
	b, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	if len(b) > MaxMetaSize {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrMetaTooLarge, len(b), MaxMetaSize)
	}
	return b, nil
}

// validate checks m's fields against their limits and its encoded size in
// its largest form (Leaving set, as Leave gossips it).
func (m Meta) validate() error {
	var errs []error
	if len(m.ID) > MaxNodeIDLen {
		errs = append(errs, fmt.Errorf("cluster.node_id: %d bytes, limit %d", len(m.ID), MaxNodeIDLen))
	}
	if len(m.Transport) > MaxTransportAddrLen {
		errs = append(errs, fmt.Errorf("cluster.transport address: %d bytes, limit %d", len(m.Transport), MaxTransportAddrLen))
	}
	if len(m.Fingerprint) > MaxFingerprintLen {
		errs = append(errs, fmt.Errorf("cluster: fingerprint: %d bytes, limit %d", len(m.Fingerprint), MaxFingerprintLen))
	}
	if len(m.Nodes) > MaxNodesLen {
		errs = append(errs, fmt.Errorf("cluster: digest of the nodes: %d bytes, limit %d", len(m.Nodes), MaxNodesLen))
	}
	if len(m.Boot) > MaxBootLen {
		errs = append(errs, fmt.Errorf("cluster: boot id: %d bytes, limit %d", len(m.Boot), MaxBootLen))
	}
	if m.Boot == "" {
		m.Boot = strings.Repeat("0", MaxBootLen) // NewMembership sets one
	}
	m.Leaving = true
	if _, err := m.Encode(); err != nil {
		errs = append(errs, fmt.Errorf("cluster: node metadata (while leaving): %w", err))
	}
	return errors.Join(errs...)
}

// DecodeMeta parses the gossip form of a node's Meta.
func DecodeMeta(b []byte) (Meta, error) {
	var m Meta
	if err := json.Unmarshal(b, &m); err != nil {
		return Meta{}, fmt.Errorf("%w: %v", ErrBadMeta, err)
	}
	if m.ID == "" {
		return Meta{}, fmt.Errorf("%w: no id", ErrBadMeta)
	}
	return m, nil
}

// Profile is a failure-detection profile: how fast a dead node is noticed
// against how often a slow one is wrongly suspected.
type Profile string

const (
	// ProfileDevice is for a handful of devices on one LAN (the default):
	// probes every 200 ms with a 100 ms timeout, suspicion multiplier 2 and
	// gossip every 50 ms. memberlist declares a killed node dead in about
	// 0.8–1 s; it also declares dead, under CPU contention, nodes that are
	// merely slow, which the membership does not report as failed unless
	// the death is confirmed (see confirm): a crashed process is reported
	// about as fast, a slow one not at all.
	ProfileDevice Profile = "device"
	// ProfileLAN is memberlist's LAN default: a dead node is seen in about
	// 5–6 s, with fewer false suspicions under stalls.
	ProfileLAN Profile = "lan"
)

// MembershipConfig configures a node's membership.
type MembershipConfig struct {
	// Meta is this node's metadata; Meta.ID is its gossip name.
	Meta Meta
	// BindAddr and BindPort are the gossip address (UDP and TCP). Port 0
	// picks a free port (tests).
	BindAddr string
	BindPort int
	// AdvertiseAddr, when set, is the address other nodes reach this one
	// at, if it differs from BindAddr.
	AdvertiseAddr string
	// Peers are gossip addresses (host:port) of known nodes; joining
	// through any one of them that answers is enough.
	Peers []string
	// SecretKey, when set, encrypts gossip (AES, 16, 24 or 32 bytes); every
	// node needs the same key.
	SecretKey []byte
	// Profile is the failure-detection profile; default ProfileDevice.
	Profile Profile
	// Logger receives membership events and memberlist's own log lines.
	Logger *slog.Logger

	// wrapTransport, when set (tests only), wraps the gossip transport:
	// the benchmarks stall a node's network with it.
	wrapTransport func(memberlist.NodeAwareTransport) memberlist.NodeAwareTransport
	// tune, when set (tests only), changes the profile's settings: the
	// benchmarks compare candidate profiles with it.
	tune func(*memberlist.Config)
}

// Validate reports every problem of the config at once.
func (c MembershipConfig) Validate() error {
	var errs []error
	if c.Meta.ID == "" {
		errs = append(errs, errors.New("cluster.node_id: must be set"))
	}
	if err := c.Meta.validate(); err != nil {
		errs = append(errs, err)
	}
	if c.BindPort < 0 || c.BindPort > 65535 {
		errs = append(errs, fmt.Errorf("cluster.gossip port %d: out of range", c.BindPort))
	}
	switch len(c.SecretKey) {
	case 0, 16, 24, 32:
	default:
		errs = append(errs, fmt.Errorf("cluster.secret_key: %d bytes, want 16, 24 or 32", len(c.SecretKey)))
	}
	switch c.Profile {
	case "", ProfileDevice, ProfileLAN:
	default:
		errs = append(errs, fmt.Errorf("cluster.profile %q: want %q or %q", c.Profile, ProfileDevice, ProfileLAN))
	}
	for _, p := range c.Peers {
		if _, _, err := net.SplitHostPort(p); err != nil {
			errs = append(errs, fmt.Errorf("cluster.peers: %q: %v", p, err))
		}
	}
	return errors.Join(errs...)
}

// memberlistConfig maps a profile onto memberlist's settings.
func memberlistConfig(p Profile) *memberlist.Config {
	c := memberlist.DefaultLANConfig()
	if p == ProfileDevice || p == "" {
		c.ProbeInterval = 200 * time.Millisecond
		c.ProbeTimeout = 100 * time.Millisecond
		c.SuspicionMult = 2
		c.GossipInterval = 50 * time.Millisecond
		c.RetransmitMult = 3
		c.PushPullInterval = 5 * time.Second
	}
	return c
}

// EventKind says what happened to a member.
type EventKind int

const (
	// MemberJoined: a node joined (or came back).
	MemberJoined EventKind = iota + 1
	// MemberLeft: a node left gracefully.
	MemberLeft
	// MemberFailed: a node was declared dead by failure detection.
	MemberFailed
	// MemberUpdated: a node's metadata changed.
	MemberUpdated
)

func (k EventKind) String() string {
	switch k {
	case MemberJoined:
		return "joined"
	case MemberLeft:
		return "left"
	case MemberFailed:
		return "failed"
	case MemberUpdated:
		return "updated"
	}
	return "EventKind(" + strconv.Itoa(int(k)) + ")"
}

// Event is a change in membership.
type Event struct {
	Kind EventKind
	Node Meta
	// Addr is the node's gossip address.
	Addr string
	At   time.Time
}

// Membership is this node's view of the cluster. Make it with
// NewMembership and Start it; Events delivers changes; Leave on shutdown.
// Its methods are safe for concurrent use.
type Membership struct {
	cfg MembershipConfig
	log *slog.Logger

	mu      sync.Mutex // guards queue, ml, meta, members, leaving, pending, stopped and rejoining
	queue   []Event
	meta    Meta
	members map[string]Meta   // alive members as the events told them
	addrs   map[string]string // their gossip addresses
	leaving map[string]bool   // members that said they are leaving
	// pending are the members memberlist declared dead whose death is
	// being confirmed (confirm); they stay in members meanwhile.
	pending map[string]*pendingFailure
	stopped bool // no more confirmations or rejoins start
	// rejoining is set while a Rejoin's join runs.
	rejoining bool
	ml        *memberlist.Memberlist
	notify    chan struct{} // capacity 1: rung when queue gains events

	stop     chan struct{} // closed when gossip stops: confirmations end
	confirms sync.WaitGroup
	rejoins  sync.WaitGroup
	spared   atomic.Int64 // deaths memberlist declared that were not confirmed: the member came back

	seenMu sync.Mutex           // guards seen
	seen   map[string]time.Time // when each member last answered a probe

	conflictMu sync.Mutex      // guards conflicts
	conflicts  map[string]bool // "id addr" of the conflicts logged
	// dupOf is the address of another member gossiping this node's id,
	// once one did (conflicts).
	dupOf string
}

// NewMembership validates cfg. It starts nothing.
func NewMembership(cfg MembershipConfig) (*Membership, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Profile == "" {
		cfg.Profile = ProfileDevice
	}
	if cfg.Meta.Boot == "" {
		var b [MaxBootLen / 2]byte
		_, _ = rand.Read(b[:])
		cfg.Meta.Boot = hex.EncodeToString(b[:])
	}
	lg := cfg.Logger
	if lg == nil {
		lg = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &Membership{cfg: cfg, log: lg, meta: cfg.Meta,
		members: make(map[string]Meta), addrs: make(map[string]string), leaving: make(map[string]bool), pending: make(map[string]*pendingFailure),
		notify: make(chan struct{}, 1), stop: make(chan struct{})}, nil
}

// Start binds the gossip listener and joins through the configured peers
// (any one answering is enough; with none answering the node starts a
// cluster of its own and others may join it later).
func (m *Membership) Start() error {
	c := memberlistConfig(m.cfg.Profile)
	if m.cfg.tune != nil {
		m.cfg.tune(c)
	}
	c.Name = m.cfg.Meta.ID
	c.BindAddr = m.cfg.BindAddr
	if c.BindAddr == "" {
		c.BindAddr = "127.0.0.1"
	}
	c.BindPort = m.cfg.BindPort
	c.AdvertisePort = m.cfg.BindPort
	if m.cfg.AdvertiseAddr != "" {
		c.AdvertiseAddr = m.cfg.AdvertiseAddr
	}
	c.SecretKey = m.cfg.SecretKey
	c.Delegate = delegate{m}
	c.Events = events{m}
	c.Ping = pings{m}
	c.Conflict = conflicts{m}
	c.Alive = aliveFilter{}
	c.Logger = log.New(slogWriter{m.log}, "", 0)
	if m.cfg.wrapTransport != nil {
		nt, err := newNetTransport(c)
		if err != nil {
			return fmt.Errorf("cluster: start gossip on %s:%d: %w", c.BindAddr, c.BindPort, err)
		}
		c.Transport = m.cfg.wrapTransport(nt)
	}
	ml, err := memberlist.Create(c)
	if err != nil {
		if c.Transport != nil {
			_ = c.Transport.Shutdown()
		}
		return fmt.Errorf("cluster: start gossip on %s:%d: %w", c.BindAddr, c.BindPort, err)
	}
	m.mu.Lock()
	m.ml = ml
	m.mu.Unlock()
	if len(m.cfg.Peers) > 0 {
		n, err := ml.Join(m.cfg.Peers)
		if err != nil && n == 0 {
			m.log.Warn("cluster: no peer answered; starting alone", "peers", m.cfg.Peers, "err", err)
		}
	}
	// The join merged the peers' view: a live member with this node's id
	// at another address is another node given the same id. Its peers
	// keep that member and ignore this one, so it would run unseen.
	m.conflictMu.Lock()
	dup := m.dupOf
	m.conflictMu.Unlock()
	if dup != "" {
		self := m.Addr()
		_ = ml.Shutdown()
		return fmt.Errorf("%w: %q gossips from %s, this node from %s; give each node its own cluster.node",
			ErrDuplicateID, m.cfg.Meta.ID, dup, self)
	}
	return nil
}

// conflicts hears of members whose id another address claims too
// (memberlist.ConflictDelegate). Called on memberlist's goroutines.
type conflicts struct{ m *Membership }

// NotifyConflict logs each conflict once: memberlist keeps the member it
// knew and ignores the other. A conflict over this node's own id is
// recorded for Start, which refuses to go on.
func (c conflicts) NotifyConflict(existing, other *memberlist.Node) {
	m := c.m
	addr := net.JoinHostPort(other.Addr.String(), strconv.Itoa(int(other.Port)))
	m.conflictMu.Lock()
	if existing.Name == m.cfg.Meta.ID && m.dupOf == "" {
		m.dupOf = addr
	}
	if m.conflicts == nil {
		m.conflicts = map[string]bool{}
	}
	seen := m.conflicts[other.Name+" "+addr]
	m.conflicts[other.Name+" "+addr] = true
	m.conflictMu.Unlock()
	if !seen {
		m.log.Error("cluster: two nodes gossip the same id; the one known first is kept, the other is ignored (give each node its own cluster.node)",
			"id", other.Name, "kept", net.JoinHostPort(existing.Addr.String(), strconv.Itoa(int(existing.Port))), "ignored", addr)
	}
}

// newNetTransport makes the transport memberlist would make itself,
// retrying a picked port that is taken for UDP or TCP (as memberlist does).
func newNetTransport(c *memberlist.Config) (*memberlist.NetTransport, error) {
	nc := &memberlist.NetTransportConfig{BindAddrs: []string{c.BindAddr}, BindPort: c.BindPort, Logger: c.Logger}
	for i := 0; ; i++ {
		nt, err := memberlist.NewNetTransport(nc)
		if err == nil || c.BindPort != 0 || i == 9 || !strings.Contains(err.Error(), "address already in use") {
			return nt, err
		}
	}
}

// LastSeen returns when member id last answered one of this node's
// probes (memberlist probes one member every probe interval, in turn),
// and whether it ever did: a failed member's last sign of life, from
// which its detection time counts.
func (m *Membership) LastSeen(id string) (time.Time, bool) {
	m.seenMu.Lock()
	defer m.seenMu.Unlock()
	t, ok := m.seen[id]
	return t, ok
}

// pings records the probes' answers (memberlist.PingDelegate).
type pings struct{ m *Membership }

func (pings) AckPayload() []byte { return nil }

func (p pings) NotifyPingComplete(other *memberlist.Node, _ time.Duration, _ []byte) {
	p.m.seenMu.Lock()
	defer p.m.seenMu.Unlock()
	if p.m.seen == nil {
		p.m.seen = map[string]time.Time{}
	}
	p.m.seen[other.Name] = time.Now()
}

// Join joins through more peers (gossip addresses). It dials them in
// turn, each for up to memberlist's TCP timeout (10 s) when it does not
// answer: a caller that must go on handling events uses Rejoin.
func (m *Membership) Join(peers ...string) (int, error) {
	return m.list().Join(peers)
}

// Rejoin joins through peers (gossip addresses) from a goroutine of its
// own and returns at once. It does nothing while an earlier Rejoin's join
// runs, before Start or after Shutdown. A node cut off from its peers
// retries joining them without waiting for the dials: it still has to
// see them go and lose its majority.
func (m *Membership) Rejoin(peers ...string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stopped || m.ml == nil || m.rejoining {
		return
	}
	m.rejoining = true
	ml := m.ml
	m.rejoins.Add(1)
	go func() {
		defer m.rejoins.Done()
		_, _ = ml.Join(peers)
		m.mu.Lock()
		m.rejoining = false
		m.mu.Unlock()
	}()
}

// Addr is this node's gossip address.
func (m *Membership) Addr() string {
	n := m.list().LocalNode()
	return net.JoinHostPort(n.Addr.String(), strconv.Itoa(int(n.Port)))
}

// Members returns the alive members, this node included, sorted by id.
// (memberlist's own Members shares nodes its goroutines write: this view is
// kept from the events instead.)
func (m *Membership) Members() []Meta {
	m.mu.Lock()
	out := make([]Meta, 0, len(m.members))
	for _, meta := range m.members {
		out = append(out, meta)
	}
	m.mu.Unlock()
	slices.SortFunc(out, func(a, b Meta) int {
		switch {
		case a.ID < b.ID:
			return -1
		case a.ID > b.ID:
			return 1
		}
		return 0
	})
	return out
}

// Leaving returns the ids of the members that said they are leaving (by
// their leaving message or their metadata's flag), in id order: still
// members until memberlist reports them left, within about 100 ms, but
// about to stop answering.
func (m *Membership) Leaving() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for id, meta := range m.members {
		if meta.Leaving || m.leaving[id] {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

// Reachable returns the alive members that memberlist has not declared
// dead, this node included, sorted by id: Members less the members whose
// death is being confirmed. A node that must stop acting when it loses
// its majority counts these: cut off from the others, it sees them go
// the confirmation's time (confirmUnreachable and more) before they
// report it failed and place its work elsewhere.
func (m *Membership) Reachable() []Meta {
	out := m.Members()
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.DeleteFunc(out, func(x Meta) bool { return m.pending[x.ID] != nil })
}

// Events returns a channel that is signalled when events are pending;
// Drain takes them. The queue never blocks memberlist: its callbacks only
// append and ring.
func (m *Membership) Events() <-chan struct{} { return m.notify }

// Drain returns the pending events in the order they happened.
func (m *Membership) Drain() []Event {
	m.mu.Lock()
	defer m.mu.Unlock()
	q := m.queue
	m.queue = nil
	return q
}

// Leave tells the others this node is leaving (they see it within about
// 100 ms instead of after failure detection), then stops gossip.
func (m *Membership) Leave(timeout time.Duration) error {
	ml := m.list()
	if ml == nil {
		return nil
	}
	m.mu.Lock()
	m.meta.Leaving = true
	m.mu.Unlock()
	// Tell every member directly (TCP) before the leave is gossiped, so
	// each can tell the leave from a crash; the metadata flag covers those
	// that miss the message. A member that does not answer (it may have
	// crashed unnoticed) is no reason to fail the leave.
	// (The nodes memberlist's Members returns are written by its
	// goroutines meanwhile: the addresses are taken from the events.)
	m.mu.Lock()
	addrs := maps.Clone(m.addrs)
	m.mu.Unlock()
	for id, addr := range addrs {
		if id == m.meta.ID {
			continue
		}
		host, port, _ := net.SplitHostPort(addr)
		p, _ := strconv.Atoi(port)
		n := &memberlist.Node{Name: id, Addr: net.ParseIP(host), Port: uint16(p)}
		if err := ml.SendReliable(n, []byte(leavingMsg+m.meta.ID)); err != nil {
			m.log.Debug("cluster: leaving message not delivered", "node", id, "err", err)
		}
	}
	// The flag is the fallback of the messages above: its broadcast not
	// finishing in time is no reason to fail the leave either.
	if err := ml.UpdateNode(timeout); err != nil {
		m.log.Debug("cluster: leaving flag not gossiped in time", "err", err)
	}
	err := ml.Leave(timeout)
	return errors.Join(err, m.Shutdown())
}

// Shutdown stops gossip without telling the others (as a crash would).
func (m *Membership) Shutdown() error {
	m.mu.Lock()
	ml := m.ml
	if !m.stopped {
		m.stopped = true
		close(m.stop)
	}
	m.mu.Unlock()
	var err error
	if ml != nil {
		err = ml.Shutdown()
	}
	m.confirms.Wait()
	m.rejoins.Wait() // a join under way ends within memberlist's TCP timeout
	return err
}

func (m *Membership) list() *memberlist.Memberlist {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.ml
}

// leavingMsg prefixes the message a leaving node sends every member.
const leavingMsg = "edged-leaving:"

// Confirming a death. memberlist declares a member dead when it missed
// its probes for a while, which a process that is merely slow (a loaded
// device, a long pause) also does; a crashed process is told apart by
// its gossip port: the kernel of a live device refuses a connection to a
// port no process listens on any more, and accepts one to a process that
// is only slow. So a member memberlist declares dead stays a member until
// a connection to its gossip port is refused (a crash: failed at once),
// connection attempts fail otherwise for confirmUnreachable (a device off
// or cut off: failed that much later), or it has not come back within
// confirmHold while still accepting connections (failed then). If it
// comes back first (memberlist hears from it again: it was slow), no
// event is reported at all.
const (
	confirmEvery       = 250 * time.Millisecond
	confirmDialTimeout = time.Second
	confirmUnreachable = 2 * time.Second
	confirmHold        = 10 * time.Second
)

// pendingFailure is a death memberlist declared that confirm checks.
type pendingFailure struct {
	ev Event // the failed event to report if confirmed
}

// push records a membership change from memberlist's callbacks (which hold
// memberlist's lock: n is read here and nowhere else). It never blocks.
func (m *Membership) push(kind EventKind, n *memberlist.Node) {
	meta, err := DecodeMeta(n.Meta)
	if err != nil {
		meta = Meta{ID: n.Name}
	}
	ev := Event{Kind: kind, Node: meta, Addr: net.JoinHostPort(n.Addr.String(), strconv.Itoa(int(n.Port))), At: time.Now()}
	m.mu.Lock()
	defer m.ring()
	defer m.mu.Unlock()
	id := meta.ID
	switch kind {
	case MemberJoined, MemberUpdated:
		old, known := m.members[id]
		p := m.pending[id]
		delete(m.pending, id)
		if kind == MemberJoined || known && old.Boot != meta.Boot {
			// A new member, or another run of a known one: a leaving
			// message heard was the old run's.
			delete(m.leaving, id)
		}
		m.members[id] = meta
		m.addrs[id] = ev.Addr
		switch {
		case known && old.Boot != meta.Boot:
			// Another run of the node: the old one is gone with
			// whatever it ran, even if gossip never saw it die.
			m.queue = append(m.queue,
				Event{Kind: MemberFailed, Node: old, Addr: ev.Addr, At: ev.At},
				Event{Kind: MemberJoined, Node: meta, Addr: ev.Addr, At: ev.At})
		case p != nil && old == meta:
			// Declared dead, not confirmed, back: it was only slow.
			m.spared.Add(1)
		case p != nil:
			m.spared.Add(1)
			m.queue = append(m.queue, Event{Kind: MemberUpdated, Node: meta, Addr: ev.Addr, At: ev.At})
		case known && kind == MemberJoined:
			ev.Kind = MemberUpdated
			m.queue = append(m.queue, ev)
		default:
			m.queue = append(m.queue, ev)
		}
	case MemberFailed:
		if m.leaving[id] || meta.Leaving {
			ev.Kind = MemberLeft
			delete(m.members, id)
			delete(m.addrs, id)
			delete(m.leaving, id)
			delete(m.pending, id)
			m.queue = append(m.queue, ev)
			return
		}
		if _, known := m.members[id]; !known || m.stopped {
			return
		}
		p := &pendingFailure{ev: ev}
		m.pending[id] = p
		m.confirms.Add(1)
		go m.confirm(id, p)
	}
}

// ring signals that events are pending.
func (m *Membership) ring() {
	select {
	case m.notify <- struct{}{}:
	default:
	}
}

// confirm checks the death of member id that memberlist declared (see
// confirmEvery) until it is confirmed, the member is back, or gossip
// stops.
func (m *Membership) confirm(id string, p *pendingFailure) {
	defer m.confirms.Done()
	hold := time.NewTimer(confirmHold)
	defer hold.Stop()
	tick := time.NewTicker(confirmEvery)
	defer tick.Stop()
	var failing time.Time // since when connections fail; zero while they do not
	for {
		m.mu.Lock()
		current := m.pending[id] == p
		m.mu.Unlock()
		if !current {
			return // back, left, or declared dead again
		}
		conn, err := net.DialTimeout("tcp", p.ev.Addr, confirmDialTimeout)
		switch {
		case err == nil:
			conn.Close()
			failing = time.Time{}
		case errors.Is(err, syscall.ECONNREFUSED):
			m.confirmed(id, p, "crashed: connection refused")
			return
		case failing.IsZero():
			failing = time.Now()
		case time.Since(failing) >= confirmUnreachable:
			m.confirmed(id, p, "unreachable: "+err.Error())
			return
		}
		select {
		case <-hold.C:
			m.confirmed(id, p, "not back within "+confirmHold.String())
			return
		case <-m.stop:
			return
		case <-tick.C:
		}
	}
}

// confirmed reports p's failure, unless it was overtaken meanwhile.
func (m *Membership) confirmed(id string, p *pendingFailure, why string) {
	m.mu.Lock()
	if m.pending[id] != p {
		m.mu.Unlock()
		return
	}
	delete(m.pending, id)
	delete(m.members, id)
	delete(m.addrs, id)
	ev := p.ev
	ev.At = time.Now()
	if m.leaving[id] {
		ev.Kind = MemberLeft
	}
	delete(m.leaving, id)
	m.queue = append(m.queue, ev)
	m.mu.Unlock()
	m.log.Info("cluster: member failed", "node", id, "why", why, "declared", p.ev.At, "confirmed_after", ev.At.Sub(p.ev.At))
	m.ring()
}

// delegate gives memberlist this node's metadata. Called on memberlist's
// goroutines; never blocks.
type delegate struct{ m *Membership }

func (d delegate) NodeMeta(limit int) []byte {
	d.m.mu.Lock()
	meta := d.m.meta
	d.m.mu.Unlock()
	b, err := meta.Encode()
	if err != nil || len(b) > limit {
		return nil // Validate refused this at construction
	}
	return b
}

// NotifyMsg records that the member a leaving message names is leaving.
// A message naming no member the node knows is dropped: anything that
// reaches the gossip port may send one (without cluster.secret_key), and
// recording every id it names would grow the node's memory without bound.
func (d delegate) NotifyMsg(b []byte) {
	if id, ok := strings.CutPrefix(string(b), leavingMsg); ok {
		d.m.mu.Lock()
		if _, known := d.m.members[id]; known {
			d.m.leaving[id] = true
		}
		d.m.mu.Unlock()
	}
}
func (delegate) GetBroadcasts(_, _ int) [][]byte   { return nil }
func (delegate) LocalState(bool) []byte            { return nil }
func (delegate) MergeRemoteState(_ []byte, _ bool) {}

// aliveFilter keeps out of memberlist's member list every alive message
// that is not an edged node's: without cluster.secret_key anything that
// reaches the gossip port is read, and a garbled message taken as a node
// (no metadata, no protocol versions) was gossiped to every member and
// made each later join fail ("protocol version (2) is incompatible: [1,
// 0]"). Called on memberlist's goroutines; never blocks.
type aliveFilter struct{}

func (aliveFilter) NotifyAlive(n *memberlist.Node) error {
	meta, err := DecodeMeta(n.Meta)
	switch {
	case err != nil:
		return err
	case meta.ID != n.Name:
		return fmt.Errorf("%w: id %q gossiped by node %q", ErrBadMeta, meta.ID, n.Name)
	case n.PMin == 0 || n.PMax == 0 || n.PMin > n.PMax:
		return fmt.Errorf("cluster: node %q gossips protocol versions %d to %d", n.Name, n.PMin, n.PMax)
	}
	return nil
}

// events queues memberlist's notifications. Called on memberlist's
// goroutines; never blocks.
type events struct{ m *Membership }

func (e events) NotifyJoin(n *memberlist.Node) { e.m.push(MemberJoined, n) }

// NotifyLeave reports a leave or a death alike (n.State is not kept current
// by memberlist v0.7.0); push tells them apart by what the node said.
func (e events) NotifyLeave(n *memberlist.Node)  { e.m.push(MemberFailed, n) }
func (e events) NotifyUpdate(n *memberlist.Node) { e.m.push(MemberUpdated, n) }

// slogWriter routes memberlist's log lines to slog at debug level.
type slogWriter struct{ l *slog.Logger }

func (w slogWriter) Write(p []byte) (int, error) {
	w.l.Debug(string(p), "component", "memberlist")
	return len(p), nil
}
