package mqtt

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"sync"

	"github.com/edgedio/edged/internal/fsutil"
)

// sessionFile is the name of the session journal in BrokerConfig.DataDir.
const sessionFile = "sessions.journal"

// sessionFrameHeader is the length and CRC32C before each record body.
const sessionFrameHeader = 8

// maxSessionRecord bounds one record body; a larger length is damage.
const maxSessionRecord = 64 << 20

var sessionCRC = crc32.MakeTable(crc32.Castagnoli)

// sessionRec is one journal record. T says which: "c" client (Client,
// Version, Expiry, Listener, Username), "cd" client deleted, "s"
// subscription (Sub), "u" unsubscribe (Filter), "m" message (Msg, To),
// "md" message dropped, "a" delivery assigned a packet id, "r" delivery
// awaiting PUBCOMP, "d" delivery done, "i" QoS 2 receipt (Tag, Topic,
// Routes), "ia" the receipt's message is in the log of route Route,
// "x" receipt released by PUBREL.
type sessionRec struct {
	T        string          `json:"t"`
	Client   string          `json:"c,omitempty"`
	Version  byte            `json:"v,omitempty"`
	Expiry   uint32          `json:"e,omitempty"`
	ExpFlag  bool            `json:"ef,omitempty"`
	Listener string          `json:"l,omitempty"`
	Username []byte          `json:"un,omitempty"`
	Sub      *sessionSub     `json:"s,omitempty"`
	Filter   string          `json:"f,omitempty"`
	MsgID    uint64          `json:"m,omitempty"`
	Msg      *sessionMsgData `json:"md,omitempty"`
	To       []sessionTo     `json:"to,omitempty"`
	PacketID uint16          `json:"p,omitempty"`
	Tag      int64           `json:"g,omitempty"`
	Topic    string          `json:"tp,omitempty"`
	Routes   []receiptRoute  `json:"rt,omitempty"`
	Route    int             `json:"k,omitempty"`
}

// sessionSub is a stored subscription.
type sessionSub struct {
	Filter            string `json:"f"`
	Qos               byte   `json:"q,omitempty"`
	RetainHandling    byte   `json:"rh,omitempty"`
	RetainAsPublished bool   `json:"rap,omitempty"`
	NoLocal           bool   `json:"nl,omitempty"`
	Identifier        int    `json:"id,omitempty"`
}

// sessionMsgData is a stored message's content.
type sessionMsgData struct {
	Topic   string `json:"t"`
	Payload []byte `json:"p,omitempty"`
	Qos     byte   `json:"q"`
	Retain  bool   `json:"r,omitempty"`
	Origin  string `json:"o,omitempty"`
	Created int64  `json:"c,omitempty"`
}

// sessionTo is one recipient of a stored message and the QoS it gets.
type sessionTo struct {
	Client string `json:"c"`
	Qos    byte   `json:"q"`
}

// receiptRoute is one ingest log a QoS 2 message goes to: Key names the
// route (0 the broker's own log, i+1 the i-th AddRoute), From is the log's
// next offset before the append, so the record, if appended, is at or
// after it.
type receiptRoute struct {
	Key  int    `json:"k"`
	From uint64 `json:"f"`
	// Known is true once Done is certain (appended here, found by a scan,
	// or not found by a scan); not stored.
	Known bool `json:"-"`
	// Done is true once the message is in this log; not stored.
	Done bool `json:"-"`
}

// sessionClient is a persistent session.
type sessionClient struct {
	id       string
	version  byte
	expiry   uint32
	expFlag  bool
	listener string
	username []byte
	subs     map[string]sessionSub
	out      map[uint16]uint64 // outbound packet id -> message id
	rel      map[uint16]bool   // outbound QoS 2 packet ids past PUBREC
	// next holds, by outbound packet id, a message mochi gave that id
	// while out still held it for another, whose end (PUBACK, PUBCOMP,
	// drop) mochi had not reported yet: it is assigned the id when that
	// end is. Not stored.
	next     map[uint16]uint64
	receipts map[uint16]*qos2Receipt
}

// sessDelivery is one recipient's copy of a stored message.
type sessDelivery struct {
	qos byte
	pid uint16 // 0: not assigned yet
}

// sessionMsgOverhead and sessionDeliveryOverhead are the memory a stored
// message costs besides its topic and payload, counted against the
// store's bound with them (sessionMsgSize): the store's own record of the
// message (sessionMsg, its map of recipients, its entry in msgs: about
// 500 bytes), and for each recipient mochi's inflight copy of the packet
// (an 800-byte packets.Packet held by value in the client's map, about
// 900 bytes with the map's share) with our delivery record. Measured with
// a heap profile of a broker holding 64,511 messages of 10 bytes for
// offline sessions: 1.3 KiB per message with one recipient, 3.2 KiB with
// three, where the topic and payload alone counted 25 bytes.
const (
	sessionMsgOverhead      = 512
	sessionDeliveryOverhead = 1024
)

