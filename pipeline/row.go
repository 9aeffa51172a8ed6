package pipeline

import (
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"unicode/utf8"

	"github.com/edgedio/edged/codec"
)

// Type is the type of a Row field.
type Type uint8

// Field types. Time is event time in milliseconds since the Unix epoch.
const (
	String Type = iota + 1
	Float
	Int
	Bool
	Time
)

// String returns the YAML spelling of t.
func (t Type) String() string {
	switch t {
	case String:
		return "string"
	case Float:
		return "float"
	case Int:
		return "int"
	case Bool:
		return "bool"
	case Time:
		return "time"
	}
	return "Type(" + strconv.Itoa(int(t)) + ")"
}

// parseType parses the YAML spelling of a type.
func parseType(s string) (Type, bool) {
	switch s {
	case "string":
		return String, true
	case "float":
		return Float, true
	case "int":
		return Int, true
	case "bool":
		return Bool, true
	case "time":
		return Time, true
	}
	return 0, false
}

// Capacity of a Row: numeric (float, int, bool, time) and string slots.
const (
	MaxNumFields = 16
	MaxStrFields = 8
)

// Field is one field of a Schema: its name, type and the slot of the Row
// holding it (a string slot for String, a numeric slot otherwise).
type Field struct {
	Name string
	Type Type
	Slot int
}

// Schema is the ordered list of a row's fields, resolved once when a config
// loads. It is immutable once built and safe to share.
type Schema struct {
	fields []Field
	nNum   int
	nStr   int
	// unknown: the source's fields could not be read from the config (its
	// own problems say why), so names are not checked against them: a
	// missing source must not also fail every field it would have had.
	unknown bool
}

// Fields returns the fields in order. The slice must not be modified.
func (s *Schema) Fields() []Field { return s.fields }

// Len returns the number of fields.
func (s *Schema) Len() int { return len(s.fields) }

// Index returns the position of the field named name, or -1.
func (s *Schema) Index(name string) int {
	for i := range s.fields {
		if s.fields[i].Name == name {
			return i
		}
	}
	return -1
}

// Field returns the i-th field.
func (s *Schema) Field(i int) Field { return s.fields[i] }

// add appends a field and gives it a slot; it fails when the name is taken
// or the row is full.
func (s *Schema) add(name string, t Type) (Field, error) {
	if s.Index(name) >= 0 {
		return Field{}, fmt.Errorf("field %q is defined twice", name)
	}
	f := Field{Name: name, Type: t}
	if t == String {
		if s.nStr == MaxStrFields {
			return Field{}, fmt.Errorf("more than %d string fields", MaxStrFields)
		}
		f.Slot = s.nStr
		s.nStr++
	} else {
		if s.nNum == MaxNumFields {
			return Field{}, fmt.Errorf("more than %d numeric fields", MaxNumFields)
		}
		f.Slot = s.nNum
		s.nNum++
	}
	s.fields = append(s.fields, f)
	return f, nil
}

// clone returns a copy of s that can be extended without touching s.
func (s *Schema) clone() *Schema {
	c := *s
	c.fields = append([]Field(nil), s.fields...)
	return &c
}

// Row is one record of a declared pipeline: the values of its Schema's
// fields, held positionally in fixed arrays so that a Row is a plain value
// (copying it allocates nothing). Numeric fields (float, int, bool, time)
// share the num slots as raw bits; strings have their own slots. A Row does
// not know its schema: the accessors take the slot resolved at load.
type Row struct {
	num [MaxNumFields]uint64
	str [MaxStrFields]string
	// origin is the MQTT message the row was decoded from, for the dead
	// letters made of it further on (a late reading, an alert that cannot
	// be evaluated): zero for a row of another source, or made by the
	// job (a window's result).
	origin Origin
}

// Origin names the MQTT message a record came from: its topic, its offset
// in the ingest log and, in a cluster, the node whose log it is. Dead
// letters name it in their error, so that those of two messages with
// equal payloads differ, and so do their msg_ids. The offset is the same
// in every replay.
type Origin struct {
	Topic, Node string
	// Offset is the message's ingest-log offset plus one: 0 means no
	// origin.
	Offset uint64
}

// IsZero reports whether o names no message.
func (o Origin) IsZero() bool { return o.Offset == 0 }

// String formats o as dead letters name it ("topic t, node n,
// ingest-log offset k"), or "" for none.
func (o Origin) String() string {
	switch {
	case o.IsZero():
		return ""
	case o.Node != "":
		return fmt.Sprintf("topic %s, node %s, ingest-log offset %d", o.Topic, o.Node, o.Offset-1)
	}
	return fmt.Sprintf("topic %s, ingest-log offset %d", o.Topic, o.Offset-1)
}

// withOrigin returns msg followed by " (origin)" when r has one.
func (r *Row) withOrigin(msg string) string {
	if r.origin.IsZero() {
		return msg
	}
	return msg + " (" + r.origin.String() + ")"
}

