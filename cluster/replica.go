package cluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/edgedio/edged/internal/fsutil"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ReplicaKey names one replicated snapshot file: the node that wrote it,
// its job and checkpoint, and its name in the snapshot directory (as in
// its snapshot.Handle).
type ReplicaKey struct {
	Node       string
	Job        string
	Checkpoint int64
	File       string
}

func (k ReplicaKey) String() string {
	return fmt.Sprintf("%s/%s/%d/%s", k.Node, k.Job, k.Checkpoint, k.File)
}

// validName accepts a path element that cannot leave its directory.
func validName(s string) bool {
	return s != "" && s != "." && s != ".." && len(s) <= 255 &&
		!strings.ContainsAny(s, "/\\\x00")
}

// Validate reports whether k can name a file safely.
func (k ReplicaKey) Validate() error {
	if !validName(k.Node) || !validName(k.Job) || !validName(k.File) || k.Checkpoint <= 0 {
		return fmt.Errorf("%w: %q", ErrBadReplicaKey, k.String())
	}
	return nil
}

// ReplicaStore keeps, on disk, the copies of snapshot files that a node
// holds for its peers: dir/<node>/<job>/<checkpoint>/<file>. A replica is
// written through a temporary file, fsynced and renamed, and only once its
// CRC32C (Castagnoli, as in snapshot.Handle) matches the one its writer
// gave; it is checked again on every read, so a replica damaged on disk is
// reported (ErrReplicaCorrupt), never served.
//
// Safe for concurrent use.
type ReplicaStore struct {
	dir string
	mu  sync.Mutex // serialises Retain against writes of the same job
}

// OpenReplicaStore opens (creating it) a replica store in dir.
func OpenReplicaStore(dir string) (*ReplicaStore, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("cluster: replica store: %w", err)
	}
	return &ReplicaStore{dir: dir}, nil
}

func (s *ReplicaStore) path(k ReplicaKey) string {
	return filepath.Join(s.dir, k.Node, k.Job, strconv.FormatInt(k.Checkpoint, 10), k.File)
}

// Put stores the replica k read from r, which must hold size bytes whose
// CRC32C is sum; otherwise nothing is stored and the error wraps
// ErrReplicaCorrupt. It returns once the replica is durable.
func (s *ReplicaStore) Put(k ReplicaKey, sum uint32, size int64, r io.Reader) error {
	if err := k.Validate(); err != nil {
		return err
	}
	path := s.path(k)
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("cluster: replica %s: %w", k, err)
	}
	f, err := os.CreateTemp(dir, k.File+".*.tmp")
	if err != nil {
		return fmt.Errorf("cluster: replica %s: %w", k, err)
	}
	tmp := f.Name()
	c := crc32.New(castagnoli)
	n, err := io.Copy(io.MultiWriter(f, c), io.LimitReader(r, size+1))
	switch {
	case err != nil:
		err = fmt.Errorf("cluster: replica %s: %w", k, err)
	case n != size:
		err = fmt.Errorf("%w: %s has %d bytes, expected %d", ErrReplicaCorrupt, k, n, size)
	case c.Sum32() != sum:
		err = fmt.Errorf("%w: %s has crc32c %08x, expected %08x", ErrReplicaCorrupt, k, c.Sum32(), sum)
	default:
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	return fsutil.SyncDir(dir)
}

// Open returns the replica k, checked against size and sum; a replica
// that does not match wraps ErrReplicaCorrupt, a missing one
// ErrReplicaMissing.
func (s *ReplicaStore) Open(k ReplicaKey, sum uint32, size int64) ([]byte, error) {
	if err := k.Validate(); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(s.path(k))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s", ErrReplicaMissing, k)
	}
	if err != nil {
		return nil, fmt.Errorf("cluster: replica %s: %w", k, err)
	}
	if err := checkReplica(k, b, sum, size); err != nil {
		return nil, err
	}
	return b, nil
}

