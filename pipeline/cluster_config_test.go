package pipeline

import (
	"strings"
	"testing"
)

const clusterBlock = `
cluster:
  node: b
  listen: 127.0.0.1:7001
  capacity: %s
  peers:
    - {id: a, address: "127.0.0.1:7000", api: "127.0.0.1:8000", capacity: %s}
    - {id: c, address: "127.0.0.1:7002", api: "127.0.0.1:8002"}
`

func clusterConfig(node, peer string) string {
	return strings.Replace(strings.Replace(clusterBlock, "%s", node, 1), "%s", peer, 1) + goodPipeline
}

// cluster.capacity and cluster.peers[].capacity default to 0 (no limit),
// are read per node, and out-of-range values are refused naming the key.
func TestClusterCapacity(t *testing.T) {
	cfg, err := Parse([]byte(clusterConfig("4", "2")))
	if err != nil {
		t.Fatal(err)
	}
	c := cfg.Cluster
	if got := []int{c.CapacityOf("b"), c.CapacityOf("a"), c.CapacityOf("c"), c.CapacityOf("x")}; got[0] != 4 || got[1] != 2 || got[2] != 0 || got[3] != 0 {
		t.Fatalf("capacities b, a, c, x: %v, want [4 2 0 0]", got)
	}
	_, err = Parse([]byte(clusterConfig("-1", "70000")))
	if err == nil {
		t.Fatal("negative and too large capacities accepted")
	}
	for _, want := range []string{"cluster.capacity", "cluster.peers[0].capacity"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not name %s: %v", want, err)
		}
	}
}
