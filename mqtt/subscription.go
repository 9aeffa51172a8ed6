package mqtt

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/edgedio/edged/internal/fsutil"
)

// subscriptionFile is the file, in the ingest log's directory, that
// records the filters the broker's session for the subscriber holds.
const subscriptionFile = "subscription.json"

// subscription is what a subscriber knows of its session's subscriptions
// on the broker: the filters it subscribed to, each with the QoS it asked
// for, that the broker granted, on the broker Broker (host and port) for
// the client ClientID.
//
// It exists for the broker's retained messages. MQTT 3.1.1 (3.3.1.3)
// sends the retained messages that match a filter every time the filter
// is subscribed to, the same filter again included. A subscriber that
// subscribed again on every connection, as clients usually do, would log
// each retained message again at every restart of edged and every
// reconnect: a duplicate the redelivery table cannot see (the broker
// sends it as a new message, without DUP). So on a resumed session
// (CONNACK's session present) the subscriber subscribes only to the
// filters the session does not hold yet, and unsubscribes from those no
// longer configured; on a new session it subscribes to all.
type subscription struct {
	Broker   string          `json:"broker"`
	ClientID string          `json:"client_id"`
	Filters  map[string]byte `json:"filters"`
}

// subscriptionPlan is what one connection sends: the filters to
// subscribe to and those to unsubscribe from.
type subscriptionPlan struct {
	sub   []string
	unsub []string
}

// subscriptions keeps a subscriber's subscription record and its file.
// Safe for concurrent use (paho calls onConnect on its own goroutines).
type subscriptions struct {
	path     string // "" keeps the record in memory only
	broker   string
	clientID string
	topics   []string
	qos      byte
	logger   *slog.Logger

	mu  sync.Mutex
	rec subscription // what the broker's session holds, as far as known
}

// newSubscriptions loads the record of dir (the ingest log's directory;
// "" for none) for cfg. A record that cannot be read is logged and
// ignored: every filter is subscribed to again, as on a new session.
func newSubscriptions(dir string, cfg SubscriberConfig, logger *slog.Logger) *subscriptions {
	s := &subscriptions{broker: brokerKey(cfg.Broker), clientID: cfg.ClientID, topics: cfg.Topics, qos: cfg.QoS, logger: logger}
	if dir == "" {
		return s
	}
	s.path = filepath.Join(dir, subscriptionFile)
	b, err := os.ReadFile(s.path)
	if errors.Is(err, os.ErrNotExist) {
		return s
	}
	var rec subscription
	if err == nil {
		err = json.Unmarshal(b, &rec)
	}
	if err != nil {
		logger.Warn("mqtt subscriber: the record of the session's subscriptions is unreadable; subscribing to every topic again (the broker resends its retained messages)",
			"path", s.path, "error", err)
		return s
	}
	s.rec = rec
	return s
}

// brokerKey names the broker of URL broker: its host and port (or socket
// path), whatever the scheme and credentials.
func brokerKey(broker string) string {
	u, err := url.Parse(broker)
	if err != nil {
		return broker
	}
	if u.Host != "" {
		return u.Host
	}
	return u.Path
}

// plan returns what a connection whose CONNACK said sessionPresent sends.
// On a new session (or one the record is not of: another broker or
// client id) it subscribes to every configured filter. On a resumed one
// it subscribes to the configured filters the session does not hold, or
// holds at another QoS, and unsubscribes from the filters it holds that
// are no longer configured.
func (s *subscriptions) plan(sessionPresent bool) subscriptionPlan {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !sessionPresent || s.rec.Broker != s.broker || s.rec.ClientID != s.clientID {
		s.rec = subscription{Broker: s.broker, ClientID: s.clientID}
		return subscriptionPlan{sub: slices.Clone(s.topics)}
	}
	var p subscriptionPlan
	for _, t := range s.topics {
		if q, ok := s.rec.Filters[t]; !ok || q != s.qos {
			p.sub = append(p.sub, t)
		}
	}
	for _, f := range slices.Sorted(maps.Keys(s.rec.Filters)) {
		if !slices.Contains(s.topics, f) {
			p.unsub = append(p.unsub, f)
		}
	}
	return p
}

// subscribed records the broker's answer to a SUBSCRIBE of filters: codes
// in their order, 0x80 and above a refusal. It returns how many filters
// the session holds now.
func (s *subscriptions) subscribed(filters []string, codes []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.rec.Filters == nil {
		s.rec.Filters = make(map[string]byte)
	}
	for i, f := range filters {
		if i < len(codes) && codes[i] < 0x80 {
			s.rec.Filters[f] = s.qos
		} else {
			delete(s.rec.Filters, f)
		}
	}
	return len(s.rec.Filters), s.saveLocked()
}

// unsubscribed records that the session no longer holds filters.
func (s *subscriptions) unsubscribed(filters []string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, f := range filters {
		delete(s.rec.Filters, f)
	}
	return s.saveLocked()
}

// held returns how many filters the session holds, as far as known.
func (s *subscriptions) held() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.rec.Filters)
}

func (s *subscriptions) saveLocked() error {
	if s.path == "" {
		return nil
	}
	b, err := json.Marshal(s.rec)
	if err == nil {
		err = fsutil.WriteFile(s.path, b)
	}
	if err != nil {
		return fmt.Errorf("mqtt subscriber: record the session's subscriptions: %w", err)
	}
	return nil
}
