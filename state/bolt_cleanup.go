package state

import (
	"bytes"
	"encoding/binary"
)

// boltCleanupCursor is where CleanupExpired resumes among the committed
// entries of the TTL states of a BoltBackend.
type boltCleanupCursor struct {
	// active says a pass over all TTL states is under way; table and
	// after (the last bolt key checked, nil for none) say where.
	active bool
	table  int
	after  []byte
}

// cleanupExpired implements CleanupExpired. It walks the committed entries
// in passes: a pass starts by committing the buffer, so that it sees every
// entry written before it, and a call stops at the end of a pass, so that
// it checks no entry twice. Entries with buffered writes are skipped (a
// write renewed them); the next pass checks them.
func (b *BoltBackend) cleanupExpired(maxEntries int) int {
	if len(b.ttl) == 0 {
		return 0
	}
	c := &b.cleanup
	if b.closed {
		panic(ErrClosed)
	}
	if !c.active {
		b.mustFlush()
		c.active, c.table, c.after = true, 0, c.after[:0]
	}
	now := b.clock.Now().UnixNano()
	budget, removed := maxEntries, 0
	for budget > 0 && c.table < len(b.ttl) {
		checked, rm, last := b.ttl[c.table].expire(now, c.after, budget)
		budget -= checked
		removed += rm
		if last == nil {
			c.table++
			c.after = c.after[:0]
		} else {
			c.after = append(c.after[:0], last...)
		}
	}
	if c.table >= len(b.ttl) {
		c.active = false
	}
	return removed
}

// expire checks at most budget entries after the bolt key after (from the
// first when empty) and deletes the expired ones (the expired elements of
// a Map entry). It returns the number of entries checked, of values
// removed, and the last key checked, or nil when it reached the end.
func (t *boltTable) expire(now int64, after []byte, budget int) (checked, removed int, last []byte) {
	bk := t.committed()
	if bk == nil {
		return 0, 0, nil
	}
	type doomed struct{ prefix, uk []byte }
	var del []doomed
	c := bk.Cursor()
	var k, v []byte
	if len(after) == 0 {
		k, v = c.First()
	} else if k, v = c.Seek(after); bytes.Equal(k, after) {
		k, v = c.Next()
	}
	var prefix []byte // the Map entry being checked
	skip := false     // it has buffered writes
	for ; k != nil; k, v = c.Next() {
		if !t.isMap {
			if checked == budget {
				break
			}
			checked++
			last = k
			if _, ok := t.buf[string(k)]; ok || len(v) < 8 {
				continue
			}
			if now >= int64(binary.BigEndian.Uint64(v)) {
				del = append(del, doomed{prefix: bytes.Clone(k)})
			}
			continue
		}
		pl := t.mustPrefixLen(k)
		if prefix == nil || !bytes.Equal(k[:pl], prefix) {
			if checked == budget {
				break
			}
			checked++
			prefix = k[:pl:pl]
			_, skip = t.buf[string(prefix)]
		}
		last = k
		if skip || len(v) < 8 {
			continue
		}
		if now >= int64(binary.BigEndian.Uint64(v)) {
			del = append(del, doomed{prefix: bytes.Clone(prefix), uk: bytes.Clone(k[pl:])})
		}
	}
	if k == nil {
		last = nil
	} else {
		last = bytes.Clone(last)
	}
	for _, d := range del {
		if t.isMap {
			t.delElem(d.prefix, d.uk)
		} else {
			t.del(d.prefix)
		}
	}
	return checked, len(del), last
}
