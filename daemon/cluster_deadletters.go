package daemon

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/edgedio/edged/pipeline"
)

// In a cluster each node counts the dead letters of the subtasks it hosts:
// the job master's node in its job's counters, a worker in counters it
// keeps per pipeline across deployments (hostedCounts). The job master's
// node answers a job's totals for the whole cluster: its own count plus
// each worker's, read from their GET /cluster/worker.

// workerDeadLetters is a worker's count of one pipeline's dead letters and
// the latest of them, newest first, in GET /cluster/worker.
type workerDeadLetters struct {
	Total  int64            `json:"total"`
	Recent []DeadLetterInfo `json:"recent,omitempty"`
}

// peerDeadLettersTTL is how long the job master's node reuses the counts
// it read from the workers: GET /jobs is polled by the dashboard.
const peerDeadLettersTTL = time.Second

// peerDeadLettersWait bounds one reading of the workers' counts; a worker
// that does not answer in time keeps its last count read.
const peerDeadLettersWait = 500 * time.Millisecond

// deadLetterCounts holds the counts of the subtasks a worker hosted and
// the workers' counts the job master's node last read.
type deadLetterCounts struct {
	mu     sync.Mutex
	hosted map[string]*pipeline.Job // by pipeline
	peers  map[string]map[string]workerDeadLetters
	read   time.Time // when peers was last read
	// reading is closed when the reading under way ends; nil when none is.
	reading chan struct{}
}

// hostedCounts returns the counters a worker's build of pipeline name
// adds to: nil before its first build (which then gives them, keep).
func (d *deadLetterCounts) hostedCounts(name string) *pipeline.Job {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.hosted[name]
}

// keep records pj as the counters of pipeline name's hosted subtasks,
// unless some are recorded already.
func (d *deadLetterCounts) keep(name string, pj *pipeline.Job) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.hosted == nil {
		d.hosted = map[string]*pipeline.Job{}
	}
	if d.hosted[name] == nil {
		d.hosted[name] = pj
	}
}

// hostedTotal returns the dead letters of pipeline name's subtasks the
// node's worker hosted.
func (d *deadLetterCounts) hostedTotal(name string) int64 {
	if pj := d.hostedCounts(name); pj != nil {
		return pj.DeadLetters()
	}
	return 0
}

// hostedTotals returns the dead letters of the subtasks the node's worker
// hosted, by pipeline.
func (d *deadLetterCounts) hostedTotals() map[string]int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[string]int64, len(d.hosted))
	for name, pj := range d.hosted {
		out[name] = pj.DeadLetters()
	}
	return out
}

// hostedJobs returns the counters of the subtasks the node's worker
// hosted, by pipeline.
func (d *deadLetterCounts) hostedJobs() map[string]*pipeline.Job {
	d.mu.Lock()
	defer d.mu.Unlock()
	return maps.Clone(d.hosted)
}

// report returns what GET /cluster/worker answers: the hosted counts, by
// pipeline.
func (d *deadLetterCounts) report() map[string]workerDeadLetters {
	d.mu.Lock()
	hosted := maps.Clone(d.hosted)
	d.mu.Unlock()
	out := make(map[string]workerDeadLetters, len(hosted))
	for name, pj := range hosted {
		l := deadLetters(name, pj.DeadLetters(), pj.RecentDeadLetters(), pipeline.RecentDeadLetters)
		out[name] = workerDeadLetters{Total: l.Total, Recent: l.Recent}
	}
	return out
}

// peerCounts returns the workers' counts (by node, then pipeline), read
// anew when the last reading is older than peerDeadLettersTTL; callers
// meanwhile wait for that reading. read asks one node.
func (d *deadLetterCounts) peerCounts(ctx context.Context, nodes []string, read func(context.Context, string) (map[string]workerDeadLetters, error)) map[string]map[string]workerDeadLetters {
	d.mu.Lock()
	if time.Since(d.read) < peerDeadLettersTTL || len(nodes) == 0 {
		defer d.mu.Unlock()
		return maps.Clone(d.peers)
	}
	if wait := d.reading; wait != nil {
		d.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
		}
		d.mu.Lock()
		defer d.mu.Unlock()
		return maps.Clone(d.peers)
	}
	done := make(chan struct{})
	d.reading = done
	d.mu.Unlock()
	d.readPeers(ctx, nodes, read, done)
	d.mu.Lock()
	defer d.mu.Unlock()
	return maps.Clone(d.peers)
}

