package pipeline

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/edgedio/edged/cluster"
)

const clusterBlock = `cluster:
  node: a
  listen: 127.0.0.1:7101
  gossip: 127.0.0.1:7201
  peers:
    - {id: b, address: "127.0.0.1:7102", api: "127.0.0.1:8082", gossip: "127.0.0.1:7202"}
`

func TestClusterConfigKeys(t *testing.T) {
	extra := "  secret_key: " + "MDEyMzQ1Njc4OWFiY2RlZg==" + "\n  profile: lan\n  channels: {credits: 4, max_inflight_bytes: 65536, max_merge_bytes: 0, ack_interval: 2s, ack_timeout: 30s}\n"
	cfg, err := Parse([]byte(goodPipeline + clusterBlock + extra))
	if err != nil {
		t.Fatal(err)
	}
	key, err := cfg.Cluster.GossipKey()
	if err != nil || string(key) != "0123456789abcdef" {
		t.Errorf("GossipKey() = %q, %v", key, err)
	}
	if cfg.Cluster.Profile != string(cluster.ProfileLAN) {
		t.Errorf("profile = %q", cfg.Cluster.Profile)
	}
	cc := cfg.Cluster.ChannelConfig()
	def := cluster.DefaultChannelConfig()
	if cc.Credits != 4 || cc.MaxInFlightBytes != 65536 || cc.MaxMergeBytes != 0 || cc.AckInterval != 2*time.Second || cc.AckTimeout != 30*time.Second || cc.MaxFrameBytes != def.MaxFrameBytes {
		t.Errorf("ChannelConfig() = %+v", cc)
	}

	cfg, err = Parse([]byte(goodPipeline + clusterBlock))
	if err != nil {
		t.Fatal(err)
	}
	if key, err := cfg.Cluster.GossipKey(); key != nil || err != nil {
		t.Errorf("GossipKey() without a key = %q, %v", key, err)
	}
	if cc := cfg.Cluster.ChannelConfig(); cc != def {
		t.Errorf("ChannelConfig() without a block = %+v, want the defaults %+v", cc, def)
	}
}

func TestBadClusterConfigs(t *testing.T) {
	tests := []struct {
		name string
		edit func(string) string
		want []string
	}{
		{"no peers and no listen", func(s string) string {
			return "cluster:\n  node: a\n"
		}, []string{`cluster.listen: is required: the host:port of this node's transport`, `cluster.peers: at least one peer is required`}},
		{"duplicate peer and missing gossip", func(s string) string {
			return s + `    - {id: a, address: "127.0.0.1:7103", api: "127.0.0.1:8083"}` + "\n"
		}, []string{`cluster.peers[1].id: "a" is not unique (cluster.node and every peer need their own id)`, `cluster.peers[1].gossip: is required with cluster.gossip: the peer's cluster.gossip`}},
		{"secret key", func(s string) string { return s + "  secret_key: c2hvcnQ=\n" },
			[]string{"cluster.secret_key: 5 bytes, want 16, 24 or 32 (e.g. from `head -c 32 /dev/urandom | base64`)"}},
		{"secret key not base64", func(s string) string { return s + "  secret_key: '!!'\n" },
			[]string{`cluster.secret_key: not base64: illegal base64 data at input byte 0`}},
		{"secret key without gossip", func(s string) string {
			s = strings.Replace(s, "  gossip: 127.0.0.1:7201\n", "", 1)
			s = strings.Replace(s, `, gossip: "127.0.0.1:7202"`, "", 1)
			return s + "  secret_key: MDEyMzQ1Njc4OWFiY2RlZg==\n"
		}, []string{`cluster.secret_key: is set and cluster.gossip is not: the key encrypts gossip`}},
		{"profile", func(s string) string { return s + "  profile: wan\n" },
			[]string{`cluster.profile: "wan": want "device" or "lan"`}},
		{"channels", func(s string) string {
			return s + "  channels: {credits: -1, max_inflight_bytes: -3, max_merge_bytes: -5, ack_interval: 1s, ack_timeout: 1s}\n"
		}, []string{
			`cluster.channels.credits: (-1) must be at least 1`,
			`cluster.channels.max_inflight_bytes: (-3) must be at least 1`,
			`cluster.channels.max_merge_bytes: (-5) must not be negative`,
			`cluster.channels.ack_timeout: (1s) must be at least twice cluster.channels.ack_interval (1s)`,
		}},
		{"placement", func(s string) string { return s + "  placement: [{operator: p/window, subtask: -1, node: z}]\n" },
			[]string{`cluster.placement[0].subtask: (-1) must not be negative`, `cluster.placement[0].node: "z" is not cluster.node or a peer`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(goodPipeline + tt.edit(clusterBlock)))
			var ce *ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("err = %v, want *ConfigError", err)
			}
			var got []string
			for _, p := range ce.Problems {
				got = append(got, p.Error())
			}
			if strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
				t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
		})
	}
}

