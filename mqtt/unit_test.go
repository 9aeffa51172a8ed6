package mqtt

import (
	"errors"
	"strings"
	"testing"
)

func TestMatchTopic(t *testing.T) {
	for _, c := range []struct {
		filter, topic string
		want          bool
	}{
		{"#", "a/b", true},
		{"#", "$SYS/x", false},
		{"sensors/#", "sensors", true},
		{"sensors/#", "sensors/a/b", true},
		{"sensors/#", "sensorsx/a", false},
		{"sensors/+", "sensors/a", true},
		{"sensors/+", "sensors/a/b", false},
		{"sensors/+/t", "sensors/a/t", true},
		{"+/+", "a", false},
		{"a/b", "a/b", true},
		{"a/b", "a/b/c", false},
		{"a/b/c", "a/b", false},
		{"+", "", true},
	} {
		if got := MatchTopic(c.filter, c.topic); got != c.want {
			t.Errorf("MatchTopic(%q, %q) = %v", c.filter, c.topic, got)
		}
	}
}

func TestBrokerConfigValidate(t *testing.T) {
	err := BrokerConfig{Filters: []string{"a/#/b", "a+", "ok/+"}}.Validate()
	if !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("Validate = %v", err)
	}
	if n := len(err.(interface{ Unwrap() []error }).Unwrap()); n != 3 {
		t.Fatalf("%d problems reported, want 3: %v", n, err)
	}
	if err := DefaultBrokerConfig().Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestMsgID(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`{"v":1}`, `{"v":1,"msg_id":"abc"}`},
		{` { } `, `{ "msg_id":"abc"}`},
		{`{"v":{"w":[1]}}`, `{"v":{"w":[1]},"msg_id":"abc"}`},
		{`21.5`, `abc|21.5`},
		{`{bad`, `abc|{bad`},
		{``, `abc|`},
		{`a|b`, `abc|a|b`},
	} {
		got := WithMsgID([]byte(c.in), "abc")
		if string(got) != c.want {
			t.Errorf("WithMsgID(%q) = %q, want %q", c.in, got, c.want)
		}
		if id, ok := ParseMsgID(got); !ok || id != "abc" {
			t.Errorf("ParseMsgID(%q) = %q, %v", got, id, ok)
		}
	}
	if _, ok := ParseMsgID([]byte(`{"v":1}`)); ok {
		t.Error("ParseMsgID found an id in a plain object")
	}
}

func TestTopicTemplate(t *testing.T) {
	tmpl := MustParseTopicTemplate("agg/{site}/{id}/avg")
	got, err := tmpl.Expand(func(n string) string { return map[string]string{"site": "north", "id": "s1"}[n] })
	if err != nil || got != "agg/north/s1/avg" {
		t.Fatalf("Expand = %q, %v", got, err)
	}
	if _, err := tmpl.Expand(func(string) string { return "+" }); !errors.Is(err, ErrTopic) {
		t.Fatalf("wildcard value: %v", err)
	}
	for _, bad := range []string{"", "a/{", "a/{}", "a/#", "a/{x y}", "a}"} {
		if _, err := ParseTopicTemplate(bad); !errors.Is(err, ErrTopic) {
			t.Errorf("ParseTopicTemplate(%q) = %v", bad, err)
		}
	}
	if got, _ := MustParseTopicTemplate("plain/topic").Expand(nil); got != "plain/topic" {
		t.Fatalf("literal template = %q", got)
	}
}

// A placeholder value that would make an invalid MQTT 3.1.1 topic name is
// an ErrTopic from Expand, naming the placeholder; values that make valid
// names (including empty levels) pass.
func TestTopicTemplateRejectsInvalidNames(t *testing.T) {
	tmpl := MustParseTopicTemplate("agg/{id}")
	for _, bad := range []string{"#", "a+b", "+", "a/#", "\xff\xfe", "x\x00y", "tab\there", "del\x7f", "c1\u0085", "nc\uffff"} {
		got, err := tmpl.Expand(func(string) string { return bad })
		if !errors.Is(err, ErrTopic) || !strings.Contains(err.Error(), "{id}") {
			t.Errorf("Expand(id=%q) = %q, %v; want an ErrTopic naming {id}", bad, got, err)
		}
	}
	for _, ok := range []string{"", "s1", "a/b", "a//b", "température", "日本"} {
		if got, err := tmpl.Expand(func(string) string { return ok }); err != nil || got != "agg/"+ok {
			t.Errorf("Expand(id=%q) = %q, %v", ok, got, err)
		}
	}
	whole := MustParseTopicTemplate("{id}")
	for _, bad := range []string{"", "$SYS/x", strings.Repeat("a", MaxTopicLength+1)} {
		if _, err := whole.Expand(func(string) string { return bad }); !errors.Is(err, ErrTopic) {
			t.Errorf("Expand({id}=%.20q) = %v, want ErrTopic", bad, err)
		}
	}
	if got, err := whole.Expand(func(string) string { return strings.Repeat("a", MaxTopicLength) }); err != nil || len(got) != MaxTopicLength {
		t.Errorf("a topic of %d bytes: %v", MaxTopicLength, err)
	}
}

// A QoS 0 message (packet identifier 0) is never redelivered, so keyOf
// gives it the zero identity without hashing its topic and payload; a
// QoS 1 or 2 message is identified by its identifier and content.
func TestKeyOfQoS0IsNotHashed(t *testing.T) {
	if k := keyOf(0, "sensors/a", []byte(`{"t":1}`)); k != (msgKey{}) {
		t.Errorf("keyOf(0, ...) = %+v, want the zero msgKey (no hash for QoS 0)", k)
	}
	a := keyOf(7, "sensors/a", []byte(`{"t":1}`))
	if a.id != 7 || a.hash == 0 {
		t.Errorf("keyOf(7, ...) = %+v, want id 7 and a content hash", a)
	}
	if b := keyOf(7, "sensors/a", []byte(`{"t":2}`)); b == a {
		t.Errorf("keyOf gives the same identity to different payloads: %+v", b)
	}
	if b := keyOf(7, "sensors/a", []byte(`{"t":1}`)); b != a {
		t.Errorf("keyOf(7, same content) = %+v, want %+v", b, a)
	}
}