// Checkpoints returns the checkpoints of job written by node that the
// store holds replicas of, ascending.
func (s *ReplicaStore) Checkpoints(node, job string) ([]int64, error) {
	ents, err := os.ReadDir(filepath.Join(s.dir, node, job))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var ids []int64
	for _, e := range ents {
		if id, err := strconv.ParseInt(e.Name(), 10, 64); err == nil && e.IsDir() {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids, nil
}

// Retain drops every replica of job, from every node, whose checkpoint is
// not in keep (the checkpoints the job still retains).
func (s *ReplicaStore) Retain(job string, keep []int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	nodes, err := os.ReadDir(s.dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, n := range nodes {
		ids, err := s.Checkpoints(n.Name(), job)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, id := range ids {
			if !slices.Contains(keep, id) {
				errs = append(errs, os.RemoveAll(filepath.Join(s.dir, n.Name(), job, strconv.FormatInt(id, 10))))
			}
		}
	}
	return errors.Join(errs...)
}

func checkReplica(k ReplicaKey, b []byte, sum uint32, size int64) error {
	if int64(len(b)) != size {
		return fmt.Errorf("%w: %s has %d bytes, expected %d", ErrReplicaCorrupt, k, len(b), size)
	}
	if got := crc32.Checksum(b, castagnoli); got != sum {
		return fmt.Errorf("%w: %s has crc32c %08x, expected %08x", ErrReplicaCorrupt, k, got, sum)
	}
	return nil
}

// ReplicaTargets returns the peers that hold the replicas of node's
// snapshot files: r of the other members (fewer if the cluster is
// smaller), chosen by rendezvous hashing on node's id, so that every node
// computes the same targets and a join or leave changes few of them.
func ReplicaTargets(node string, members []string, r int) []string {
	type scored struct {
		id    string
		score float64
	}
	var ss []scored
	for _, m := range slices.Compact(slices.Sorted(slices.Values(members))) {
		if m != node {
			ss = append(ss, scored{m, score(Unit("replicas-of/"+node), Member{ID: m, Capacity: 1})})
		}
	}
	slices.SortFunc(ss, func(a, b scored) int {
		if c := cmp.Compare(b.score, a.score); c != 0 {
			return c
		}
		return cmp.Compare(a.id, b.id)
	})
	out := make([]string, 0, min(r, len(ss)))
	for _, s := range ss[:min(r, len(ss))] {
		out = append(out, s.id)
	}
	return out
}

// ReplicaClient copies replicas to and from peers (HTTPReplicaClient over
// the nodes' REST APIs; tests may use a ReplicaStore map).
type ReplicaClient interface {
	// PutReplica stores the replica k (size bytes from body, CRC32C sum)
	// on peer, returning once it is durable there.
	PutReplica(ctx context.Context, peer string, k ReplicaKey, sum uint32, size int64, body io.Reader) error
	// GetReplica reads the replica k from peer, which checks it against
	// sum and size before it serves it.
	GetReplica(ctx context.Context, peer string, k ReplicaKey, sum uint32, size int64) ([]byte, error)
}

// Replicate copies the file at path, replica k with CRC32C sum, to every
// one of peers at once, and returns once all hold it durably. It fails,
// naming each peer that does not hold it, if any copy fails: the
// snapshot's acknowledgement must not count until its replicas exist.
//
// The file is streamed, never held in memory: it is read once to check
// it against sum, then once per peer (from the page cache).
func Replicate(ctx context.Context, c ReplicaClient, peers []string, k ReplicaKey, path string, sum uint32) error {
	if err := k.Validate(); err != nil {
		return err
	}
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("cluster: replicate %s: %w", k, err)
	}
	defer f.Close()
	// The local file is checked first: a replica of a damaged file would
	// be worse than none.
	h := crc32.New(castagnoli)
	size, err := io.Copy(h, f)
	if err != nil {
		return fmt.Errorf("cluster: replicate %s: %w", k, err)
	}
	if got := h.Sum32(); got != sum {
		return fmt.Errorf("%w: %s has crc32c %08x, expected %08x", ErrReplicaCorrupt, k, got, sum)
	}
	errs := make([]error, len(peers))
	var wg sync.WaitGroup
	for i, p := range peers {
		wg.Go(func() {
			if err := c.PutReplica(ctx, p, k, sum, size, io.NewSectionReader(f, 0, size)); err != nil {
				errs[i] = fmt.Errorf("%w: %s on %s: %w", ErrReplication, k, p, err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// FetchReplica reads replica k from the first of holders that serves it
// intact, and writes it durably to path. A holder whose copy is missing,
// corrupt or unreachable is logged and the next one tried; the error, if
// none serves it, names every holder's failure.
func FetchReplica(ctx context.Context, c ReplicaClient, holders []string, k ReplicaKey, sum uint32, size int64, path string, log *slog.Logger) (from string, err error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var errs []error
	for _, h := range holders {
		b, err := c.GetReplica(ctx, h, k, sum, size)
		if err == nil {
			// Check again here: the bytes crossed a network.
			err = checkReplica(k, b, sum, size)
		}
		if err != nil {
			log.Warn("replica unusable, trying the next holder", "replica", k.String(), "holder", h, "err", err)
			errs = append(errs, fmt.Errorf("%s: %w", h, err))
			continue
		}
		dir := filepath.Dir(path)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return "", err
		}
		tmp := path + ".fetch.tmp"
		if err := os.WriteFile(tmp, b, 0o644); err != nil {
			return "", err
		}
		f, err := os.Open(tmp)
		if err == nil {
			err = f.Sync()
			f.Close()
		}
		if err == nil {
			err = os.Rename(tmp, path)
		}
		if err == nil {
			err = fsutil.SyncDir(dir)
		}
		if err != nil {
			os.Remove(tmp)
			return "", fmt.Errorf("cluster: fetch %s: %w", k, err)
		}
		return h, nil
	}
	return "", fmt.Errorf("%w: %s from %v: %w", ErrNoReplica, k, holders, errors.Join(errs...))
}
