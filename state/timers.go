package state

import "slices"

// Timer is a timer of a keyed operator: when time (event time or
// processing time, depending on the queue) reaches Timestamp, the operator
// sets Key as the current key and calls its timer function for Namespace.
type Timer[K, N comparable] struct {
	Timestamp int64
	Key       K
	Group     int
	Namespace N
}

// TimerQueue holds the timers of one kind (event time or processing time)
// of one operator subtask. There is at most one timer per timestamp, key
// and namespace. Timers fire in order of timestamp, then of registration.
// Timers are indexed by key group, for snapshots.
//
// It is a pure data structure: no clock, no goroutine. The operator feeds it
// the watermark (or the processing time) through PopUntil. Not safe for
// concurrent use.
type TimerQueue[K, N comparable] struct {
	// groups holds the queued timers of each key group.
	groups map[int]map[Timer[K, N]]*timerItem[K, N]
	// heap orders the queued timers by (timestamp, seq).
	heap []*timerItem[K, N]
	// free keeps fired and deleted items for reuse.
	free []*timerItem[K, N]
	seq  uint64
}

// timerItem is a queued timer: its place in the heap and its registration
// sequence number, which orders timers of equal timestamp.
type timerItem[K, N comparable] struct {
	t   Timer[K, N]
	seq uint64
	pos int
}

// NewTimerQueue returns an empty timer queue.
func NewTimerQueue[K, N comparable]() *TimerQueue[K, N] {
	return &TimerQueue[K, N]{groups: make(map[int]map[Timer[K, N]]*timerItem[K, N])}
}

// group returns the timers of key group g, creating the map if asked.
func (q *TimerQueue[K, N]) group(g int, create bool) map[Timer[K, N]]*timerItem[K, N] {
	m := q.groups[g]
	if m == nil && create {
		m = make(map[Timer[K, N]]*timerItem[K, N])
		q.groups[g] = m
	}
	return m
}

// Register queues a timer at ts for key, of key group group, in namespace
// ns. It returns false, and changes nothing, if that timer is queued
// already.
func (q *TimerQueue[K, N]) Register(ts int64, key K, group int, ns N) bool {
	t := Timer[K, N]{Timestamp: ts, Key: key, Group: group, Namespace: ns}
	m := q.group(group, true)
	if _, ok := m[t]; ok {
		return false
	}
	var it *timerItem[K, N]
	if n := len(q.free); n > 0 {
		it, q.free = q.free[n-1], q.free[:n-1]
	} else {
		it = new(timerItem[K, N])
	}
	it.t, it.seq, it.pos = t, q.seq, len(q.heap)
	q.seq++
	m[t] = it
	q.heap = append(q.heap, it)
	q.up(it.pos)
	return true
}

// registerAll registers the timers ts in their order, as Register does
// one by one, but sizes the queue once: a restore of many timers makes
// one allocation for their items and one map per key group, instead of
// one item per timer and maps grown timer by timer.
func (q *TimerQueue[K, N]) registerAll(ts []Timer[K, N]) {
	if len(ts) == 0 {
		return
	}
	counts := make(map[int]int)
	for i := range ts {
		counts[ts[i].Group]++
	}
	for g, n := range counts {
		if q.groups[g] == nil {
			q.groups[g] = make(map[Timer[K, N]]*timerItem[K, N], n)
		}
	}
	items := make([]timerItem[K, N], len(ts))
	q.heap = slices.Grow(q.heap, len(ts))
	used := 0
	for _, t := range ts {
		m := q.groups[t.Group]
		if _, ok := m[t]; ok {
			continue
		}
		it := &items[used]
		used++
		it.t, it.seq, it.pos = t, q.seq, len(q.heap)
		q.seq++
		m[t] = it
		q.heap = append(q.heap, it)
		q.up(it.pos)
	}
}