// readPeers reads every node's counts at once, within
// peerDeadLettersWait, keeps the answers (a node that does not answer
// keeps its last ones) and closes done.
func (d *deadLetterCounts) readPeers(ctx context.Context, nodes []string, read func(context.Context, string) (map[string]workerDeadLetters, error), done chan struct{}) {
	ctx, cancel := context.WithTimeout(ctx, peerDeadLettersWait)
	defer cancel()
	got := make([]map[string]workerDeadLetters, len(nodes))
	var wg sync.WaitGroup
	for i, node := range nodes {
		wg.Go(func() {
			if c, err := read(ctx, node); err == nil {
				got[i] = c
				if got[i] == nil {
					got[i] = map[string]workerDeadLetters{}
				}
			}
		})
	}
	wg.Wait()
	d.mu.Lock()
	if d.peers == nil {
		d.peers = map[string]map[string]workerDeadLetters{}
	}
	for i, node := range nodes {
		if got[i] == nil {
			continue
		}
		// Named here, once: the answers are shared, read-only, by every
		// caller from now on.
		for _, c := range got[i] {
			for k := range c.Recent {
				c.Recent[k].Node = node
			}
		}
		d.peers[node] = got[i]
	}
	d.read, d.reading = time.Now(), nil
	d.mu.Unlock()
	close(done)
}

// nodeDeadLetters returns the dead letters of job j's subtasks on this
// node: the job master's own and, on a node that hosted some as a
// worker before it took over, those.
func (n *node) nodeDeadLetters(j *job) int64 {
	return j.pj.DeadLetters() + n.deadCounts.hostedTotal(j.name)
}

// clusterDeadLetters returns job j's dead letters by node of the cluster
// (this node's own included), their total, and the latest of them (at
// most limit), each naming its node. Called on a node of a cluster.
func (n *node) clusterDeadLetters(ctx context.Context, j *job, limit int) (by map[string]int64, total int64, latest []DeadLetterInfo) {
	self := n.cluster.cfg.Node
	by = map[string]int64{self: n.nodeDeadLetters(j)}
	recent := deadLetters(j.name, 0, j.pj.RecentDeadLetters(), limit).Recent
	lists := [][]DeadLetterInfo{recent}
	if pj := n.deadCounts.hostedCounts(j.name); pj != nil && pj != j.pj {
		// Those of the subtasks it hosted as a worker before it took
		// over: older than its own.
		lists = append(lists, deadLetters(j.name, 0, pj.RecentDeadLetters(), limit).Recent)
	}
	for _, l := range lists {
		for i := range l {
			l[i].Node = self
		}
	}
	if n.cluster.peers == nil {
		return by, sumOf(by), interleave(lists, limit)
	}
	var peers []string
	for _, id := range n.cluster.cfg.Nodes() {
		if id != self {
			peers = append(peers, id)
		}
	}
	counts := n.deadCounts.peerCounts(ctx, peers, func(ctx context.Context, node string) (map[string]workerDeadLetters, error) {
		w, err := n.cluster.peers.workerStatus(ctx, node)
		return w.DeadLetters, err
	})
	for _, node := range slices.Sorted(maps.Keys(counts)) {
		c, ok := counts[node][j.name]
		if !ok {
			continue
		}
		by[node] = c.Total
		lists = append(lists, c.Recent)
	}
	return by, sumOf(by), interleave(lists, limit)
}

// interleave returns at most limit dead letters of lists, each newest
// first: the nodes' dead letters are not ordered among each other, so the
// newest of each list in turn, then the next.
func interleave(lists [][]DeadLetterInfo, limit int) []DeadLetterInfo {
	out := []DeadLetterInfo{}
	for i := 0; len(out) < limit; i++ {
		more := false
		for _, l := range lists {
			if i < len(l) && len(out) < limit {
				out = append(out, l[i])
				more = true
			}
		}
		if !more {
			break
		}
	}
	return out
}

// sumOf returns the sum of the counts of by.
func sumOf(by map[string]int64) int64 {
	var n int64
	for _, c := range by {
		n += c
	}
	return n
}