// sessionMsgSize is what a message for recipients persistent sessions
// counts against the store's bound: its topic and payload, mochi's copy
// of the payload for each recipient, and the overheads above.
func sessionMsgSize(data *sessionMsgData, recipients int) int64 {
	return int64(len(data.Topic)+len(data.Payload)) + sessionMsgOverhead +
		int64(recipients)*(int64(len(data.Payload))+sessionDeliveryOverhead)
}

// sessionMsg is a message stored for persistent sessions.
type sessionMsg struct {
	id      uint64
	data    sessionMsgData
	size    int64
	pending map[string]*sessDelivery
}

// qos2Receipt remembers an inbound QoS 2 packet id until PUBREL.
type qos2Receipt struct {
	tag    int64
	topic  string
	routes []receiptRoute
}

// sessionStore is the broker's durable session state: persistent
// sessions, their subscriptions, the QoS 1/2 messages queued or in flight
// for them, and the inbound QoS 2 packet ids not yet released. It is an
// append-only journal of checksummed records that is replayed at open and
// rewritten (compacted) when it grows; records are group-committed: add
// appends to a buffer and sync makes every record added so far durable
// with one write and one fsync, shared by everyone waiting.
//
// A failed write or fsync of the journal (a full card, an I/O error)
// leaves its file suspect: the failed write may have left a torn end,
// and after a failed fsync the kernel may have dropped the pages it could
// not write while a later fsync reports success. So the store never
// appends to that file again: the callers waiting for records the failed
// attempt covered get the error (even if a later rewrite makes those
// records durable), and the next caller that waits for the journal (or
// close) rewrites it from the in-memory state (compact: a new file,
// fsync, rename, directory fsync). When that succeeds the store is
// healthy again; while it fails, those callers get the error too.
// Nothing is acknowledged that is not durable.
//
// What a refused caller's record put in the in-memory state is taken out
// again where keeping it would let a later rewrite persist it as if it
// had been accepted: a message stored for persistent sessions ("m", the
// publisher got no PUBACK and resends it) and a QoS 2 receipt ("i", the
// device got no PUBREC and resends the PUBLISH). The other durable
// records are kept: a persistent session ("c") and its subscriptions
// ("s") the broker library holds in memory anyway once the client asked
// for them (it keeps the session of a client stopped in
// OnSessionEstablish and the subscription of one stopped in
// OnSubscribed), so persisting them makes the journal hold what the
// running broker holds, and the client, disconnected, asks again; a
// session discarded by a clean connect ("cd") and a QoS 2 receipt released
// by PUBREL ("x") are what the client asked for, and the device resends
// its PUBREL, which finds nothing left to release and gets its PUBCOMP.
//
// All methods are safe for concurrent use; the store starts no
// goroutines.
type sessionStore struct {
	dir          string
	path         string
	maxBytes     int64
	compactBytes int64
	logger       *slog.Logger
	fs           journalFS

	mu        sync.Mutex // guards every field below
	f         journalFile
	fileSize  int64
	buf       []byte // records added, not yet written
	added     uint64 // records added
	synced    uint64 // records durable
	syncing   bool
	advanced  chan struct{} // closed and replaced when synced advances
	space     chan struct{} // closed and replaced when liveBytes shrinks
	failed    error         // the last write, fsync or rewrite failed; nil when healthy
	failedTo  uint64        // records up to here were covered by the failed attempt
	waits     map[*sessionWait]struct{}
	closed    bool
	clients   map[string]*sessionClient
	msgs      map[uint64]*sessionMsg
	nextMsg   uint64
	liveBytes int64
	lastTag   int64
	appended  uint64 // the last "ia" record added
	stats     SessionStats
}

// SessionStats counts what the broker's session store holds and did.
type SessionStats struct {
	// Sessions is the number of persistent sessions stored.
	Sessions int
	// Messages is the number of messages stored for them.
	Messages int
	// Bytes is what the stored messages cost in memory, what
	// BrokerConfig.SessionMaxBytes bounds: their topics and payloads,
	// the library's copy of each payload per recipient, and about 1.5 KiB
	// of bookkeeping per message and recipient.
	Bytes int64
	// Receipts is the number of inbound QoS 2 packet ids awaiting PUBREL.
	Receipts int
	// Blocked counts publishes that waited for space.
	Blocked uint64
	// Syncs counts journal fsyncs.
	Syncs uint64
	// Compactions counts journal rewrites.
	Compactions uint64
	// TornBytes is what opening cut off the journal's end.
	TornBytes int64
	// Failures counts failed journal writes, fsyncs and rewrites.
	Failures uint64
	// Recoveries counts rewrites that made the journal healthy again
	// after a failure.
	Recoveries uint64
}

