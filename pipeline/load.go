package pipeline

import (
	"encoding"
	"fmt"
	"io"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/edgedio/edged/snapshot"
)

// Load reads the config file at path, decodes it strictly (unknown keys and
// values of the wrong type are problems) and validates it. It returns a
// *ConfigError listing every problem, or an error from reading the file.
func Load(path string) (*Config, error) {
	data, err := readConfig(path)
	if err != nil {
		return nil, fmt.Errorf("pipeline: load config: %w", err)
	}
	cfg, err := Parse(data)
	if ce, ok := err.(*ConfigError); ok {
		ce.File = path
	}
	return cfg, err
}

// MaxConfigBytes is the largest config file Load reads: a config is a few
// kilobytes, and a path given by mistake (a log file, /dev/zero, a FIFO
// that never ends) was read whole into memory until the node ran out of
// it.
const MaxConfigBytes = 4 << 20

// readConfig reads the file at path, refusing one over MaxConfigBytes.
func readConfig(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.IsDir() {
		return nil, fmt.Errorf("%s is a directory, not a config file", path)
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxConfigBytes+1))
	if err != nil {
		return nil, err // names the path
	}
	if len(data) > MaxConfigBytes {
		return nil, fmt.Errorf("%s: %w: more than %d bytes, not a config file", path, ErrConfigTooLarge, MaxConfigBytes)
	}
	return data, nil
}

// Parse decodes and validates a config from YAML, as Load does.
func Parse(data []byte) (*Config, error) {
	var root yaml.Node
	var p problems
	if err := yaml.Unmarshal(data, &root); err != nil {
		p.add("", strings.TrimPrefix(err.Error(), "yaml: "))
		return nil, p.err("")
	}
	cfg := &Config{}
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		d := nodeDecoder{probs: &p}
		d.decode(root.Content[0], reflect.ValueOf(cfg).Elem(), "")
		if d.expandedTooMuch {
			// What decoded is cut short anywhere: validating it would
			// only add noise (and work) to the one problem that matters.
			return nil, p.err("")
		}
	}
	if len(p) > 0 {
		// Validate what decoded too, so the user sees everything at once,
		// but say nothing more of a key whose value did not decode.
		bad := map[string]bool{}
		for _, q := range p {
			bad[q.Path] = true
		}
		var v problems
		cfg.validate(&v)
		for _, q := range v {
			if !bad[q.Path] {
				p = append(p, q)
			}
		}
		return nil, p.err("")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return cfg, nil
}

// nodeDecoder decodes a yaml.Node tree into Go values by their yaml tags,
// recording a Problem (with the key path) for every unknown key and every
// value of the wrong type instead of stopping at the first.
type nodeDecoder struct {
	probs *problems
	// aliasDepth is how many aliases the node being decoded is reached
	// through, and expanded how many values (and entries of mappings and
	// lists) were decoded through one: the cost of the aliases, which
	// MaxAliasExpansion bounds. expandedTooMuch is set once it is over.
	aliasDepth      int
	expanded        int
	expandedTooMuch bool
}

// MaxAliasExpansion bounds how many YAML values (and entries of mappings
// and lists) a config may decode through aliases (*name), every
// repetition counted: an alias of a list of aliases repeats the work at
// each level, so a file of a few kilobytes would otherwise decode
// billions of values (a "billion laughs"). Past it the config is refused
// naming the key where the bound was reached.
const MaxAliasExpansion = 100_000

// defaulter is implemented by structs that have defaults before decoding.
type defaulter interface{ setDefaults() }

// nodeUnmarshaler is implemented by types that decode themselves.
type nodeUnmarshaler interface {
	unmarshalNode(d *nodeDecoder, n *yaml.Node, path string)
}

var (
	durationType     = reflect.TypeFor[time.Duration]()
	modeType         = reflect.TypeFor[snapshot.Mode]()
	textUnmarshalerT = reflect.TypeFor[encoding.TextUnmarshaler]()
)

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	}
	return strconv.Quote(n.Value)
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.Tag == "!!null"
}

