package pipeline

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// mqttTopicConfig is a pipeline reading topic from the embedded broker
// (or from broker when set), with max_message_bytes bound.
func mqttTopicConfig(topic, broker string, bound int) string {
	b := ""
	if broker != "" {
		b = "\n        broker: " + broker
	}
	return fmt.Sprintf(`
pipelines:
  - name: p
    source:
      mqtt:
        topics: [%q]
        format: json
        max_message_bytes: %d%s
        fields:
          id: {type: string}
    sinks: [{stdout: {}}]
`, topic, bound, b)
}

// A topic filter on the embedded broker that matches only topics too
// long for a message over max_message_bytes to be cut to a dead letter
// (34 bytes at the smallest bound, 64) is refused naming it: the broker
// would end the connection of every device sending such a message. The
// filter's shortest topic counts: "+" matches an empty level, a trailing
// "#" the parent level. An external broker's pipeline is not bound so.
func TestTopicLongerThanACutMessageIsRefused(t *testing.T) {
	long := "s/" + strings.Repeat("t", 33) // 35 bytes
	for _, c := range []struct {
		topic, broker string
		bound         int
		refused       bool
	}{
		{long, "", 64, true},
		{long[:34], "", 64, false},
		{long + "/#", "", 64, true},
		{"+/" + long[2:] + "/+", "", 64, true}, // 36: "/" + 33 + "/"
		{"+/" + long[2:], "", 64, false},       // 34
		{long, "", 65, false},
		{long, "tcp://127.0.0.1:1883", 64, false},
		{"#", "", 64, false},
	} {
		_, err := Parse([]byte(mqttTopicConfig(c.topic, c.broker, c.bound)))
		var ce *ConfigError
		refused := errors.As(err, &ce) && len(ce.Problems) == 1 &&
			ce.Problems[0].Path == "pipelines[0].source.mqtt.topics[0]" &&
			strings.Contains(ce.Problems[0].Msg, "may have to become a dead letter")
		if refused != c.refused || (!c.refused && err != nil) {
			t.Errorf("topic %q, broker %q, max_message_bytes %d: %v; want refused %v", c.topic, c.broker, c.bound, err, c.refused)
		}
	}
}
