package state

import (
	"encoding"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/edgedio/edged/codec"
)

// The encodings of the codec package carry no type information (see
// package codec): a struct is its fields end to end. Snapshots therefore
// record, beside the codecs' names, the layout of every type a default
// codec encodes (its fields by name and type, down to the scalars), and a
// restore refuses state whose layout changed. Without it, a type that
// kept its name and gained a field read the old bytes as the new type: a
// List of such a struct restored two old elements as one new one, and a
// Value failed as a corrupt snapshot.

// codecPkg is the package of the default codecs, whose encodings follow
// the layout of their type.
var codecPkg = reflect.TypeFor[codec.Codec[int]]().PkgPath()

// compiledPrefix starts the type name of the codec package's compiled
// codecs (codec.Compile of a type other than the built-in scalars): the
// ones that write a type's fields end to end. Its CBOR, Gob and JSON
// codecs describe themselves and its Binary codec is the type's own
// format: they are not checked by layout.
const compiledPrefix = "compiled["

// layouts caches typeLayout by type.
var layouts sync.Map // reflect.Type -> string

// codecLayout returns the layout of the type a compiled default codec c
// encodes, "" for any other codec: the built-in scalar ones, whose type
// is their layout, and those whose format is not the fields end to end
// (a codec of the user's own, CBOR, Gob, JSON, Binary).
func codecLayout(c any) string {
	if c == nil {
		return ""
	}
	ct := reflect.TypeOf(c)
	if ct.PkgPath() != codecPkg || !strings.HasPrefix(ct.Name(), compiledPrefix) {
		return ""
	}
	m, ok := ct.MethodByName("Decode")
	if !ok || m.Type.NumOut() == 0 {
		return ""
	}
	t := m.Type.Out(0)
	if l, ok := layouts.Load(t); ok {
		return l.(string)
	}
	var b strings.Builder
	writeLayout(&b, t, map[reflect.Type]bool{})
	l, _ := layouts.LoadOrStore(t, b.String())
	return l.(string)
}

var (
	timeType        = reflect.TypeFor[time.Time]()
	unmarshalerType = reflect.TypeFor[encoding.BinaryUnmarshaler]()
)

// writeLayout writes the layout of t as the default codec encodes it:
// scalars by kind, structs by their encoded fields, containers by their
// elements; a type with binary marshaling by name, since its format is
// its own.
func writeLayout(b *strings.Builder, t reflect.Type, open map[reflect.Type]bool) {
	if t == timeType {
		b.WriteString("time")
		return
	}
	if t.Kind() != reflect.Interface && reflect.PointerTo(t).Implements(unmarshalerType) {
		fmt.Fprintf(b, "binary(%v)", t)
		return
	}
	if open[t] { // a recursive type: named where it recurs
		fmt.Fprintf(b, "%v", t)
		return
	}
	switch t.Kind() {
	case reflect.Struct:
		open[t] = true
		b.WriteString("struct{")
		first := true
		for i := range t.NumField() {
			f := t.Field(i)
			if f.Name == "_" || f.Tag.Get("codec") == "-" {
				continue
			}
			if !first {
				b.WriteString("; ")
			}
			first = false
			b.WriteString(f.Name)
			b.WriteByte(' ')
			writeLayout(b, f.Type, open)
		}
		b.WriteByte('}')
		delete(open, t)
	case reflect.Array:
		fmt.Fprintf(b, "[%d]", t.Len())
		writeLayout(b, t.Elem(), open)
	case reflect.Slice:
		b.WriteString("[]")
		writeLayout(b, t.Elem(), open)
	case reflect.Pointer:
		b.WriteByte('*')
		writeLayout(b, t.Elem(), open)
	case reflect.Map:
		b.WriteString("map[")
		writeLayout(b, t.Key(), open)
		b.WriteByte(']')
		writeLayout(b, t.Elem(), open)
	default:
		b.WriteString(t.Kind().String())
	}
}
