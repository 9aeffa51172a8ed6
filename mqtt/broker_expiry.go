package mqtt

import (
	"reflect"
	"time"
	"unsafe"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// mochi expires queued messages (MQTT 5 message expiry, and its maximum
// of a day for every message) in a pass it runs once a second over every
// client, which copies and sorts all the messages queued for the client:
// about 270 ms for a persistent session holding 65,535, every second,
// with the allocation to match. An offline consumer of a busy topic made
// the whole broker crawl. The broker runs that pass itself instead, on
// each client no more often than its queue's length allows (expiryPeriod).

// expiryBatch is the queued messages whose expiry pass per second the
// broker accepts for one client; a client with more is passed over less
// often (expiryPeriod).
const expiryBatch = 4096

// maxExpiryPeriod bounds the wait between two expiry passes of a client:
// an expired message is dropped at most this late.
const maxExpiryPeriod = 16 * time.Second

// expiryPeriod returns how long after one expiry pass over a client with
// queued messages queued comes the next: a second up to expiryBatch, one
// more second per expiryBatch beyond, up to maxExpiryPeriod. The cost of
// the passes stays about that of a pass over expiryBatch messages a
// second per client, whatever its queue.
func expiryPeriod(queued int) time.Duration {
	return min(time.Duration(1+queued/expiryBatch)*time.Second, maxExpiryPeriod)
}

// stopLibraryExpiry stops the ticker of mochi's own once-a-second expiry
// pass (Server.loop.inflightExpiry); it reports false, leaving it, if
// mochi no longer has that field. It runs before Serve starts the loop
// that reads the ticker.
func stopLibraryExpiry(s *mochi.Server) bool {
	loop := reflect.ValueOf(s).Elem().FieldByName("loop")
	if loop.Kind() != reflect.Pointer || loop.IsNil() {
		return false
	}
	f := loop.Elem().FieldByName("inflightExpiry")
	if !f.IsValid() || f.Type() != reflect.TypeFor[*time.Ticker]() {
		return false
	}
	field := (**time.Ticker)(unsafe.Pointer(f.UnsafeAddr()))
	if *field == nil {
		return false
	}
	(*field).Stop()
	*field = new(time.Ticker) // a nil channel: the loop's case never fires
	return true
}

// libraryExpiryStopped reports whether stopLibraryExpiry stopped s's
// ticker. For tests.
func libraryExpiryStopped(s *mochi.Server) bool {
	f := reflect.ValueOf(s).Elem().FieldByName("loop").Elem().FieldByName("inflightExpiry")
	t := *(**time.Ticker)(unsafe.Pointer(f.UnsafeAddr()))
	return t != nil && t.C == nil
}

// expireLoop runs the expiry passes until the broker closes: every
// second it passes over each client whose period (expiryPeriod) is up.
func (b *Broker) expireLoop() {
	defer b.flushers.Done()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	next := map[*mochi.Client]time.Time{}
	for {
		select {
		case <-b.ctx.Done():
			return
		case now := <-tick.C:
			b.expirePass(now, next)
		}
	}
}

// expirePass passes over the clients of the broker whose time in next
// is up (a client not in next is due), dropping their expired queued
// messages as mochi's pass does, and forgets the clients that are gone.
func (b *Broker) expirePass(now time.Time, next map[*mochi.Client]time.Time) {
	clients := b.server.Clients.GetAll()
	for cl := range next {
		if c, ok := clients[cl.ID]; !ok || c != cl {
			delete(next, cl)
		}
	}
	maxExpiry := b.server.Options.Capabilities.MaximumMessageExpiryInterval
	for _, cl := range clients {
		queued := cl.State.Inflight.Len()
		if queued == 0 {
			delete(next, cl)
			continue
		}
		if due, ok := next[cl]; ok && now.Before(due) {
			continue
		}
		// ClearExpiredInflights calls the hooks' OnQosDropped for each
		// message it drops (mochi's pass calls them a second time with
		// only the packet id, which the hooks here ignore). It copies
		// and sorts every queued message first (800 bytes each: 52 MB
		// for a queue of 65,535), so it runs only when one has expired.
		if expired, known := anyExpired(cl.State.Inflight, now.Unix(), maxExpiry); expired || !known {
			cl.ClearExpiredInflights(now.Unix(), maxExpiry)
		}
		next[cl] = now.Add(expiryPeriod(queued) - time.Second/2)
	}
}

// expiredPacket reports whether ClearExpiredInflights drops pk at now
// (Unix seconds) with the broker's maximum message expiry maxExpiry: an
// MQTT 5 message past its expiry, or any message older than maxExpiry.
func expiredPacket(pk *packets.Packet, now, maxExpiry int64) bool {
	return (pk.ProtocolVersion == 5 && pk.Expiry > 0 && pk.Expiry < now) ||
		(maxExpiry > 0 && now-pk.Created > maxExpiry)
}

// anyExpired reports whether a message queued in in has expired at now
// (expiredPacket), reading mochi's map of them in place instead of the
// copy Inflight.GetAll makes; known is false, and expired too, if mochi
// no longer keeps them in that map, and the caller passes over the
// queue as before.
func anyExpired(in *mochi.Inflight, now, maxExpiry int64) (expired, known bool) {
	f := reflect.ValueOf(in).Elem().FieldByName("internal")
	if !f.IsValid() || f.Type() != reflect.TypeFor[map[uint16]packets.Packet]() {
		return false, false
	}
	m := *(*map[uint16]packets.Packet)(unsafe.Pointer(f.UnsafeAddr()))
	in.RLock()
	defer in.RUnlock()
	for _, pk := range m {
		if expiredPacket(&pk, now, maxExpiry) {
			return true, true
		}
	}
	return false, true
}
