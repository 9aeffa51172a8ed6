package pipeline

import (
	"encoding/binary"
	"errors"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/edgedio/edged/codec"
)

func jsonTestDecoder(t testing.TB) (*JSONDecoder, *Schema, []FieldSpec) {
	s := &Schema{}
	id, _ := s.add("id", String)
	temp, _ := s.add("temp", Float)
	ts, _ := s.add("ts", Time)
	ok, _ := s.add("ok", Bool)
	n, _ := s.add("n", Int)
	specs := []FieldSpec{
		{Field: id, Path: []string{"sensor", "id"}},
		{Field: temp, Path: []string{"t"}},
		{Field: ts, Path: []string{"ts"}, Unit: Seconds},
		{Field: ok, Path: []string{"ok"}},
		{Field: n, Path: []string{"n"}},
	}
	d, err := NewJSONDecoder(specs)
	if err != nil {
		t.Fatal(err)
	}
	return d, s, specs
}

const samplePayload = `{"sensor": {"id": "sensor_7", "loc": [1, 2, {"x": null}]}, "t": 35.8, "extra": "a\"b", "ts": 1547718199, "ok": true, "n": -3}`

func TestJSONDecode(t *testing.T) {
	d, s, _ := jsonTestDecoder(t)
	var r Row
	if err := d.Decode(samplePayload, &r); err != nil {
		t.Fatal(err)
	}
	got := string(r.AppendJSON(nil, s))
	want := `{"id":"sensor_7","temp":35.8,"ts":1547718199000,"ok":true,"n":-3}`
	if got != want {
		t.Errorf("got %s\nwant %s", got, want)
	}
	// Escapes in values and keys, RFC 3339 times.
	if err := d.Decode(`{"sensor":{"\u0069d":"a\nb"},"t":1e1,"ts":"2019-01-17T09:43:19Z","ok":false,"n":0}`, &r); err != nil {
		t.Fatal(err)
	}
	if r.Str(0) != "a\nb" || r.Float(0) != 10 || r.Int(1) != 1547718199000 {
		t.Errorf("escaped: %s", r.AppendJSON(nil, s))
	}
}

func TestJSONMalformed(t *testing.T) {
	d, _, _ := jsonTestDecoder(t)
	for _, in := range []string{
		``, `{`, `[]`, `{"t": 1}`, `{"sensor":{"id":"x"},"t":"hot","ts":1,"ok":true,"n":1}`,
		`{"sensor":{"id":"x"},"t":1,"ts":1,"ok":true,"n":1.5}`,
		`{"sensor":{"id":"x"},"t":1,"ts":1,"ok":true,"n":1} x`,
		`{"sensor":{"id":"x"},"t":01,"ts":1,"ok":true,"n":1}`,
		`{"sensor":{"id":"x"},"t":1,"t":2,"ts":1,"ok":true,"n":1}`,
		`{"sensor":"x","t":1,"ts":1,"ok":true,"n":1}`,
		`{"a":` + string(make([]byte, 0)) + `[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}`,
	} {
		var r Row
		if err := d.Decode(in, &r); !errors.Is(err, ErrMalformed) {
			t.Errorf("Decode(%q) = %v, want ErrMalformed", in, err)
		}
	}
	// A value that is not an object where a mapped path goes through it
	// names its key.
	for _, in := range []string{`{"sensor":null,"t":1,"ts":1}`, `{"sensor":"x","t":1,"ts":1}`, `{"sensor":[],"t":1,"ts":1}`} {
		var r Row
		err := d.Decode(in, &r)
		if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), `expected an object for key "sensor"`) {
			t.Errorf("Decode(%q) = %v, want one naming the key", in, err)
		}
	}
}

// The reason of a value of the wrong type names the field's type with
// its article: "is not an int", not "is not a int".
func TestJSONWrongTypeReason(t *testing.T) {
	d, _, _ := jsonTestDecoder(t)
	for in, want := range map[string]string{
		`{"sensor":{"id":"x"},"t":1,"ts":1,"ok":true,"n":1.5}`:    `field "n": the number "1.5" is not an int`,
		`{"sensor":{"id":"x"},"t":1,"ts":1,"ok":true,"n":"7"}`:    `field "n": the string "7" is not an int`,
		`{"sensor":{"id":"x"},"t":"hot","ts":1,"ok":true,"n":1}`:  `field "temp": the string "hot" is not a float`,
		`{"sensor":{"id":"x"},"t":1,"ts":"soon","ok":true,"n":1}`: `field "ts": the string "soon" is not a time`,
	} {
		var r Row
		if err := d.Decode(in, &r); err == nil || !strings.HasSuffix(err.Error(), want) {
			t.Errorf("Decode(%s) = %v, want an error ending %s", in, err, want)
		}
	}
}

