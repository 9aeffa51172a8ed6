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

// Nodes whose configs name other cluster nodes (another cluster.node and
// peers' ids) gossip other digests of their node ids, though their
// pipelines are the same: they count majorities of another size and
// build another job plan (an MQTT source has one split per node). The
// peers' addresses are node-local and change nothing. A member whose
// node ids differ gets no subtasks and is warned about once, naming it
// and this node's ids; so does a member whose cluster.channels.credits
// differ (it would fail every channel from a node with more credits),
// while one whose other channel settings differ matches; a member that
// gossips no digest (an older version) is compared by its pipelines
// alone.
func TestClusterMemberWithOtherNodesPlacedAround(t *testing.T) {
	cfgOf := func(node string, peers ...string) *pipeline.Config {
		var b strings.Builder
		fmt.Fprintf(&b, "cluster:\n  node: %s\n  listen: 127.0.0.1:7100\n  peers:\n", node)
		for i, p := range peers {
			fmt.Fprintf(&b, "    - {id: %s, address: \"127.0.0.1:%d\", api: \"127.0.0.1:%d\"}\n", p, 7101+i, 8101+i)
		}
		b.WriteString(`pipelines:
  - name: sensors
    source: {generator: {count: 10}}
    key: id
    sinks: [{stdout: {}}]
`)
		cfg, err := pipeline.Parse([]byte(b.String()))
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	digest := func(cfg *pipeline.Config) string {
		return nodesDigest(cfg.Cluster.Nodes(), cfg.Cluster.ChannelConfig().Shared())
	}
	a, b, c := cfgOf("a", "b", "c"), cfgOf("b", "c", "a"), cfgOf("c", "a")
	// e names a's nodes but takes 8 credits a channel; f sets channel
	// settings that are each end's own.
	e, f := cfgOf("a", "b", "c"), cfgOf("a", "b", "c")
	e.Cluster.Channels.Credits = 8
	f.Cluster.Channels.AckInterval, f.Cluster.Channels.MaxFrameBytes = 2*time.Second, 1<<20
	if pipelinesFingerprint(a.Pipelines) != pipelinesFingerprint(c.Pipelines) {
		t.Fatal("the pipelines differ: the test needs the same ones")
	}
	if digest(a) != digest(b) {
		t.Errorf("nodes a and b name the same nodes but gossip %s and %s", digest(a), digest(b))
	}
	if digest(a) == digest(c) {
		t.Errorf("node c's config names only a and c, yet it gossips a's digest %s", digest(a))
	}
	if digest(a) == digest(e) {
		t.Errorf("node e takes other credits, yet it gossips a's digest %s", digest(a))
	}
	if digest(a) != digest(f) {
		t.Errorf("node f differs from a in node-local channel settings, yet it gossips %s, a %s", digest(f), digest(a))
	}
	if len(digest(a)) != cluster.MaxNodesLen {
		t.Errorf("digest %q: want %d hex digits", digest(a), cluster.MaxNodesLen)
	}

	start := func(id, nodes string, peers ...string) *cluster.Membership {
		m, err := cluster.NewMembership(cluster.MembershipConfig{
			Meta: cluster.Meta{ID: id, Transport: "127.0.0.1:7000",
				Fingerprint: pipelinesFingerprint(a.Pipelines), Nodes: nodes},
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
	ma := start("a", digest(a))
	start("b", digest(b), ma.Addr())
	start("c", digest(c), ma.Addr())
	start("d", "", ma.Addr()) // an older version: no digest
	start("e", digest(e), ma.Addr())
	start("f", digest(f), ma.Addr())
	testutil.Eventually(t, 10*time.Second, "a sees b to f", func() bool { return len(ma.Members()) == 6 })
	var logs testutil.Buffer
	n := &clusterNode{cfg: a.Cluster, log: slog.New(slog.NewTextHandler(&logs, nil)),
		fingerprint: pipelinesFingerprint(a.Pipelines), nodesDigest: digest(a)}
	v := &liveView{c: n}
	v.m.Store(ma)
	if others := v.otherPipelines(); len(others) != 2 || !others["c"] || !others["e"] {
		t.Errorf("members placed around: %v, want c and e", others)
	}
	v.checkFingerprints()
	v.checkFingerprints()
	out := logs.String()
	if k := strings.Count(out, "names other cluster nodes or channel credits"); k != 2 || !strings.Contains(out, "member=c") || !strings.Contains(out, "member=e") ||
		!strings.Contains(out, "our_nodes=\"[a b c]\"") || !strings.Contains(out, `our_channels="`+cluster.DefaultChannelConfig().Shared()+`"`) {
		t.Fatalf("want a warning naming c and one naming e, with this node's ids and credits, got %d:\n%s", k, out)
	}
	if strings.Contains(out, "runs other pipelines") {
		t.Fatalf("the warning blames the pipelines:\n%s", out)
	}
}

// A node started with other pipelines than the leader it follows (node a,
// its window size changed, joining b, the leader, and c) is the one that
// gets no subtasks: it logs once, as an error naming the leader, that
// this node runs other pipelines than the leader, and nothing about c,
// which runs the leader's; its GET /cluster marks itself, not b and c,
// as running other pipelines, as the leader's does.
func TestClusterNodeWithOtherPipelinesThanTheLeaderSaysItIsTheOne(t *testing.T) {
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
	leaders, ours := strings.Repeat("b", 64), strings.Repeat("a", 64)
	b := start("b", leaders)
	start("c", leaders, b.Addr())
	a := start("a", ours, b.Addr())
	testutil.Eventually(t, 10*time.Second, "a sees b and c", func() bool { return len(a.Members()) == 3 })

	var logs testutil.Buffer
	c := &clusterNode{cfg: &pipeline.ClusterConfig{Node: "a", Peers: []pipeline.PeerConfig{{ID: "b"}, {ID: "c"}}},
		log: slog.New(slog.NewTextHandler(&logs, nil)), fingerprint: ours}
	c.lead.id = "b"
	v := &liveView{c: c}
	v.m.Store(a)
	v.checkFingerprints()
	v.checkFingerprints()
	out := logs.String()
	if n := strings.Count(out, "this node runs other pipelines than the leader"); n != 1 || !strings.Contains(out, "level=ERROR") || !strings.Contains(out, "leader=b") {
		t.Fatalf("want one error naming leader b, got %d:\n%s", n, out)
	}
	if strings.Contains(out, "member=c") || strings.Contains(out, "a member runs other pipelines") {
		t.Fatalf("c runs the leader's pipelines, yet this node warns about it:\n%s", out)
	}
	if got := v.otherThanLeader("b"); len(got) != 1 || !got["a"] {
		t.Fatalf("members marked as running other pipelines than the leader: %v, want a alone", got)
	}
	// On a node that matches the leader, nothing changes: otherPipelines
	// says which members differ.
	c.fingerprint = leaders
	if got := v.otherThanLeader("b"); got != nil {
		t.Fatalf("a node matching the leader marks %v", got)
	}
}
