package cluster

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
)

// Faults is a seeded fault schedule for a MemoryNetwork: the probability
// of each fault per frame, and partitions by tick.
type Faults struct {
	// Drop, Duplicate, Delay and Reorder are the probabilities (0 to 1)
	// that a frame is lost, arrives twice, arrives 1 to MaxDelay ticks
	// late, or overtakes the frame sent before it on its link.
	Drop, Duplicate, Delay, Reorder float64
	// MaxDelay is the longest delay, in ticks (default 1 if Delay > 0).
	MaxDelay int
	// Partitions cut links for a span of ticks.
	Partitions []Partition
	// Limit, if positive, is the most drops, duplicates, delays and
	// reorders injected in all; after that frames pass unharmed, so a
	// job restarted after a fault can run to its end.
	Limit int
	// DropIf, if set, is asked about every frame before the random
	// faults, with the network's lock held: true loses the frame (counted
	// as dropped). It targets one frame, a control message for instance;
	// it must not call the network.
	DropIf func(from, to string, frame []byte) bool
}

// Partition cuts the link between nodes A and B from tick From until tick
// Until (exclusive): frames sent either way are lost, and at tick From
// both sides are told that the other disconnected.
type Partition struct {
	A, B        string
	From, Until int
}

// NetworkStats counts what a MemoryNetwork did to frames.
type NetworkStats struct {
	Sent, Delivered, Dropped, Duplicated, Delayed, Reordered, Cut int
}

// MemoryNetwork is an in-memory network of nodes for protocol tests. It
// runs only when the test calls Step: each Step is one tick that starts
// the partitions scheduled for it and delivers the frames due, calling the
// receiving node's Handler on the caller's goroutine. Given the same seed,
// faults and sends, it does the same thing.
//
// Safe for concurrent use; handlers may Send from within HandleFrame.
type MemoryNetwork struct {
	mu     sync.Mutex // guards every field below
	rng    *rand.Rand
	faults Faults
	tick   int
	order  uint64 // enqueue counter, to keep delivery stable
	nodes  map[string]*MemoryTransport
	queue  []pending
	cut    map[[2]string]bool // links cut by hand (Cut)
	closed map[string]bool    // nodes closed: peers learn it at the next Step
	stats  NetworkStats
	faulty int           // faults injected, against Faults.Limit
	ready  chan struct{} // capacity 1: rung when a frame is queued
}

type pending struct {
	at       int
	order    uint64
	from, to string
	data     []byte
}

// NewMemoryNetwork returns a network whose faults are drawn from seed.
func NewMemoryNetwork(seed uint64, f Faults) *MemoryNetwork {
	if f.Delay > 0 && f.MaxDelay < 1 {
		f.MaxDelay = 1
	}
	return &MemoryNetwork{
		rng:    rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		faults: f,
		nodes:  map[string]*MemoryTransport{},
		cut:    map[[2]string]bool{},
		closed: map[string]bool{},
		ready:  make(chan struct{}, 1),
	}
}

// Ready returns a channel that receives a value after a frame was queued:
// a pump waits on it instead of spinning.
func (n *MemoryNetwork) Ready() <-chan struct{} { return n.ready }

// roll draws whether a fault of probability p strikes now; n.mu is held.
func (n *MemoryNetwork) roll(p float64) bool {
	if p <= 0 || n.faults.Limit > 0 && n.faulty >= n.faults.Limit {
		return false
	}
	if n.rng.Float64() < p {
		n.faulty++
		return true
	}
	return false
}

// Node adds node addr, whose deliveries go to h, and returns its transport.
func (n *MemoryNetwork) Node(addr string, h Handler) *MemoryTransport {
	n.mu.Lock()
	defer n.mu.Unlock()
	t := &MemoryTransport{net: n, addr: addr, h: h}
	n.nodes[addr] = t
	return t
}

// Tick returns the number of Steps taken.
func (n *MemoryNetwork) Tick() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.tick
}

// Pending returns the number of frames on the way.
func (n *MemoryNetwork) Pending() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.queue)
}

// Stats returns what the network did so far.
func (n *MemoryNetwork) Stats() NetworkStats {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.stats
}

// Cut cuts the link between a and b now, until Heal: both sides are told
// at the next Step.
func (n *MemoryNetwork) Cut(a, b string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.cut[link(a, b)] = true
	n.queue = append(n.queue, pending{at: n.tick, from: a, to: b, data: nil}, pending{at: n.tick, from: b, to: a, data: nil})
}

// Heal restores a link cut by Cut.
func (n *MemoryNetwork) Heal(a, b string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.cut, link(a, b))
}

func link(a, b string) [2]string {
	if a > b {
		a, b = b, a
	}
	return [2]string{a, b}
}

