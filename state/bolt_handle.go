package state

import (
	"encoding/binary"
	"fmt"

	"github.com/jonboulle/clockwork"

	"github.com/edgedio/edged/codec"
)

// boltHandle is what every bolt-backend handle is made of: the table, the
// scope (key context and namespace), the TTL policy, and the encoded key
// of the current key and namespace, kept while the key context has not
// moved (KeyContext.gen) and the namespace has not changed.
//
// Every method of a handle calls begin first: the backend commits its
// buffer there if it is full, never later in the method, so committed
// bytes a method reads stay valid to its end. Methods decode what they
// read before they call user functions (Reduce, Add, Merge), which may use
// other handles.
type boltHandle[K, N comparable] struct {
	kc *KeyContext[K]
	t  *boltTable
	kd codec.Codec[K]
	nd codec.Codec[N]
	ns N
	// ttl is the time to live in nanoseconds, 0 when entries do not
	// expire as a whole.
	ttl          int64
	updateOnRead bool
	clock        clockwork.Clock

	kb    []byte
	kbGen uint64
	kbOK  bool
	// other holds the key of another namespace (merges); val is scratch
	// for values.
	other []byte
	val   []byte
}

func newBoltHandle[K, N comparable](b *BoltBackend, kc *KeyContext[K], t *boltTable, ttl TTLConfig) boltHandle[K, N] {
	return boltHandle[K, N]{
		kc: kc, t: t,
		kd:  t.sp.codecs.key.(codec.Codec[K]),
		nd:  t.sp.codecs.namespace.(codec.Codec[N]),
		ttl: int64(ttl.TTL), updateOnRead: ttl.UpdateOnRead, clock: b.clock,
	}
}

// begin starts a method: it commits the backend's buffer if it is full.
func (h *boltHandle[K, N]) begin() { h.t.b.maybeFlush() }

// SetNamespace scopes the handle to namespace n until the next call.
func (h *boltHandle[K, N]) SetNamespace(n N) {
	h.ns = n
	h.kbOK = false
}

// Clear removes the entry of the current key and namespace.
func (h *boltHandle[K, N]) Clear() {
	h.begin()
	if h.t.isMap {
		h.t.clearEntry(h.key())
		return
	}
	h.t.del(h.key())
}

func (h *boltHandle[K, N]) now() int64 { return h.clock.Now().UnixNano() }

// key returns the entry key of the current key and namespace.
func (h *boltHandle[K, N]) key() []byte {
	if h.kbOK && h.kbGen == h.kc.gen {
		return h.kb
	}
	h.kb = h.appendKey(h.kb[:0], h.ns)
	h.kbGen, h.kbOK = h.kc.gen, true
	return h.kb
}

// keyFor returns the entry key of the current key in namespace n, valid
// until the next call.
func (h *boltHandle[K, N]) keyFor(n N) []byte {
	h.other = h.appendKey(h.other[:0], n)
	return h.other
}

func (h *boltHandle[K, N]) appendKey(dst []byte, n N) []byte {
	if !h.kc.has {
		panic(noCurrentKey(h.t.sp.name))
	}
	g := h.kc.group
	if !h.t.b.groups.Contains(g) {
		panic(fmt.Sprintf("state %q: key group %d outside the backend's key groups %v (KeyContext not set?)", h.t.sp.name, g, h.t.b.groups))
	}
	dst = binary.BigEndian.AppendUint16(dst, uint16(g))
	dst, err := h.kd.Append(dst, h.kc.key)
	if err == nil {
		dst, err = h.nd.Append(dst, n)
	}
	if err != nil {
		panic(fmt.Errorf("state %q: encoding key %v: %w", h.t.sp.name, h.kc.key, err))
	}
	return dst
}

// corrupt fails the backend for a stored value that does not decode.
func (h *boltHandle[K, N]) corrupt(err error) {
	h.t.b.fail(fmt.Errorf("state %q: stored value of key %v: %w", h.t.sp.name, h.kc.key, err))
}

// split returns the expiry time and payload of a stored value (of an
// entry, or of a Map element).
func (h *boltHandle[K, N]) split(raw []byte) (exp int64, payload []byte) {
	if h.t.sp.ttl.TTL == 0 {
		return 0, raw
	}
	if len(raw) < 8 {
		h.corrupt(fmt.Errorf("%d bytes, no expiry time", len(raw)))
	}
	return int64(binary.BigEndian.Uint64(raw)), raw[8:]
}

// read returns the payload of the live entry at key, or false. It deletes
// an expired entry, and renews a live one if the TTL says so.
func (h *boltHandle[K, N]) read(key []byte) ([]byte, bool) {
	raw, ok := h.t.get(key)
	if !ok || h.ttl == 0 {
		return raw, ok
	}
	exp, payload := h.split(raw)
	now := h.now()
	if now >= exp {
		h.t.del(key)
		return nil, false
	}
	if h.updateOnRead {
		h.val = append(binary.BigEndian.AppendUint64(h.val[:0], uint64(expiry(now, h.ttl))), payload...)
		h.t.put(key, h.val)
	}
	return payload, true
}

