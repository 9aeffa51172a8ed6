package state

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"

	bolt "go.etcd.io/bbolt"

	"github.com/edgedio/edged/keygroup"
)

// snapshot implements Snapshot for the bolt backend, of the key groups in
// want (b's, or some of them): it commits the buffer and opens a read
// transaction, a consistent view that WriteTo reads while the owner goes
// on writing. The bolt layout is the stream's, so WriteTo copies bytes.
func (b *BoltBackend) snapshot(want keygroup.Range) (*KeyedSnapshot, error) {
	if b.closed {
		return nil, ErrClosed
	}
	if err := b.flush(); err != nil {
		return nil, err
	}
	timers, err := b.registry.captureTimers(b.groups, want)
	if err != nil {
		return nil, err
	}
	tx, err := b.db.Begin(false)
	if err != nil {
		return nil, fmt.Errorf("state: bolt backend %s: begin snapshot: %w", b.path, err)
	}
	states := timers
	for _, t := range b.tables {
		states = append(states, snapState{meta: metaOf(&t.sp), src: boltSource{tx: tx, bucket: t.bucket}})
	}
	for _, p := range b.registry.pendingStates() {
		var src recordSource = rawSource(p.groups)
		if p.meta.kind != kindTimers {
			src = boltSource{tx: tx, bucket: []byte(bucketPrefix + p.meta.name)}
		}
		states = append(states, snapState{meta: p.meta, src: src})
	}
	return newKeyedSnapshot(want, states, tx.Rollback), nil
}

// boltSource reads the records of a bucket in a snapshot's read
// transaction.
type boltSource struct {
	tx     *bolt.Tx
	bucket []byte
}

func (s boltSource) records(g int, w *recordWriter) error {
	bk := s.tx.Bucket(s.bucket)
	if bk == nil {
		return nil
	}
	var prefix [2]byte
	binary.BigEndian.PutUint16(prefix[:], uint16(g))
	c := bk.Cursor()
	for k, v := c.Seek(prefix[:]); k != nil && bytes.HasPrefix(k, prefix[:]); k, v = c.Next() {
		w.add(k[2:], v)
	}
	return nil
}

// restoreGroup writes the records of the keyed states of key group g into
// their buckets, in one transaction, and keeps the timers' records for
// their queues.
func (b *BoltBackend) restoreGroup(g int, states []sectionState) error {
	if b.closed {
		return ErrClosed
	}
	if err := b.flush(); err != nil {
		return err
	}
	b.closeRead()
	var keyed []sectionState
	for _, st := range states {
		if st.meta.kind == kindTimers {
			if err := b.registry.addRecords(st.meta, g, st.records); err != nil {
				return err
			}
			continue
		}
		if _, err := b.registry.add(st.meta); err != nil {
			return err
		}
		keyed = append(keyed, st)
	}
	err := b.db.Update(func(tx *bolt.Tx) error {
		for _, st := range keyed {
			if err := putSection(tx, g, st); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("state: restore key group %d into %s: %w", g, b.path, err)
	}
	return nil
}

// putSection writes the records of the keyed state st of key group g into
// its bucket.
func putSection(tx *bolt.Tx, g int, st sectionState) error {
	type kv struct{ k, v []byte }
	bk, err := tx.CreateBucketIfNotExists([]byte(bucketPrefix + st.meta.name))
	if err != nil {
		return err
	}
	recs := make([]kv, 0, st.records.count)
	err = forEachRecord(st.records, func(key, val []byte) error {
		recs = append(recs, kv{groupKey(g, key), val})
		return nil
	})
	if err != nil {
		return err
	}
	slices.SortFunc(recs, func(a, b kv) int { return bytes.Compare(a.k, b.k) })
	for _, r := range recs {
		if err := bk.Put(r.k, r.v); err != nil {
			return err
		}
	}
	return nil
}

// groupKey returns the bolt key of the record key key of key group g.
func groupKey(g int, key []byte) []byte {
	k := binary.BigEndian.AppendUint16(make([]byte, 0, 2+len(key)), uint16(g))
	return append(k, key...)
}
