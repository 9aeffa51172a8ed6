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

// encodeWire appends a batch to dst: the head, then the records as
// codec.AppendBatchDict writes them with e, the numbering of the strings
// sent on the batch's channel (see codec.DictEncoder). The head is the
// uvarint n<<1|same, n the count of timestamps: with same set, the one
// timestamp all n records share as a zig-zag varint (records without a
// timestamp, or of one instant, cost nothing each); otherwise each
// timestamp as a zig-zag varint delta from the one before.
func encodeWire[T any](c codec.Codec[T], e *codec.DictEncoder, dst []byte, ts []int64, items []T) ([]byte, error) {
	if len(ts) > 0 && allEqual(ts) {
		dst = binary.AppendUvarint(dst, uint64(len(ts))<<1|1)
		dst = binary.AppendVarint(dst, ts[0])
	} else {
		dst = binary.AppendUvarint(dst, uint64(len(ts))<<1)
		prev := int64(0)
		for _, t := range ts {
			dst = binary.AppendVarint(dst, t-prev)
			prev = t
		}
	}
	return codec.AppendBatchDict(c, e, dst, items)
}

// allEqual reports whether every element of ts equals the first.
func allEqual(ts []int64) bool {
	for _, t := range ts[1:] {
		if t != ts[0] {
			return false
		}
	}
	return true
}

// decodeWire decodes src into ts[:0] and items[:0]: one batch written by
// encodeWire, or several written one after the other (a frame that
// crossed nodes carries several when batches joined one waiting for
// credit: see cluster.Send.Merge). Every batch is self-delimiting, its
// records decoded by d with dd, the numbering of the strings received on
// the batch's channel; batches of a channel must be decoded in the order
// they were sent, each once. On error it returns ts[:0] and items[:0].
func decodeWire[T any](d *codec.Decoder[T], dd *codec.DictDecoder, ts []int64, items []T, src []byte) ([]int64, []T, error) {
	ts, items = ts[:0], items[:0]
	for {
		var err error
		if ts, items, src, err = decodeWireBatch(d, dd, ts, items, src); err != nil {
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
func decodeWireBatch[T any](d *codec.Decoder[T], dd *codec.DictDecoder, ts []int64, items []T, src []byte) ([]int64, []T, []byte, error) {
	ts, m, src, err := DecodeWireHead(ts, src)
	if err != nil {
		return ts, items, src, fmt.Errorf("%w: %w", errWire, err)
	}
	items, k, err := d.AppendNDict(items, src, m, dd)
	if err != nil {
		return ts, items, src, fmt.Errorf("%w: record %w", errWire, err)
	}
	return ts, items, src[k:], nil
}

// DecodeWireHead decodes the head of the wire batch at the start of src
// (encodeWire's layout): its timestamps, appended to ts, and its record
// count, which must equal theirs. It returns ts, the count and the bytes
// after the head, where the records start. An error names the part of the
// head that is corrupt and wraps no sentinel: the caller wraps it in its
// own (cluster.DecodeBatch decodes the same batches).
func DecodeWireHead(ts []int64, src []byte) ([]int64, int, []byte, error) {
	h, k := binary.Uvarint(src)
	n := h >> 1
	if k <= 0 || n > uint64(len(src)) {
		return ts, 0, src, errors.New("timestamp count")
	}
	src = src[k:]
	if h&1 == 1 {
		// One timestamp for all; n, checked against the bytes received
		// above, bounds the slice grown here.
		t, k := binary.Varint(src)
		if k <= 0 {
			return ts, 0, src, errors.New("timestamp")
		}
		src = src[k:]
		ts = slices.Grow(ts, int(n))
		for range n {
			ts = append(ts, t)
		}
	} else {
		prev := int64(0)
		for range n {
			d, k := binary.Varint(src)
			if k <= 0 {
				return ts, 0, src, errors.New("timestamp")
			}
			prev += d
			ts = append(ts, prev)
			src = src[k:]
		}
	}
	m, k := binary.Uvarint(src)
	if k <= 0 || m > uint64(len(src)) {
		return ts, 0, src, errors.New("record count")
	}
	if m != n {
		return ts, 0, src, fmt.Errorf("%d timestamps for %d records", n, m)
	}
	return ts, int(m), src[k:], nil
}