const capacityBlock = `
cluster:
  node: b
  listen: 127.0.0.1:7001
  capacity: %s
  peers:
    - {id: a, address: "127.0.0.1:7000", api: "127.0.0.1:8000", capacity: %s}
    - {id: c, address: "127.0.0.1:7002", api: "127.0.0.1:8002"}
`

func capacityConfig(node, peer string) string {
	return strings.Replace(strings.Replace(capacityBlock, "%s", node, 1), "%s", peer, 1) + goodPipeline
}

// cluster.capacity and cluster.peers[].capacity default to 0 (no limit),
// are read per node, and out-of-range values are refused naming the key.
func TestClusterCapacity(t *testing.T) {
	cfg, err := Parse([]byte(capacityConfig("4", "2")))
	if err != nil {
		t.Fatal(err)
	}
	c := cfg.Cluster
	if got := []int{c.CapacityOf("b"), c.CapacityOf("a"), c.CapacityOf("c"), c.CapacityOf("x")}; got[0] != 4 || got[1] != 2 || got[2] != 0 || got[3] != 0 {
		t.Fatalf("capacities b, a, c, x: %v, want [4 2 0 0]", got)
	}
	_, err = Parse([]byte(capacityConfig("-1", "70000")))
	if err == nil {
		t.Fatal("negative and too large capacities accepted")
	}
	for _, want := range []string{"cluster.capacity", "cluster.peers[0].capacity"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not name %s: %v", want, err)
		}
	}
}

func clusterOf(peers int, replicas int) *ClusterConfig {
	c := &ClusterConfig{Node: "a", Listen: "127.0.0.1:7101", Replicas: replicas}
	for i := range peers {
		id := string(rune('b' + i))
		c.Peers = append(c.Peers, PeerConfig{ID: id, Address: "127.0.0.1:710" + string(rune('2'+i)), API: "127.0.0.1:808" + string(rune('2'+i))})
	}
	return c
}

func TestClusterReplicas(t *testing.T) {
	for _, tc := range []struct {
		peers, replicas, want int
		problem               string
	}{
		{peers: 2, replicas: 0, want: 2},
		{peers: 1, replicas: 0, want: 1},
		{peers: 4, replicas: 0, want: 2},
		{peers: 4, replicas: 3, want: 3},
		{peers: 2, replicas: 3, problem: "must be at most the number of peers"},
		{peers: 2, replicas: -1, problem: "must not be negative"},
	} {
		c := clusterOf(tc.peers, tc.replicas)
		var p problems
		c.validate(&p)
		if tc.problem == "" {
			if len(p) > 0 {
				t.Errorf("%d peers, replicas %d: %v", tc.peers, tc.replicas, p)
			}
			if got := c.ReplicaCount(); got != tc.want {
				t.Errorf("%d peers, replicas %d: ReplicaCount %d, want %d", tc.peers, tc.replicas, got, tc.want)
			}
			continue
		}
		if len(p) != 1 || p[0].Path != "cluster.replicas" || !strings.Contains(p[0].Msg, tc.problem) {
			t.Errorf("%d peers, replicas %d: problems %v, want one at cluster.replicas saying %q", tc.peers, tc.replicas, p, tc.problem)
		}
	}
}

