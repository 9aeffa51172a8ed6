package mqtt

import "strings"

// MatchTopic reports whether the topic name matches the MQTT topic filter
// ("+" one level, "#" this level and all below). As the MQTT spec requires,
// a filter starting with a wildcard does not match a topic starting with
// "$" ($SYS and the like).
func MatchTopic(filter, topic string) bool {
	if strings.HasPrefix(topic, "$") && (strings.HasPrefix(filter, "+") || strings.HasPrefix(filter, "#")) {
		return false
	}
	for {
		f, frest, fmore := strings.Cut(filter, "/")
		if f == "#" {
			return true
		}
		t, trest, tmore := strings.Cut(topic, "/")
		if f != "+" && f != t {
			return false
		}
		if !fmore || !tmore {
			// "a/#" matches "a" too.
			return fmore == tmore || (fmore && frest == "#")
		}
		filter, topic = frest, trest
	}
}

// validFilter reports whether f is a well-formed MQTT topic filter.
func validFilter(f string) bool {
	if f == "" || strings.ContainsRune(f, 0) {
		return false
	}
	levels := strings.Split(f, "/")
	for i, l := range levels {
		if strings.Contains(l, "#") && (l != "#" || i != len(levels)-1) {
			return false
		}
		if strings.Contains(l, "+") && l != "+" {
			return false
		}
	}
	return true
}
