package cluster

import (
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/codec"
)

// BatchEncoder fills the body of one record batch, capped in records and in
// bytes: a batch crossing nodes must fit in a frame, whatever the records
// weigh. The body has the layout of the runtime's wire batch
// (actors/wire.go): the uvarint count of timestamps shifted left by one
// (the low bit, set when all records share one timestamp written once, is
// clear here), each timestamp as a zig-zag varint delta from the one
// before, the uvarint count of records, then the records as
// codec.AppendBatch writes them; the runtime's tasks number the strings
// of their records per channel besides (codec.AppendBatchDict), which
// this encoder and DecodeBatch do not.
//
// Not safe for concurrent use; the sending task owns it.
type BatchEncoder[T any] struct {
	codec      codec.Codec[T]
	maxRecords int
	maxBytes   int
	ts         []byte // timestamp deltas
	recs       []byte // encoded records
	n          int
	prevTS     int64
	scratch    []byte
}

// NewBatchEncoder returns an encoder of batches of at most maxRecords
// records and maxBytes body bytes (both at least 1).
func NewBatchEncoder[T any](c codec.Codec[T], maxRecords, maxBytes int) *BatchEncoder[T] {
	return &BatchEncoder[T]{codec: c, maxRecords: max(1, maxRecords), maxBytes: max(1, maxBytes)}
}

// Len returns the number of records in the open batch.
func (e *BatchEncoder[T]) Len() int { return e.n }

// Size returns the body size the open batch would encode to, in bytes.
func (e *BatchEncoder[T]) Size() int {
	return uvarintLen(uint64(e.n)<<1) + uvarintLen(uint64(e.n)) + len(e.ts) + len(e.recs)
}

// Full reports whether the open batch holds its maximum of records.
func (e *BatchEncoder[T]) Full() bool { return e.n >= e.maxRecords }

// Add appends v with event timestamp ts to the open batch. It returns false,
// adding nothing, when the batch is full or v would take it past the byte
// cap: the caller sends the batch (Flush) and adds v again. A record that
// alone exceeds the byte cap is an error wrapping ErrRecordTooLarge.
func (e *BatchEncoder[T]) Add(ts int64, v T) (bool, error) {
	if e.n >= e.maxRecords {
		return false, nil
	}
	var err error
	e.scratch, err = e.codec.Append(e.scratch[:0], v)
	if err != nil {
		return false, fmt.Errorf("encode record: %w", err)
	}
	d := ts - e.prevTS
	grow := varintLen(d) + len(e.scratch) +
		uvarintLen(uint64(e.n+1)<<1) - uvarintLen(uint64(e.n)<<1) +
		uvarintLen(uint64(e.n+1)) - uvarintLen(uint64(e.n))
	if e.Size()+grow > e.maxBytes {
		if e.n == 0 {
			return false, fmt.Errorf("%w: %d bytes, cap %d", ErrRecordTooLarge, grow+2, e.maxBytes)
		}
		return false, nil
	}
	e.ts = binary.AppendVarint(e.ts, d)
	e.recs = append(e.recs, e.scratch...)
	e.prevTS = ts
	e.n++
	return true, nil
}

// Flush appends the open batch's body to dst, starts a new batch and
// returns dst. An empty batch appends nothing.
func (e *BatchEncoder[T]) Flush(dst []byte) []byte {
	if e.n == 0 {
		return dst
	}
	dst = binary.AppendUvarint(dst, uint64(e.n)<<1)
	dst = append(dst, e.ts...)
	dst = binary.AppendUvarint(dst, uint64(e.n))
	dst = append(dst, e.recs...)
	e.ts, e.recs, e.n, e.prevTS = e.ts[:0], e.recs[:0], 0, 0
	return dst
}

// DecodeBatch decodes a batch body into ts[:0] and items[:0]: one batch,
// or several one after the other, as a frame carries them when batches
// joined one waiting for credit (Send.Merge). Each batch is
// self-delimiting: its records are decoded one by one. It never panics; a
// corrupt body gives an error wrapping ErrCorruptFrame (and the codec's
// error, if it failed).
func DecodeBatch[T any](c codec.Codec[T], ts []int64, items []T, src []byte) ([]int64, []T, error) {
	ts, items = ts[:0], items[:0]
	for {
		var err error
		if ts, items, src, err = decodeOneBatch(c, ts, items, src); err != nil {
			clear(items)
			return ts[:0], items[:0], err
		}
		if len(src) == 0 {
			return ts, items, nil
		}
	}
}

// decodeOneBatch decodes the batch at the start of src, appending to ts
// and items, and returns the bytes after it.
func decodeOneBatch[T any](c codec.Codec[T], ts []int64, items []T, src []byte) ([]int64, []T, []byte, error) {
	ts, m, src, err := actors.DecodeWireHead(ts, src)
	if err != nil {
		return ts, items, src, fmt.Errorf("%w: %w", ErrCorruptFrame, err)
	}
	items = slices.Grow(items, m)
	for i := range m {
		v, k, err := c.Decode(src)
		if err == nil && (k < 0 || k > len(src)) {
			err = fmt.Errorf("codec consumed %d of %d bytes", k, len(src))
		}
		if err != nil {
			return ts, items, src, fmt.Errorf("%w: record %d: %w", ErrCorruptFrame, i, err)
		}
		items = append(items, v)
		src = src[k:]
	}
	return ts, items, src, nil
}