// Float returns the float in numeric slot i.
func (r *Row) Float(i int) float64 { return math.Float64frombits(r.num[i]) }

// Int returns the int (or time, in ms) in numeric slot i.
func (r *Row) Int(i int) int64 { return int64(r.num[i]) }

// Bool returns the bool in numeric slot i.
func (r *Row) Bool(i int) bool { return r.num[i] != 0 }

// Str returns the string in string slot i.
func (r *Row) Str(i int) string { return r.str[i] }

// SetFloat sets numeric slot i.
func (r *Row) SetFloat(i int, v float64) { r.num[i] = math.Float64bits(v) }

// SetInt sets numeric slot i to an int or a time in ms.
func (r *Row) SetInt(i int, v int64) { r.num[i] = uint64(v) }

// SetBool sets numeric slot i.
func (r *Row) SetBool(i int, v bool) {
	r.num[i] = 0
	if v {
		r.num[i] = 1
	}
}

// SetStr sets string slot i.
func (r *Row) SetStr(i int, v string) { r.str[i] = v }

// Number returns field f as a float64, for aggregates: floats as they are,
// ints and times converted, bools as 0 or 1.
func (r *Row) Number(f Field) float64 {
	switch f.Type {
	case Float:
		return r.Float(f.Slot)
	case Int, Time:
		return float64(r.Int(f.Slot))
	case Bool:
		return float64(r.num[f.Slot])
	}
	return 0
}

// Value returns field f boxed, for expressions and formatting. It
// allocates for most values; it is not for the decode path.
func (r *Row) Value(f Field) any {
	switch f.Type {
	case String:
		return r.str[f.Slot]
	case Float:
		return r.Float(f.Slot)
	case Int, Time:
		return r.Int(f.Slot)
	case Bool:
		return r.Bool(f.Slot)
	}
	return nil
}

// AppendJSON appends r as a JSON object with the fields of s in order.
// Times are written as milliseconds. A NaN or infinite float is written as
// null.
func (r *Row) AppendJSON(dst []byte, s *Schema) []byte {
	dst = append(dst, '{')
	for i, f := range s.fields {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = strconv.AppendQuote(dst, f.Name)
		dst = append(dst, ':')
		switch f.Type {
		case String:
			dst = appendJSONString(dst, r.str[f.Slot])
		case Float:
			v := r.Float(f.Slot)
			if math.IsNaN(v) || math.IsInf(v, 0) {
				dst = append(dst, "null"...)
			} else {
				dst = strconv.AppendFloat(dst, v, 'g', -1, 64)
			}
		case Int, Time:
			dst = strconv.AppendInt(dst, r.Int(f.Slot), 10)
		case Bool:
			dst = strconv.AppendBool(dst, r.Bool(f.Slot))
		}
	}
	return append(dst, '}')
}

// appendJSONString appends s quoted as a JSON string; a byte that is not
// valid UTF-8 is written as U+FFFD (the decoders refuse such strings, so
// only a computed field could hold one).
func appendJSONString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= utf8.RuneSelf {
			r, n := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && n == 1 {
				dst = append(dst, "\ufffd"...)
			} else {
				dst = append(dst, s[i:i+n]...)
			}
			i += n - 1
			continue
		}
		switch {
		case c == '"' || c == '\\':
			dst = append(dst, '\\', c)
		case c == '\n':
			dst = append(dst, '\\', 'n')
		case c == '\t':
			dst = append(dst, '\\', 't')
		case c == '\r':
			dst = append(dst, '\\', 'r')
		case c < 0x20:
			dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		default:
			dst = append(dst, c)
		}
	}
	return append(dst, '"')
}

// rowVersion is the first byte of a Row's binary encoding: version 1
// for a row without an origin, version 2 (rowVersionOrigin) for one with
// it, which follows the strings.
const (
	rowVersion       = 1
	rowVersionOrigin = 2
)

// rowOriginFlag marks, in the numeric slot count of a Row's encoding on a
// channel (AppendDict), a row whose origin follows its strings.
const rowOriginFlag = 0x80

// AppendBinary appends the binary encoding of r: a version byte, the
// number of numeric slots up to the last non-zero one and their 8-byte
// little-endian values, then the same for strings (uvarint length and
// bytes). It implements encoding.BinaryAppender, so codec.For[Row] uses it.
func (r Row) AppendBinary(dst []byte) ([]byte, error) {
	n, m := r.slots()
	v := byte(rowVersion)
	if !r.origin.IsZero() {
		v = rowVersionOrigin
	}
	dst = append(dst, v, byte(n))
	for i := range n {
		dst = binary.LittleEndian.AppendUint64(dst, r.num[i])
	}
	dst = append(dst, byte(m))
	for i := range m {
		dst = binary.AppendUvarint(dst, uint64(len(r.str[i])))
		dst = append(dst, r.str[i]...)
	}
	if v == rowVersionOrigin {
		for _, s := range []string{r.origin.Topic, r.origin.Node} {
			dst = binary.AppendUvarint(dst, uint64(len(s)))
			dst = append(dst, s...)
		}
		dst = binary.AppendUvarint(dst, r.origin.Offset)
	}
	return dst, nil
}

