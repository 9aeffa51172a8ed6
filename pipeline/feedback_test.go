package pipeline

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// templateMayMatch agrees with the MQTT matching rules: a placeholder is
// any text without wildcards ('/' included, or none), + one level, a
// trailing # any number of levels and its parent.
func TestTemplateMayMatch(t *testing.T) {
	for _, c := range []struct {
		tmpl, filter string
		want         bool
	}{
		{"agg/{id}", "agg/+", true},
		{"agg/{id}", "agg/#", true},
		{"agg/{id}", "#", true},
		{"agg/{id}", "agg", false}, // "agg/…" always has a second level
		{"agg/{id}", "sensors/+/temperature", false},
		{"agg/{id}", "+/x/y", true}, // {id} = "x/y"
		{"agg/x", "agg/+/+", false},
		{"agg/x", "agg/x/#", true}, // # matches its parent level
		{"agg/x", "agg/x/+", false},
		{"agg/{id}/avg", "agg/+/temperature", false},
		{"agg/{id}/avg", "agg/+/avg", true},
		{"agg/{id}/avg", "+/+", false}, // three levels at least
		{"sensors/{id}/temperature", "sensors/+/temperature", true},
		{"sensors/{id}-avg", "sensors/+/temperature", false},
		{"sensors/{id}-avg", "sensors/+", true},
		{"deadletter/p", "deadletter/p", true},
		{"deadletter/p", "deadletter/q", false},
		{"deadletter/p", "+/+", true},
		{"deadletter/p", "+", false},
		{"{a}{b}", "x/y/z", true},
		{"a{b}c", "a/c", true},   // b = "/"
		{"a{b}c", "a/+/c", true}, // b = "/x/"
		{"a{b}c", "b/+", false},
	} {
		if got := templateMayMatch(c.tmpl, c.filter); got != c.want {
			t.Errorf("templateMayMatch(%q, %q) = %v, want %v", c.tmpl, c.filter, got, c.want)
		}
	}
}

// mqttMatch is the MQTT 3.1.1 topic matching rule, level by level: the
// model templateMayMatch is checked against.
func mqttMatch(filter, topic string) bool {
	fl, tl := strings.Split(filter, "/"), strings.Split(topic, "/")
	for i, f := range fl {
		if f == "#" {
			return true
		}
		if i >= len(tl) || (f != "+" && f != tl[i]) {
			return false
		}
	}
	return len(fl) == len(tl)
}

// templateMayMatch says a template can make a topic a filter matches
// exactly when some fill of its placeholders does: random templates and
// filters over a small alphabet, each template filled with every
// combination of short texts, by seed.
func TestTemplateMayMatchAgreesWithFills(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	// Every text over a, b and / of up to 7 characters: a filter here
	// has at most 7 characters, so a template of one placeholder that
	// can make a topic it matches can with one of them. Templates of two
	// are checked one way only (with fills of up to 3 characters).
	fills := []string{""}
	for i := 0; i < len(fills) && len(fills[i]) < 7; i++ {
		for _, c := range []string{"a", "b", "/"} {
			fills = append(fills, fills[i]+c)
		}
	}
	gen := func(parts []string, n int) string {
		var b strings.Builder
		for range n {
			b.WriteString(parts[rng.IntN(len(parts))])
		}
		return b.String()
	}
	var matched int
	for range 1000 {
		tmpl := gen([]string{"a", "b", "/", "{x}"}, 1+rng.IntN(5))
		filter := gen([]string{"a", "b", "+", "/"}, 1+rng.IntN(5))
		if len(filter) > 5 {
			continue
		}
		if rng.IntN(4) == 0 {
			filter += "/#"
		}
		if checkTopicFilter(filter) != "" || checkTopicTemplate(tmpl) != "" {
			continue
		}
		n := strings.Count(tmpl, "{x}")
		if n > 2 {
			continue
		}
		any := false
		var fill func(s string, k int)
		fill = func(s string, k int) {
			if any {
				return
			}
			if k == n {
				any = s != "" && mqttMatch(filter, s)
				return
			}
			for _, v := range fills {
				if n == 2 && len(v) > 3 {
					break
				}
				fill(strings.Replace(s, "{x}", v, 1), k+1)
			}
		}
		fill(tmpl, 0)
		got := templateMayMatch(tmpl, filter)
		if any && !got {
			t.Fatalf("templateMayMatch(%q, %q) = false, but a fill matches", tmpl, filter)
		}
		if got && !any && n < 2 {
			t.Fatalf("templateMayMatch(%q, %q) = true, but no fill matches", tmpl, filter)
		}
		if any {
			matched++
		}
	}
	if matched == 0 {
		t.Fatal("no template matched a filter: the check saw nothing")
	}
}

