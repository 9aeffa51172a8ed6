package pipeline

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math"
	"regexp"
	"strconv"
	"testing"
	"unicode/utf8"
)

// diffDecoder is the decoder the differential fuzz test checks against
// encoding/json: fields of every JSON type, one of them nested.
func diffDecoder(t testing.TB) (*JSONDecoder, []FieldSpec) {
	s := &Schema{}
	id, _ := s.add("id", String)
	str, _ := s.add("s", String)
	f, _ := s.add("f", Float)
	n, _ := s.add("n", Int)
	b, _ := s.add("b", Bool)
	specs := []FieldSpec{
		{Field: id, Path: []string{"a", "id"}},
		{Field: str, Path: []string{"s"}},
		{Field: f, Path: []string{"f"}},
		{Field: n, Path: []string{"n"}},
		{Field: b, Path: []string{"b"}},
	}
	d, err := NewJSONDecoder(specs)
	if err != nil {
		t.Fatal(err)
	}
	return d, specs
}

// surrogateEscape matches a \u escape of a UTF-16 surrogate.
var surrogateEscape = regexp.MustCompile(`\\u[dD][89a-fA-F][0-9a-fA-F]{2}`)

// refDecode is what encoding/json makes of in: the top-level object, or
// ok false when it refuses in.
func refDecode(in string) (map[string]any, bool) {
	dec := json.NewDecoder(bytes.NewReader([]byte(in)))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil || m == nil {
		return nil, false
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, false
	}
	return m, true
}

// plainJSON reports whether in has no duplicate key in any object and
// nests at most maxDepth deep: the inputs on which encoding/json and the
// decoder must agree.
func plainJSON(in string, maxDepth int) bool {
	dec := json.NewDecoder(bytes.NewReader([]byte(in)))
	type frame struct {
		keys      map[string]bool // nil for an array
		expectKey bool
	}
	var stack []*frame
	valueDone := func() {
		if n := len(stack); n > 0 && stack[n-1].keys != nil {
			stack[n-1].expectKey = true
		}
	}
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return true
		}
		if err != nil {
			return false
		}
		if n := len(stack); n > 0 && stack[n-1].keys != nil && stack[n-1].expectKey {
			if tok == json.Delim('}') {
				stack = stack[:n-1]
				valueDone()
				continue
			}
			k, _ := tok.(string)
			if stack[n-1].keys[k] {
				return false
			}
			stack[n-1].keys[k] = true
			stack[n-1].expectKey = false
			continue
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &frame{keys: map[string]bool{}, expectKey: true})
		case json.Delim('['):
			stack = append(stack, &frame{})
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
			valueDone()
		default:
			valueDone()
		}
		if len(stack) > maxDepth {
			return false
		}
	}
}

// refField returns the value at path in m.
func refField(m map[string]any, path []string) (any, bool) {
	var v any = m
	for _, k := range path {
		o, ok := v.(map[string]any)
		if !ok {
			return nil, false
		}
		if v, ok = o[k]; !ok {
			return nil, false
		}
	}
	return v, true
}

// FuzzJSONDecodeDifferential checks the decoder against encoding/json:
// what it accepts encoding/json accepts, with the same field values and
// valid UTF-8 strings; and what encoding/json accepts with fields of the
// right types (valid UTF-8, no surrogate escapes, no duplicate keys, not
// too deep) it accepts too. Run with go test -fuzz FuzzJSONDecodeDifferential.
func FuzzJSONDecodeDifferential(f *testing.F) {
	d, specs := diffDecoder(f)
	for _, seed := range []string{
		`{"a":{"id":"x"},"s":"y","f":1.5,"n":-3,"b":true}`,
		`{"a":{"id":"\ud83d\ude00","z":[1,{"q":null}]},"s":"\u00e9\n","f":-0,"n":0,"b":false}`,
		`{"a":{"id":"\ud83d"},"s":"y","f":1,"n":1,"b":true}`,
		`{"a":{"id":"x"},"s":"a` + "\xff" + `","f":1,"n":1,"b":true}`,
		`{"a":{"id":42},"s":"y","f":1,"n":1,"b":true}`,
		`{"a":{"id":"x"},"a":{"z":1},"s":"y","f":1,"n":1,"b":true}`,
		`{"a":{"id":"x"},"s":"y","f":1e999,"n":1,"b":true}`,
		`{"a":{"id":"x"},"s":"y","f":1,"n":1e2,"b":"true"}`,
		`{"x":"\q","a":{"id":"x"},"s":"y","f":1,"n":1,"b":true}`,
		`{"\u0061":{"i\u0064":"k"},"s":"","f":2E-3,"n":9223372036854775807,"b":true}`,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, in string) {
		var r Row
		err := d.Decode(in, &r)
		if err != nil && !errors.Is(err, ErrMalformed) {
			t.Fatalf("error not ErrMalformed: %v", err)
		}
		m, refOK := refDecode(in)
		if err == nil {
			if !refOK || !json.Valid([]byte(in)) {
				t.Fatalf("accepted what encoding/json refuses: %q", in)
			}
			for _, sp := range specs {
				v, ok := refField(m, sp.Path)
				if !ok {
					t.Fatalf("field %q decoded, encoding/json has none: %q", sp.Field.Name, in)
				}
				checkSame(t, &r, sp, v, in)
			}
			return
		}
		if !refOK || !utf8.ValidString(in) || surrogateEscape.MatchString(in) || !plainJSON(in, maxJSONDepth-2) {
			return // encoding/json refuses it or would guess
		}
		for _, sp := range specs {
			v, ok := refField(m, sp.Path)
			if !ok || !refTypeOK(sp.Field.Type, v) {
				return // a field is missing or of another type: refused rightly
			}
		}
		t.Fatalf("refused what encoding/json decodes plainly: %q: %v", in, err)
	})
}

// refTypeOK reports whether encoding/json's v is a value of type t.
func refTypeOK(t Type, v any) bool {
	switch t {
	case String:
		_, ok := v.(string)
		return ok
	case Float:
		n, ok := v.(json.Number)
		if !ok {
			return false
		}
		_, err := strconv.ParseFloat(string(n), 64)
		return err == nil
	case Int:
		n, ok := v.(json.Number)
		if !ok {
			return false
		}
		_, err := strconv.ParseInt(string(n), 10, 64)
		return err == nil
	case Bool:
		_, ok := v.(bool)
		return ok
	}
	return false
}

func checkSame(t *testing.T, r *Row, sp FieldSpec, v any, in string) {
	t.Helper()
	f := sp.Field
	if !refTypeOK(f.Type, v) {
		t.Fatalf("field %q decoded from %T %v: %q", f.Name, v, v, in)
	}
	switch f.Type {
	case String:
		got := r.Str(f.Slot)
		if !utf8.ValidString(got) || got != v.(string) {
			t.Fatalf("field %q = %q, encoding/json %q: %q", f.Name, got, v, in)
		}
	case Float:
		want, _ := strconv.ParseFloat(string(v.(json.Number)), 64)
		if got := r.Float(f.Slot); math.Float64bits(got) != math.Float64bits(want) {
			t.Fatalf("field %q = %v, encoding/json %v: %q", f.Name, got, want, in)
		}
	case Int:
		want, _ := strconv.ParseInt(string(v.(json.Number)), 10, 64)
		if got := r.Int(f.Slot); got != want {
			t.Fatalf("field %q = %v, encoding/json %v: %q", f.Name, got, want, in)
		}
	case Bool:
		if got := r.Bool(f.Slot); got != v.(bool) {
			t.Fatalf("field %q = %v, encoding/json %v: %q", f.Name, got, v, in)
		}
	}
}
