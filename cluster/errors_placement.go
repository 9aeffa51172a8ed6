package cluster

import "errors"

// ErrNoMembers is returned by Place when there are units to place and no
// member to place them on.
var ErrNoMembers = errors.New("cluster: no members to place units on")

// ErrMetaTooLarge is returned when a node's metadata does not fit gossip's
// 512 bytes.
var ErrMetaTooLarge = errors.New("cluster: node metadata too large")

// ErrBadMeta is returned for node metadata that does not parse.
var ErrBadMeta = errors.New("cluster: bad node metadata")
