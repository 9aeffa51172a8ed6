package state

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"slices"

	bolt "go.etcd.io/bbolt"
)

// boltTable is one keyed state of a BoltBackend: a bucket, and the writes
// to it not committed yet. It deals in encoded keys and values; the
// handles encode and decode.
//
// The bucket's keys are entry keys: the key group in two big-endian bytes,
// the stream key and the namespace, encoded by their codecs; for Map state
// one bolt key per element, the entry key followed by the encoded user
// key. Values are the snapshot records' values (see snapshot_format.go).
type boltTable struct {
	b      *BoltBackend
	sp     spec
	bucket []byte
	isMap  bool
	// prefixLen returns the length of the entry key at the front of a
	// Map element's bolt key.
	prefixLen func(key []byte) (int, error)
	// accept checks a restored bolt key and value (boltCheck).
	accept func(key, val []byte) error
	// buf holds the buffered writes by entry key; bufOps counts them.
	buf    map[string]*bufEntry
	bufOps int
	// rb is the committed bucket in the backend's read transaction number
	// rbGen (nil when the bucket had not been committed yet).
	rb    *bolt.Bucket
	rbGen uint64
}

// bufEntry is the buffered write of one entry.
type bufEntry struct {
	// val, or del, is the entry's new value (not Map state).
	val []byte
	del bool
	// cleared says that the committed elements of the entry are deleted,
	// and elems holds written elements by encoded user key (Map state).
	cleared bool
	elems   map[string]*bufEntry
}

// bucketPrefix prefixes the bucket names of keyed states.
const bucketPrefix = "k/"

func newBoltTable(b *BoltBackend, s spec, prefixLen func([]byte) (int, error)) *boltTable {
	return &boltTable{
		b: b, sp: s,
		bucket:    []byte(bucketPrefix + s.name),
		isMap:     s.kind == kindMap,
		prefixLen: prefixLen,
		buf:       make(map[string]*bufEntry),
	}
}

func (t *boltTable) spec() *spec { return &t.sp }

// committed returns the committed bucket, nil if there is none yet.
func (t *boltTable) committed() *bolt.Bucket {
	tx := t.b.readTx()
	if t.rbGen != t.b.rgen {
		t.rb, t.rbGen = tx.Bucket(t.bucket), t.b.rgen
	}
	return t.rb
}

// getCommitted returns the committed value of key. (A cursor rather than
// Bucket.Get, which cannot tell an empty value from none.)
func (t *boltTable) getCommitted(key []byte) ([]byte, bool) {
	bk := t.committed()
	if bk == nil {
		return nil, false
	}
	k, v := bk.Cursor().Seek(key)
	if !bytes.Equal(k, key) {
		return nil, false
	}
	return v, true
}

// get returns the value of the entry key, buffered or committed. A
// committed value is valid until the next flush.
func (t *boltTable) get(key []byte) ([]byte, bool) {
	if e, ok := t.buf[string(key)]; ok {
		return e.val, !e.del
	}
	return t.getCommitted(key)
}

// entry returns the buffered write of key, creating it.
func (t *boltTable) entry(key []byte) *bufEntry {
	e, ok := t.buf[string(key)]
	if !ok {
		t.checkKeySize(len(key))
		e = new(bufEntry)
		t.buf[string(key)] = e
		t.b.markDirty(t, 1)
	}
	return e
}

// put buffers val, copied, as the value of key.
func (t *boltTable) put(key, val []byte) {
	e := t.entry(key)
	e.val = append(e.val[:0:0], val...)
	e.del = false
}

// del buffers the deletion of key.
func (t *boltTable) del(key []byte) {
	e := t.entry(key)
	e.val, e.del = nil, true
}

// getElem returns the value of the element uk of the Map entry prefix;
// full is prefix followed by uk.
func (t *boltTable) getElem(prefix, uk, full []byte) ([]byte, bool) {
	if e, ok := t.buf[string(prefix)]; ok {
		if op, ok := e.elems[string(uk)]; ok {
			return op.val, !op.del
		}
		if e.cleared {
			return nil, false
		}
	}
	return t.getCommitted(full)
}

// elem returns the buffered write of element uk of entry prefix.
func (t *boltTable) elem(prefix, uk []byte) *bufEntry {
	e := t.entry(prefix)
	op, ok := e.elems[string(uk)]
	if !ok {
		t.checkKeySize(len(prefix) + len(uk))
		if e.elems == nil {
			e.elems = make(map[string]*bufEntry)
		}
		op = new(bufEntry)
		e.elems[string(uk)] = op
		t.b.markDirty(t, 1)
	}
	return op
}

// putElem buffers val, copied, as the value of element uk of entry prefix.
func (t *boltTable) putElem(prefix, uk, val []byte) {
	op := t.elem(prefix, uk)
	op.val = append(op.val[:0:0], val...)
	op.del = false
}

