package mqtt

import (
	"strings"
	"sync"
	"sync/atomic"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/eclipse/paho.mqtt.golang/packets"
)

// subscriberStore is the paho Store of a Subscriber: paho's in-memory
// store without the copies of inbound PUBLISH packets.
//
// paho puts every inbound QoS 1 and 2 PUBLISH in its store ("i.<id>")
// until it sends the acknowledgement, and deletes it then; on reconnect
// it discards such entries (it resends outbound packets and replays
// inbound PUBRELs only). For a subscriber, whose durability is the ingest
// log and whose unacknowledged messages the broker redelivers, the copy
// only costs a map insert and delete under a lock per message, and holds
// up to MaxPending messages. Everything else paho stores (inbound PUBRELs
// of QoS 2, outbound SUBSCRIBEs) is kept as paho's MemoryStore keeps it.
// Safe for concurrent use: paho calls it from its reading and writing
// goroutines.
type subscriberStore struct {
	mu sync.Mutex // guards m
	m  map[string]packets.ControlPacket
	n  atomic.Int64 // len(m): Del of an absent key skips the lock

	stored atomic.Uint64 // packets Put kept, ever (tests)
}

var _ paho.Store = (*subscriberStore)(nil)

func newSubscriberStore() *subscriberStore {
	return &subscriberStore{m: make(map[string]packets.ControlPacket)}
}

// inboundPublish reports whether key and p are an inbound PUBLISH.
func inboundPublish(key string, p packets.ControlPacket) bool {
	_, ok := p.(*packets.PublishPacket)
	return ok && strings.HasPrefix(key, "i.")
}

// Open does nothing: the store is always open.
func (s *subscriberStore) Open() {}

// Close does nothing; the entries stay for a reconnect, as in paho's
// MemoryStore until Reset.
func (s *subscriberStore) Close() {}

// Put stores p under key, unless it is an inbound PUBLISH.
func (s *subscriberStore) Put(key string, p packets.ControlPacket) {
	if inboundPublish(key, p) {
		return
	}
	s.mu.Lock()
	s.m[key] = p
	s.n.Store(int64(len(s.m)))
	s.mu.Unlock()
	s.stored.Add(1)
}

// Get returns the packet stored under key, or nil.
func (s *subscriberStore) Get(key string) packets.ControlPacket {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[key]
}

// All returns the keys stored.
func (s *subscriberStore) All() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys := make([]string, 0, len(s.m))
	for k := range s.m {
		keys = append(keys, k)
	}
	return keys
}

// Del removes key; paho calls it for every acknowledgement it sends.
func (s *subscriberStore) Del(key string) {
	if s.n.Load() == 0 {
		return
	}
	s.mu.Lock()
	delete(s.m, key)
	s.n.Store(int64(len(s.m)))
	s.mu.Unlock()
}

// Reset removes everything.
func (s *subscriberStore) Reset() {
	s.mu.Lock()
	clear(s.m)
	s.n.Store(0)
	s.mu.Unlock()
}