func (d *nodeDecoder) decode(n *yaml.Node, v reflect.Value, path string) {
	if d.expandedTooMuch {
		return
	}
	if n.Kind == yaml.AliasNode {
		d.aliasDepth++
		defer func() { d.aliasDepth-- }()
		for n.Kind == yaml.AliasNode {
			n = n.Alias
		}
	}
	if d.aliasDepth > 0 {
		d.expanded += 1 + len(n.Content)
		if d.expanded > MaxAliasExpansion {
			d.expandedTooMuch = true
			d.probs.add(path, fmt.Sprintf("YAML aliases expand the config to more than %d values (every repetition counted): write the repeated parts out, or repeat them less", MaxAliasExpansion))
			return
		}
	}
	if v.CanAddr() {
		if u, ok := v.Addr().Interface().(nodeUnmarshaler); ok {
			u.unmarshalNode(d, n, path)
			return
		}
	}
	t := v.Type()
	switch {
	case t == durationType:
		if n.Kind != yaml.ScalarNode {
			d.probs.add(path, describe(n)+" is not a duration")
			return
		}
		dur, err := time.ParseDuration(n.Value)
		if err != nil {
			if n.Value == "0" {
				dur = 0
			} else {
				d.probs.add(path, strconv.Quote(n.Value)+" is not a duration")
				return
			}
		}
		v.SetInt(int64(dur))
		return
	case t == modeType:
		var m snapshot.Mode
		if n.Kind != yaml.ScalarNode || m.UnmarshalText([]byte(n.Value)) != nil {
			d.probs.add(path, describe(n)+" must be exactly_once or at_least_once")
			return
		}
		v.Set(reflect.ValueOf(m))
		return
	case reflect.PointerTo(t).Implements(textUnmarshalerT):
		if n.Kind != yaml.ScalarNode {
			d.probs.add(path, describe(n)+" is not valid")
			return
		}
		if err := v.Addr().Interface().(encoding.TextUnmarshaler).UnmarshalText([]byte(n.Value)); err != nil {
			d.probs.add(path, fmt.Sprintf("%q is not valid: %v", n.Value, err))
		}
		return
	}
	switch t.Kind() {
	case reflect.Pointer:
		if isNull(n) && t.Elem().Kind() != reflect.Struct {
			return
		}
		e := reflect.New(t.Elem())
		if !isNull(n) {
			d.decode(n, e.Elem(), path)
		}
		v.Set(e)
	case reflect.Struct:
		if dft, ok := v.Addr().Interface().(defaulter); ok {
			dft.setDefaults()
		}
		if isNull(n) {
			return
		}
		if n.Kind != yaml.MappingNode {
			d.probs.add(path, describe(n)+" is not a mapping")
			return
		}
		fields := map[string]int{}
		for i := range t.NumField() {
			if tag := strings.Split(t.Field(i).Tag.Get("yaml"), ",")[0]; tag != "" && tag != "-" {
				fields[tag] = i
			}
		}
		seen := map[string]bool{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, val := n.Content[i], n.Content[i+1]
			kp := join(path, k.Value)
			if seen[k.Value] {
				d.probs.add(kp, "duplicate key")
				continue
			}
			seen[k.Value] = true
			fi, ok := fields[k.Value]
			if !ok {
				d.probs.add(kp, unknownKey(k.Value, fields))
				continue
			}
			d.decode(val, v.Field(fi), kp)
		}
	case reflect.Slice:
		if isNull(n) {
			return
		}
		if n.Kind != yaml.SequenceNode {
			d.probs.add(path, describe(n)+" is not a list")
			return
		}
		s := reflect.MakeSlice(t, len(n.Content), len(n.Content))
		for i, c := range n.Content {
			d.decode(c, s.Index(i), fmt.Sprintf("%s[%d]", path, i))
		}
		v.Set(s)
	case reflect.String:
		if n.Kind != yaml.ScalarNode || isNull(n) {
			d.probs.add(path, describe(n)+" is not a string")
			return
		}
		v.SetString(n.Value)
	case reflect.Int, reflect.Int64, reflect.Int32:
		x, err := strconv.ParseInt(n.Value, 0, t.Bits())
		if n.Kind != yaml.ScalarNode || err != nil {
			d.probs.add(path, describe(n)+" is not an integer")
			return
		}
		v.SetInt(x)
	case reflect.Float64:
		x, err := strconv.ParseFloat(n.Value, 64)
		if n.Kind != yaml.ScalarNode || err != nil {
			d.probs.add(path, describe(n)+" is not a number")
			return
		}
		v.SetFloat(x)
	case reflect.Bool:
		x, err := strconv.ParseBool(n.Value)
		if n.Kind != yaml.ScalarNode || err != nil {
			d.probs.add(path, describe(n)+" is not a bool")
			return
		}
		v.SetBool(x)
	default:
		d.probs.add(path, "cannot decode into "+t.String())
	}
}

// unmarshalNode decodes the ordered mapping of fields.
func (f *Fields) unmarshalNode(d *nodeDecoder, n *yaml.Node, path string) {
	if isNull(n) {
		return
	}
	if n.Kind != yaml.MappingNode {
		d.probs.add(path, describe(n)+" is not a mapping of field names")
		return
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		fc := FieldConfig{Name: k.Value}
		kp := join(path, k.Value)
		if val.Kind == yaml.ScalarNode {
			fc.Type = val.Value
		} else {
			d.decode(val, reflect.ValueOf(&fc).Elem(), kp)
			fc.Name = k.Value
		}
		*f = append(*f, fc)
	}
}

// unmarshalNode decodes an ordered `name: expr` mapping.
func (e *Exprs) unmarshalNode(d *nodeDecoder, n *yaml.Node, path string) {
	if isNull(n) {
		return
	}
	if n.Kind != yaml.MappingNode {
		d.probs.add(path, describe(n)+" is not a mapping of names to expressions")
		return
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		if val.Kind != yaml.ScalarNode {
			d.probs.add(join(path, k.Value), describe(val)+" is not an expression")
			continue
		}
		*e = append(*e, NamedExpr{Name: k.Value, Expr: val.Value})
	}
}

// unknownKey says what is wrong with key, which is not one of the known
// keys at its level: the known key it is likely a misspelling of (at most
// two edits away), else the known keys.
func unknownKey(key string, known map[string]int) string {
	best, bestD := "", 3
	names := make([]string, 0, len(known))
	for k := range known {
		names = append(names, k)
	}
	slices.Sort(names)
	for _, k := range names {
		if d := editDistance(strings.ToLower(key), k); d < bestD {
			best, bestD = k, d
		}
	}
	if best != "" {
		return fmt.Sprintf("unknown key; did you mean %q?", best)
	}
	return "unknown key (known here: " + strings.Join(names, ", ") + ")"
}

// editDistance is the Levenshtein distance between a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			sub := prev[j-1]
			if a[i-1] != b[j-1] {
				sub++
			}
			cur[j] = min(sub, prev[j]+1, cur[j-1]+1)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