// sessionWait is a caller waiting for record seq to be durable. err is
// set once an attempt that covered seq failed: the caller is refused,
// even if a later rewrite makes the state durable. If the caller is
// refused, undo takes out of the in-memory state what its record put
// there: message msg ("m", if client is empty), or client's QoS 2
// receipt pid with tag ("i").
type sessionWait struct {
	seq  uint64
	err  error
	undo *sessionUndo
}

// sessionUndo names what a refused record put in the in-memory state.
type sessionUndo struct {
	msg    uint64
	client string
	pid    uint16
	tag    int64
}

// journalFile is the journal file as the store writes it.
type journalFile interface {
	Write(b []byte) (int, error)
	Sync() error
	Close() error
}

// journalFS is the file system the store writes the journal through;
// tests replace it to inject failures (a full card, an I/O error).
type journalFS interface {
	OpenFile(name string, flag int, perm os.FileMode) (journalFile, error)
	Rename(from, to string) error
	Remove(name string) error
	SyncDir(dir string) error
}

// osFS is the journalFS of the operating system.
type osFS struct{}

func (osFS) OpenFile(name string, flag int, perm os.FileMode) (journalFile, error) {
	return os.OpenFile(name, flag, perm)
}
func (osFS) Rename(from, to string) error { return os.Rename(from, to) }
func (osFS) Remove(name string) error     { return os.Remove(name) }
func (osFS) SyncDir(dir string) error     { return fsutil.SyncDir(dir) }

// openSessionStore opens (creating if needed) the journal in dir,
// replays it, assigns packet ids to deliveries that had none and rewrites
// it compacted. If that rewrite fails (a full card) the store opens
// failed, and the next use rewrites it.
func openSessionStore(dir string, maxBytes, compactBytes int64, logger *slog.Logger) (*sessionStore, error) {
	return openSessionStoreFS(dir, maxBytes, compactBytes, logger, osFS{})
}

