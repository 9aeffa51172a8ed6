package cluster

import "errors"

// ErrNoMembers is returned by Place when there are units to place and no
// member to place them on.
var ErrNoMembers = errors.New("cluster: no members to place units on")