// delElem buffers the deletion of element uk of entry prefix.
func (t *boltTable) delElem(prefix, uk []byte) {
	op := t.elem(prefix, uk)
	op.val, op.del = nil, true
}

// clearEntry buffers the deletion of every element of the Map entry
// prefix.
func (t *boltTable) clearEntry(prefix []byte) {
	e := t.entry(prefix)
	e.cleared = true
	clear(e.elems)
}

// forEachElem calls fn with every element of the Map entry prefix, in no
// particular order. Committed slices are valid until the next flush; fn
// must not write to the table.
func (t *boltTable) forEachElem(prefix []byte, fn func(uk, val []byte)) {
	e := t.buf[string(prefix)]
	if e == nil || !e.cleared {
		if bk := t.committed(); bk != nil {
			c := bk.Cursor()
			for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
				uk := k[len(prefix):]
				if e != nil {
					if _, ok := e.elems[string(uk)]; ok {
						continue
					}
				}
				fn(uk, v)
			}
		}
	}
	if e != nil {
		for uk, op := range e.elems {
			if !op.del {
				fn([]byte(uk), op.val)
			}
		}
	}
}

// apply writes the buffered writes in tx, in key order.
func (t *boltTable) apply(tx *bolt.Tx) error {
	bk, err := tx.CreateBucketIfNotExists(t.bucket)
	if err != nil {
		return err
	}
	for _, k := range slices.Sorted(maps.Keys(t.buf)) {
		e := t.buf[k]
		key := []byte(k)
		if !t.isMap {
			if e.del {
				err = bk.Delete(key)
			} else {
				err = bk.Put(key, e.val)
			}
			if err != nil {
				return err
			}
			continue
		}
		if e.cleared {
			var old [][]byte
			c := bk.Cursor()
			for ck, _ := c.Seek(key); ck != nil && bytes.HasPrefix(ck, key); ck, _ = c.Next() {
				old = append(old, bytes.Clone(ck))
			}
			for _, ck := range old {
				if err := bk.Delete(ck); err != nil {
					return err
				}
			}
		}
		for _, uk := range slices.Sorted(maps.Keys(e.elems)) {
			op := e.elems[uk]
			full := append(key[:len(key):len(key)], uk...)
			if op.del {
				err = bk.Delete(full)
			} else {
				err = bk.Put(full, op.val)
			}
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// MaxBoltKeyBytes is the longest entry key (encoded key and namespace,
// with the state's prefix) the bolt backend holds: bbolt's bound.
const MaxBoltKeyBytes = bolt.MaxKeySize

// checkKeySize fails on a key bbolt would refuse at the next commit, so
// that the failure comes from the write that made it.
func (t *boltTable) checkKeySize(n int) {
	if n > bolt.MaxKeySize {
		panic(fmt.Errorf("%w: state %q: an entry key of %d bytes exceeds bbolt's %d", ErrKeyTooLarge, t.sp.name, n, bolt.MaxKeySize))
	}
}

// resetBuffer drops the buffered writes once committed.
func (t *boltTable) resetBuffer() {
	clear(t.buf)
	t.bufOps = 0
}

// len counts the entries, after committing the buffer.
func (t *boltTable) len() int {
	t.b.mustFlush()
	bk := t.committed()
	if bk == nil {
		return 0
	}
	n := 0
	var last []byte
	c := bk.Cursor()
	for k, _ := c.First(); k != nil; k, _ = c.Next() {
		if !t.isMap {
			n++
			continue
		}
		pl := t.mustPrefixLen(k)
		if last == nil || !bytes.Equal(k[:pl], last) {
			n++
			last = append(last[:0], k[:pl]...)
		}
	}
	return n
}

// mustPrefixLen returns the length of the entry key of the Map element key
// k, and fails the backend if k does not decode.
func (t *boltTable) mustPrefixLen(k []byte) int {
	pl, err := t.prefixLen(k)
	if err != nil {
		t.b.fail(fmt.Errorf("state %q: stored key %x: %w", t.sp.name, k, err))
	}
	return pl
}

// check calls fn with every committed key and value, and returns the
// first error, wrapped in ErrCorruptSnapshot.
func (t *boltTable) check(fn func(key, val []byte) error) error {
	t.b.mustFlush()
	bk := t.committed()
	if bk == nil {
		return nil
	}
	c := bk.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		if err := fn(k, v); err != nil {
			if !errors.Is(err, ErrCorruptSnapshot) {
				err = fmt.Errorf("%w: %w", ErrCorruptSnapshot, err)
			}
			return fmt.Errorf("key %x: %w", k, err)
		}
	}
	return nil
}