// openSessionStoreFS is openSessionStore writing through fs.
func openSessionStoreFS(dir string, maxBytes, compactBytes int64, logger *slog.Logger, fs journalFS) (*sessionStore, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("mqtt: session store: %w", err)
	}
	s := &sessionStore{
		dir: dir, path: filepath.Join(dir, sessionFile),
		maxBytes: maxBytes, compactBytes: compactBytes, logger: logger, fs: fs,
		advanced: make(chan struct{}), space: make(chan struct{}),
		clients: map[string]*sessionClient{}, msgs: map[uint64]*sessionMsg{},
		waits: map[*sessionWait]struct{}{},
	}
	if err := s.replay(); err != nil {
		return nil, err
	}
	for _, m := range s.msgs {
		for id, d := range m.pending {
			if d.pid == 0 {
				s.assignFresh(s.clients[id], m, d)
			}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.compact(); err != nil {
		// The journal on disk holds what was replayed (and perhaps a torn
		// end, never appended to): start failed, as after a failed write,
		// and rewrite it at the next use, rather than not start at all on
		// a card that is still full.
		s.failLocked(s.added, err)
	}
	return s, nil
}

// replay reads the journal into memory, cutting off a torn end: a
// partial or damaged last record, left by a crash before the fsync that
// would have made it durable. A damaged record followed by a good one is
// damage, not a torn end (ErrCorruptSession).
func (s *sessionStore) replay() error {
	data, err := os.ReadFile(s.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("mqtt: session store: %w", err)
	}
	pos := 0
	for pos < len(data) {
		body, ok := sessionFrame(data[pos:])
		if !ok {
			break
		}
		var rec sessionRec
		if err := json.Unmarshal(body, &rec); err != nil {
			return fmt.Errorf("%w: %s at byte %d: %v", ErrCorruptSession, s.path, pos, err)
		}
		s.apply(&rec)
		pos += sessionFrameHeader + len(body)
	}
	if torn := len(data) - pos; torn > 0 {
		if sessionDamageBefore(data[pos:]) {
			return fmt.Errorf("%w: %s: damaged record at byte %d before the end", ErrCorruptSession, s.path, pos)
		}
		// Nothing acknowledged depended on a torn end.
		s.stats.TornBytes = int64(torn)
		s.logger.Warn("mqtt broker: session journal had a torn end; cut off", "file", s.path, "bytes", torn)
	}
	return nil
}

// sessionFrame returns the body of the frame at the start of b if it is
// whole and its checksum matches.
func sessionFrame(b []byte) ([]byte, bool) {
	if len(b) < sessionFrameHeader {
		return nil, false
	}
	n := binary.LittleEndian.Uint32(b)
	if n == 0 || n > maxSessionRecord || uint64(len(b)-sessionFrameHeader) < uint64(n) {
		return nil, false
	}
	body := b[sessionFrameHeader : sessionFrameHeader+int(n)]
	if crc32.Checksum(body, sessionCRC) != binary.LittleEndian.Uint32(b[4:]) {
		return nil, false
	}
	return body, true
}

// sessionDamageBefore reports whether the bad frame at the start of b is
// followed by a good one: damage in the middle, not a torn end.
func sessionDamageBefore(b []byte) bool {
	if len(b) < sessionFrameHeader {
		return false
	}
	n := binary.LittleEndian.Uint32(b)
	if n == 0 || n > maxSessionRecord || uint64(len(b)-sessionFrameHeader) <= uint64(n) {
		return false
	}
	_, ok := sessionFrame(b[sessionFrameHeader+int(n):])
	return ok
}

// apply changes the in-memory state by rec. s.mu is held (or the store is
// not shared yet).
func (s *sessionStore) apply(r *sessionRec) {
	switch r.T {
	case "c":
		c := s.clients[r.Client]
		if c == nil {
			c = &sessionClient{id: r.Client, subs: map[string]sessionSub{}, out: map[uint16]uint64{},
				rel: map[uint16]bool{}, next: map[uint16]uint64{}, receipts: map[uint16]*qos2Receipt{}}
			s.clients[r.Client] = c
		}
		c.version, c.expiry, c.expFlag, c.listener, c.username = r.Version, r.Expiry, r.ExpFlag, r.Listener, r.Username
	case "cd":
		c := s.clients[r.Client]
		if c == nil {
			return
		}
		delete(s.clients, r.Client)
		for _, m := range s.msgs {
			if _, ok := m.pending[r.Client]; ok {
				delete(m.pending, r.Client)
				s.maybeFree(m)
			}
		}
	case "s":
		if c := s.clients[r.Client]; c != nil && r.Sub != nil {
			c.subs[r.Sub.Filter] = *r.Sub
		}
	case "u":
		if c := s.clients[r.Client]; c != nil {
			delete(c.subs, r.Filter)
		}
	case "m":
		if r.Msg == nil {
			return
		}
		m := &sessionMsg{id: r.MsgID, data: *r.Msg, pending: map[string]*sessDelivery{}}
		for _, to := range r.To {
			if s.clients[to.Client] != nil {
				m.pending[to.Client] = &sessDelivery{qos: to.Qos}
			}
		}
		m.size = sessionMsgSize(&m.data, len(m.pending))
		if r.MsgID >= s.nextMsg {
			s.nextMsg = r.MsgID + 1
		}
		if len(m.pending) == 0 {
			return
		}
		s.msgs[m.id] = m
		s.liveBytes += m.size
	case "md":
		if m := s.msgs[r.MsgID]; m != nil {
			clear(m.pending)
			s.maybeFree(m)
		}
	case "a":
		c, m := s.clients[r.Client], s.msgs[r.MsgID]
		if c == nil || m == nil || m.pending[r.Client] == nil {
			return
		}
		m.pending[r.Client].pid = r.PacketID
		c.out[r.PacketID] = m.id
	case "r":
		if c := s.clients[r.Client]; c != nil {
			if _, ok := c.out[r.PacketID]; ok {
				c.rel[r.PacketID] = true
			}
		}
	case "d":
		c := s.clients[r.Client]
		if c == nil {
			return
		}
		id, ok := c.out[r.PacketID]
		if !ok {
			return
		}
		delete(c.out, r.PacketID)
		delete(c.rel, r.PacketID)
		if m := s.msgs[id]; m != nil {
			delete(m.pending, r.Client)
			s.maybeFree(m)
		}
	case "i":
		if c := s.clients[r.Client]; c != nil {
			c.receipts[r.PacketID] = &qos2Receipt{tag: r.Tag, topic: r.Topic, routes: append([]receiptRoute(nil), r.Routes...)}
		}
		s.lastTag = max(s.lastTag, r.Tag)
	case "ia":
		if c := s.clients[r.Client]; c != nil && c.receipts[r.PacketID] != nil {
			for i := range c.receipts[r.PacketID].routes {
				if rt := &c.receipts[r.PacketID].routes[i]; rt.Key == r.Route {
					rt.Known, rt.Done = true, true
				}
			}
		}
	case "x":
		if c := s.clients[r.Client]; c != nil {
			delete(c.receipts, r.PacketID)
		}
	}
}

// maybeFree forgets m once no recipient waits for it. s.mu is held.
func (s *sessionStore) maybeFree(m *sessionMsg) {
	if len(m.pending) > 0 || s.msgs[m.id] == nil {
		return
	}
	delete(s.msgs, m.id)
	s.liveBytes -= m.size
	close(s.space)
	s.space = make(chan struct{})
}

// assignFresh gives d a packet id its client does not use. s.mu is held.
func (s *sessionStore) assignFresh(c *sessionClient, m *sessionMsg, d *sessDelivery) {
	for pid := uint16(1); pid != 0; pid++ {
		if _, used := c.out[pid]; !used {
			d.pid = pid
			c.out[pid] = m.id
			return
		}
	}
}

// add applies rec and appends it to the journal buffer; it returns the
// record's sequence number for sync. s.mu is held.
func (s *sessionStore) add(r *sessionRec) uint64 {
	s.apply(r)
	s.added++
	if s.failed != nil {
		// The next rewrite writes the state; the buffer would only grow.
		return s.added
	}
	body, err := json.Marshal(r)
	if err != nil { // cannot happen: plain data
		panic(fmt.Sprintf("mqtt: session record: %v", err))
	}
	var hdr [sessionFrameHeader]byte
	binary.LittleEndian.PutUint32(hdr[:], uint32(len(body)))
	binary.LittleEndian.PutUint32(hdr[4:], crc32.Checksum(body, sessionCRC))
	s.buf = append(append(s.buf, hdr[:]...), body...)
	return s.added
}

// waitSynced returns once record seq is durable, leading a group commit if
// no one else is. If a write, fsync or rewrite that covered seq fails
// while it waits it returns that error; if the store had failed before,
// it rewrites the journal (recoverLocked). s.mu is held; it is released
// while writing and waiting.
func (s *sessionStore) waitSynced(seq uint64) error {
	return s.wait(&sessionWait{seq: seq})
}

// wait is waitSynced for w, which failLocked refuses if an attempt that
// covers w.seq fails while w waits. s.mu is held.
func (s *sessionStore) wait(w *sessionWait) error {
	if s.synced >= w.seq {
		return nil
	}
	s.waits[w] = struct{}{}
	defer delete(s.waits, w)
	for {
		if w.err != nil {
			return w.err
		}
		if s.synced >= w.seq {
			return nil
		}
		if s.closed {
			return ErrBrokerClosed
		}
		if s.syncing {
			ch := s.advanced
			s.mu.Unlock()
			<-ch
			s.mu.Lock()
			continue
		}
		if s.failed != nil {
			s.recoverLocked()
			continue
		}
		s.flushLocked()
	}
}

// recoverLocked rewrites the journal from the in-memory state after a
// failure; the store is healthy again if that succeeds. s.mu is held and
// no group commit is running.
func (s *sessionStore) recoverLocked() {
	upto, was := s.added, s.failed
	if err := s.compact(); err != nil {
		s.failLocked(upto, err)
		return
	}
	s.failed, s.failedTo = nil, 0
	s.stats.Recoveries++
	s.logger.Info("mqtt broker: session journal rewritten after a failure; sessions are persisted again",
		"file", s.path, "failure", was)
}

// failLocked records that an attempt to make the records up to upto
// durable failed with err: the callers waiting for those not durable yet
// get err, what their records put in the in-memory state is taken out
// where it must be (see sessionStore), and the journal file is not
// appended to again. s.mu is held.
func (s *sessionStore) failLocked(upto uint64, err error) {
	if s.failed == nil {
		s.logger.Error("mqtt broker: session journal write failed; persistent sessions are refused until it is rewritten",
			"file", s.path, "err", err)
	} else {
		s.logger.Warn("mqtt broker: rewriting the session journal failed; persistent sessions are still refused",
			"file", s.path, "err", err)
	}
	s.failed, s.failedTo = err, upto
	s.buf = nil // the rewrite writes the in-memory state
	s.stats.Failures++
	for w := range s.waits {
		if w.err != nil || w.seq <= s.synced || w.seq > upto {
			continue
		}
		w.err = err
		u := w.undo
		if u == nil {
			continue
		}
		if u.client == "" {
			if m := s.msgs[u.msg]; m != nil {
				clear(m.pending)
				s.maybeFree(m)
			}
		} else if c := s.clients[u.client]; c != nil && c.receipts[u.pid] != nil && c.receipts[u.pid].tag == u.tag {
			delete(c.receipts, u.pid)
		}
	}
}

// flushLocked writes and fsyncs the buffer as group commit leader, then
// compacts the journal if it grew past its bound. s.mu is held.
func (s *sessionStore) flushLocked() {
	s.syncing = true
	buf, upto, f := s.buf, s.added, s.f
	s.buf = nil
	s.mu.Unlock()
	_, err := f.Write(buf)
	if err == nil {
		err = f.Sync()
	}
	s.mu.Lock()
	s.syncing = false
	if err != nil {
		s.failLocked(upto, fmt.Errorf("%w: session journal %s: %v", ErrSessionStore, s.path, err))
	} else {
		s.fileSize += int64(len(buf))
		s.synced = upto
		s.stats.Syncs++
		if s.fileSize > s.compactBytes {
			if err := s.compact(); err != nil {
				s.failLocked(s.added, err)
			}
		}
	}
	close(s.advanced)
	s.advanced = make(chan struct{})
}

// compact rewrites the journal from the in-memory state into a new file,
// fsyncs it and renames it over the old one. s.mu is held and no group
// commit is running; the buffer is empty or already applied to the state.
// A failed rewrite removes its new file, so it does not hold the space
// of a full card; the journal it was to replace is left as it was, unless
// the failure came after the rename (then the new file is the journal).
func (s *sessionStore) compact() error {
	tmp := s.path + ".tmp"
	f, err := s.fs.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("%w: compact %s: %v", ErrSessionStore, s.path, err)
	}
	w := bufio.NewWriterSize(f, 64<<10)
	var size int64
	write := func(r *sessionRec) {
		body, _ := json.Marshal(r)
		var hdr [sessionFrameHeader]byte
		binary.LittleEndian.PutUint32(hdr[:], uint32(len(body)))
		binary.LittleEndian.PutUint32(hdr[4:], crc32.Checksum(body, sessionCRC))
		w.Write(hdr[:])
		w.Write(body)
		size += sessionFrameHeader + int64(len(body))
	}
	for _, r := range s.snapshot() {
		write(r)
	}
	err = w.Flush()
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		if err = s.fs.Rename(tmp, s.path); err != nil {
			err = fmt.Errorf("rename: %w", err)
		}
	}
	if err != nil {
		if rerr := s.fs.Remove(tmp); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
			err = fmt.Errorf("%w (removing %s: %v)", err, tmp, rerr)
		}
	}
	if err == nil {
		if err = s.fs.SyncDir(s.dir); err != nil {
			err = fmt.Errorf("sync directory: %w", err)
		}
	}
	if err != nil {
		return fmt.Errorf("%w: compact %s: %v", ErrSessionStore, s.path, err)
	}
	nf, err := s.fs.OpenFile(s.path, os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("%w: compact %s: %v", ErrSessionStore, s.path, err)
	}
	if s.f != nil {
		s.f.Close()
	}
	s.f, s.fileSize = nf, size
	s.buf = nil
	s.synced = s.added
	s.stats.Compactions++
	if s.compactBytes < 2*size {
		s.compactBytes = 2 * size // grow the bound rather than rewrite on every sync
	}
	return nil
}

