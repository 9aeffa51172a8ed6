package codec

import (
	"encoding/binary"
	"fmt"
	"slices"
)

// AppendBatch appends a uvarint count followed by each value of vs, encoded
// with c. A batch must take at least one byte per value (DecodeBatch relies
// on it to bound the count), so a batch of values that encode to nothing,
// such as struct{}, is an error wrapping ErrUnsupported. On error it
// returns dst with its original length.
func AppendBatch[T any](c Codec[T], dst []byte, vs []T) ([]byte, error) {
	return appendBatch(c, nil, dst, vs)
}

// appendBatch is AppendBatch, or AppendBatchDict when e is not nil: the
// values that Decoder.AppendNDict reads with a numbering (a DictCoder, a
// struct of scalars, a string) are then written with e's.
func appendBatch[T any](c Codec[T], e *DictEncoder, dst []byte, vs []T) ([]byte, error) {
	start := len(dst)
	out := binary.AppendUvarint(dst, uint64(len(vs)))
	body := len(out)
	var err error
	cc, isCompiled := any(c).(compiled[T])
	_, isString := any(c).(StringCodec)
	switch {
	case e != nil && isDictCoder[T]():
		for i := range vs {
			out = any(&vs[i]).(DictCoder).AppendDict(out, e)
		}
	case isCompiled:
		// One loop over the values, no interface call per value.
		out, err = cc.appendAll(out, vs, e)
	case e != nil && isString:
		for _, s := range any(vs).([]string) {
			out = e.AppendString(out, s)
		}
	default:
		for i := range vs {
			if out, err = c.Append(out, vs[i]); err != nil {
				err = fmt.Errorf("batch value %d: %w", i, err)
				break
			}
		}
	}
	if err != nil {
		return dst[:start], err
	}
	if len(out)-body < len(vs) {
		return dst[:start], fmt.Errorf("%w: batch of %d values encodes to %d bytes",
			ErrUnsupported, len(vs), len(out)-body)
	}
	return out, nil
}

// DecodeBatch decodes a batch written by AppendBatch, appending the values
// to dst[:0] and returning it. It rejects a count larger than the bytes
// that follow it, so a corrupt count cannot cause a huge allocation, and
// rejects bytes left over after the last value. On error it returns dst[:0]
// and an error wrapping ErrCorrupt or ErrShort.
func DecodeBatch[T any](c Codec[T], dst []T, src []byte) ([]T, error) {
	dst = dst[:0]
	count, off, err := readUvarint(src)
	if err != nil {
		return dst, fmt.Errorf("batch count: %w", err)
	}
	if count > uint64(len(src)-off) {
		return dst, fmt.Errorf("%w: batch count %d exceeds the %d bytes left",
			ErrShort, count, len(src)-off)
	}
	dst = slices.Grow(dst, int(count))
	for i := range int(count) {
		v, n, err := c.Decode(src[off:])
		if err == nil && (n < 0 || n > len(src)-off) {
			err = fmt.Errorf("%w: codec consumed %d of %d bytes", ErrCorrupt, n, len(src)-off)
		}
		if err != nil {
			clear(dst)
			return dst[:0], fmt.Errorf("batch value %d: %w", i, err)
		}
		dst = append(dst, v)
		off += n
	}
	if off != len(src) {
		clear(dst)
		return dst[:0], fmt.Errorf("%w: %d bytes after the batch", ErrCorrupt, len(src)-off)
	}
	return dst, nil
}
