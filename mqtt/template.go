package mqtt

import (
	"fmt"
	"strings"
)

// TopicTemplate is a topic name with {field} placeholders, such as
// "agg/{id}" or "alerts/{site}/{sensor}", filled in per record.
type TopicTemplate struct {
	text  string
	parts []templatePart
}

type templatePart struct {
	literal string
	field   string // placeholder name; empty for a literal
}

// ParseTopicTemplate parses text. Placeholders are {name} with a
// non-empty name of letters, digits, '_', '-' or '.'; the literal parts
// must not contain MQTT wildcards.
func ParseTopicTemplate(text string) (TopicTemplate, error) {
	t := TopicTemplate{text: text}
	if text == "" {
		return t, fmt.Errorf("%w: empty topic template", ErrTopic)
	}
	rest := text
	for rest != "" {
		open := strings.IndexByte(rest, '{')
		if open < 0 {
			t.parts = append(t.parts, templatePart{literal: rest})
			break
		}
		if open > 0 {
			t.parts = append(t.parts, templatePart{literal: rest[:open]})
		}
		end := strings.IndexByte(rest[open:], '}')
		if end < 0 {
			return t, fmt.Errorf("%w: template %q: unclosed {", ErrTopic, text)
		}
		name := rest[open+1 : open+end]
		if !validFieldName(name) {
			return t, fmt.Errorf("%w: template %q: bad placeholder {%s}", ErrTopic, text, name)
		}
		t.parts = append(t.parts, templatePart{field: name})
		rest = rest[open+end+1:]
	}
	for _, p := range t.parts {
		if strings.ContainsAny(p.literal, "+#}\x00") {
			return t, fmt.Errorf("%w: template %q: literal %q has a wildcard, NUL or stray }", ErrTopic, text, p.literal)
		}
	}
	return t, nil
}

// MustParseTopicTemplate is ParseTopicTemplate that panics on error, for
// templates fixed in code.
func MustParseTopicTemplate(text string) TopicTemplate {
	t, err := ParseTopicTemplate(text)
	if err != nil {
		panic(err)
	}
	return t
}

func validFieldName(n string) bool {
	if n == "" {
		return false
	}
	for _, r := range n {
		ok := r == '_' || r == '-' || r == '.' || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9')
		if !ok {
			return false
		}
	}
	return true
}

// String returns the template's text.
func (t TopicTemplate) String() string { return t.text }

// Expand fills each placeholder with field(name). A value must not
// contain MQTT wildcards or NUL ('/' is allowed and adds levels).
func (t TopicTemplate) Expand(field func(name string) string) (string, error) {
	if len(t.parts) == 1 && t.parts[0].field == "" {
		return t.parts[0].literal, nil
	}
	var sb strings.Builder
	for _, p := range t.parts {
		if p.field == "" {
			sb.WriteString(p.literal)
			continue
		}
		v := field(p.field)
		if strings.ContainsAny(v, "+#\x00") {
			return "", fmt.Errorf("%w: template %q: {%s} = %q has a wildcard or NUL", ErrTopic, t.text, p.field, v)
		}
		sb.WriteString(v)
	}
	return sb.String(), nil
}