// snapshot returns records that rebuild the current state. s.mu is held.
func (s *sessionStore) snapshot() []*sessionRec {
	var out []*sessionRec
	ids := make([]string, 0, len(s.clients))
	for id := range s.clients {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		c := s.clients[id]
		out = append(out, &sessionRec{T: "c", Client: id, Version: c.version, Expiry: c.expiry, ExpFlag: c.expFlag, Listener: c.listener, Username: c.username})
		for _, sub := range c.subs {
			sub := sub
			out = append(out, &sessionRec{T: "s", Client: id, Sub: &sub})
		}
		for pid, rc := range c.receipts {
			out = append(out, &sessionRec{T: "i", Client: id, PacketID: pid, Tag: rc.tag, Topic: rc.topic, Routes: rc.routes})
			for _, r := range rc.routes {
				if r.Known && r.Done {
					out = append(out, &sessionRec{T: "ia", Client: id, PacketID: pid, Route: r.Key})
				}
			}
		}
	}
	mids := make([]uint64, 0, len(s.msgs))
	for id := range s.msgs {
		mids = append(mids, id)
	}
	sort.Slice(mids, func(i, j int) bool { return mids[i] < mids[j] })
	for _, id := range mids {
		m := s.msgs[id]
		data := m.data
		r := &sessionRec{T: "m", MsgID: id, Msg: &data}
		for c, d := range m.pending {
			r.To = append(r.To, sessionTo{Client: c, Qos: d.qos})
		}
		out = append(out, r)
		for c, d := range m.pending {
			if d.pid != 0 {
				out = append(out, &sessionRec{T: "a", Client: c, PacketID: d.pid, MsgID: id})
				if s.clients[c].rel[d.pid] {
					out = append(out, &sessionRec{T: "r", Client: c, PacketID: d.pid})
				}
			}
		}
	}
	return out
}

