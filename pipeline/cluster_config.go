package pipeline

import (
	"encoding/base64"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/edgedio/edged/cluster"
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
	// Capacity is the most keyed subtasks (summed over every job and keyed
	// operator) this node may run; 0 (the default) means no limit. A
	// drain or a rebalance whose placement would put more on a node than
	// its capacity is refused, with the node and the count in the reason;
	// a failover is not (the job runs over capacity rather than not at
	// all, and says so in the log). Each peer's capacity is
	// cluster.peers[].capacity; the node that runs the job masters reads
	// them all.
	Capacity int `yaml:"capacity"`
	// Weight is this node's share of the keyed subtasks that placement
	// spreads (those whose home node is gone or drained), relative to the
	// other nodes' weights: a node of weight 2 gets about twice the
	// subtasks of a node of weight 1. 1 to MaxWeight; 0 (unset) means 1.
	// Capacity stays the limit. Each peer's weight is
	// cluster.peers[].weight; the node that runs the job masters reads
	// them all.
	Weight int `yaml:"weight"`
	// Placement pins subtasks to nodes; a subtask not listed runs on node
	// number subtask modulo the number of nodes, in id order. An MQTT
	// source has one subtask per node, each reading its own node's ingest
	// log.
	Placement []PlacementConfig `yaml:"placement"`
	// SecretKey, when set, encrypts and authenticates gossip: the base64
	// of a 16, 24 or 32-byte AES key, the same on every node. A node with
	// another key (or none) cannot join.
	SecretKey string `yaml:"secret_key"`
	// Profile is the failure-detection profile of the membership:
	// "device" (default: a killed node is declared dead in about a
	// second) or "lan" (memberlist's LAN default, about 5–6 s, fewer
	// false suspicions on a congested network).
	Profile string `yaml:"profile"`
	// Channels tunes the cross-node channels; unset keys keep their
	// defaults (cluster.DefaultChannelConfig).
	Channels ChannelsConfig `yaml:"channels"`
	// Replicas is how many peers hold a copy of each state file a node
	// writes for a checkpoint before its acknowledgement counts. 0 means
	// DefaultReplicas, bounded by the number of peers; at most the number
	// of peers.
	Replicas int `yaml:"replicas"`
	// Leadership times the hand-back, the check for a second leader and
	// the leader's retries; unset keys keep their defaults
	// (cluster.DefaultLeadershipConfig).
	Leadership LeadershipBlock `yaml:"leadership"`
}

// LeadershipBlock is the `cluster.leadership` block. Zero values keep
// the defaults.
type LeadershipBlock struct {
	// Settle is how long a lower node must be up before the leadership
	// goes back to it.
	Settle time.Duration `yaml:"settle"`
	// MaxSettle caps the settle delay of a flapping node.
	MaxSettle time.Duration `yaml:"max_settle"`
	// Stable is how long a node must stay up to count as stable again.
	Stable time.Duration `yaml:"stable"`
	// HandbackInterval and MaxHandbackInterval space hand-back attempts.
	HandbackInterval    time.Duration `yaml:"handback_interval"`
	MaxHandbackInterval time.Duration `yaml:"max_handback_interval"`
	// SplitPoll is how often a leader looks for a second leader.
	SplitPoll time.Duration `yaml:"split_poll"`
	// AnswerPoll is how often a leader asks a lower node that did not
	// answer a take-over message which node it follows.
	AnswerPoll time.Duration `yaml:"answer_poll"`
	// RestartPoll is how often a restarted leader asks its peers again.
	RestartPoll time.Duration `yaml:"restart_poll"`
	// ResumeBackoff and MaxResumeBackoff space a leader's retries of
	// restarting or cancelling its jobs.
	ResumeBackoff    time.Duration `yaml:"resume_backoff"`
	MaxResumeBackoff time.Duration `yaml:"max_resume_backoff"`
	// DeployRetry is how often a job master whose node sees no majority
	// tries to deploy its job again.
	DeployRetry time.Duration `yaml:"deploy_retry"`
}

