package pipeline

import (
	"fmt"
	"net"
	"net/url"
	"strings"
)

// Feedback loops over MQTT. A pipeline whose MQTT sink publishes, on the
// broker its MQTT source reads, to a topic one of its topic filters
// matches reads its own results (or dead letters) again, forever; so do
// pipelines that feed each other in a cycle. Validate refuses both.

// embeddedAddr is the embedded broker's address when node.broker is not
// set (daemon.DefaultBroker).
const embeddedAddr = "127.0.0.1:1883"

// sinkBroker returns where the MQTT sinks of c publish, as the daemon
// decides: "" for the embedded broker, which runs when a pipeline reads
// it, the simulator publishes to it or a pipeline that reads no external
// broker has an MQTT sink; else the external broker of the first
// pipeline that reads one.
func (c *Config) sinkBroker() string {
	embedded := c.Node.Simulator != nil
	external := ""
	for _, pc := range c.Pipelines {
		src := pc.Source.MQTT
		switch {
		case src != nil && src.Broker == "":
			embedded = true
		case src != nil:
			if external == "" {
				external = src.Broker
			}
		default:
			for _, s := range pc.Sinks {
				embedded = embedded || s.MQTT != nil
			}
		}
	}
	if embedded {
		return ""
	}
	return external
}

// sameBroker reports whether a source reading broker src ("": the
// embedded one) reads the broker the sinks publish to (sink, as
// sinkBroker returns it). An external URL naming the embedded broker's
// own host:port is the embedded broker.
func (c *Config) sameBroker(src, sink string) bool {
	if src == sink {
		return true
	}
	if sink != "" || src == "" {
		return false
	}
	u, err := url.Parse(src)
	if err != nil {
		return false
	}
	addr := c.Node.Broker
	if addr == "" {
		addr = embeddedAddr
	}
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if h == "" || h == "0.0.0.0" || h == "::" || h == "localhost" {
		h = "127.0.0.1"
	}
	uh := u.Hostname()
	if uh == "localhost" {
		uh = "127.0.0.1"
	}
	return uh == h && u.Port() == p
}

// feed is one way results of a pipeline reach a source: the topic a sink
// publishes to (a template, or the dead letters' topic) and the filter
// that matches it.
type feed struct {
	from, to int    // pipeline indexes
	topicKey string // the YAML key of the topic
	topic    string
	filter   string // the topic filter
	filterAt string // the YAML key of the filter
}

func (f feed) String() string {
	return fmt.Sprintf("%s %q is matched by %s %q", f.topicKey, f.topic, f.filterAt, f.filter)
}

// checkFeedback refuses a pipeline whose MQTT results reach its own MQTT
// source on the same broker, and pipelines whose results reach each other
// in a cycle.
func (c *Config) checkFeedback(p *problems) {
	sink := c.sinkBroker()
	// feeds[i] are the feeds out of pipeline i, at most one per target.
	feeds := make([][]feed, len(c.Pipelines))
	for i, pc := range c.Pipelines {
		for j, sc := range pc.Sinks {
			if sc.MQTT == nil || sc.MQTT.Topic == "" || checkTopicTemplate(sc.MQTT.Topic) != "" {
				continue
			}
			key := fmt.Sprintf("pipelines[%d].sinks[%d].mqtt", i, j)
			topics := []struct{ key, topic string }{
				{key + ".topic", sc.MQTT.Topic},
				{key + " (its dead letters)", "deadletter/" + pc.Name},
			}
			for k, qc := range c.Pipelines {
				src := qc.Source.MQTT
				if src == nil || !c.sameBroker(src.Broker, sink) {
					continue
				}
				if k == i || !hasFeed(feeds[i], k) {
				topics:
					for _, t := range topics {
						for f, filter := range src.Topics {
							if checkTopicFilter(filter) != "" || !templateMayMatch(t.topic, filter) {
								continue
							}
							fd := feed{from: i, to: k, topicKey: t.key, topic: t.topic, filter: filter,
								filterAt: fmt.Sprintf("pipelines[%d].source.mqtt.topics[%d]", k, f)}
							if k == i {
								p.add(t.key, fmt.Sprintf("%q is matched by %s %q, the pipeline's own source, on the same broker: the pipeline would read its own output again, forever",
									t.topic, fd.filterAt, filter))
							} else {
								feeds[i] = append(feeds[i], fd)
							}
							break topics
						}
					}
				}
			}
		}
	}
	// A cycle through two or more pipelines.
	const (
		unseen = iota
		onPath
		done
	)
	state := make([]int, len(c.Pipelines))
	var path []feed
	var visit func(i int)
	visit = func(i int) {
		state[i] = onPath
		for _, f := range feeds[i] {
			switch state[f.to] {
			case onPath:
				// The cycle is the path from f.to's outgoing feed on, and f.
				start := 0
				for start < len(path) && path[start].from != f.to {
					start++
				}
				cycle := append(append([]feed(nil), path[start:]...), f)
				parts := make([]string, len(cycle))
				names := make([]string, 0, len(cycle)+1)
				for n, cf := range cycle {
					parts[n] = cf.String()
					names = append(names, fmt.Sprintf("%q", c.Pipelines[cf.from].Name))
				}
				names = append(names, fmt.Sprintf("%q", c.Pipelines[f.to].Name))
				p.add(fmt.Sprintf("pipelines[%d]", f.to), fmt.Sprintf("pipelines %s feed each other in a cycle on the same broker (%s): their output would be read again, forever",
					strings.Join(names, " -> "), strings.Join(parts, "; ")))
			case unseen:
				path = append(path, f)
				visit(f.to)
				path = path[:len(path)-1]
			}
		}
		state[i] = done
	}
	for i := range c.Pipelines {
		if state[i] == unseen {
			visit(i)
		}
	}
}

