package mqtt

import (
	"fmt"
	"strings"
	"unicode/utf8"
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

// Expand fills each placeholder with field(name) and checks the result
// with ValidateTopicName ('/' in a value is allowed and adds levels). An
// error wraps ErrTopic and names the placeholder whose value made the
// topic invalid.
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
		if err := checkTopicText(v); err != nil {
			return "", fmt.Errorf("%w: template %q: {%s} = %q: %s", ErrTopic, t.text, p.field, v, err)
		}
		sb.WriteString(v)
	}
	topic := sb.String()
	if err := ValidateTopicName(topic); err != nil {
		return "", fmt.Errorf("template %q: %w", t.text, err)
	}
	return topic, nil
}

// MaxTopicLength is the longest topic name MQTT can carry, in bytes.
const MaxTopicLength = 65535

// ValidateTopicName reports whether name can be published to, by the
// rules of MQTT 3.1.1 (sections 1.5.3 and 4.7) and what brokers enforce:
// 1 to 65535 bytes of well-formed UTF-8, no wildcard ('+', '#'), no NUL,
// no control character (U+0001–U+001F, U+007F–U+009F, which Mosquitto
// disconnects a client for) and no non-character U+FFFE or U+FFFF, and
// not starting with '$' (reserved for the broker). Empty levels ("a//b",
// "a/") are valid. The error wraps ErrTopic.
func ValidateTopicName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: empty topic name", ErrTopic)
	case len(name) > MaxTopicLength:
		return fmt.Errorf("%w: topic name of %d bytes, more than %d", ErrTopic, len(name), MaxTopicLength)
	case name[0] == '$':
		return fmt.Errorf("%w: topic name %q starts with $ (reserved for the broker)", ErrTopic, name)
	}
	if err := checkTopicText(name); err != nil {
		return fmt.Errorf("%w: topic name %q: %s", ErrTopic, name, err)
	}
	return nil
}

// checkTopicText returns what makes s unfit for a topic name, ignoring
// length and '$'; nil if nothing.
func checkTopicText(s string) error {
	if !utf8.ValidString(s) {
		return errTopicText("is not valid UTF-8")
	}
	for _, r := range s {
		switch {
		case r == '+' || r == '#':
			return errTopicText("has a wildcard")
		case r == 0:
			return errTopicText("has a NUL")
		case r < 0x20 || (r >= 0x7f && r <= 0x9f):
			return errTopicText(fmt.Sprintf("has the control character %U", r))
		case r == 0xfffe || r == 0xffff:
			return errTopicText(fmt.Sprintf("has the non-character %U", r))
		}
	}
	return nil
}

type errTopicText string

func (e errTopicText) Error() string { return string(e) }