// LeadershipConfig returns the leadership timings: the defaults with the
// block's keys applied.
func (c *ClusterConfig) LeadershipConfig() cluster.LeadershipConfig {
	lc := cluster.DefaultLeadershipConfig()
	b := c.Leadership
	set := func(dst *time.Duration, v time.Duration) {
		if v != 0 {
			*dst = v
		}
	}
	set(&lc.Settle, b.Settle)
	set(&lc.MaxSettle, b.MaxSettle)
	set(&lc.Stable, b.Stable)
	set(&lc.MinInterval, b.HandbackInterval)
	set(&lc.MaxInterval, b.MaxHandbackInterval)
	set(&lc.SplitPoll, b.SplitPoll)
	set(&lc.AnswerPoll, b.AnswerPoll)
	set(&lc.RestartPoll, b.RestartPoll)
	set(&lc.ResumeBackoff, b.ResumeBackoff)
	set(&lc.MaxResumeBackoff, b.MaxResumeBackoff)
	set(&lc.DeployRetry, b.DeployRetry)
	// A maximum left unset is at least the minimum set.
	for _, p := range []struct {
		max     *time.Duration
		min     time.Duration
		userMax time.Duration
	}{
		{&lc.MaxSettle, lc.Settle, b.MaxSettle},
		{&lc.MaxInterval, lc.MinInterval, b.MaxHandbackInterval},
		{&lc.MaxResumeBackoff, lc.ResumeBackoff, b.MaxResumeBackoff},
	} {
		if p.userMax == 0 {
			*p.max = max(*p.max, p.min)
		}
	}
	return lc
}

// ChannelsConfig is the `cluster.channels` block. Zero values keep the
// defaults.
type ChannelsConfig struct {
	// Credits is the number of batches unacknowledged per channel.
	Credits int `yaml:"credits"`
	// MaxInFlightBytes bounds the batch bytes unacknowledged per channel.
	MaxInFlightBytes int `yaml:"max_inflight_bytes"`
	// MaxFrameBytes is the largest frame a channel sends.
	MaxFrameBytes int `yaml:"max_frame_bytes"`
	// MaxMergeBytes caps the frames merged from batches waiting for
	// credit; nil keeps the default, 0 turns merging off.
	MaxMergeBytes *int `yaml:"max_merge_bytes"`
	// AckInterval is how often a receiver repeats its latest
	// acknowledgement.
	AckInterval time.Duration `yaml:"ack_interval"`
	// AckTimeout is how long a sender waits for progress before it fails
	// the channel.
	AckTimeout time.Duration `yaml:"ack_timeout"`
}

// ChannelConfig returns the cross-node channel configuration: the
// defaults with the block's keys applied.
func (c *ClusterConfig) ChannelConfig() cluster.ChannelConfig {
	cc := cluster.DefaultChannelConfig()
	ch := c.Channels
	if ch.Credits != 0 {
		cc.Credits = ch.Credits
	}
	if ch.MaxInFlightBytes != 0 {
		cc.MaxInFlightBytes = ch.MaxInFlightBytes
	}
	if ch.MaxFrameBytes != 0 {
		cc.MaxFrameBytes = ch.MaxFrameBytes
	}
	if ch.MaxMergeBytes != nil {
		cc.MaxMergeBytes = *ch.MaxMergeBytes
	}
	if ch.AckInterval != 0 {
		cc.AckInterval = ch.AckInterval
	}
	if ch.AckTimeout != 0 {
		cc.AckTimeout = ch.AckTimeout
	}
	return cc
}