const weightBlock = `
cluster:
  node: b
  listen: 127.0.0.1:7001
  capacity: 4
  weight: %s
  peers:
    - {id: a, address: "127.0.0.1:7000", api: "127.0.0.1:8000", capacity: 2, weight: %s}
    - {id: c, address: "127.0.0.1:7002", api: "127.0.0.1:8002"}
`

func weightConfig(node, peer string) string {
	return strings.Replace(strings.Replace(weightBlock, "%s", node, 1), "%s", peer, 1) + goodPipeline
}

// cluster.weight and cluster.peers[].weight default to 1, are read per
// node beside the capacities (which they leave alone), and out-of-range
// values are refused naming the key.
func TestClusterWeight(t *testing.T) {
	cfg, err := Parse([]byte(weightConfig("3", "2")))
	if err != nil {
		t.Fatal(err)
	}
	c := cfg.Cluster
	if got := []int{c.WeightOf("b"), c.WeightOf("a"), c.WeightOf("c"), c.WeightOf("x")}; got[0] != 3 || got[1] != 2 || got[2] != 1 || got[3] != 1 {
		t.Fatalf("weights b, a, c, x: %v, want [3 2 1 1]", got)
	}
	if c.CapacityOf("b") != 4 || c.CapacityOf("a") != 2 {
		t.Fatalf("capacities b, a: %d %d, want 4 2", c.CapacityOf("b"), c.CapacityOf("a"))
	}
	if cfg, err = Parse([]byte(weightConfig("0", "1000"))); err != nil {
		t.Fatal(err)
	}
	if got := cfg.Cluster.WeightOf("b"); got != 1 {
		t.Fatalf("weight 0: WeightOf %d, want 1", got)
	}
	_, err = Parse([]byte(weightConfig("-1", "1001")))
	var ce *ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("err = %v, want *ConfigError", err)
	}
	var got []string
	for _, p := range ce.Problems {
		got = append(got, p.Error())
	}
	want := []string{
		"cluster.weight: (-1) must be 1 to 1000 (0 or unset means 1): the node's share of placement relative to the others'",
		"cluster.peers[0].weight: (1001) must be 1 to 1000 (0 or unset means 1): the node's share of placement relative to the others'",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// Two nodes given the same transport, API or gossip address (a peer at
// this node's own cluster.listen or cluster.gossip, or two peers at one
// address) is a config mistake like a duplicate id: the node sends one
// node's frames or calls to another. It was accepted: a's frames for c
// went to b, or to a itself, and the job never deployed.
func TestClusterConfigDuplicateAddressesRefused(t *testing.T) {
	tests := []struct{ name, peer, key string }{
		{"peer transport at cluster.listen", `    - {id: c, address: "127.0.0.1:7101", api: "127.0.0.1:8083", gossip: "127.0.0.1:7203"}`, "cluster.peers[1].address"},
		{"two peers at one transport", `    - {id: c, address: "127.0.0.1:7102", api: "127.0.0.1:8083", gossip: "127.0.0.1:7203"}`, "cluster.peers[1].address"},
		{"two peers at one api", `    - {id: c, address: "127.0.0.1:7103", api: "127.0.0.1:8082", gossip: "127.0.0.1:7203"}`, "cluster.peers[1].api"},
		{"peer gossip at cluster.gossip", `    - {id: c, address: "127.0.0.1:7103", api: "127.0.0.1:8083", gossip: "127.0.0.1:7201"}`, "cluster.peers[1].gossip"},
		{"two peers at one gossip", `    - {id: c, address: "127.0.0.1:7103", api: "127.0.0.1:8083", gossip: "127.0.0.1:7202"}`, "cluster.peers[1].gossip"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(goodPipeline + clusterBlock + tt.peer + "\n"))
			var ce *ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("err = %v, want a *ConfigError naming %s", err, tt.key)
			}
			var got []string
			for _, p := range ce.Problems {
				got = append(got, p.Error())
			}
			if len(got) != 1 || !strings.HasPrefix(got[0], tt.key+": ") {
				t.Errorf("problems %q, want one naming %s", got, tt.key)
			}
		})
	}
}
