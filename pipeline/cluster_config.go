package pipeline

import (
	"fmt"
	"regexp"
	"slices"
)

// ClusterConfig is the YAML `cluster` block: the node is one of several
// edged processes that run every pipeline together. Each node runs the
// same pipelines (the same config but for this block); the node with the
// lowest id runs each job's job master (checkpoint coordinator, restarts)
// and the others host the tasks placed on them.
type ClusterConfig struct {
	// Node is this node's id. Required.
	Node string `yaml:"node"`
	// Listen is the host:port of this node's transport (cross-node
	// channels). Required.
	Listen string `yaml:"listen"`
	// Gossip, when set, is the host:port of this node's membership
	// (gossip, UDP and TCP): the nodes then detect each other's failure,
	// the job masters place a dead node's subtasks on the live ones and
	// put them back when it returns, and a node that does not see a
	// majority of the cluster runs nothing. Every peer then needs its
	// gossip address. Without it placement is static.
	Gossip string `yaml:"gossip"`
	// Peers are the other nodes. At least one.
	Peers []PeerConfig `yaml:"peers"`
	// Placement pins subtasks to nodes; a subtask not listed runs on node
	// number subtask modulo the number of nodes, in id order. An MQTT
	// source has one subtask per node, each reading its own node's ingest
	// log.
	Placement []PlacementConfig `yaml:"placement"`
	// Replicas is how many peers hold a copy of each state file a node
	// writes for a checkpoint before its acknowledgement counts. 0 means
	// DefaultReplicas, bounded by the number of peers; at most the number
	// of peers.
	Replicas int `yaml:"replicas"`
}

// DefaultReplicas is cluster.replicas when it is not set.
const DefaultReplicas = 2

// ReplicaCount returns the number of peers that hold a copy of each state
// file: cluster.replicas, or DefaultReplicas bounded by the number of
// peers.
func (c *ClusterConfig) ReplicaCount() int {
	if c.Replicas > 0 {
		return c.Replicas
	}
	return min(DefaultReplicas, len(c.Peers))
}

// PeerConfig is one entry of `cluster.peers`.
type PeerConfig struct {
	// ID is the peer's node id.
	ID string `yaml:"id"`
	// Address is the host:port of the peer's transport (its
	// cluster.listen).
	Address string `yaml:"address"`
	// API is the host:port of the peer's REST API (its node.listen):
	// deployments and state files go there.
	API string `yaml:"api"`
	// Gossip is the host:port of the peer's membership (its
	// cluster.gossip); required when cluster.gossip is set.
	Gossip string `yaml:"gossip"`
}

// PlacementConfig is one entry of `cluster.placement`.
type PlacementConfig struct {
	// Operator is the operator's uid: "<pipeline>/<operator>", for example
	// "temps/window".
	Operator string `yaml:"operator"`
	// Subtask is the operator's subtask.
	Subtask int `yaml:"subtask"`
	// Node is the node that runs it.
	Node string `yaml:"node"`
}

var nodeID = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// Nodes returns the ids of every node, this one included, in order.
func (c *ClusterConfig) Nodes() []string {
	ids := []string{c.Node}
	for _, p := range c.Peers {
		ids = append(ids, p.ID)
	}
	slices.Sort(ids)
	return ids
}

// Master returns the node that runs the job masters: the lowest id.
func (c *ClusterConfig) Master() string { return c.Nodes()[0] }

// Peer returns the peer with id, if any.
func (c *ClusterConfig) Peer(id string) (PeerConfig, bool) {
	for _, p := range c.Peers {
		if p.ID == id {
			return p, true
		}
	}
	return PeerConfig{}, false
}

func (c *ClusterConfig) validate(p *problems) {
	if !nodeID.MatchString(c.Node) {
		p.add("cluster.node", fmt.Sprintf("%q must be 1 to 63 letters, digits, '.', '_' or '-', starting with a letter or digit", c.Node))
	}
	if c.Listen == "" {
		p.add("cluster.listen", "is required: the host:port of this node's transport")
	} else {
		checkAddr(p, "cluster.listen", c.Listen)
	}
	checkAddr(p, "cluster.gossip", c.Gossip)
	if len(c.Peers) == 0 {
		p.add("cluster.peers", "at least one peer is required")
	}
	seen := map[string]bool{c.Node: true}
	for i, peer := range c.Peers {
		path := fmt.Sprintf("cluster.peers[%d]", i)
		switch {
		case !nodeID.MatchString(peer.ID):
			p.add(path+".id", fmt.Sprintf("%q must be 1 to 63 letters, digits, '.', '_' or '-', starting with a letter or digit", peer.ID))
		case seen[peer.ID]:
			p.add(path+".id", fmt.Sprintf("%q is not unique (cluster.node and every peer need their own id)", peer.ID))
		}
		seen[peer.ID] = true
		if peer.Address == "" {
			p.add(path+".address", "is required: the peer's cluster.listen")
		} else {
			checkAddr(p, path+".address", peer.Address)
		}
		if peer.API == "" {
			p.add(path+".api", "is required: the peer's node.listen")
		} else {
			checkAddr(p, path+".api", peer.API)
		}
		switch {
		case c.Gossip != "" && peer.Gossip == "":
			p.add(path+".gossip", "is required with cluster.gossip: the peer's cluster.gossip")
		case c.Gossip == "" && peer.Gossip != "":
			p.add(path+".gossip", "is set and cluster.gossip is not: set both or neither")
		case peer.Gossip != "":
			checkAddr(p, path+".gossip", peer.Gossip)
		}
	}
	switch {
	case c.Replicas < 0:
		p.add("cluster.replicas", fmt.Sprintf("(%d) must not be negative (0 means %d, bounded by the number of peers)", c.Replicas, DefaultReplicas))
	case c.Replicas > len(c.Peers) && len(c.Peers) > 0:
		p.add("cluster.replicas", fmt.Sprintf("(%d) must be at most the number of peers (%d): each copy goes to another node", c.Replicas, len(c.Peers)))
	}
	for i, pl := range c.Placement {
		path := fmt.Sprintf("cluster.placement[%d]", i)
		if pl.Operator == "" {
			p.add(path+".operator", "is required")
		}
		if pl.Subtask < 0 {
			p.add(path+".subtask", fmt.Sprintf("(%d) must not be negative", pl.Subtask))
		}
		if !seen[pl.Node] {
			p.add(path+".node", fmt.Sprintf("%q is not cluster.node or a peer", pl.Node))
		}
	}
}
