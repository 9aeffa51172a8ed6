package daemon

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgedio/edged/cluster"
	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/pipeline"
)

func TestPipelinesFingerprint(t *testing.T) {
	parse := func(p int, size, topic, dir string) []pipeline.PipelineConfig {
		cfg, err := pipeline.Parse([]byte(fmt.Sprintf(`
pipelines:
  - name: sensors
    parallelism: %d
    source: {generator: {count: 10}}
    key: id
    window:
      type: tumbling
      size: %s
      aggregates: [{name: count, fn: count}]
    sinks: [{stdout: {}}, {mqtt: {topic: %q}}]
    checkpoint: {dir: %s, interval: 1s}
`, p, size, topic, dir)))
		if err != nil {
			t.Fatal(err)
		}
		return cfg.Pipelines
	}
	fa := pipelinesFingerprint(parse(2, "1s", "agg/{id}", "a-data/checkpoints"))
	if len(fa) != cluster.MaxFingerprintLen || fa != pipelinesFingerprint(parse(2, "1s", "agg/{id}", "a-data/checkpoints")) {
		t.Fatalf("fingerprint %q: want 64 hex digits, the same for the same pipelines", fa)
	}
	for name, other := range map[string][]pipeline.PipelineConfig{
		"parallelism": parse(3, "1s", "agg/{id}", "a-data/checkpoints"),
		"window size": parse(2, "2s", "agg/{id}", "a-data/checkpoints"),
		"sink topic":  parse(2, "1s", "out/{id}", "a-data/checkpoints"),
	} {
		if pipelinesFingerprint(other) == fa {
			t.Errorf("pipelines that differ in %s have the same fingerprint", name)
		}
	}
	// The configs of a cluster's nodes differ in their directories (as
	// configs/cluster-{a,b,c}.yaml do): the same fingerprint.
	if fb := pipelinesFingerprint(parse(2, "1s", "agg/{id}", "/var/lib/b/checkpoints")); fb != fa {
		t.Errorf("pipelines that differ only in checkpoint.dir: fingerprints %s and %s", fa, fb)
	}
}

// The nodes of the shipped three-node cluster gossip the same
// fingerprint: their configs differ only in node-local settings.
func TestShippedClusterConfigsSameFingerprint(t *testing.T) {
	var fps []string
	for _, node := range []string{"a", "b", "c"} {
		cfg, err := pipeline.Load(filepath.Join("..", "configs", "cluster-"+node+".yaml"))
		if err != nil {
			t.Fatal(err)
		}
		fps = append(fps, pipelinesFingerprint(cfg.Pipelines))
	}
	if fps[0] != fps[1] || fps[0] != fps[2] {
		t.Fatalf("configs/cluster-{a,b,c}.yaml: fingerprints %v", fps)
	}
}

// A member gossiping other pipelines than this node's is reported once
// per run of it, and a member with the same ones not at all.
func TestClusterFingerprintMismatchWarnedOnce(t *testing.T) {
	start := func(id, fp string, peers ...string) *cluster.Membership {
		m, err := cluster.NewMembership(cluster.MembershipConfig{
			Meta:     cluster.Meta{ID: id, Transport: "127.0.0.1:7000", Fingerprint: fp},
			BindAddr: "127.0.0.1", Peers: peers, Logger: slog.New(slog.DiscardHandler),
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.Shutdown() })
		return m
	}
	ours, theirs := strings.Repeat("a", 64), strings.Repeat("b", 64)
	a := start("a", ours)
	start("b", ours, a.Addr())
	start("c", theirs, a.Addr())
	testutil.Eventually(t, 10*time.Second, "a sees b and c", func() bool { return len(a.Members()) == 3 })

	var logs testutil.Buffer
	c := &clusterNode{cfg: &pipeline.ClusterConfig{Node: "a"}, log: slog.New(slog.NewTextHandler(&logs, nil)), fingerprint: ours}
	v := &liveView{c: c}
	v.m.Store(a)
	v.checkFingerprints()
	v.checkFingerprints()
	out := logs.String()
	if n := strings.Count(out, "runs other pipelines"); n != 1 || !strings.Contains(out, "member=c") {
		t.Fatalf("want one warning about c, got %d:\n%s", n, out)
	}
}
