package main

import (
	"testing"

	"github.com/edgedio/edged/mqtt"
)

// TestNoLogTopicsAreNotIngested checks that the no-log load of the
// embedded scenario publishes to topics the pipeline's filter does not
// match, while the durable load's topics match it.
func TestNoLogTopicsAreNotIngested(t *testing.T) {
	ts := func(int) int64 { return epochMS }
	for _, root := range []string{"e/emb-4", "e/emb-16-r2"} {
		filter := root + "/+"
		durable, _ := reading(root, "m", 10, 4, ts)(3)
		if !mqtt.MatchTopic(filter, durable) {
			t.Errorf("durable topic %q does not match the pipeline's filter %q", durable, filter)
		}
		noLog, _ := reading(noLogRoot(root), "m", 10, 4, ts)(3)
		if mqtt.MatchTopic(filter, noLog) {
			t.Errorf("no-log topic %q matches the pipeline's filter %q: it would be ingested", noLog, filter)
		}
	}
}
