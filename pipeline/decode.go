package pipeline

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf16"
	"unicode/utf8"
)

// TimeUnit says how a number in a payload is read as a time field: seconds
// or milliseconds since the Unix epoch. A string is always read as RFC 3339.
type TimeUnit uint8

// Time units.
const (
	Millis TimeUnit = iota
	Seconds
)

// FieldSpec says where a decoder finds one field of the schema.
type FieldSpec struct {
	// Field is the schema field the value goes to.
	Field Field
	// Path is the JSON key path ($.a.b is {"a","b"}).
	Path []string
	// Column is the 0-based CSV column.
	Column int
	// Unit applies to time fields given as numbers.
	Unit TimeUnit
}

// maxJSONDepth bounds the nesting a JSON decoder follows: the arrays and
// objects around the deepest value, the outermost object counted (it is
// at depth 0).
const maxJSONDepth = 64

// jsonNode is a node of the JSON decoder's key trie: either a leaf (spec >=
// 0) or an object whose keys are the children (obj is its index among the
// objects, for the duplicate check).
type jsonNode struct {
	name     string
	spec     int
	obj      int
	children []*jsonNode
}

// JSONDecoder decodes JSON objects into Rows, reading only the mapped key
// paths and skipping (but checking) everything else. It builds no map and,
// for payloads without escaped strings, allocates nothing: string values
// are substrings of the payload. A JSONDecoder is immutable and may be
// shared.
//
// It accepts only what encoding/json accepts, and decodes a mapped field
// to the value encoding/json would give it, or refuses the payload
// (ErrMalformed, naming the field) where encoding/json would guess:
//
//   - a string field takes a JSON string only (42 and true are refused,
//     not turned into "42"); its value must be valid UTF-8 (encoding/json
//     replaces bad bytes by U+FFFD, which would merge distinct keys);
//     escapes are decoded, a surrogate pair (\ud83d\ude00) as the one
//     character it encodes, and a lone surrogate is refused;
//   - float and int fields take a JSON number only (not "12"); an int
//     field refuses a fraction or exponent, a float field a number beyond
//     float64's range;
//   - a bool field takes the literals true and false only;
//   - a time field takes a JSON number (in the field's unit) or a JSON
//     string in RFC 3339;
//   - a mapped key given twice, or an object on a mapped path given twice
//     (encoding/json keeps the last), is refused.
//
// Values the pipeline does not map are checked for JSON syntax only.
type JSONDecoder struct {
	root  jsonNode
	specs []FieldSpec
}

// NewJSONDecoder returns the decoder of specs; every spec needs a Path. At
// most 64 fields, and at most 64 objects on their paths.
func NewJSONDecoder(specs []FieldSpec) (*JSONDecoder, error) {
	if len(specs) > 64 {
		return nil, fmt.Errorf("pipeline: at most 64 decoded fields, have %d", len(specs))
	}
	d := &JSONDecoder{root: jsonNode{spec: -1, obj: -1}, specs: specs}
	objs := 0
	for i, s := range specs {
		if len(s.Path) == 0 {
			return nil, fmt.Errorf("pipeline: field %q has an empty path", s.Field.Name)
		}
		n := &d.root
		for j, k := range s.Path {
			var c *jsonNode
			for _, ch := range n.children {
				if ch.name == k {
					c = ch
				}
			}
			leaf := j == len(s.Path)-1
			switch {
			case c == nil:
				c = &jsonNode{name: k, spec: -1, obj: -1}
				if !leaf {
					if objs == 64 {
						return nil, fmt.Errorf("pipeline: field %q: at most 64 objects on the fields' paths", s.Field.Name)
					}
					c.obj = objs
					objs++
				}
				n.children = append(n.children, c)
			case leaf || c.spec >= 0:
				return nil, fmt.Errorf("pipeline: field %q: path $.%s overlaps another field", s.Field.Name, strings.Join(s.Path, "."))
			}
			if leaf {
				c.spec = i
			}
			n = c
		}
	}
	return d, nil
}