// isCut reports whether the link a-b is cut at the current tick.
func (n *MemoryNetwork) isCut(a, b string) bool {
	if n.cut[link(a, b)] || n.closed[a] || n.closed[b] {
		return true
	}
	for _, p := range n.faults.Partitions {
		if link(p.A, p.B) == link(a, b) && n.tick >= p.From && n.tick < p.Until {
			return true
		}
	}
	return false
}

// Step advances one tick: nodes on either side of a partition starting now
// are told, then every frame due is delivered, in order. It returns the
// number of frames delivered.
func (n *MemoryNetwork) Step() int {
	n.mu.Lock()
	n.tick++
	var discs []notice
	for _, p := range n.faults.Partitions {
		if p.From == n.tick {
			discs = append(discs, n.disconnect(p.A, p.B)...)
		}
	}
	var due, later []pending
	for _, p := range n.queue {
		if p.at < n.tick {
			due = append(due, p)
		} else {
			later = append(later, p)
		}
	}
	n.queue = later
	slices.SortStableFunc(due, func(a, b pending) int {
		if a.at != b.at {
			return a.at - b.at
		}
		return cmp.Compare(a.order, b.order)
	})
	type delivery struct {
		h    Handler
		data []byte
	}
	var out []delivery
	for _, p := range due {
		if p.data == nil { // a cut or closed node, announced
			if t := n.nodes[p.to]; t != nil && !n.closed[p.to] {
				discs = append(discs, notice{t.h, p.from})
			}
			continue
		}
		t := n.nodes[p.to]
		if t == nil || n.isCut(p.from, p.to) {
			n.stats.Cut++
			continue
		}
		n.stats.Delivered++
		out = append(out, delivery{t.h, p.data})
	}
	tick := n.tick
	n.mu.Unlock()
	for _, d := range discs {
		d.h.HandleDisconnect(d.peer, fmt.Errorf("memory network: link cut at tick %d", tick))
	}
	for _, d := range out {
		d.h.HandleFrame(d.data)
	}
	return len(out)
}

// notice is a disconnect to tell a handler about.
type notice struct {
	h    Handler
	peer string
}

// disconnect returns the notices telling a and b that they lost each
// other. n.mu is held.
func (n *MemoryNetwork) disconnect(a, b string) []notice {
	var out []notice
	if t := n.nodes[a]; t != nil {
		out = append(out, notice{t.h, b})
	}
	if t := n.nodes[b]; t != nil {
		out = append(out, notice{t.h, a})
	}
	return out
}

// send enqueues data from one node to another, applying the faults.
func (n *MemoryNetwork) send(from, to string, data []byte) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed[from] {
		return fmt.Errorf("node %q: %w", from, ErrTransportClosed)
	}
	if _, ok := n.nodes[to]; !ok {
		return fmt.Errorf("%w: %q", ErrUnknownNode, to)
	}
	n.stats.Sent++
	f := n.faults
	if n.isCut(from, to) {
		n.stats.Cut++
		return nil
	}
	defer func() {
		select {
		case n.ready <- struct{}{}:
		default:
		}
	}()
	if f.DropIf != nil && f.DropIf(from, to, data) || n.roll(f.Drop) {
		n.stats.Dropped++
		return nil
	}
	copies := 1
	if n.roll(f.Duplicate) {
		n.stats.Duplicated++
		copies = 2
	}
	for range copies {
		p := pending{at: n.tick, from: from, to: to, data: data}
		n.order++
		p.order = n.order
		if n.roll(f.Delay) {
			n.stats.Delayed++
			p.at += 1 + n.rng.IntN(f.MaxDelay)
		}
		if n.roll(f.Reorder) {
			// Overtake the last frame still queued on this link.
			for i := len(n.queue) - 1; i >= 0; i-- {
				q := &n.queue[i]
				if q.from == from && q.to == to && q.data != nil {
					n.stats.Reordered++
					p.at, p.order, q.at, q.order = q.at, q.order, p.at, p.order
					break
				}
			}
		}
		n.queue = append(n.queue, p)
	}
	return nil
}

// MemoryTransport is one node of a MemoryNetwork.
type MemoryTransport struct {
	net  *MemoryNetwork
	addr string
	h    Handler
}

// Addr returns the node's name.
func (t *MemoryTransport) Addr() string { return t.addr }

// Send queues frame for node to, subject to the network's faults.
func (t *MemoryTransport) Send(to string, frame []byte) error {
	return t.net.send(t.addr, to, frame)
}

// Close takes the node off the network, as a crash would: frames to and
// from it are lost, and every other node is told at the next Step.
func (t *MemoryTransport) Close() error {
	n := t.net
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed[t.addr] {
		return nil
	}
	n.closed[t.addr] = true
	for addr := range n.nodes {
		if addr != t.addr {
			n.queue = append(n.queue, pending{at: n.tick, from: t.addr, to: addr})
		}
	}
	return nil
}
