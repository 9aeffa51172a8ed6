package pipeline

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"
)

// strictDecoders returns a JSON and a CSV decoder of one field of type t
// (JSON key "v", CSV column 0).
func strictDecoders(t *testing.T, typ Type) (*JSONDecoder, *CSVDecoder, Field) {
	t.Helper()
	s := &Schema{}
	f, _ := s.add("v", typ)
	j, err := NewJSONDecoder([]FieldSpec{{Field: f, Path: []string{"v"}}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewCSVDecoder([]FieldSpec{{Field: f, Column: 0}}, ',')
	if err != nil {
		t.Fatal(err)
	}
	return j, c, f
}

func TestJSONSurrogatePairs(t *testing.T) {
	j, _, f := strictDecoders(t, String)
	var r Row
	if err := j.Decode(`{"v":"\ud83d\ude00 \uD83D\uDE01"}`, &r); err != nil {
		t.Fatal(err)
	}
	if got := r.Str(f.Slot); got != "😀 😁" {
		t.Errorf("got %q (% x), want %q", got, got, "😀 😁")
	}
	// Keys decode the same way: the mapped key matches its escaped form.
	s := &Schema{}
	g, _ := s.add("x", String)
	jk, err := NewJSONDecoder([]FieldSpec{{Field: g, Path: []string{"😀"}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := jk.Decode(`{"\ud83d\ude00":"smile"}`, &r); err != nil || r.Str(g.Slot) != "smile" {
		t.Errorf("escaped key: %v %q", err, r.Str(g.Slot))
	}
	// A lone or misordered surrogate is a dead letter that names the
	// field: two distinct keys must never merge into U+FFFD.
	for _, in := range []string{
		`{"v":"\ud83d"}`, `{"v":"\ude00"}`, `{"v":"\ud83d\u0041"}`, `{"v":"\ude00\ud83d"}`, `{"v":"x\ud83d"}`,
	} {
		err := j.Decode(in, &r)
		if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), `"v"`) || !strings.Contains(err.Error(), "surrogate") {
			t.Errorf("Decode(%s) = %v, want ErrMalformed naming field \"v\" and the surrogate", in, err)
		}
	}
}

func TestInvalidUTF8IsDeadLetter(t *testing.T) {
	j, c, _ := strictDecoders(t, String)
	var r Row
	for _, in := range []string{"{\"v\":\"a\xffb\"}", "{\"v\":\"\xc3\"}", "{\"v\":\"\\n\xed\xa0\x80\"}"} {
		err := j.Decode(in, &r)
		if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), `"v"`) || !strings.Contains(err.Error(), "UTF-8") {
			t.Errorf("json Decode(%q) = %v, want ErrMalformed naming \"v\" and UTF-8", in, err)
		}
	}
	if err := c.Decode("a\xffb", &r); !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "UTF-8") {
		t.Errorf("csv: %v, want invalid UTF-8", err)
	}
	// Invalid UTF-8 in a value the pipeline does not read is not its
	// business.
	if err := j.Decode("{\"x\":\"\xff\",\"v\":\"ok\"}", &r); err != nil {
		t.Errorf("skipped value: %v", err)
	}
}

func TestStringFieldRefusesNumbers(t *testing.T) {
	j, c, f := strictDecoders(t, String)
	var r Row
	for _, in := range []string{`{"v":42}`, `{"v":true}`, `{"v":-1.5e3}`} {
		err := j.Decode(in, &r)
		if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), `"v"`) {
			t.Errorf("Decode(%s) = %v, want ErrMalformed naming \"v\"", in, err)
		}
	}
	// CSV has no types: a column is text.
	if err := c.Decode("42", &r); err != nil || r.Str(f.Slot) != "42" {
		t.Errorf("csv: %v %q", err, r.Str(f.Slot))
	}
}

