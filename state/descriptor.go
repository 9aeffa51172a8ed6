package state

import (
	"fmt"
	"reflect"
	"strings"

	"github.com/edgedio/edged/codec"
)

// ValueDescriptor describes keyed Value state: one value per key (and
// namespace).
type ValueDescriptor[V any] struct {
	// Name identifies the state within its backend; it must not be empty.
	Name string
	// Codec encodes the value for disk backends and snapshots. Nil means
	// codec.Compile[V]().
	Codec codec.Codec[V]
	// TTL makes values expire; the zero value keeps them for ever.
	TTL TTLConfig
}

// ListDescriptor describes keyed List state: a list of values per key (and
// namespace).
type ListDescriptor[V any] struct {
	// Name identifies the state within its backend; it must not be empty.
	Name string
	// Codec encodes one element. Nil means codec.Compile[V]().
	Codec codec.Codec[V]
	// TTL makes whole lists expire: every write renews the list's time to
	// live, and an expired list is dropped with all its elements.
	TTL TTLConfig
}

// MapDescriptor describes keyed Map state: a map from user keys UK to
// values UV per key (and namespace).
type MapDescriptor[UK comparable, UV any] struct {
	// Name identifies the state within its backend; it must not be empty.
	Name string
	// KeyCodec encodes the user keys. Nil means codec.Compile[UK]().
	KeyCodec codec.Codec[UK]
	// ValueCodec encodes the user values. Nil means codec.Compile[UV]().
	ValueCodec codec.Codec[UV]
	// TTL makes map elements expire one by one: writing an element renews
	// its time to live only.
	TTL TTLConfig
}

// ReducingDescriptor describes keyed Reducing state: one value per key (and
// namespace) into which added values are folded with Reduce.
type ReducingDescriptor[V any] struct {
	// Name identifies the state within its backend; it must not be empty.
	Name string
	// Codec encodes the value. Nil means codec.Compile[V]().
	Codec codec.Codec[V]
	// Reduce folds b into a: Add(v) stores Reduce(current, v), and a
	// namespace merge stores Reduce(target, source). Required.
	Reduce func(a, b V) V
	// TTL makes values expire; the zero value keeps them for ever.
	TTL TTLConfig
}

// AggregatingDescriptor describes keyed Aggregating state: one accumulator
// per key (and namespace) into which inputs are added; Get returns the
// accumulator's result.
type AggregatingDescriptor[IN, ACC, OUT any] struct {
	// Name identifies the state within its backend; it must not be empty.
	Name string
	// Codec encodes the accumulator. Nil means codec.Compile[ACC]().
	Codec codec.Codec[ACC]
	// Create returns the accumulator of a key (and namespace) without one.
	// Required.
	Create func() ACC
	// Add folds an input into an accumulator and returns the new one.
	// Required.
	Add func(in IN, acc ACC) ACC
	// Merge combines two accumulators; MergeNamespaces needs it (session
	// windows), other uses do not.
	Merge func(a, b ACC) ACC
	// Result turns an accumulator into the state's value. Required.
	Result func(acc ACC) OUT
	// TTL makes accumulators expire; the zero value keeps them for ever.
	TTL TTLConfig
}

// kind is the kind of a registered state. A name is bound to one kind.
type kind uint8

const (
	kindValue kind = iota + 1
	kindList
	kindMap
	kindReducing
	kindAggregating
	kindOperatorList
	kindUnionList
	kindBroadcast
	// kindTimers is a timer queue registered with RegisterTimerQueue: not
	// a state handles are made of, but snapshot and restored like one.
	kindTimers
)

var kindNames = [...]string{
	kindValue:        "Value",
	kindList:         "List",
	kindMap:          "Map",
	kindReducing:     "Reducing",
	kindAggregating:  "Aggregating",
	kindOperatorList: "ListState",
	kindUnionList:    "UnionListState",
	kindBroadcast:    "BroadcastState",
	kindTimers:       "Timers",
}

