package stream_test

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/cluster"
	"github.com/edgedio/edged/pipeline"
	"github.com/edgedio/edged/stream"
)

// settingsJob builds the declared pipeline with the given window size and
// checkpoint directory, as the daemon builds it on every node.
func settingsJob(t *testing.T, size, dir string, opts ...stream.Option) *stream.Environment {
	t.Helper()
	cfg, err := pipeline.Parse(fmt.Appendf(nil, `
pipelines:
  - name: sensors
    parallelism: 2
    source: {generator: {count: 2000, keys: 20}}
    event_time: {field: ts}
    key: id
    window:
      type: tumbling
      size: %s
      aggregates: [{name: count, fn: count}]
    sinks: [{stdout: {}}]
    checkpoint: {dir: %q, interval: 100ms}
`, size, dir))
	if err != nil {
		t.Fatal(err)
	}
	pc := cfg.Pipelines[0]
	envOpts, err := pipeline.EnvOptions(pc)
	if err != nil {
		t.Fatal(err)
	}
	env := stream.NewEnvironment(pc.Name, append(envOpts, opts...)...)
	if err := pipeline.Build(pc, env, io.Discard); err != nil {
		t.Fatal(err)
	}
	return env
}

// A node whose declared pipeline differs from the job master's only in
// an operator setting (the window's size; the graph is the same) is
// refused when it registers; one that differs only in a node-local
// setting (checkpoint.dir) is not.
func TestMultiNodeSettingsMismatchRefused(t *testing.T) {
	for _, c := range []struct {
		name, size string
		refused    bool
	}{
		{"window size", "2s", true},
		{"checkpoint dir only", "1s", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			mc := memoryCluster(t, 2, 1, cluster.Faults{})
			env := settingsJob(t, "1s", t.TempDir(), stream.WithCluster(mc.Cluster))
			other, err := settingsJob(t, c.size, t.TempDir()).Graph()
			if err != nil {
				t.Fatal(err)
			}
			mc.spread(t, env)
			mc.Nodes[1].Job = other
			err = execute(t, env)
			switch {
			case !c.refused && err != nil:
				t.Fatalf("refused: %v", err)
			case c.refused && (!errors.Is(err, actors.ErrPlanMismatch) || !strings.Contains(err.Error(), `node "node-1"`)):
				t.Fatalf("got %v, want ErrPlanMismatch naming node-1", err)
			}
			if c.refused {
				t.Log(err)
			} else {
				mc.checkCrossed(t)
			}
		})
	}
}

// A node whose cluster.channels.credits or max_inflight_bytes differ from
// the job master's is refused when it registers, with an error that names
// the settings and both values (before, every channel from the node with more credits
// failed with cluster.ErrCreditExceeded and the job restarted over and
// over); channel settings that are each end's own (the acknowledgement
// interval, the largest frame) may differ.
func TestMultiNodeChannelSettingsMismatch(t *testing.T) {
	for _, c := range []struct {
		name    string
		mod     func(*cluster.ChannelConfig)
		refused bool
	}{
		{"credits", func(cfg *cluster.ChannelConfig) { cfg.Credits = 8 }, true},
		{"in-flight bytes", func(cfg *cluster.ChannelConfig) { cfg.MaxInFlightBytes = 1 << 20 }, true},
		{"ack interval and frame size", func(cfg *cluster.ChannelConfig) {
			cfg.AckInterval, cfg.MaxFrameBytes = 80*time.Millisecond, 128<<10
		}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			other := testChannelConfig()
			c.mod(&other)
			mc := memoryClusterOf(t, 1, cluster.Faults{}, []cluster.ChannelConfig{testChannelConfig(), other})
			env := settingsJob(t, "1s", t.TempDir(), stream.WithCluster(mc.Cluster))
			mc.spread(t, env)
			err := execute(t, env)
			switch {
			case !c.refused && err != nil:
				t.Fatalf("refused: %v", err)
			case c.refused && (!errors.Is(err, actors.ErrPlanMismatch) ||
				!strings.Contains(err.Error(), fmt.Sprintf(`node "node-1" runs with %s, the job master with %s`, other.Shared(), testChannelConfig().Shared()))):
				t.Fatalf("got %v, want ErrPlanMismatch naming node-1's and the master's channel settings", err)
			}
			if c.refused {
				t.Log(err)
			} else {
				mc.checkCrossed(t)
			}
		})
	}
}