// record adds r and, if durable, waits until it is on disk.
func (s *sessionStore) record(r *sessionRec, durable bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrBrokerClosed
	}
	seq := s.add(r)
	if !durable {
		return nil
	}
	w := &sessionWait{seq: seq}
	if r.T == "i" {
		w.undo = &sessionUndo{client: r.Client, pid: r.PacketID, tag: r.Tag}
	}
	return s.wait(w)
}

// sync returns once every record added so far is durable.
func (s *sessionStore) sync() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.waitSynced(s.added)
}

// hasClient reports whether id has a stored persistent session.
func (s *sessionStore) hasClient(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.clients[id] != nil
}

// hasClients reports whether any persistent session is stored.
func (s *sessionStore) hasClients() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.clients) > 0
}

// addMessage stores a message for recipients, waiting while the store is
// full, and returns once it is durable.
func (s *sessionStore) addMessage(ctx context.Context, data sessionMsgData, to []sessionTo) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id, seq, err := s.addMessageLocked(ctx, data, to)
	if err != nil {
		return 0, err
	}
	return id, s.wait(&sessionWait{seq: seq, undo: &sessionUndo{msg: id}})
}

// addMessageNoWait stores a message for recipients, waiting while the
// store is full, and returns its id and the sequence number of its
// record without waiting for it to be durable: the caller holds the
// publisher's acknowledgement until syncedTo(seq) (see ackGate). If the
// journal then fails, the message stays in memory (mochi routed it
// already) and the rewrite persists it; the publisher, which got no
// acknowledgement, may resend it, a duplicate QoS 1 allows.
func (s *sessionStore) addMessageNoWait(ctx context.Context, data sessionMsgData, to []sessionTo) (id, seq uint64, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addMessageLocked(ctx, data, to)
}

