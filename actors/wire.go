package actors

import (
	"encoding/binary"
	"errors"
	"fmt"

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

// decodeWire decodes a batch written by encodeWire into ts[:0] and
// items[:0].
func decodeWire[T any](c codec.Codec[T], ts []int64, items []T, src []byte) ([]int64, []T, error) {
	n, k := binary.Uvarint(src)
	if k <= 0 || n > uint64(len(src)) {
		return ts[:0], items[:0], fmt.Errorf("%w: timestamp count", errWire)
	}
	src = src[k:]
	ts = ts[:0]
	prev := int64(0)
	for range n {
		d, k := binary.Varint(src)
		if k <= 0 {
			return ts[:0], items[:0], fmt.Errorf("%w: timestamp", errWire)
		}
		prev += d
		ts = append(ts, prev)
		src = src[k:]
	}
	items, err := codec.DecodeBatch(c, items, src)
	if err != nil {
		return ts[:0], items[:0], err
	}
	if len(items) != len(ts) {
		return ts[:0], items[:0], fmt.Errorf("%w: %d timestamps for %d records", errWire, len(ts), len(items))
	}
	return ts, items, nil
}
