// Package codec turns stream elements into bytes and back.
//
// Every element type of a job has a Codec: state backends store encoded
// values, serialized channels between devices carry encoded batches
// (AppendBatch, DecodeBatch), and a job option routes every key-by edge
// through a codec so that no channel depends on shared Go pointers. For
// returns the default codec of a type: hand-written codecs for the scalar
// types, string and []byte; the type's own binary marshaling methods if it
// has them; otherwise a codec compiled once per type by walking its fields
// with reflect, which per record touches memory through precomputed offsets
// and allocates nothing to encode a struct of scalars and strings, and only
// the strings to decode it. A Decoder decodes a stream of values, such as
// the batches of one channel, and keeps the short strings it decoded, so
// that a key seen before costs no allocation. Binary, CBOR, Gob and JSON
// wrap other encodings for interchange and comparison.
//
// Encodings are length-delimited: Decode reports how many bytes it consumed,
// so values can be laid end to end. They are also canonical: the compiled
// and built-in codecs give a value one encoding (map entries are sorted),
// and their decoders reject any other bytes, so equal values encode to
// equal bytes and a decoded value re-encodes to what it was decoded from.
// The formats are not self-describing and carry no version: a stored value
// must be read back with the codec of the same type.
//
// Concurrency: codecs are stateless values, safe for concurrent use by any
// number of goroutines, and neither encoding nor decoding blocks. A
// Decoder has state and belongs to one goroutine. The one
// shared state is a cache of compiled types, filled by For and Compile and
// never changed after, so a type is compiled once per process.
//
// Errors: decoders never panic on bad input. They return errors wrapping
// ErrShort when the input ends early and ErrCorrupt when it is not a valid
// encoding; Compile and encoders return errors wrapping ErrUnsupported.
package codec