// freed returns a channel closed when a stored message is next freed,
// and counts a blocked publish first if blocked.
func (s *sessionStore) freed(blocked bool) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if blocked {
		s.stats.Blocked++
	}
	return s.space
}

// syncedTo reports whether record seq is durable.
func (s *sessionStore) syncedTo(seq uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.synced >= seq
}

// waitSyncedTo is waitSynced for a caller not holding s.mu.
func (s *sessionStore) waitSyncedTo(seq uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.waitSynced(seq)
}

// addMessageLocked is addMessageNoWait with s.mu held.
func (s *sessionStore) addMessageLocked(ctx context.Context, data sessionMsgData, to []sessionTo) (id, seq uint64, err error) {
	size := sessionMsgSize(&data, len(to))
	blocked := false
	for s.maxBytes > 0 && s.liveBytes > 0 && s.liveBytes+size > s.maxBytes {
		if s.closed {
			return 0, 0, ErrBrokerClosed
		}
		if !blocked {
			blocked = true
			s.stats.Blocked++
			s.logger.Warn("mqtt broker: session store full; the publisher waits until subscribers acknowledge",
				"max_bytes", s.maxBytes, "bytes", s.liveBytes)
		}
		ch := s.space
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
		}
		s.mu.Lock()
		if ctx.Err() != nil {
			return 0, 0, fmt.Errorf("mqtt: session store full: %w", ctx.Err())
		}
	}
	if s.closed {
		return 0, 0, ErrBrokerClosed
	}
	id = s.nextMsg
	return id, s.add(&sessionRec{T: "m", MsgID: id, Msg: &data, To: to}), nil
}

// assign records that message id went to client as packet pid, unless
// the packet sent (topic, payload) is not that message, client does not
// wait for id or id has a packet id already. An empty topic is a packet
// sent under its topic alias alone (MQTT 5). mochi gives a message an id
// only once the id's previous flow left its inflight messages, and
// reports that flow's end (done) after: if pid is still assigned to
// another message, id gets pid when that end is reported.
func (s *sessionStore) assign(client string, pid uint16, id uint64, topic string, payload []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, m := s.clients[client], s.msgs[id]
	if s.closed || c == nil || m == nil || (topic != "" && m.data.Topic != topic) || !bytes.Equal(m.data.Payload, payload) {
		return
	}
	if d := m.pending[client]; d == nil || d.pid != 0 {
		return
	}
	if _, used := c.out[pid]; used {
		c.next[pid] = id
		return
	}
	s.add(&sessionRec{T: "a", Client: client, PacketID: pid, MsgID: id})
}

