package daemon

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/edgedio/edged/cluster"
	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/pipeline"
)

func TestPipelinesFingerprint(t *testing.T) {
	parse := func(p int) []pipeline.PipelineConfig {
		cfg, err := pipeline.Parse([]byte(fmt.Sprintf(`
pipelines:
  - name: sensors
    parallelism: %d
    source: {generator: {count: 10}}
    sinks: [{stdout: {}}]
`, p)))
		if err != nil {
			t.Fatal(err)
		}
		return cfg.Pipelines
	}
	fa, fb := pipelinesFingerprint(parse(2)), pipelinesFingerprint(parse(3))
	if len(fa) != cluster.MaxFingerprintLen || fa != pipelinesFingerprint(parse(2)) {
		t.Fatalf("fingerprint %q: want 64 hex digits, the same for the same pipelines", fa)
	}
	if fa == fb {
		t.Fatal("pipelines that differ have the same fingerprint")
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