// GossipKey returns the decoded cluster.secret_key; nil when unset.
func (c *ClusterConfig) GossipKey() ([]byte, error) {
	if c.SecretKey == "" {
		return nil, nil
	}
	k, err := base64.StdEncoding.DecodeString(strings.TrimSpace(c.SecretKey))
	if err != nil {
		return nil, fmt.Errorf("not base64: %w", err)
	}
	switch len(k) {
	case 16, 24, 32:
		return k, nil
	}
	return nil, fmt.Errorf("%d bytes, want 16, 24 or 32 (e.g. from `head -c 32 /dev/urandom | base64`)", len(k))
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
	// Capacity is the peer's cluster.capacity: the most keyed subtasks it
	// may run; 0 (the default) means no limit.
	Capacity int `yaml:"capacity"`
	// Weight is the peer's cluster.weight: its relative share of the
	// keyed subtasks placement spreads; 0 (unset) means 1.
	Weight int `yaml:"weight"`
}

// MaxWeight bounds cluster.weight and cluster.peers[].weight.
const MaxWeight = 1000

// MaxCapacity bounds cluster.capacity and cluster.peers[].capacity.
const MaxCapacity = 1 << 16

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

// CapacityOf returns the capacity of node id (this node's
// cluster.capacity, or its peer entry's); 0 means no limit, and so does an
// id the config does not know.
func (c *ClusterConfig) CapacityOf(id string) int {
	if id == c.Node {
		return c.Capacity
	}
	p, _ := c.Peer(id)
	return p.Capacity
}

// WeightOf returns the placement weight of node id (this node's
// cluster.weight, or its peer entry's), at least 1; 1 for an id the config
// does not know.
func (c *ClusterConfig) WeightOf(id string) int {
	w := c.Weight
	if id != c.Node {
		p, _ := c.Peer(id)
		w = p.Weight
	}
	return max(w, 1)
}

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
	checkCapacity(p, "cluster.capacity", c.Capacity)
	checkWeight(p, "cluster.weight", c.Weight)
	seen := map[string]bool{c.Node: true}
	// Every node needs its own transport, API and gossip address: a
	// second node at one of them would get the first one's frames or
	// calls (node.listen is not known here: the peers' APIs are compared
	// among themselves).
	addrs := map[string]string{}
	if c.Listen != "" {
		addrs["address "+c.Listen] = "cluster.listen"
	}
	if c.Gossip != "" {
		addrs["gossip "+c.Gossip] = "cluster.gossip"
	}
	unique := func(path, kind, addr string) {
		if addr == "" {
			return
		}
		if first, ok := addrs[kind+" "+addr]; ok {
			p.add(path, fmt.Sprintf("%q is %s's too (every node needs its own address)", addr, first))
			return
		}
		addrs[kind+" "+addr] = path
	}
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
		checkCapacity(p, path+".capacity", peer.Capacity)
		checkWeight(p, path+".weight", peer.Weight)
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
		unique(path+".address", "address", peer.Address)
		unique(path+".api", "api", peer.API)
		unique(path+".gossip", "gossip", peer.Gossip)
	}
	if _, err := c.GossipKey(); err != nil {
		p.add("cluster.secret_key", err.Error())
	}
	if c.SecretKey != "" && c.Gossip == "" {
		p.add("cluster.secret_key", "is set and cluster.gossip is not: the key encrypts gossip")
	}
	switch cluster.Profile(c.Profile) {
	case "", cluster.ProfileDevice, cluster.ProfileLAN:
	default:
		p.add("cluster.profile", fmt.Sprintf("%q: want %q or %q", c.Profile, cluster.ProfileDevice, cluster.ProfileLAN))
	}
	for _, err := range []error{c.ChannelConfig().Validate(), c.LeadershipConfig().Validate()} {
		if err == nil {
			continue
		}
		for _, line := range strings.Split(err.Error(), "\n") {
			key, msg, _ := strings.Cut(line, " ")
			p.add(key, msg)
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

func checkCapacity(p *problems, path string, n int) {
	if n < 0 || n > MaxCapacity {
		p.add(path, fmt.Sprintf("(%d) must be 0 (no limit) to %d keyed subtasks", n, MaxCapacity))
	}
}

func checkWeight(p *problems, path string, n int) {
	if n < 0 || n > MaxWeight {
		p.add(path, fmt.Sprintf("(%d) must be 1 to %d (0 or unset means 1): the node's share of placement relative to the others'", n, MaxWeight))
	}
}