// done records the end of client's outbound flow pid (its PUBACK or
// PUBCOMP, or mochi dropped the message), then gives pid to the message
// mochi gave it meanwhile, if one waits for it (see assign).
func (s *sessionStore) done(client string, pid uint16) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.clients[client]
	if s.closed || c == nil {
		return
	}
	if _, ok := c.out[pid]; ok {
		s.add(&sessionRec{T: "d", Client: client, PacketID: pid})
	}
	id, ok := c.next[pid]
	if !ok {
		return
	}
	delete(c.next, pid)
	if m := s.msgs[id]; m != nil {
		if d := m.pending[client]; d != nil && d.pid == 0 {
			s.add(&sessionRec{T: "a", Client: client, PacketID: pid, MsgID: id})
		}
	}
}

// outbound reports whether client has pid assigned to a stored message.
func (s *sessionStore) outbound(client string, pid uint16) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.clients[client]
	if c == nil {
		return false
	}
	_, ok := c.out[pid]
	return ok
}

// receipt returns a copy of client's QoS 2 receipt for pid.
func (s *sessionStore) receipt(client string, pid uint16) (qos2Receipt, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.clients[client]; c != nil {
		if rc := c.receipts[pid]; rc != nil {
			cp := *rc
			cp.routes = append([]receiptRoute(nil), rc.routes...)
			return cp, true
		}
	}
	return qos2Receipt{}, false
}

// nextTag returns a receive time in ns that no earlier receipt used.
func (s *sessionStore) nextTag(now int64) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lastTag = max(now, s.lastTag+1)
	return s.lastTag
}

// routeDone marks route key of client's receipt pid: known says whether
// done is certain. A message known to be in the log is journaled ("ia")
// without waiting: the broker calls syncAppended before each append, so
// the record is durable before any append that starts after it, and a
// checkpoint cannot release the message while a crash would leave it
// findable only by a scan of the log.
func (s *sessionStore) routeDone(client string, pid uint16, key int, known, done bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.clients[client]
	if c == nil || c.receipts[pid] == nil {
		return
	}
	if known && done && !s.closed {
		s.appended = s.add(&sessionRec{T: "ia", Client: client, PacketID: pid, Route: key})
		return
	}
	for i := range c.receipts[pid].routes {
		if r := &c.receipts[pid].routes[i]; r.Key == key {
			r.Known, r.Done = known, done
		}
	}
}

// syncAppended returns once every "ia" record added so far is durable;
// the broker calls it before each append to an ingest log. A failed or
// closed journal does not hold up appends (QoS 2 receipts fail on their
// own then): once an attempt that covered the last "ia" record failed,
// it returns nil without trying again.
func (s *sessionStore) syncAppended() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.appended <= s.synced || (s.failed != nil && s.appended <= s.failedTo) || s.closed {
		return nil
	}
	return s.waitSynced(s.appended)
}

// receiptsToResolve returns a copy of every receipt with a route not
// known yet, keyed by client and packet id.
func (s *sessionStore) receiptsToResolve() map[string]map[uint16]qos2Receipt {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]map[uint16]qos2Receipt{}
	for id, c := range s.clients {
		for pid, rc := range c.receipts {
			for _, r := range rc.routes {
				if !r.Known {
					if out[id] == nil {
						out[id] = map[uint16]qos2Receipt{}
					}
					cp := *rc
					cp.routes = append([]receiptRoute(nil), rc.routes...)
					out[id][pid] = cp
					break
				}
			}
		}
	}
	return out
}

// Stats returns the store's counters.
func (s *sessionStore) Stats() SessionStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.Sessions, st.Messages, st.Bytes = len(s.clients), len(s.msgs), s.liveBytes
	for _, c := range s.clients {
		st.Receipts += len(c.receipts)
	}
	return st
}

// close makes every record added durable and closes the file.
func (s *sessionStore) close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	err := s.waitSynced(s.added)
	s.closed = true
	close(s.space)
	s.space = make(chan struct{})
	if s.f != nil { // nil if no rewrite succeeded since the open
		if cerr := s.f.Close(); err == nil {
			err = cerr
		}
	}
	return err
}

// crash closes the file without writing the records not yet synced, as a
// kill -9 would lose them. For tests.
func (s *sessionStore) crash() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.syncing {
		ch := s.advanced
		s.mu.Unlock()
		<-ch
		s.mu.Lock()
	}
	s.closed = true
	s.buf = nil
	close(s.space)
	s.space = make(chan struct{})
	if s.f != nil {
		s.f.Close()
	}
}