// Delete removes the timer at ts for key, group and ns. It returns false if
// there was none.
func (q *TimerQueue[K, N]) Delete(ts int64, key K, group int, ns N) bool {
	t := Timer[K, N]{Timestamp: ts, Key: key, Group: group, Namespace: ns}
	m := q.group(group, false)
	it, ok := m[t]
	if !ok {
		return false
	}
	q.remove(m, it)
	return true
}

// Peek returns the next timer to fire, if any.
func (q *TimerQueue[K, N]) Peek() (Timer[K, N], bool) {
	if len(q.heap) == 0 {
		return Timer[K, N]{}, false
	}
	return q.heap[0].t, true
}

// PopUntil fires, in order, every timer whose timestamp is at most wm: it
// removes the timer from the queue and then calls fn with it. fn may
// register and delete timers; those it registers at or before wm fire in
// the same call, in their order. (A fn that always registers a timer at or
// before wm never returns.)
func (q *TimerQueue[K, N]) PopUntil(wm int64, fn func(Timer[K, N])) {
	for len(q.heap) > 0 && q.heap[0].t.Timestamp <= wm {
		it := q.heap[0]
		t := it.t
		q.remove(q.group(t.Group, false), it)
		fn(t)
	}
}

// Len returns the number of queued timers.
func (q *TimerQueue[K, N]) Len() int { return len(q.heap) }

// Groups returns the key groups that have queued timers, in increasing
// order.
func (q *TimerQueue[K, N]) Groups() []int {
	var gs []int
	for g, m := range q.groups {
		if len(m) > 0 {
			gs = append(gs, g)
		}
	}
	slices.Sort(gs)
	return gs
}

// InGroup returns the queued timers of key group g in firing order: what a
// snapshot of the key group writes. Registering them in this order into an
// empty queue restores their order within the group.
func (q *TimerQueue[K, N]) InGroup(g int) []Timer[K, N] {
	m := q.group(g, false)
	items := make([]*timerItem[K, N], 0, len(m))
	for _, it := range m {
		items = append(items, it)
	}
	slices.SortFunc(items, func(a, b *timerItem[K, N]) int {
		if timerLess(a, b) {
			return -1
		}
		return 1
	})
	ts := make([]Timer[K, N], len(items))
	for i, it := range items {
		ts[i] = it.t
	}
	return ts
}

// remove takes it out of the heap and of m, its group's index, and keeps
// the item for reuse.
func (q *TimerQueue[K, N]) remove(m map[Timer[K, N]]*timerItem[K, N], it *timerItem[K, N]) {
	delete(m, it.t)
	i, last := it.pos, len(q.heap)-1
	if i != last {
		q.swap(i, last)
	}
	q.heap[last] = nil
	q.heap = q.heap[:last]
	if i != last {
		if !q.down(i) {
			q.up(i)
		}
	}
	*it = timerItem[K, N]{}
	q.free = append(q.free, it)
}

func timerLess[K, N comparable](a, b *timerItem[K, N]) bool {
	if a.t.Timestamp != b.t.Timestamp {
		return a.t.Timestamp < b.t.Timestamp
	}
	return a.seq < b.seq
}

func (q *TimerQueue[K, N]) swap(i, j int) {
	q.heap[i], q.heap[j] = q.heap[j], q.heap[i]
	q.heap[i].pos, q.heap[j].pos = i, j
}

func (q *TimerQueue[K, N]) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !timerLess(q.heap[i], q.heap[p]) {
			return
		}
		q.swap(i, p)
		i = p
	}
}

// down sifts the item at i down and reports whether it moved.
func (q *TimerQueue[K, N]) down(i int) bool {
	start, n := i, len(q.heap)
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		c := l
		if r := l + 1; r < n && timerLess(q.heap[r], q.heap[l]) {
			c = r
		}
		if !timerLess(q.heap[c], q.heap[i]) {
			break
		}
		q.swap(i, c)
		i = c
	}
	return i > start
}
