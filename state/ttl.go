package state

import (
	"fmt"
	"math"
	"time"
)

// TTLConfig sets the time to live of keyed state entries, in processing
// time: the clock of the backend. The zero value turns TTL off.
//
// An expired entry is never returned: reads treat it as absent, and a
// write to it starts afresh (an Aggregating state creates a new
// accumulator, a List starts empty). Expired entries are removed lazily,
// when a handle touches them, and incrementally by CleanupExpired.
//
// What expires: a Value, Reducing or Aggregating entry as a whole; a List as
// a whole (every write renews the whole list); a Map element by element.
type TTLConfig struct {
	// TTL is how long an entry lives after its last renewal. 0 turns TTL
	// off; negative is an error.
	TTL time.Duration
	// UpdateOnRead renews an entry when it is read as well. Default false:
	// only creating and writing an entry renew it.
	UpdateOnRead bool
}

// expiry returns the expiry time (Unix nanoseconds) of an entry renewed
// at now with a TTL of ttl nanoseconds, math.MaxInt64 when that is beyond
// what an int64 holds: a TTL of time.Duration(math.MaxInt64) ("forever")
// or of more than about 236 years from 2026 never expires, where the sum
// would wrap negative and expire every entry as it is written.
func expiry(now, ttl int64) int64 {
	if ttl > 0 && now > math.MaxInt64-ttl {
		return math.MaxInt64
	}
	return now + ttl
}

// validate reports a negative TTL.
func (c TTLConfig) validate() error {
	if c.TTL < 0 {
		return fmt.Errorf("%w: negative TTL %v", ErrDescriptor, c.TTL)
	}
	return nil
}

// CleanupExpired removes expired entries of the keyed states of b that have
// a TTL, checking at most maxEntries entries (a key and namespace of one
// state; the elements of a Map entry are checked together). Successive
// calls resume where the previous one stopped and go round all such states,
// so calling it with a small budget per record or per timer tick bounds
// both the work per call and how long expired state stays in memory. One
// call checks every entry at most once. It returns the number of values
// removed, a Map element counting as one value.
//
// Call it from the subtask's goroutine, like every use of b.
func CleanupExpired(b Backend, maxEntries int) int {
	if isNilBackend(b) || maxEntries <= 0 {
		return 0
	}
	return b.cleanupExpired(maxEntries)
}
