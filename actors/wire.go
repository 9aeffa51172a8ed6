package actors

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/edgedio/edged/codec"
)

// errWire is wrapped by every error decoding a wire batch.
var errWire = errors.New("actors: corrupt wire batch")

// encodeWire appends a batch to dst: the uvarint count of timestamps, each
// timestamp as a zig-zag varint delta from the one before, then the records
// as codec.AppendBatch writes them.
func encodeWire[T any](c codec.Codec[T], dst []byte, ts []int64, items []T) ([]byte, error) {
	dst = binary.AppendUvarint(dst, uint64(len(ts)))
	prev := int64(0)
	for _, t := range ts {
		dst = binary.AppendVarint(dst, t-prev)
		prev = t
	}
	return codec.AppendBatch(c, dst, items)
}

// decodeWire decodes src into ts[:0] and items[:0]: one batch written by
// encodeWire, or several written one after the other (a frame that
// crossed nodes carries several when batches joined one waiting for
// credit: see cluster.Send.Merge). Every batch is self-delimiting, its
// records decoded one by one. On error it returns ts[:0] and items[:0].
func decodeWire[T any](c codec.Codec[T], ts []int64, items []T, src []byte) ([]int64, []T, error) {
	ts, items = ts[:0], items[:0]
	for {
		var err error
		if ts, items, src, err = decodeWireBatch(c, ts, items, src); err != nil {
			clear(items)
			return ts[:0], items[:0], err
		}
		if len(src) == 0 {
			return ts, items, nil
		}
	}
}

// decodeWireBatch decodes the batch at the start of src, appending to ts
// and items, and returns the bytes after it.
func decodeWireBatch[T any](c codec.Codec[T], ts []int64, items []T, src []byte) ([]int64, []T, []byte, error) {
	n, k := binary.Uvarint(src)
	if k <= 0 || n > uint64(len(src)) {
		return ts, items, src, fmt.Errorf("%w: timestamp count", errWire)
	}
	src = src[k:]
	prev := int64(0)
	for range n {
		d, k := binary.Varint(src)
		if k <= 0 {
			return ts, items, src, fmt.Errorf("%w: timestamp", errWire)
		}
		prev += d
		ts = append(ts, prev)
		src = src[k:]
	}
	m, k := binary.Uvarint(src)
	if k <= 0 || m > uint64(len(src)) {
		return ts, items, src, fmt.Errorf("%w: record count", errWire)
	}
	if m != n {
		return ts, items, src, fmt.Errorf("%w: %d timestamps for %d records", errWire, n, m)
	}
	src = src[k:]
	items = slices.Grow(items, int(m))
	for i := range m {
		v, k, err := c.Decode(src)
		if err == nil && (k < 0 || k > len(src)) {
			err = fmt.Errorf("%w: codec consumed %d of %d bytes", errWire, k, len(src))
		}
		if err != nil {
			return ts, items, src, fmt.Errorf("%w: record %d: %w", errWire, i, err)
		}
		items = append(items, v)
		src = src[k:]
	}
	return ts, items, src, nil
}
