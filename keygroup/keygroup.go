// Package keygroup maps keys to key groups and key groups to subtasks.
//
// Every key hashes to one of maxParallelism key groups, fixed for a job's
// life. Subtask i of n owns a contiguous range of key groups. Keyed state,
// timers and snapshots are organised by key group, so rescaling or moving
// work between devices moves whole key groups and nothing is re-hashed.
//
// The package is pure: no I/O, no goroutines, no clocks.
package keygroup

import (
	"fmt"
	"math"

	"github.com/cespare/xxhash/v2"
)

// DefaultMaxParallelism is the number of key groups of a job that does not
// set one.
const DefaultMaxParallelism = 128

// MaxMaxParallelism is the largest number of key groups a job may have.
const MaxMaxParallelism = 1 << 15

// Range is the half-open interval [Start, End) of key groups owned by one
// subtask.
type Range struct {
	Start int
	End   int
}

// Len returns the number of key groups in r.
func (r Range) Len() int { return r.End - r.Start }

// Contains reports whether key group g lies in r.
func (r Range) Contains(g int) bool { return g >= r.Start && g < r.End }

// String formats r as "[start,end)".
func (r Range) String() string { return fmt.Sprintf("[%d,%d)", r.Start, r.End) }

// HashString returns the stable 64-bit hash of a string key. It is the same
// on every machine and in every process, which key groups depend on.
func HashString(s string) uint64 { return xxhash.Sum64String(s) }

// HashBytes returns the stable 64-bit hash of an encoded key.
func HashBytes(b []byte) uint64 { return xxhash.Sum64(b) }

// HashUint64 returns the stable 64-bit hash of an integer key (the
// finaliser of SplitMix64: every input bit affects every output bit).
func HashUint64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// HashFloat64 returns the stable hash of a float key; 0 and -0 hash alike.
func HashFloat64(f float64) uint64 {
	if f == 0 {
		f = 0
	}
	return HashUint64(math.Float64bits(f))
}

// Of returns the key group of a key hash: hash mod maxParallelism.
func Of(hash uint64, maxParallelism int) int {
	return int(hash % uint64(maxParallelism))
}

// Subtask returns the index of the subtask, among parallelism subtasks, that
// owns key group g: g*parallelism/maxParallelism.
func Subtask(g, parallelism, maxParallelism int) int {
	return g * parallelism / maxParallelism
}

// RangeFor returns the contiguous key groups owned by subtask i of
// parallelism subtasks. The ranges of all subtasks partition
// [0, maxParallelism), and g is in RangeFor(Subtask(g, p, m), p, m).
func RangeFor(i, parallelism, maxParallelism int) Range {
	return Range{
		Start: (i*maxParallelism + parallelism - 1) / parallelism,
		End:   ((i+1)*maxParallelism + parallelism - 1) / parallelism,
	}
}

// Validate reports whether parallelism and maxParallelism fit together.
func Validate(parallelism, maxParallelism int) error {
	switch {
	case maxParallelism < 1 || maxParallelism > MaxMaxParallelism:
		return fmt.Errorf("keygroup: max parallelism %d out of range [1,%d]", maxParallelism, MaxMaxParallelism)
	case parallelism < 1:
		return fmt.Errorf("keygroup: parallelism %d must be at least 1", parallelism)
	case parallelism > maxParallelism:
		return fmt.Errorf("keygroup: parallelism %d exceeds max parallelism %d", parallelism, maxParallelism)
	}
	return nil
}