func (k kind) String() string {
	if int(k) < len(kindNames) && kindNames[k] != "" {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// codecs holds the codecs a registered state is encoded with. Each field
// holds a codec.Codec of the type named in its comment, or nil where the
// kind has no such part. The memory backend encodes nothing per record; a
// disk backend and snapshots will use these.
type codecs struct {
	key       any // codec.Codec[K], the stream key
	namespace any // codec.Codec[N]
	userKey   any // codec.Codec[UK] of Map state
	value     any // codec.Codec of the value, element, user value or accumulator
	// err is the first error met compiling a default codec. The memory
	// backend keeps state of types without a codec; whatever needs the
	// encoding (a snapshot, a disk backend) reports err.
	err error
}

// spec is what a registered state is: handles made for the same name must
// agree on it, and a snapshot records it.
type spec struct {
	name string
	kind kind
	// sig names the kind and the types, for error messages and for
	// matching: "Value[int] keyed by string".
	sig string
	// types names the types without the kind: "int keyed by string". A
	// snapshot records it with the kind, and a restore compares them.
	types  string
	ttl    TTLConfig
	codecs codecs
}

// codecNames names the codec types of s, as a snapshot records them, and
// then, after layoutSep, the layouts of the types the default codecs
// among them encode (codecLayout): a restore refuses state whose codecs
// or layouts changed, since their encodings may differ.
func (s *spec) codecNames() string {
	name := func(c any) string {
		if c == nil {
			return "-"
		}
		return fmt.Sprintf("%T", c)
	}
	names := fmt.Sprintf("key=%s ns=%s userkey=%s value=%s",
		name(s.codecs.key), name(s.codecs.namespace), name(s.codecs.userKey), name(s.codecs.value))
	var layouts []string
	for _, part := range []struct {
		name string
		c    any
	}{{"key", s.codecs.key}, {"ns", s.codecs.namespace}, {"userkey", s.codecs.userKey}, {"value", s.codecs.value}} {
		if l := codecLayout(part.c); l != "" {
			layouts = append(layouts, part.name+"="+l)
		}
	}
	if len(layouts) == 0 {
		return names
	}
	return names + layoutSep + strings.Join(layouts, " ")
}

// layoutSep separates the codec names from the layouts in codecNames.
// Snapshots written before layouts were recorded have none.
const layoutSep = " | layout "

// splitLayouts splits what codecNames returned into the codec names and
// the layouts ("" when there are none).
func splitLayouts(codecs string) (names, layouts string) {
	names, layouts, _ = strings.Cut(codecs, layoutSep)
	return names, layouts
}

// voidNamespace is the namespace of state created without one.
type voidNamespace struct{}

// newKeyedSpec returns the spec of keyed state of kind k over key type K
// and namespace type N; types names what is stored ("int", "string -> int").
func newKeyedSpec[K, N comparable](name string, k kind, ttl TTLConfig, types string) spec {
	sig := fmt.Sprintf("%s[%s] keyed by %v", k, types, reflect.TypeFor[K]())
	desc := fmt.Sprintf("%s keyed by %v", types, reflect.TypeFor[K]())
	if reflect.TypeFor[N]() != reflect.TypeFor[voidNamespace]() {
		sig += fmt.Sprintf(" in namespace %v", reflect.TypeFor[N]())
		desc += fmt.Sprintf(" in namespace %v", reflect.TypeFor[N]())
	}
	s := spec{name: name, kind: k, sig: sig, types: desc, ttl: ttl}
	s.codecs.key = defaultCodec[K](nil, &s.codecs.err)
	s.codecs.namespace = defaultCodec[N](nil, &s.codecs.err)
	return s
}

// typeName returns the name of T for signatures.
func typeName[T any]() string { return reflect.TypeFor[T]().String() }

// defaultCodec returns c, or the compiled default codec of T when c is nil.
// A compile error is stored in *errp unless it already holds one.
func defaultCodec[T any](c codec.Codec[T], errp *error) codec.Codec[T] {
	if c != nil {
		return c
	}
	c, err := codec.Compile[T]()
	if err != nil && *errp == nil {
		*errp = fmt.Errorf("state: no codec for %v: %w", reflect.TypeFor[T](), err)
	}
	return c
}

// checkName reports an empty state name.
func checkName(name string) error {
	if name == "" {
		return fmt.Errorf("%w: empty state name", ErrDescriptor)
	}
	return nil
}

// checkKeyed validates what every keyed state constructor gets.
func checkKeyed[K comparable](b Backend, kc *KeyContext[K], name string, ttl TTLConfig) error {
	if isNilBackend(b) {
		return ErrNoBackend
	}
	if err := checkName(name); err != nil {
		return err
	}
	if strings.HasPrefix(name, timerPrefix) {
		return fmt.Errorf("%w: state name %q: the prefix %q is reserved for timer queues", ErrDescriptor, name, timerPrefix)
	}
	if kc == nil {
		return fmt.Errorf("state %q: %w", name, ErrNoKeyContext)
	}
	if err := ttl.validate(); err != nil {
		return fmt.Errorf("state %q: %w", name, err)
	}
	return checkKeyType[K](name, "key")
}

// PointerIn returns where key type t holds a pointer, "" if it holds
// none: "the type itself", "field ID", "field A.B[0]". Keys are found by
// == in memory, which compares pointers, and by their encoding on disk,
// which follows them: two keys pointing to equal values are two entries
// on one backend and one on the other. A time.Time holds its location
// by pointer (and a monotonic reading, which == also compares), so equal
// instants need not be equal keys.
func PointerIn(t reflect.Type) string { return pointerIn(t, "", 0) }

func pointerIn(t reflect.Type, path string, depth int) string {
	if depth > 32 { // deeper than any key type
		return ""
	}
	where := "the type itself"
	if path != "" {
		where = "field " + path
	}
	if t == timeType {
		return where + ", a time.Time, whose location is a pointer: key by its UnixNano()"
	}
	switch t.Kind() {
	case reflect.Pointer, reflect.UnsafePointer:
		return where
	case reflect.Array:
		return pointerIn(t.Elem(), path+"[0]", depth+1)
	case reflect.Struct:
		for i := range t.NumField() {
			f := t.Field(i)
			if f.Name == "_" { // == skips blank fields
				continue
			}
			name := f.Name
			if path != "" {
				name = path + "." + f.Name
			}
			if p := pointerIn(f.Type, name, depth+1); p != "" {
				return p
			}
		}
	}
	return ""
}

// checkKeyType refuses a key type of state name (what a key is: the
// stream key or a Map's user key) that holds a pointer.
func checkKeyType[K any](name, what string) error {
	t := reflect.TypeFor[K]()
	if p := PointerIn(t); p != "" {
		return fmt.Errorf("%w: state %q: %s type %v holds a pointer (%s): keys are found by ==, which compares the pointer, "+
			"not what it points to; key by the value itself", ErrDescriptor, name, what, t, p)
	}
	return nil
}
