package actors

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// A negative Cluster.ControlTimeout or RetryInterval is refused when the
// runner is made, naming the setting, as a negative linger or checkpoint
// pause is. Before, both were taken as their default (10 s, 1 s) without
// a word.
func TestClusterRefusesNegativeDurations(t *testing.T) {
	n := newLoopNet()
	for _, c := range []struct {
		set  func(c *Cluster)
		want string
	}{
		{func(c *Cluster) { c.ControlTimeout = -time.Second }, "cluster.control_timeout (-1s) must not be negative"},
		{func(c *Cluster) { c.RetryInterval = -time.Millisecond }, "cluster.retry_interval (-1ms) must not be negative"},
	} {
		cl := loopCluster(n)
		c.set(cl)
		cfg := DefaultConfig()
		cfg.Cluster = cl
		job := twoStageJob(&countingSource{n: 1, emitted: new(atomic.Int64)}, okSink{})
		_, err := NewRunner(job, cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("NewRunner: %v, want %q", err, c.want)
		}
	}
	cl := loopCluster(n)
	cfg := DefaultConfig()
	cfg.Cluster = cl
	if _, err := NewRunner(twoStageJob(&countingSource{n: 1, emitted: new(atomic.Int64)}, okSink{}), cfg); err != nil {
		t.Errorf("NewRunner with the default durations: %v", err)
	}
}