func hasFeed(fs []feed, to int) bool {
	for _, f := range fs {
		if f.to == to {
			return true
		}
	}
	return false
}

// templateMayMatch reports whether some topic that the sink topic
// template tmpl makes can be matched by the subscription filter filter
// (both checked already). A {field} placeholder may be filled with any
// text without + or # (a value may hold '/': it spans levels, and it may
// be empty); in the filter + is one level and a trailing # is any number
// of levels, "a/#" matching "a" too (MQTT 3.1.1, 4.7.1.2). A topic
// starting with '$' is never a result topic (the sinks refuse it), so the
// rule that wildcards do not match such topics does not arise.
func templateMayMatch(tmpl, filter string) bool {
	type tok struct {
		any bool // a placeholder (template) or + (filter)
		c   byte
	}
	var t []tok
	for i := 0; i < len(tmpl); i++ {
		if tmpl[i] == '{' {
			end := strings.IndexByte(tmpl[i:], '}')
			if end < 0 {
				return false
			}
			t = append(t, tok{any: true})
			i += end
			continue
		}
		t = append(t, tok{c: tmpl[i]})
	}
	hash := false
	if filter == "#" {
		return true
	}
	if strings.HasSuffix(filter, "/#") {
		filter, hash = strings.TrimSuffix(filter, "/#"), true
	}
	var f []tok
	for i := 0; i < len(filter); i++ {
		if filter[i] == '+' {
			f = append(f, tok{any: true})
			continue
		}
		f = append(f, tok{c: filter[i]})
	}
	// Reachability over (position in t, position in f): each step reads
	// one character of a topic both can make, or skips an empty
	// placeholder or + level. The topic matches when both are at their
	// ends, or, with a trailing /#, when f is at its end and the rest of
	// the topic is empty or starts with '/' (which a placeholder, or a
	// literal '/', can give).
	type pos struct{ i, j int }
	seen := map[pos]bool{}
	stack := []pos{{0, 0}}
	for len(stack) > 0 {
		s := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if seen[s] {
			continue
		}
		seen[s] = true
		i, j := s.i, s.j
		if j == len(f) {
			if i == len(t) {
				return true
			}
			if hash && (t[i].any || t[i].c == '/') {
				return true
			}
		}
		next := func(i, j int) { stack = append(stack, pos{i, j}) }
		if i < len(t) && t[i].any {
			next(i+1, j) // an empty rest of the placeholder
		}
		if j < len(f) && f[j].any {
			next(i, j+1) // the rest of the level ends here
		}
		if i >= len(t) || j >= len(f) {
			continue
		}
		switch {
		case !t[i].any && !f[j].any:
			if t[i].c == f[j].c {
				next(i+1, j+1)
			}
		case !t[i].any: // + reads a literal that is not '/'
			if t[i].c != '/' {
				next(i+1, j)
			}
		case !f[j].any: // a placeholder gives the filter's literal
			next(i, j+1)
		default: // a placeholder gives a character + takes: neither ends
		}
	}
	return false
}
