package cluster

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"slices"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/keygroup"
)

// Fingerprint is a stable hash of a job's plan: its name, max
// parallelism, vertices (UID, parallelism, record types, keyed, chaining),
// edges (ends, partitioner, side output, input), chains and, when set,
// its settings digest (actors.Job.Settings: the operator settings the
// graph does not show, such as a window's size or a sink's topic, as the
// daemon sets it for a declared pipeline). Two nodes
// exchange frames for a job only when their fingerprints are equal: the
// channel IDs both derive from the plan then name the same channels.
type Fingerprint [sha256.Size]byte

// String returns the fingerprint in hex.
func (f Fingerprint) String() string { return hex.EncodeToString(f[:]) }

// Short returns the first 12 hex digits, for logs.
func (f Fingerprint) Short() string { return f.String()[:12] }

// Check compares the fingerprint of peer's plan with f, this node's, and
// returns an error wrapping ErrPlanMismatch if they differ.
func (f Fingerprint) Check(job, peer string, theirs Fingerprint) error {
	if f == theirs {
		return nil
	}
	return fmt.Errorf("%w: job %q: node %q runs plan %s, this node runs %s; both must run the same job graph and settings",
		ErrPlanMismatch, job, peer, theirs.Short(), f.Short())
}

// FingerprintOf returns the fingerprint of j's plan. It fails if j is not
// a valid job. It reads j only; the order of j.Vertices and j.Edges is
// part of the plan, as channel IDs name edges by index.
func FingerprintOf(j *actors.Job) (Fingerprint, error) {
	plan, err := actors.BuildPlan(j)
	if err != nil {
		return Fingerprint{}, fmt.Errorf("fingerprint job %q: %w", j.Name, err)
	}
	var b []byte
	str := func(s string) {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	num := func(v int) { b = binary.AppendVarint(b, int64(v)) }
	flag := func(v bool) {
		if v {
			b = append(b, 1)
		} else {
			b = append(b, 0)
		}
	}
	typ := func(t actors.ElemType) {
		if t == nil {
			str("")
			return
		}
		str(t.String())
	}
	str("edged plan v1")
	str(j.Name)
	maxP := j.MaxParallelism
	if maxP == 0 {
		maxP = keygroup.DefaultMaxParallelism
	}
	num(maxP)
	num(len(j.Vertices))
	for _, v := range j.Vertices {
		num(v.ID)
		str(v.UID)
		num(v.Parallelism)
		typ(v.In)
		typ(v.In2)
		typ(v.Out)
		tags := make([]string, 0, len(v.SideOutputs))
		for tag := range v.SideOutputs {
			tags = append(tags, tag)
		}
		slices.Sort(tags)
		num(len(tags))
		for _, tag := range tags {
			str(tag)
			typ(v.SideOutputs[tag])
		}
		flag(v.IsSource())
		flag(v.Keyed)
		flag(v.NoChain)
	}
	num(len(j.Edges))
	for _, e := range j.Edges {
		num(e.From.ID)
		num(e.To.ID)
		str(e.Partition.String())
		str(e.Output)
		num(e.Input)
	}
	num(len(plan.Chains))
	for _, c := range plan.Chains {
		num(len(c.Vertices))
		for _, v := range c.Vertices {
			num(v.ID)
		}
	}
	if j.Settings != "" {
		// Only when set, so that a job built in Go without settings
		// keeps the fingerprint of its graph.
		str("settings")
		str(j.Settings)
	}
	return sha256.Sum256(b), nil
}