// Decode decodes the JSON object in data into r, which it zeroes first.
// Every mapped path must be present; other keys are skipped. Errors wrap
// ErrMalformed; Decode never panics.
func (d *JSONDecoder) Decode(data string, r *Row) error {
	*r = Row{}
	p := jsonParser{s: data, d: d, r: r}
	p.ws()
	if err := p.object(&d.root, 0); err != nil {
		return err
	}
	p.ws()
	if p.i != len(p.s) {
		return p.fail("trailing data")
	}
	if want := uint64(1)<<len(d.specs) - 1; p.seen != want {
		for i := range d.specs {
			if p.seen&(1<<i) == 0 {
				return fmt.Errorf("%w: missing field %q ($.%s)", ErrMalformed, d.specs[i].Field.Name, strings.Join(d.specs[i].Path, "."))
			}
		}
	}
	return nil
}

type jsonParser struct {
	s       string
	i       int
	d       *JSONDecoder
	r       *Row
	seen    uint64 // specs decoded
	objSeen uint64 // objects on mapped paths entered
}

func (p *jsonParser) fail(what string) error {
	return fmt.Errorf("%w: json: %s at offset %d", ErrMalformed, what, p.i)
}

func (p *jsonParser) ws() {
	for p.i < len(p.s) {
		switch p.s[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

// object parses an object at p.i; n is the trie node of the object (nil:
// skip everything inside).
func (p *jsonParser) object(n *jsonNode, depth int) error {
	if depth >= maxJSONDepth {
		return p.fail("nesting too deep")
	}
	if p.i >= len(p.s) || p.s[p.i] != '{' {
		return p.fail("expected object")
	}
	p.i++
	p.ws()
	if p.i < len(p.s) && p.s[p.i] == '}' {
		p.i++
		return nil
	}
	for {
		p.ws()
		key, esc, err := p.str()
		if err != nil {
			return err
		}
		if esc {
			var bad string
			if key, bad = unquote(key); bad != "" {
				return p.fail(bad + " in key")
			}
		}
		p.ws()
		if p.i >= len(p.s) || p.s[p.i] != ':' {
			return p.fail("expected ':'")
		}
		p.i++
		p.ws()
		var child *jsonNode
		if n != nil {
			for _, c := range n.children {
				if c.name == key {
					child = c
					break
				}
			}
		}
		switch {
		case child == nil:
			err = p.skip(depth + 1)
		case child.spec >= 0:
			err = p.leaf(child.spec)
		default:
			if p.objSeen&(1<<child.obj) != 0 {
				return p.fail("duplicate key " + strconv.Quote(clip(key)))
			}
			p.objSeen |= 1 << child.obj
			if p.i < len(p.s) && p.s[p.i] != '{' {
				// A mapped path goes through it: name the key, not
				// only the offset ({"sensor": null} for $.sensor.id).
				return p.fail("expected an object for key " + strconv.Quote(clip(key)))
			}
			err = p.object(child, depth+1)
		}
		if err != nil {
			return err
		}
		p.ws()
		if p.i >= len(p.s) {
			return p.fail("unterminated object")
		}
		switch p.s[p.i] {
		case ',':
			p.i++
		case '}':
			p.i++
			return nil
		default:
			return p.fail("expected ',' or '}'")
		}
	}
}

// str parses a string at p.i and returns its raw contents (escapes left in
// place, but checked) and whether it has escapes.
func (p *jsonParser) str() (string, bool, error) {
	if p.i >= len(p.s) || p.s[p.i] != '"' {
		return "", false, p.fail("expected string")
	}
	start := p.i + 1
	esc := false
	for j := start; j < len(p.s); j++ {
		switch c := p.s[j]; {
		case c == '"':
			p.i = j + 1
			return p.s[start:j], esc, nil
		case c == '\\':
			esc = true
			j++
			if j >= len(p.s) {
				break
			}
			switch p.s[j] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if _, ok := hex4(p.s, j+1); !ok {
					p.i = j
					return "", false, p.fail(`bad \u escape`)
				}
				j += 4
			default:
				p.i = j
				return "", false, p.fail("bad escape")
			}
		case c < 0x20:
			p.i = j
			return "", false, p.fail("control character in string")
		}
	}
	return "", false, p.fail("unterminated string")
}

// hex4 reads the 4 hex digits of a \u escape at s[i:].
func hex4(s string, i int) (rune, bool) {
	if i < 0 || i+4 > len(s) {
		return 0, false
	}
	var v rune
	for k := i; k < i+4; k++ {
		c := s[k]
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		v = v<<4 | rune(c)
	}
	return v, true
}

// scanNumber returns the end of the JSON number at s[i:], or -1 when there
// is none: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?.
func scanNumber(s string, i int) int {
	j := i
	if j < len(s) && s[j] == '-' {
		j++
	}
	k := skipDigits(s, j)
	if k == j || (k-j > 1 && s[j] == '0') {
		return -1
	}
	j = k
	if j < len(s) && s[j] == '.' {
		if k = skipDigits(s, j+1); k == j+1 {
			return -1
		}
		j = k
	}
	if j < len(s) && (s[j] == 'e' || s[j] == 'E') {
		j++
		if j < len(s) && (s[j] == '+' || s[j] == '-') {
			j++
		}
		if k = skipDigits(s, j); k == j {
			return -1
		}
		j = k
	}
	return j
}

// skipDigits returns the end of the decimal digits at s[j:].
func skipDigits(s string, j int) int {
	for j < len(s) && s[j] >= '0' && s[j] <= '9' {
		j++
	}
	return j
}

// isJSONNumber reports whether all of s is one JSON number.
func isJSONNumber(s string) bool { return scanNumber(s, 0) == len(s) }

// number scans a JSON number at p.i and returns its text.
func (p *jsonParser) number() (string, error) {
	j := scanNumber(p.s, p.i)
	if j < 0 {
		return "", p.fail("bad number")
	}
	start := p.i
	p.i = j
	return p.s[start:j], nil
}

func (p *jsonParser) literal(word string) bool {
	if strings.HasPrefix(p.s[p.i:], word) {
		p.i += len(word)
		return true
	}
	return false
}

// skip checks and skips one value.
func (p *jsonParser) skip(depth int) error {
	if depth >= maxJSONDepth {
		return p.fail("nesting too deep")
	}
	if p.i >= len(p.s) {
		return p.fail("expected value")
	}
	switch c := p.s[p.i]; {
	case c == '{':
		return p.object(nil, depth)
	case c == '[':
		p.i++
		p.ws()
		if p.i < len(p.s) && p.s[p.i] == ']' {
			p.i++
			return nil
		}
		for {
			p.ws()
			if err := p.skip(depth + 1); err != nil {
				return err
			}
			p.ws()
			if p.i >= len(p.s) {
				return p.fail("unterminated array")
			}
			if p.s[p.i] == ']' {
				p.i++
				return nil
			}
			if p.s[p.i] != ',' {
				return p.fail("expected ',' or ']'")
			}
			p.i++
		}
	case c == '"':
		_, _, err := p.str()
		return err
	case c == '-' || (c >= '0' && c <= '9'):
		_, err := p.number()
		return err
	case p.literal("true"), p.literal("false"), p.literal("null"):
		return nil
	}
	return p.fail("unexpected character")
}

// leaf parses the value of spec i into the row.
func (p *jsonParser) leaf(i int) error {
	spec := &p.d.specs[i]
	if p.seen&(1<<i) != 0 {
		return p.fail("duplicate key for field " + strconv.Quote(spec.Field.Name))
	}
	p.seen |= 1 << i
	if p.i >= len(p.s) {
		return p.fail("expected value")
	}
	var text string
	var kind textKind
	switch c := p.s[p.i]; {
	case c == '"':
		s, esc, err := p.str()
		if err != nil {
			return err
		}
		if esc {
			var bad string
			if s, bad = unquote(s); bad != "" {
				return fmt.Errorf("%w: json: field %q: %s at offset %d", ErrMalformed, spec.Field.Name, bad, p.i)
			}
		}
		text, kind = s, jsonString
	case c == '-' || (c >= '0' && c <= '9'):
		s, err := p.number()
		if err != nil {
			return err
		}
		text, kind = s, jsonNumber
	case p.literal("true"):
		text, kind = "true", jsonBool
	case p.literal("false"):
		text, kind = "false", jsonBool
	default:
		return fmt.Errorf("%w: json: field %q: expected a %s at offset %d", ErrMalformed, spec.Field.Name, spec.Field.Type, p.i)
	}
	return setField(p.r, spec, text, kind)
}

// textKind says what a field's text was in the payload.
type textKind uint8

const (
	jsonString textKind = iota // a JSON string, unquoted
	jsonNumber                 // a JSON number
	jsonBool                   // the JSON literal true or false
	csvText                    // a CSV column, trimmed
)

// setField parses text into the field of spec. A JSON value must have the
// field's JSON type (a time takes a number or an RFC 3339 string); CSV
// text is read as the JSON value it spells: a number as a JSON number, a
// bool as true or false, anything else as a string.
func setField(r *Row, spec *FieldSpec, text string, kind textKind) error {
	f := spec.Field
	bad := func() error {
		what := ""
		switch kind {
		case jsonString:
			what = "the string "
		case jsonNumber:
			what = "the number "
		}
		article := "a"
		if f.Type == Int {
			article = "an"
		}
		return fmt.Errorf("%w: field %q: %s%q is not %s %s", ErrMalformed, f.Name, what, clip(text), article, f.Type)
	}
	number := kind == jsonNumber || (kind == csvText && f.Type != String && isJSONNumber(text))
	switch f.Type {
	case String:
		if kind != jsonString && kind != csvText {
			return bad()
		}
		if !utf8.ValidString(text) {
			return fmt.Errorf("%w: field %q: invalid UTF-8 in %q", ErrMalformed, f.Name, clip(text))
		}
		r.SetStr(f.Slot, text)
	case Float:
		if !number {
			return bad()
		}
		v, err := strconv.ParseFloat(text, 64)
		if err != nil {
			return bad()
		}
		r.SetFloat(f.Slot, v)
	case Int:
		if !number {
			return bad()
		}
		v, err := strconv.ParseInt(text, 10, 64)
		if err != nil {
			return bad()
		}
		r.SetInt(f.Slot, v)
	case Bool:
		if (kind != jsonBool && kind != csvText) || (text != "true" && text != "false") {
			return bad()
		}
		r.SetBool(f.Slot, text == "true")
	case Time:
		var ms int64
		ok := false
		switch {
		case number:
			ms, ok = parseNumTime(text, spec.Unit)
		case kind == jsonString || kind == csvText:
			ms, ok = parseRFC3339(text)
		}
		if !ok {
			return bad()
		}
		r.SetInt(f.Slot, ms)
	}
	return nil
}

// parseNumTime reads a JSON number in unit as milliseconds, taken down to
// its millisecond as an RFC 3339 time is (time.UnixMilli): 9.9996 s is
// 9999 ms, in the window of second 9, not 10. A number without an
// exponent is read exactly (1.001 s is 1001 ms, though 1.001*1000 is
// 1000.9999999999999 in float64); one with an exponent through float64,
// within a microsecond of a millisecond counting as that millisecond.
func parseNumTime(text string, unit TimeUnit) (int64, bool) {
	if v, err := strconv.ParseInt(text, 10, 64); err == nil {
		if unit == Seconds {
			if v > math.MaxInt64/1000 || v < math.MinInt64/1000 {
				return 0, false
			}
			v *= 1000
		}
		return v, true
	}
	if !strings.ContainsAny(text, "eE") {
		return parseDecimalTime(text, unit)
	}
	v, err := strconv.ParseFloat(text, 64)
	if err != nil {
		return 0, false
	}
	if unit == Seconds {
		v *= 1000
	}
	if r := math.Round(v); math.Abs(v-r) < 1e-3 {
		v = r
	} else {
		v = math.Floor(v)
	}
	if math.IsNaN(v) || v >= math.MaxInt64 || v < math.MinInt64 {
		return 0, false
	}
	return int64(v), true
}

// parseDecimalTime reads text, a JSON number with a fraction and no
// exponent (-?digits.digits), in unit as milliseconds, exactly, taken
// down to its millisecond.
func parseDecimalTime(text string, unit TimeUnit) (int64, bool) {
	neg := strings.HasPrefix(text, "-")
	if neg {
		text = text[1:]
	}
	whole, frac, ok := strings.Cut(text, ".")
	if !ok || whole == "" || frac == "" {
		return 0, false
	}
	shift := 0 // the fraction's digits that are whole milliseconds
	if unit == Seconds {
		shift = 3
	}
	const limit = math.MaxInt64 + 1 // the magnitude of math.MinInt64
	var ms uint64
	digit := func(c byte) bool {
		if c < '0' || c > '9' || ms > (limit-uint64(c-'0'))/10 {
			return false
		}
		ms = ms*10 + uint64(c-'0')
		return true
	}
	for i := range len(whole) {
		if !digit(whole[i]) {
			return 0, false
		}
	}
	rest := false // a nonzero digit below the millisecond
	for i := range len(frac) {
		c := frac[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		if i >= shift {
			rest = rest || c != '0'
		} else if !digit(c) {
			return 0, false
		}
	}
	for i := len(frac); i < shift; i++ {
		if !digit('0') {
			return 0, false
		}
	}
	if !neg {
		if ms > math.MaxInt64 {
			return 0, false
		}
		return int64(ms), true
	}
	if rest {
		ms++ // down, away from zero
	}
	switch {
	case ms == 0:
		return 0, true
	case ms > limit:
		return 0, false
	}
	return -int64(ms-1) - 1, true
}

// parseRFC3339 reads an RFC 3339 time as milliseconds.
func parseRFC3339(text string) (int64, bool) {
	t, err := time.Parse(time.RFC3339Nano, text)
	if err != nil {
		return 0, false
	}
	return t.UnixMilli(), true
}

// clip shortens s for an error message.
func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

// unquote decodes the escapes of a JSON string's raw contents, which str
// has checked. A surrogate pair becomes the character it encodes; a lone
// surrogate is refused. It returns what is wrong, or "".
func unquote(raw string) (string, string) {
	var b strings.Builder
	b.Grow(len(raw))
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		if c != '\\' {
			b.WriteByte(c)
			continue
		}
		i++
		if i >= len(raw) {
			return "", "bad escape"
		}
		switch raw[i] {
		case '"', '\\', '/':
			b.WriteByte(raw[i])
		case 'b':
			b.WriteByte('\b')
		case 'f':
			b.WriteByte('\f')
		case 'n':
			b.WriteByte('\n')
		case 'r':
			b.WriteByte('\r')
		case 't':
			b.WriteByte('\t')
		case 'u':
			v, ok := hex4(raw, i+1)
			if !ok {
				return "", `bad \u escape`
			}
			i += 4
			if utf16.IsSurrogate(v) {
				var lo rune
				ok := false
				if i+2 < len(raw) && raw[i+1] == '\\' && raw[i+2] == 'u' {
					lo, ok = hex4(raw, i+3)
				}
				r := utf16.DecodeRune(v, lo)
				if !ok || r == utf8.RuneError {
					return "", fmt.Sprintf(`lone surrogate \u%04x`, v)
				}
				v = r
				i += 6
			}
			b.WriteRune(v)
		default:
			return "", "bad escape"
		}
	}
	return b.String(), ""
}

// CSVDecoder decodes delimited lines into Rows by column index. A column
// may be quoted as RFC 4180 says: "a,b" is the text a,b and "say ""hi"""
// is say "hi"; spaces around the quotes are dropped, and the text inside
// is taken as it is, not trimmed. A line whose quoted column has no
// closing quote or text after it, or with a quote in an unquoted column,
// is malformed (as encoding/csv says too), in every column up to the
// last one read. An unquoted column is trimmed of spaces. A column is
// read as the JSON value it spells: float, int and time fields take JSON
// numbers only (1.5, -2e3; not NaN, Inf, 0x1p4, 1_0, +1 or 01), a time
// field also RFC 3339, a bool field true or false, and a string field
// any valid UTF-8. It allocates nothing but the text of a column with
// doubled quotes: strings are substrings of the line. A CSVDecoder is
// immutable and may be shared.
type CSVDecoder struct {
	delim  byte
	specs  []FieldSpec
	byCol  []int // column -> spec index, or -1
	needed int   // columns the line must have
}

// NewCSVDecoder returns the decoder of specs (by Column) for lines
// separated by delim.
func NewCSVDecoder(specs []FieldSpec, delim byte) (*CSVDecoder, error) {
	if delim == '"' || delim == '\r' || delim == '\n' {
		return nil, fmt.Errorf("pipeline: csv delimiter %q: not a quote or a line end", delim)
	}
	d := &CSVDecoder{delim: delim, specs: specs}
	for i, s := range specs {
		if s.Column < 0 || s.Column > 1023 {
			return nil, fmt.Errorf("pipeline: field %q: column %d out of range", s.Field.Name, s.Column)
		}
		for len(d.byCol) <= s.Column {
			d.byCol = append(d.byCol, -1)
		}
		if d.byCol[s.Column] >= 0 {
			return nil, fmt.Errorf("pipeline: field %q: column %d is taken", s.Field.Name, s.Column)
		}
		d.byCol[s.Column] = i
	}
	d.needed = len(d.byCol)
	return d, nil
}

// Decode decodes line into r, which it zeroes first. Errors wrap
// ErrMalformed; Decode never panics.
func (d *CSVDecoder) Decode(line string, r *Row) error {
	*r = Row{}
	line = strings.TrimRight(line, "\r\n")
	quotes := strings.IndexByte(line, '"') >= 0
	col := 0
	for start := 0; col < d.needed; col++ {
		var v string
		next := -1
		if quotes {
			var err error
			if v, next, err = d.column(line, start, col); err != nil {
				return err
			}
		} else {
			// No quote in the line: the column ends at the delimiter.
			v = line[start:]
			if end := strings.IndexByte(v, d.delim); end >= 0 {
				v, next = v[:end], start+end+1
			}
			v = strings.TrimSpace(v)
		}
		if i := d.byCol[col]; i >= 0 {
			if err := setField(r, &d.specs[i], v, csvText); err != nil {
				return err
			}
		}
		if next < 0 {
			col++
			break
		}
		start = next
	}
	if col < d.needed {
		return fmt.Errorf("%w: csv: %d columns, want at least %d", ErrMalformed, col, d.needed)
	}
	return nil
}

// column returns the text of column col, which starts at line[start:],
// and where the next column starts (-1: col is the line's last).
func (d *CSVDecoder) column(line string, start, col int) (string, int, error) {
	i := start
	for i < len(line) && (line[i] == ' ' || line[i] == '\t') && line[i] != d.delim {
		i++
	}
	if i == len(line) || line[i] != '"' {
		end := strings.IndexByte(line[start:], d.delim)
		next := -1
		if end < 0 {
			end = len(line) - start
		} else {
			next = start + end + 1
		}
		v := line[start : start+end]
		if strings.IndexByte(v, '"') >= 0 {
			return "", 0, fmt.Errorf("%w: csv: column %d: a quote in an unquoted column %q (quote the whole column and double its quotes)", ErrMalformed, col, clip(v))
		}
		return strings.TrimSpace(v), next, nil
	}
	// A quoted column: up to the quote that is not doubled.
	from := i + 1
	j, doubled := from, false
	for {
		k := strings.IndexByte(line[j:], '"')
		if k < 0 {
			return "", 0, fmt.Errorf("%w: csv: column %d: no closing quote in %q", ErrMalformed, col, clip(line[i:]))
		}
		j += k
		if j+1 < len(line) && line[j+1] == '"' {
			doubled = true
			j += 2
			continue
		}
		break
	}
	v := line[from:j]
	if doubled {
		v = strings.ReplaceAll(v, `""`, `"`)
	}
	k := j + 1
	for k < len(line) && (line[k] == ' ' || line[k] == '\t') && line[k] != d.delim {
		k++
	}
	switch {
	case k == len(line):
		return v, -1, nil
	case line[k] == d.delim:
		return v, k + 1, nil
	}
	return "", 0, fmt.Errorf("%w: csv: column %d: text after the closing quote in %q", ErrMalformed, col, clip(line[i:]))
}
