package state

import (
	"github.com/jonboulle/clockwork"
)

// memHandle is what every memory-backend handle is made of: the table, the
// scope (key context and namespace), the TTL policy and a cache of the
// current entry.
//
// The cache makes Get followed by Update on the same key cost one map
// lookup: the entry pointer is kept while the key context has not moved to
// another key (KeyContext.gen), the namespace has not changed, and no entry
// of the table has moved (memTable.epoch).
type memHandle[K, N comparable, T any] struct {
	kc *KeyContext[K]
	t  *memTable[K, N, T]
	ns N
	// ttl is the time to live in nanoseconds, 0 when entries do not
	// expire as a whole.
	ttl          int64
	updateOnRead bool
	clock        clockwork.Clock

	cached     *entry[K, N, T]
	cacheGen   uint64
	cacheEpoch uint64
}

func newMemHandle[K, N comparable, T any](b *MemoryBackend, kc *KeyContext[K], t *memTable[K, N, T], ttl TTLConfig) memHandle[K, N, T] {
	return memHandle[K, N, T]{kc: kc, t: t, ttl: int64(ttl.TTL), updateOnRead: ttl.UpdateOnRead, clock: b.clock}
}

// SetNamespace scopes the handle to namespace n (for windows: the window)
// until the next call.
func (h *memHandle[K, N, T]) SetNamespace(n N) {
	h.ns = n
	h.cached = nil
}

// Clear removes the entry of the current key and namespace.
func (h *memHandle[K, N, T]) Clear() {
	h.t.remove(h.group(), h.key())
	h.cached = nil
}

// group returns the current key's key group. It panics with
// ErrNoCurrentKey while the key context has no key: its group is then 0,
// a real key group of the first subtask, or that of the key it had last.
func (h *memHandle[K, N, T]) group() *memGroup[K, N, T] {
	if !h.kc.has {
		panic(noCurrentKey(h.t.sp.name))
	}
	return h.t.group(h.kc.group)
}

func (h *memHandle[K, N, T]) key() nsKey[K, N] { return nsKey[K, N]{h.kc.key, h.ns} }

func (h *memHandle[K, N, T]) now() int64 { return h.clock.Now().UnixNano() }

// lookup returns the entry of the current key and namespace, expired or
// not, or nil.
func (h *memHandle[K, N, T]) lookup() *entry[K, N, T] {
	if h.cached != nil && h.cacheGen == h.kc.gen && h.cacheEpoch == h.t.epoch {
		return h.cached
	}
	e := h.t.find(h.group(), h.key())
	h.remember(e)
	return e
}

func (h *memHandle[K, N, T]) remember(e *entry[K, N, T]) {
	h.cached, h.cacheGen, h.cacheEpoch = e, h.kc.gen, h.t.epoch
}

// read returns the live entry of the current key and namespace, or nil. It
// removes an expired entry, and renews a live one if the TTL says so.
func (h *memHandle[K, N, T]) read() *entry[K, N, T] {
	e := h.lookup()
	if e == nil || h.ttl == 0 {
		return e
	}
	now := h.now()
	if now >= e.exp {
		h.Clear()
		return nil
	}
	if h.updateOnRead {
		e.exp = expiry(now, h.ttl)
	}
	return e
}

// write returns the entry of the current key and namespace for writing,
// renewed, creating it when absent. fresh reports that the entry holds the
// zero T because it was just created or had expired.
func (h *memHandle[K, N, T]) write() (e *entry[K, N, T], fresh bool) {
	e = h.lookup()
	if e == nil {
		e = h.t.insert(h.group(), h.key())
		h.remember(e)
		fresh = true
	}
	if h.ttl == 0 {
		return e, fresh
	}
	now := h.now()
	if !fresh && now >= e.exp {
		var zero T
		e.v, fresh = zero, true
	}
	e.exp = expiry(now, h.ttl)
	return e, fresh
}

// set stores v in e, the current entry as returned by write when the
// table's epoch was epoch. If entries moved since (user code in between
// touched the table), it finds the entry anew.
func (h *memHandle[K, N, T]) set(e *entry[K, N, T], epoch uint64, v T) {
	if h.t.epoch != epoch {
		e, _ = h.write()
	}
	e.v = v
}

// take removes the entry of the current key in namespace n and returns its
// value; ok is false when there was none or it had expired.
func (h *memHandle[K, N, T]) take(n N) (v T, ok bool) {
	grp := h.group()
	k := nsKey[K, N]{h.kc.key, n}
	i, found := grp.index[k]
	if !found {
		return v, false
	}
	e := &grp.slots[i]
	v, ok = e.v, h.ttl == 0 || h.now() < e.exp
	h.t.removeAt(grp, i)
	h.cached = nil
	return v, ok
}

// mergeNamespaces folds the values of the current key in namespaces
// sources into its value in target with merge, in the order given, and
// removes the sources. A source equal to target is skipped.
func (h *memHandle[K, N, T]) mergeNamespaces(target N, sources []N, merge func(acc, v T) T) {
	saved := h.ns
	defer h.SetNamespace(saved)
	h.SetNamespace(target)
	var acc T
	have, merged := false, false
	if e := h.read(); e != nil {
		acc, have = e.v, true
	}
	for _, s := range sources {
		if s == target {
			continue
		}
		v, ok := h.take(s)
		if !ok {
			continue
		}
		if have {
			acc = merge(acc, v)
		} else {
			acc, have = v, true
		}
		merged = true
	}
	if merged {
		e, _ := h.write()
		e.v = acc
	}
}