func csvTestDecoder(t testing.TB) (*CSVDecoder, *Schema) {
	s := &Schema{}
	id, _ := s.add("id", String)
	ts, _ := s.add("ts", Time)
	temp, _ := s.add("temp", Float)
	d, err := NewCSVDecoder([]FieldSpec{{Field: id, Column: 0}, {Field: ts, Column: 1, Unit: Seconds}, {Field: temp, Column: 3}}, ',')
	if err != nil {
		t.Fatal(err)
	}
	return d, s
}

func TestCSVDecode(t *testing.T) {
	d, s := csvTestDecoder(t)
	var r Row
	if err := d.Decode("sensor_1, 1547718199,skip,35.8,more\r\n", &r); err != nil {
		t.Fatal(err)
	}
	if got, want := string(r.AppendJSON(nil, s)), `{"id":"sensor_1","ts":1547718199000,"temp":35.8}`; got != want {
		t.Errorf("got %s want %s", got, want)
	}
	for _, in := range []string{"", "a,1,x", "a,x,y,1", "a,1,y,hot"} {
		if err := d.Decode(in, &r); !errors.Is(err, ErrMalformed) {
			t.Errorf("Decode(%q) = %v, want ErrMalformed", in, err)
		}
	}
}

func TestRowCodecRoundTrip(t *testing.T) {
	c := codec.For[Row]()
	var r Row
	r.SetStr(0, "sensor_1")
	r.SetStr(3, "x")
	r.SetFloat(0, math.Pi)
	r.SetInt(5, -7)
	b, err := c.Append(nil, r)
	if err != nil {
		t.Fatal(err)
	}
	got, n, err := c.Decode(b)
	if err != nil || n != len(b) || got != r {
		t.Fatalf("round trip: %v %d %v", got, n, err)
	}
	// A row without an origin is encoded as version 1 always was (state
	// written before origins existed restores); one with an origin as
	// version 2, which keeps it.
	if v, _ := r.AppendBinary(nil); v[0] != rowVersion {
		t.Fatalf("a row without an origin encoded as version %d", v[0])
	}
	r.origin = Origin{Topic: "sensors/a/temperature", Node: "node-2", Offset: 1 << 40}
	if b, err = c.Append(nil, r); err != nil {
		t.Fatal(err)
	}
	if got, n, err = c.Decode(b); err != nil || n != len(b) || got != r {
		t.Fatalf("round trip with an origin: %+v %d %v", got.origin, n, err)
	}
	if v, _ := r.AppendBinary(nil); v[0] != rowVersionOrigin {
		t.Fatalf("a row with an origin encoded as version %d", v[0])
	}
}

// Rows crossing a channel code their strings with the channel's
// numbering: a batch of rows decodes, in order, to the same rows, and a
// key sent before takes a byte instead of its length.
func TestRowDictRoundTrip(t *testing.T) {
	c := codec.For[Row]()
	keys := []string{"sensor_1", "sensor_2", "sensor_3"}
	var rows []Row
	for i := range 300 {
		var r Row
		r.SetStr(0, keys[i%len(keys)])
		if i%7 == 0 {
			r.SetStr(MaxStrFields-1, strings.Repeat("long", 10)) // over the numbered length
		}
		r.SetFloat(0, float64(i)/3)
		r.SetInt(MaxNumFields-1, int64(-i))
		if i%3 != 0 {
			// Rows of MQTT messages carry their origin across.
			r.origin = Origin{Topic: "sensors/" + keys[i%len(keys)], Offset: uint64(i) + 1}
			if i%2 == 0 {
				r.origin.Node = "node-1"
			}
		}
		rows = append(rows, r)
	}
	rows = append(rows, Row{}, Row{origin: Origin{Offset: 1}}) // no slot at all
	var e codec.DictEncoder
	var dd codec.DictDecoder
	d := codec.NewDecoder(c)
	var out []Row
	var coded int
	for range 2 {
		b, err := codec.AppendBatchDict(c, &e, nil, rows)
		if err != nil {
			t.Fatal(err)
		}
		coded = len(b)
		n, k := binary.Uvarint(b)
		out, k2, err := d.AppendNDict(out[:0], b[k:], int(n), &dd)
		if err != nil || k+k2 != len(b) {
			t.Fatalf("decode: %v, %d of %d bytes", err, k+k2, len(b))
		}
		if !slices.Equal(out, rows) {
			t.Fatal("decoded rows differ")
		}
	}
	plain, err := codec.AppendBatch(c, nil, rows)
	if err != nil {
		t.Fatal(err)
	}
	if coded >= len(plain)-len(rows)*8 {
		t.Fatalf("numbered batch %d bytes, plain %d", coded, len(plain))
	}
}