func TestNumbersAreJSONNumbers(t *testing.T) {
	for _, typ := range []Type{Float, Int, Time} {
		j, c, _ := strictDecoders(t, typ)
		var r Row
		for _, in := range []string{"NaN", "nan", "Inf", "+Inf", "-Infinity", "infinity", "0x1p4", "0x10", "1_0", "+1", ".5", "5.", "1e", "0b1", "0o7", "01", "1e999", " ", "--1"} {
			if err := c.Decode(in, &r); !errors.Is(err, ErrMalformed) {
				t.Errorf("%s csv Decode(%q) = %v, want ErrMalformed", typ, in, err)
			}
		}
		// A number in a JSON string is a string, not a number.
		if err := j.Decode(`{"v":"12"}`, &r); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s json Decode(\"12\") = %v, want ErrMalformed", typ, err)
		}
	}
	_, c, f := strictDecoders(t, Float)
	var r Row
	for in, want := range map[string]float64{"1.5": 1.5, "-0.25e2": -25, "3": 3, " 7E+1 ": 70} {
		if err := c.Decode(in, &r); err != nil || r.Float(f.Slot) != want {
			t.Errorf("csv Decode(%q) = %v %v, want %v", in, r.Float(f.Slot), err, want)
		}
	}
	_, ci, fi := strictDecoders(t, Int)
	if err := ci.Decode("-12", &r); err != nil || r.Int(fi.Slot) != -12 {
		t.Errorf("csv int: %v %d", err, r.Int(fi.Slot))
	}
	// Times: a JSON string is RFC 3339 only; CSV text is a number or RFC 3339.
	jt, ct, ft := strictDecoders(t, Time)
	if err := jt.Decode(`{"v":"2019-01-17T09:43:19Z"}`, &r); err != nil || r.Int(ft.Slot) != 1547718199000 {
		t.Errorf("json rfc3339: %v %d", err, r.Int(ft.Slot))
	}
	if err := ct.Decode("2019-01-17T09:43:19Z", &r); err != nil || r.Int(ft.Slot) != 1547718199000 {
		t.Errorf("csv rfc3339: %v %d", err, r.Int(ft.Slot))
	}
	if err := ct.Decode("1547718199000.4", &r); err != nil || r.Int(ft.Slot) != 1547718199000 {
		t.Errorf("csv ms: %v %d", err, r.Int(ft.Slot))
	}
}

func TestBoolsAreLiterals(t *testing.T) {
	j, c, f := strictDecoders(t, Bool)
	var r Row
	for _, in := range []string{`{"v":"true"}`, `{"v":1}`, `{"v":"1"}`} {
		if err := j.Decode(in, &r); !errors.Is(err, ErrMalformed) {
			t.Errorf("json Decode(%s) = %v, want ErrMalformed", in, err)
		}
	}
	for in, want := range map[string]bool{"true": true, "false": false} {
		if err := c.Decode(in, &r); err != nil || r.Bool(f.Slot) != want {
			t.Errorf("csv Decode(%q) = %v %v", in, r.Bool(f.Slot), err)
		}
	}
	for _, in := range []string{"1", "0", "t", "TRUE", "yes"} {
		if err := c.Decode(in, &r); !errors.Is(err, ErrMalformed) {
			t.Errorf("csv Decode(%q) = %v, want ErrMalformed", in, err)
		}
	}
}

func TestJSONEscapesCheckedInSkippedStrings(t *testing.T) {
	j, _, _ := strictDecoders(t, String)
	var r Row
	for _, in := range []string{`{"x":"\q","v":"a"}`, `{"x":"\u12","v":"a"}`, `{"x":"\u12g4","v":"a"}`} {
		if err := j.Decode(in, &r); !errors.Is(err, ErrMalformed) {
			t.Errorf("Decode(%s) = %v, want ErrMalformed", in, err)
		}
	}
}

func TestJSONDuplicateObjectOnPath(t *testing.T) {
	s := &Schema{}
	f, _ := s.add("id", String)
	j, err := NewJSONDecoder([]FieldSpec{{Field: f, Path: []string{"a", "id"}}})
	if err != nil {
		t.Fatal(err)
	}
	var r Row
	// encoding/json keeps the last "a", which has no id: taking the first
	// would decode a value the payload's last word withdrew.
	if err := j.Decode(`{"a":{"id":"x"},"a":{"z":1}}`, &r); !errors.Is(err, ErrMalformed) {
		t.Errorf("Decode = %v (%q), want ErrMalformed", err, r.Str(f.Slot))
	}
}

func TestAppendJSONWritesValidUTF8(t *testing.T) {
	s := &Schema{}
	f, _ := s.add("s", String)
	var r Row
	r.SetStr(f.Slot, "a\xffb\xc3é\u2028")
	out := r.AppendJSON(nil, s)
	if !utf8.Valid(out) || !json.Valid(out) {
		t.Fatalf("AppendJSON = %q: not valid UTF-8 JSON", out)
	}
	var back map[string]string
	if err := json.Unmarshal(out, &back); err != nil || back["s"] != "a\ufffdb\ufffdé\u2028" {
		t.Errorf("round trip: %q %v", back["s"], err)
	}
}