// readForWrite returns the payload of the entry at key for a write that
// renews it: an expired entry counts as absent.
func (h *boltHandle[K, N]) readForWrite(key []byte) ([]byte, bool) {
	raw, ok := h.t.get(key)
	if !ok || h.ttl == 0 {
		return raw, ok
	}
	exp, payload := h.split(raw)
	if h.now() >= exp {
		return nil, false
	}
	return payload, true
}

// startValue returns h.val emptied, with room for the expiry time of a TTL
// entry; finishValue fills that in.
func (h *boltHandle[K, N]) startValue() []byte {
	if h.ttl == 0 {
		return h.val[:0]
	}
	return append(h.val[:0], 0, 0, 0, 0, 0, 0, 0, 0)
}

// write stores v, built on startValue, as the entry at key, renewed.
func (h *boltHandle[K, N]) write(key, v []byte) {
	if h.ttl != 0 {
		binary.BigEndian.PutUint64(v, uint64(expiry(h.now(), h.ttl)))
	}
	h.val = v
	h.t.put(key, v)
}

// take deletes the entry of the current key in namespace n and returns
// its payload; ok is false when there was none or it had expired.
func (h *boltHandle[K, N]) take(n N) (payload []byte, ok bool) {
	key := h.keyFor(n)
	raw, found := h.t.get(key)
	if !found {
		return nil, false
	}
	h.t.del(key)
	if h.ttl == 0 {
		return raw, true
	}
	exp, payload := h.split(raw)
	return payload, h.now() < exp
}

// boltMerge folds the values of the current key in namespaces sources
// into its value in target, Merge(acc, v) in the order given, and removes
// the sources; a source equal to target is skipped.
func boltMerge[K, N comparable, T any](h *boltHandle[K, N], target N, sources []N, dec func([]byte) T, enc func([]byte, T) []byte, merge func(acc, v T) T) {
	h.begin()
	var acc T
	have, merged := false, false
	if p, ok := h.read(h.keyFor(target)); ok {
		acc, have = dec(p), true
	}
	for _, s := range sources {
		if s == target {
			continue
		}
		p, ok := h.take(s)
		if !ok {
			continue
		}
		v := dec(p)
		if have {
			acc = merge(acc, v)
		} else {
			acc, have = v, true
		}
		merged = true
	}
	if merged {
		key := h.keyFor(target)
		h.write(key, enc(h.startValue(), acc))
	}
}

// decoder returns a function decoding one value with c, failing the
// backend on error.
func decoder[K, N comparable, V any](h *boltHandle[K, N], c codec.Codec[V]) func([]byte) V {
	return func(p []byte) V {
		v, err := decodeAll(c, p)
		if err != nil {
			h.corrupt(err)
		}
		return v
	}
}

// encoder returns a function appending the encoding of a value by c,
// panicking on error (a value the codec cannot encode).
func encoder[K, N comparable, V any](h *boltHandle[K, N], c codec.Codec[V]) func([]byte, V) []byte {
	return func(dst []byte, v V) []byte {
		out, err := c.Append(dst, v)
		if err != nil {
			panic(fmt.Errorf("state %q: encoding value of key %v: %w", h.t.sp.name, h.kc.key, err))
		}
		return out
	}
}

// boltCheck returns the function that checks a restored bolt key and
// value of state s: the key is the key group (in b's key groups), a key
// and a namespace, then what suffix accepts (nothing, or a Map's user
// key); the value an expiry time if s has a TTL, then what payload
// accepts.
func boltCheck[K, N comparable](b *BoltBackend, s *spec, suffix, payload func([]byte) error) func(key, val []byte) error {
	// The codecs are missing only when boltTableFor refuses the state.
	kd, _ := s.codecs.key.(codec.Codec[K])
	nd, _ := s.codecs.namespace.(codec.Codec[N])
	ttl := s.ttl.TTL > 0
	return func(key, val []byte) error {
		if len(key) < 2 || !b.groups.Contains(int(binary.BigEndian.Uint16(key))) {
			return fmt.Errorf("%w: key outside the key groups %v", ErrCorruptSnapshot, b.groups)
		}
		_, n1, err := kd.Decode(key[2:])
		if err != nil {
			return fmt.Errorf("key: %w", err)
		}
		_, n2, err := nd.Decode(key[2+n1:])
		if err != nil {
			return fmt.Errorf("namespace: %w", err)
		}
		if err := suffix(key[2+n1+n2:]); err != nil {
			return err
		}
		if ttl {
			if len(val) < 8 {
				return fmt.Errorf("%w: value of %d bytes has no expiry time", ErrCorruptSnapshot, len(val))
			}
			val = val[8:]
		}
		return payload(val)
	}
}

// noSuffix accepts an entry key that ends after its namespace.
func noSuffix(b []byte) error {
	if len(b) != 0 {
		return fmt.Errorf("%w: %d bytes after the namespace", ErrCorruptSnapshot, len(b))
	}
	return nil
}

// checkOne returns the function accepting exactly one value of c.
func checkOne[V any](c codec.Codec[V]) func([]byte) error {
	return func(b []byte) error {
		_, err := decodeAll(c, b)
		return err
	}
}