// FuzzRowDecodeDict decodes any bytes as the first row of a channel: an
// error wrapping codec.ErrCorrupt or codec.ErrShort, never a panic.
func FuzzRowDecodeDict(f *testing.F) {
	var r Row
	r.SetStr(0, "a")
	r.SetStr(1, "a")
	r.SetFloat(1, 2)
	var e codec.DictEncoder
	f.Add(r.AppendDict(nil, &e))
	r.origin = Origin{Topic: "t", Node: "n", Offset: 7}
	f.Add(r.AppendDict(nil, &e))
	f.Add([]byte{0, 2, 1, 3})
	f.Add([]byte{17})
	f.Fuzz(func(t *testing.T, in []byte) {
		var dd codec.DictDecoder
		d := codec.NewDecoder(codec.For[Row]())
		out, n, err := d.AppendNDict(nil, in, 1, &dd)
		if err != nil {
			if !errors.Is(err, codec.ErrCorrupt) && !errors.Is(err, codec.ErrShort) {
				t.Fatalf("error %v wraps neither ErrCorrupt nor ErrShort", err)
			}
			return
		}
		if n < 1 || n > len(in) || len(out) != 1 {
			t.Fatalf("decoded %d rows from %d of %d bytes", len(out), n, len(in))
		}
	})
}

func FuzzJSONDecode(f *testing.F) {
	d, s, _ := jsonTestDecoder(f)
	f.Add(samplePayload)
	f.Add(`{"sensor":{"id":"a\u00e9"},"t":-0.5e-3,"ts":"2019-01-17T09:43:19Z","ok":false,"n":0}`)
	f.Add(`{"a":[{"b":[1,2,"x"]}],"t":1}`)
	f.Fuzz(func(t *testing.T, in string) {
		// Whole and in two halves (the second half alone must not panic
		// either).
		var r Row
		err := d.Decode(in, &r)
		if err != nil && !errors.Is(err, ErrMalformed) {
			t.Fatalf("error not ErrMalformed: %v", err)
		}
		if err == nil {
			// Re-encoding and decoding the row's own JSON keeps it.
			_ = r.AppendJSON(nil, s)
		}
		_ = d.Decode(in[len(in)/2:], &r)
		var back Row
		b, _ := r.AppendBinary(nil)
		if err := back.UnmarshalBinary(b); err != nil || back != r {
			t.Fatalf("binary round trip: %v", err)
		}
	})
}

func FuzzCSVDecode(f *testing.F) {
	d, _ := csvTestDecoder(f)
	f.Add("sensor_1,1547718199,x,35.8")
	f.Add("a,1.5,,NaN")
	f.Add(`"a,""b""",1547718199, "x,y" ,"35.8"`)
	f.Add(`"a,1,x"y,"2`)
	f.Fuzz(func(t *testing.T, in string) {
		var r Row
		if err := d.Decode(in, &r); err != nil && !errors.Is(err, ErrMalformed) {
			t.Fatalf("error not ErrMalformed: %v", err)
		}
	})
}

func FuzzRowUnmarshal(f *testing.F) {
	var r Row
	r.SetStr(1, "x")
	r.SetInt(2, 9)
	b, _ := r.AppendBinary(nil)
	f.Add(b)
	r.origin = Origin{Topic: "t", Offset: 3}
	b, _ = r.AppendBinary(nil)
	f.Add(b)
	f.Fuzz(func(t *testing.T, b []byte) {
		var r Row
		if r.UnmarshalBinary(b) != nil {
			return
		}
		again, _ := r.AppendBinary(nil)
		var r2 Row
		if err := r2.UnmarshalBinary(again); err != nil || r2 != r {
			t.Fatalf("re-decode: %v", err)
		}
	})
}

func TestDecodeAllocatesNothing(t *testing.T) {
	d, _, _ := jsonTestDecoder(t)
	c, _ := csvTestDecoder(t)
	var r Row
	if n := testing.AllocsPerRun(100, func() { _ = d.Decode(samplePayload, &r) }); n != 0 {
		t.Errorf("JSON decode: %v allocs, want 0", n)
	}
	if n := testing.AllocsPerRun(100, func() { _ = c.Decode("sensor_1,1547718199,x,35.8", &r) }); n != 0 {
		t.Errorf("CSV decode: %v allocs, want 0", n)
	}
}