// slots returns the numeric slots up to the last non-zero one and the
// string slots up to the last non-empty one: the slots a Row's encodings
// carry.
func (r *Row) slots() (n, m int) {
	n, m = MaxNumFields, MaxStrFields
	for n > 0 && r.num[n-1] == 0 {
		n--
	}
	for m > 0 && r.str[m-1] == "" {
		m--
	}
	return n, m
}

// AppendDict appends r for a channel between tasks (codec.DictCoder): as
// AppendBinary does without its version byte, the strings coded with the
// channel's numbering, so that a key or an id sent before takes a byte or
// two.
func (r *Row) AppendDict(dst []byte, e *codec.DictEncoder) []byte {
	n, m := r.slots()
	origin := !r.origin.IsZero()
	if origin {
		dst = append(dst, byte(n)|rowOriginFlag)
	} else {
		dst = append(dst, byte(n))
	}
	for i := range n {
		dst = binary.LittleEndian.AppendUint64(dst, r.num[i])
	}
	dst = append(dst, byte(m))
	for i := range m {
		dst = e.AppendString(dst, r.str[i])
	}
	if origin {
		dst = e.AppendString(dst, r.origin.Topic)
		dst = e.AppendString(dst, r.origin.Node)
		dst = binary.AppendUvarint(dst, r.origin.Offset)
	}
	return dst
}

// DecodeDict decodes what AppendDict wrote into r, which is zero, and
// returns the bytes consumed. Bad input gives an error wrapping
// codec.ErrCorrupt or codec.ErrShort.
func (r *Row) DecodeDict(src []byte, rd codec.DictReader) (int, error) {
	if len(src) < 1 || int(src[0]&^rowOriginFlag) > MaxNumFields {
		return 0, fmt.Errorf("%w: row: numeric slots", codec.ErrCorrupt)
	}
	origin := src[0]&rowOriginFlag != 0
	n := int(src[0] &^ rowOriginFlag)
	off := 1
	if len(src)-off < 8*n+1 {
		return 0, fmt.Errorf("%w: row: %d numeric slots", codec.ErrShort, n)
	}
	for i := range n {
		r.num[i] = binary.LittleEndian.Uint64(src[off+8*i:])
	}
	off += 8 * n
	m := int(src[off])
	off++
	if m > MaxStrFields {
		return 0, fmt.Errorf("%w: row: %d string slots", codec.ErrCorrupt, m)
	}
	for i := range m {
		s, k, err := rd.String(src[off:])
		if err != nil {
			return 0, fmt.Errorf("row string %d: %w", i, err)
		}
		r.str[i] = s
		off += k
	}
	if origin {
		for _, s := range []*string{&r.origin.Topic, &r.origin.Node} {
			v, k, err := rd.String(src[off:])
			if err != nil {
				return 0, fmt.Errorf("row origin: %w", err)
			}
			*s = v
			off += k
		}
		o, k := binary.Uvarint(src[off:])
		if k <= 0 || o == 0 {
			return 0, fmt.Errorf("%w: row: origin offset", codec.ErrCorrupt)
		}
		r.origin.Offset = o
		off += k
	}
	return off, nil
}

// UnmarshalBinary decodes what AppendBinary wrote. It never panics; bad
// input gives an error wrapping ErrMalformed.
func (r *Row) UnmarshalBinary(b []byte) error {
	*r = Row{}
	bad := func(what string) error { return fmt.Errorf("%w: row: %s", ErrMalformed, what) }
	if len(b) < 2 || b[0] != rowVersion && b[0] != rowVersionOrigin {
		return bad("bad header")
	}
	origin := b[0] == rowVersionOrigin
	n := int(b[1])
	b = b[2:]
	if n > MaxNumFields || len(b) < 8*n {
		return bad("bad numeric slots")
	}
	for i := range n {
		r.num[i] = binary.LittleEndian.Uint64(b[8*i:])
	}
	b = b[8*n:]
	if len(b) < 1 || int(b[0]) > MaxStrFields {
		return bad("bad string slots")
	}
	m := int(b[0])
	b = b[1:]
	str := func(s *string) bool {
		l, k := binary.Uvarint(b)
		if k <= 0 || l > uint64(len(b)-k) {
			return false
		}
		*s = string(b[k : k+int(l)])
		b = b[k+int(l):]
		return true
	}
	for i := range m {
		if !str(&r.str[i]) {
			return bad("bad string length")
		}
	}
	if origin {
		if !str(&r.origin.Topic) || !str(&r.origin.Node) {
			return bad("bad origin")
		}
		off, k := binary.Uvarint(b)
		if k <= 0 || off == 0 {
			return bad("bad origin offset")
		}
		r.origin.Offset = off
		b = b[k:]
	}
	if len(b) != 0 {
		return bad("trailing bytes")
	}
	return nil
}