func mqttPipelineYAML(name, broker string, topics, sink string) string {
	b := ""
	if broker != "" {
		b = "\n        broker: " + broker
	}
	return `
  - name: ` + name + `
    source:
      mqtt:` + b + `
        topics: [` + topics + `]
        format: json
        fields: {id: {type: string, path: $.sensor}, t: {type: float, path: $.t}}
    sinks: [{stdout: {}}, {mqtt: {topic: "` + sink + `"}}]`
}

// A pipeline whose MQTT sink publishes its results, or its dead letters,
// where its own source reads on the same broker is refused, naming both
// keys; so are pipelines that feed each other in a cycle. Pipelines that
// feed one another in a chain, and a sink to another broker, are not.
func TestFeedbackLoopRefused(t *testing.T) {
	for _, c := range []struct {
		name      string
		pipelines []string
		want      []string // in the error, or none for a valid config
	}{
		{"own results", []string{mqttPipelineYAML("p", "", "sensors/#", "sensors/{id}/avg")},
			[]string{`pipelines[0].sinks[1].mqtt.topic: "sensors/{id}/avg" is matched by pipelines[0].source.mqtt.topics[0] "sensors/#", the pipeline's own source, on the same broker`}},
		{"own results through a placeholder", []string{mqttPipelineYAML("p", "", "x/+/temperature", "x/{id}")},
			[]string{`pipelines[0].sinks[1].mqtt.topic: "x/{id}" is matched by pipelines[0].source.mqtt.topics[0] "x/+/temperature", the pipeline's own source, on the same broker`}},
		{"own dead letters", []string{mqttPipelineYAML("p", "", "sensors/+/temperature, deadletter/#", "agg/{id}")},
			[]string{`pipelines[0].sinks[1].mqtt (its dead letters): "deadletter/p" is matched by pipelines[0].source.mqtt.topics[1] "deadletter/#", the pipeline's own source, on the same broker`}},
		{"external broker the sinks use", []string{mqttPipelineYAML("p", "tcp://192.0.2.1:1883", `"#"`, "agg/{id}")},
			[]string{`pipelines[0].sinks[1].mqtt.topic: "agg/{id}" is matched by pipelines[0].source.mqtt.topics[0] "#", the pipeline's own source, on the same broker`}},
		{"external broker that is the embedded one", []string{mqttPipelineYAML("p", "tcp://localhost:1883", `"#"`, "agg/{id}"), mqttPipelineYAML("q", "", "in/+", "out/{id}")},
			[]string{`pipelines[0].sinks[1].mqtt.topic: "agg/{id}" is matched by pipelines[0].source.mqtt.topics[0] "#", the pipeline's own source, on the same broker`}},
		{"cycle", []string{mqttPipelineYAML("p", "", "a/+", "b/{id}"), mqttPipelineYAML("q", "", "b/+", "a/{id}")},
			[]string{`pipelines "p" -> "q" -> "p" feed each other in a cycle`,
				`pipelines[0].sinks[1].mqtt.topic "b/{id}" is matched by pipelines[1].source.mqtt.topics[0] "b/+"`,
				`pipelines[1].sinks[1].mqtt.topic "a/{id}" is matched by pipelines[0].source.mqtt.topics[0] "a/+"`}},
		{"cycle through dead letters", []string{mqttPipelineYAML("p", "", "a/+", "b/{id}"), mqttPipelineYAML("q", "", "deadletter/+", "x/{id}"),
			mqttPipelineYAML("r", "", "x/#", "a/{id}")},
			[]string{`feed each other in a cycle`, `(its dead letters) "deadletter/p" is matched by pipelines[1].source.mqtt.topics[0] "deadletter/+"`}},
		{"chain", []string{mqttPipelineYAML("p", "", "a/+", "b/{id}"), mqttPipelineYAML("q", "", "b/+", "c/{id}")}, nil},
		{"other topics", []string{mqttPipelineYAML("p", "", "sensors/+/temperature", "sensors/{id}/avg")}, nil},
		{"sinks on the embedded broker, source on another", []string{mqttPipelineYAML("p", "tcp://192.0.2.1:1883", `"#"`, "agg/{id}"),
			mqttPipelineYAML("q", "", "in/+", "out/{id}")}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse([]byte("pipelines:" + strings.Join(c.pipelines, "")))
			if len(c.want) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error, want %q", c.want)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %v\nwant %q", err, w)
				}
			}
		})
	}
}