func BenchmarkDecode(b *testing.B) {
	d, _, _ := jsonTestDecoder(b)
	c, _ := csvTestDecoder(b)
	payloads := make([]string, 1024)
	for i := range payloads {
		payloads[i] = `{"sensor": {"id": "sensor_` + strconv.Itoa(i%100) + `", "loc": [1, 2]}, "t": 35.8, "ts": 1547718199, "ok": true, "n": -3}`
	}
	b.Run("format=json", func(b *testing.B) {
		b.SetBytes(int64(len(payloads[0])))
		b.ReportAllocs()
		var r Row
		i := 0
		for b.Loop() {
			if err := d.Decode(payloads[i&1023], &r); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
	b.Run("format=csv", func(b *testing.B) {
		line := "sensor_1,1547718199,x,35.8"
		b.SetBytes(int64(len(line)))
		b.ReportAllocs()
		var r Row
		for b.Loop() {
			if err := c.Decode(line, &r); err != nil {
				b.Fatal(err)
			}
		}
	})
	// A line with quoted columns, one with doubled quotes (the only
	// text the decoder allocates).
	b.Run("format=csv/quoted", func(b *testing.B) {
		line := `"sensor ""1""",1547718199,"x,y","35.8"`
		b.SetBytes(int64(len(line)))
		b.ReportAllocs()
		var r Row
		for b.Loop() {
			if err := c.Decode(line, &r); err != nil {
				b.Fatal(err)
			}
		}
	})
	// Baseline: encoding/json into a map, what the decoder avoids.
	b.Run("format=json/baseline=encoding-json-map", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			var m map[string]any
			if err := jsonUnmarshal([]byte(payloads[i&1023]), &m); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
}

// A payload nested 64 arrays or objects deep, the outermost object
// counted, decodes; one nested 65 deep is a dead letter.
func TestJSONNestingBound(t *testing.T) {
	d, _, _ := jsonTestDecoder(t)
	nested := func(total int) string {
		arrays := total - 1 // inside the outer object
		return `{"sensor":{"id":"x"},"t":1,"ts":1,"ok":true,"n":1,"x":` + strings.Repeat("[", arrays) + strings.Repeat("]", arrays) + `}`
	}
	var r Row
	if err := d.Decode(nested(maxJSONDepth), &r); err != nil {
		t.Fatalf("nested %d deep: %v", maxJSONDepth, err)
	}
	if err := d.Decode(nested(maxJSONDepth+1), &r); !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "nesting too deep") {
		t.Fatalf("nested %d deep: %v, want nesting too deep", maxJSONDepth+1, err)
	}
}

// A time given as a number with a fraction of a millisecond is taken down
// to its millisecond, as the same time given in RFC 3339 is, exactly for
// decimal fractions (1.001 s is 1001 ms, though 1.001*1000 is
// 1000.9999999999999 in float64). Before, it was rounded to the nearest
// millisecond: a reading stamped 9.9996 s (a device sending Python's
// time.time()) went to the window of the next second, and
// 1547718199.9996 gave 1547718200000 where "2019-01-17T09:43:19.9996Z"
// gave 1547718199999.
func TestNumericTimeIsTakenDownToItsMillisecond(t *testing.T) {
	for _, c := range []struct {
		text string
		unit TimeUnit
		want int64
	}{
		{"1547718199.9996", Seconds, 1547718199999},
		{"1547718199.999", Seconds, 1547718199999},
		{"1.001", Seconds, 1001},
		{"0.0005", Seconds, 0},
		{"1547718199999.7", Millis, 1547718199999},
		{"1547718199999.0", Millis, 1547718199999},
		{"-0.5", Millis, -1},
		{"-0.0", Millis, 0},
		{"-1.0001", Seconds, -1001},
		{"-1.001", Seconds, -1001},
		{"9.9996e0", Seconds, 9999},
		{"1.001e0", Seconds, 1001},
		{"1e3", Seconds, 1000000},
		{"9223372036854775.807", Seconds, math.MaxInt64},
	} {
		got, ok := parseNumTime(c.text, c.unit)
		if !ok || got != c.want {
			t.Errorf("parseNumTime(%s, %v) = %d, %v; want %d", c.text, c.unit, got, ok, c.want)
		}
	}
	for _, text := range []string{"9223372036854775.808", "-9223372036854775.809", "1e400", "9223372036854775807.5"} {
		if got, ok := parseNumTime(text, Seconds); ok {
			t.Errorf("parseNumTime(%s, s) = %d, want out of range", text, got)
		}
	}

	d, _, _ := jsonTestDecoder(t)
	var num, str Row
	if err := d.Decode(`{"sensor":{"id":"a"},"t":1,"ts":1547718199.9996,"ok":true,"n":1}`, &num); err != nil {
		t.Fatal(err)
	}
	if err := d.Decode(`{"sensor":{"id":"a"},"t":1,"ts":"2019-01-17T09:43:19.9996Z","ok":true,"n":1}`, &str); err != nil {
		t.Fatal(err)
	}
	if num.Int(1) != str.Int(1) {
		t.Errorf("ts 1547718199.9996 is %d ms, \"2019-01-17T09:43:19.9996Z\" %d ms", num.Int(1), str.Int(1))
	}
}
