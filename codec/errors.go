package codec

import (
	"errors"
	"fmt"
)

// ErrCorrupt is wrapped by every error a decoder returns for input that is
// not a valid encoding: bad tags, non-canonical varints, out-of-range values,
// unsorted map keys, trailing bytes in a batch.
var ErrCorrupt = errors.New("codec: corrupt input")

// ErrShort is wrapped by the errors decoders return when the input ends
// before the value does; more input might make it decode.
var ErrShort = errors.New("codec: input too short")

// ErrUnsupported is wrapped by the errors Compile returns for types it cannot
// encode (channels, funcs, interfaces, unsafe pointers, unexported fields)
// and by the errors encoders return for values they cannot encode (a time
// outside the int64 nanosecond range, a cyclic value).
var ErrUnsupported = errors.New("codec: unsupported type")

// Errors returned on the hot path are built once so that failing to decode
// costs no allocation either.
var (
	errShortVarint  = fmt.Errorf("%w: varint", ErrShort)
	errLongVarint   = fmt.Errorf("%w: varint overflows 64 bits", ErrCorrupt)
	errPaddedVarint = fmt.Errorf("%w: varint is not minimally encoded", ErrCorrupt)
	errRange        = fmt.Errorf("%w: integer out of range for its type", ErrCorrupt)
	errBool         = fmt.Errorf("%w: bool byte is neither 0 nor 1", ErrCorrupt)
	errShortFixed   = fmt.Errorf("%w: fixed-width value", ErrShort)
	errShortBytes   = fmt.Errorf("%w: length-prefixed bytes", ErrShort)
	errDepth        = fmt.Errorf("%w: nesting deeper than %d", ErrCorrupt, maxDepth)
	errEncodeDepth  = fmt.Errorf("%w: value nests deeper than %d (cyclic?)", ErrUnsupported, maxDepth)
)

var (
	errShortElems = fmt.Errorf("%w: element count exceeds the bytes left", ErrShort)
	errPointerTag = fmt.Errorf("%w: pointer tag is neither 0 nor 1", ErrCorrupt)
	errMapOrder   = fmt.Errorf("%w: map keys out of order or repeated", ErrCorrupt)
)
