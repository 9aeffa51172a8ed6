package pipeline

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
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

// maxJSONDepth bounds the nesting a JSON decoder follows.
const maxJSONDepth = 64

// jsonNode is a node of the JSON decoder's key trie: either a leaf (spec >=
// 0) or an object whose keys are the children.
type jsonNode struct {
	name     string
	spec     int
	children []*jsonNode
}

// JSONDecoder decodes JSON objects into Rows, reading only the mapped key
// paths and skipping (but checking) everything else. It builds no map and,
// for payloads without escaped strings, allocates nothing: string values
// are substrings of the payload. A JSONDecoder is immutable and may be
// shared.
type JSONDecoder struct {
	root  jsonNode
	specs []FieldSpec
}

// NewJSONDecoder returns the decoder of specs; every spec needs a Path. At
// most 64 fields.
func NewJSONDecoder(specs []FieldSpec) (*JSONDecoder, error) {
	if len(specs) > 64 {
		return nil, fmt.Errorf("pipeline: at most 64 decoded fields, have %d", len(specs))
	}
	d := &JSONDecoder{root: jsonNode{spec: -1}, specs: specs}
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
				c = &jsonNode{name: k, spec: -1}
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
	s    string
	i    int
	d    *JSONDecoder
	r    *Row
	seen uint64
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
	if depth > maxJSONDepth {
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
			if key, err = unquote(key); err != nil {
				return p.fail("bad escape in key")
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
// place) and whether it has escapes.
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
		case c < 0x20:
			p.i = j
			return "", false, p.fail("control character in string")
		}
	}
	return "", false, p.fail("unterminated string")
}

// number scans a JSON number at p.i and returns its text.
func (p *jsonParser) number() (string, error) {
	start := p.i
	j := p.i
	if j < len(p.s) && p.s[j] == '-' {
		j++
	}
	digits := func() int {
		k := j
		for j < len(p.s) && p.s[j] >= '0' && p.s[j] <= '9' {
			j++
		}
		return j - k
	}
	if n := digits(); n == 0 || (n > 1 && p.s[j-n] == '0') {
		return "", p.fail("bad number")
	}
	if j < len(p.s) && p.s[j] == '.' {
		j++
		if digits() == 0 {
			return "", p.fail("bad number")
		}
	}
	if j < len(p.s) && (p.s[j] == 'e' || p.s[j] == 'E') {
		j++
		if j < len(p.s) && (p.s[j] == '+' || p.s[j] == '-') {
			j++
		}
		if digits() == 0 {
			return "", p.fail("bad number")
		}
	}
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
	if depth > maxJSONDepth {
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
	quoted := false
	switch c := p.s[p.i]; {
	case c == '"':
		s, esc, err := p.str()
		if err != nil {
			return err
		}
		if esc {
			if s, err = unquote(s); err != nil {
				return p.fail("bad escape")
			}
		}
		text, quoted = s, true
	case c == '-' || (c >= '0' && c <= '9'):
		s, err := p.number()
		if err != nil {
			return err
		}
		text = s
	case p.literal("true"):
		text = "true"
	case p.literal("false"):
		text = "false"
	default:
		return fmt.Errorf("%w: json: field %q: expected a %s at offset %d", ErrMalformed, spec.Field.Name, spec.Field.Type, p.i)
	}
	if err := setField(p.r, spec, text, quoted); err != nil {
		return err
	}
	return nil
}

// setField parses text into the field of spec. quoted says the text was a
// JSON string (so a number field refuses it... except times in RFC 3339).
func setField(r *Row, spec *FieldSpec, text string, quoted bool) error {
	f := spec.Field
	bad := func() error {
		return fmt.Errorf("%w: field %q: %q is not a %s", ErrMalformed, f.Name, clip(text), f.Type)
	}
	switch f.Type {
	case String:
		r.SetStr(f.Slot, text)
	case Float:
		v, err := strconv.ParseFloat(text, 64)
		if err != nil || quoted {
			return bad()
		}
		r.SetFloat(f.Slot, v)
	case Int:
		v, err := strconv.ParseInt(text, 10, 64)
		if err != nil || quoted {
			return bad()
		}
		r.SetInt(f.Slot, v)
	case Bool:
		v, err := strconv.ParseBool(text)
		if err != nil || (quoted && text != "true" && text != "false") {
			return bad()
		}
		r.SetBool(f.Slot, v)
	case Time:
		ms, ok := parseTime(text, spec.Unit)
		if !ok {
			return bad()
		}
		r.SetInt(f.Slot, ms)
	}
	return nil
}

// parseTime reads a number in unit, or an RFC 3339 time, as milliseconds.
func parseTime(text string, unit TimeUnit) (int64, bool) {
	if v, err := strconv.ParseInt(text, 10, 64); err == nil {
		if unit == Seconds {
			if v > math.MaxInt64/1000 || v < math.MinInt64/1000 {
				return 0, false
			}
			v *= 1000
		}
		return v, true
	}
	if v, err := strconv.ParseFloat(text, 64); err == nil {
		if unit == Seconds {
			v *= 1000
		}
		if math.IsNaN(v) || v >= math.MaxInt64 || v <= math.MinInt64 {
			return 0, false
		}
		return int64(math.Round(v)), true
	}
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

// unquote decodes the escapes of a JSON string's raw contents.
func unquote(raw string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		if c != '\\' {
			b.WriteByte(c)
			continue
		}
		i++
		if i >= len(raw) {
			return "", ErrMalformed
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
			if i+4 >= len(raw) {
				return "", ErrMalformed
			}
			v, err := strconv.ParseUint(raw[i+1:i+5], 16, 32)
			if err != nil {
				return "", ErrMalformed
			}
			b.WriteRune(rune(v))
			i += 4
		default:
			return "", ErrMalformed
		}
	}
	return b.String(), nil
}

// CSVDecoder decodes delimited lines into Rows by column index. Values are
// trimmed of spaces; quoting is not supported (a quote is an ordinary
// character). It allocates nothing: strings are substrings of the line. A
// CSVDecoder is immutable and may be shared.
type CSVDecoder struct {
	delim  byte
	specs  []FieldSpec
	byCol  []int // column -> spec index, or -1
	needed int   // columns the line must have
}

// NewCSVDecoder returns the decoder of specs (by Column) for lines
// separated by delim.
func NewCSVDecoder(specs []FieldSpec, delim byte) (*CSVDecoder, error) {
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
	col := 0
	for start := 0; col < d.needed; col++ {
		end := strings.IndexByte(line[start:], d.delim)
		var v string
		if end < 0 {
			v = line[start:]
		} else {
			v = line[start : start+end]
		}
		if i := d.byCol[col]; i >= 0 {
			if err := setField(r, &d.specs[i], strings.TrimSpace(v), false); err != nil {
				return err
			}
		}
		if end < 0 {
			col++
			break
		}
		start += end + 1
	}
	if col < d.needed {
		return fmt.Errorf("%w: csv: %d columns, want at least %d", ErrMalformed, col, d.needed)
	}
	return nil
}
