package pipeline

import (
	"strings"
	"testing"
)

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
