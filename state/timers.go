package state

import (
	"slices"

	"github.com/edgedio/edged/keygroup"
)

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
// Timers are kept in a bucket per timestamp, in registration order, and
// the timestamps with a bucket in a heap: operators register their timers
// in runs of one timestamp (window ends, one per key), so registering and
// firing a timer cost a few operations whatever the number of keys,
// instead of a heap operation over all queued timers.
//
// It is a pure data structure: no clock, no goroutine. The operator feeds it
// the watermark (or the processing time) through PopUntil. Not safe for
// concurrent use.
type TimerQueue[K, N comparable] struct {
	// groups holds the queued timers of each key group.
	groups map[int]map[Timer[K, N]]*timerItem[K, N]
	// buckets holds the queued timers of each timestamp.
	buckets map[int64]*timerBucket[K, N]
	// times is a min-heap of the timestamps of buckets; an entry whose
	// bucket is gone (all its timers deleted) is skipped when it comes
	// to the top.
	times []int64
	// cur is the bucket last used (registration and firing come in runs
	// of one timestamp): it spares a map look-up.
	cur *timerBucket[K, N]
	// n is the number of queued timers.
	n int
	// free and freeBuckets keep fired and deleted items, and emptied
	// buckets, for reuse.
	free        []*timerItem[K, N]
	freeBuckets []*timerBucket[K, N]
	seq         uint64
}

// timerItem is a queued timer and its registration sequence number, which
// orders timers of equal timestamp. A deleted item stays in its bucket
// until firing reaches it.
type timerItem[K, N comparable] struct {
	t       Timer[K, N]
	seq     uint64
	deleted bool
}

// timerBucket holds the timers of one timestamp in registration order:
// items[head:], of which live are not deleted.
type timerBucket[K, N comparable] struct {
	ts    int64
	items []*timerItem[K, N]
	head  int
	live  int
}

// NewTimerQueue returns an empty timer queue.
func NewTimerQueue[K, N comparable]() *TimerQueue[K, N] {
	return &TimerQueue[K, N]{
		groups:  make(map[int]map[Timer[K, N]]*timerItem[K, N]),
		buckets: make(map[int64]*timerBucket[K, N]),
	}
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
	q.insert(m, it, t)
	return true
}

// insert queues it as timer t; m is t's key group's index.
func (q *TimerQueue[K, N]) insert(m map[Timer[K, N]]*timerItem[K, N], it *timerItem[K, N], t Timer[K, N]) {
	it.t, it.seq, it.deleted = t, q.seq, false
	q.seq++
	m[t] = it
	b := q.bucket(t.Timestamp)
	b.items = append(b.items, it)
	b.live++
	q.n++
}

// bucket returns the bucket of ts, making it if there is none.
func (q *TimerQueue[K, N]) bucket(ts int64) *timerBucket[K, N] {
	if b := q.cur; b != nil && b.ts == ts {
		return b
	}
	b := q.buckets[ts]
	if b == nil {
		if n := len(q.freeBuckets); n > 0 {
			b, q.freeBuckets = q.freeBuckets[n-1], q.freeBuckets[:n-1]
		} else {
			b = new(timerBucket[K, N])
		}
		b.ts = ts
		q.buckets[ts] = b
		q.pushTime(ts)
	}
	q.cur = b
	return b
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
	used := 0
	for _, t := range ts {
		m := q.groups[t.Group]
		if _, ok := m[t]; ok {
			continue
		}
		q.insert(m, &items[used], t)
		used++
	}
}

// removeGroups removes the queued timers of the key groups in r, and
// returns how many it removed.
func (q *TimerQueue[K, N]) removeGroups(r keygroup.Range) int {
	removed := 0
	for g, m := range q.groups {
		if !r.Contains(g) {
			continue
		}
		for _, it := range m {
			it.deleted = true
			q.n--
			removed++
			b := q.bucket(it.t.Timestamp)
			if b.live--; b.live == 0 {
				q.dropBucket(b)
			}
		}
		delete(q.groups, g)
	}
	q.compactTimes()
	return removed
}

// Contains reports whether the timer at ts for key, group and ns is
// queued.
func (q *TimerQueue[K, N]) Contains(ts int64, key K, group int, ns N) bool {
	_, ok := q.group(group, false)[Timer[K, N]{Timestamp: ts, Key: key, Group: group, Namespace: ns}]
	return ok
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
	delete(m, t)
	it.deleted = true
	q.n--
	b := q.bucket(ts)
	if b.live--; b.live == 0 {
		q.dropBucket(b)
		q.compactTimes()
	}
	return true
}

// compactTimes rebuilds the heap of timestamps from the buckets when the
// entries of dropped buckets outnumber the live ones: a timer moved on and
// on (deleted, registered a little later) would otherwise leave an entry
// per move until the watermark reached it. Not called from PopUntil,
// which pops the entry of the bucket it dropped itself.
func (q *TimerQueue[K, N]) compactTimes() {
	if len(q.times) <= 2*len(q.buckets)+64 {
		return
	}
	q.times = q.times[:0]
	for ts := range q.buckets {
		q.times = append(q.times, ts)
	}
	slices.Sort(q.times) // a sorted slice is a min-heap
}

// dropBucket removes b, which holds no live timer any more, and keeps its
// items (all deleted) and itself for reuse. Its entry in times stays until
// it comes to the top.
func (q *TimerQueue[K, N]) dropBucket(b *timerBucket[K, N]) {
	delete(q.buckets, b.ts)
	for _, it := range b.items[b.head:] {
		q.freeItem(it)
	}
	clear(b.items)
	b.items, b.head, b.live = b.items[:0], 0, 0
	if q.cur == b {
		q.cur = nil
	}
	q.freeBuckets = append(q.freeBuckets, b)
}

func (q *TimerQueue[K, N]) freeItem(it *timerItem[K, N]) {
	*it = timerItem[K, N]{}
	q.free = append(q.free, it)
}

// top returns the bucket of the earliest timestamp, dropping the entries
// of times whose bucket is gone, or nil when no timer is queued.
func (q *TimerQueue[K, N]) top() *timerBucket[K, N] {
	for len(q.times) > 0 {
		ts := q.times[0]
		b := q.cur
		if b == nil || b.ts != ts {
			b = q.buckets[ts]
		}
		if b != nil {
			q.cur = b
			return b
		}
		q.popTime()
	}
	return nil
}

// first returns the first live item of b (which has one), releasing the
// deleted items before it.
func (q *TimerQueue[K, N]) first(b *timerBucket[K, N]) *timerItem[K, N] {
	for {
		it := b.items[b.head]
		if !it.deleted {
			return it
		}
		b.items[b.head] = nil
		b.head++
		q.freeItem(it)
	}
}

// Peek returns the next timer to fire, if any.
func (q *TimerQueue[K, N]) Peek() (Timer[K, N], bool) {
	b := q.top()
	if b == nil {
		return Timer[K, N]{}, false
	}
	return q.first(b).t, true
}

// PopUntil fires, in order, every timer whose timestamp is at most wm: it
// removes the timer from the queue and then calls fn with it. fn may
// register and delete timers; those it registers at or before wm fire in
// the same call, in their order. (A fn that always registers a timer at or
// before wm never returns.)
func (q *TimerQueue[K, N]) PopUntil(wm int64, fn func(Timer[K, N])) {
	for {
		b := q.top()
		if b == nil || b.ts > wm {
			return
		}
		it := q.first(b)
		b.items[b.head] = nil
		b.head++
		t := it.t
		delete(q.groups[t.Group], t)
		q.freeItem(it)
		q.n--
		if b.live--; b.live == 0 {
			q.dropBucket(b)
			q.popTime()
		}
		fn(t)
	}
}

// pushTime adds ts to the heap of timestamps.
func (q *TimerQueue[K, N]) pushTime(ts int64) {
	q.times = append(q.times, ts)
	for i := len(q.times) - 1; i > 0; {
		p := (i - 1) / 2
		if q.times[p] <= q.times[i] {
			break
		}
		q.times[i], q.times[p] = q.times[p], q.times[i]
		i = p
	}
}

// popTime removes the earliest timestamp from the heap.
func (q *TimerQueue[K, N]) popTime() {
	last := len(q.times) - 1
	q.times[0] = q.times[last]
	q.times = q.times[:last]
	for i := 0; ; {
		l := 2*i + 1
		if l >= last {
			return
		}
		c := l
		if r := l + 1; r < last && q.times[r] < q.times[l] {
			c = r
		}
		if q.times[i] <= q.times[c] {
			return
		}
		q.times[i], q.times[c] = q.times[c], q.times[i]
		i = c
	}
}

// Len returns the number of queued timers.
func (q *TimerQueue[K, N]) Len() int { return q.n }

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

func timerLess[K, N comparable](a, b *timerItem[K, N]) bool {
	if a.t.Timestamp != b.t.Timestamp {
		return a.t.Timestamp < b.t.Timestamp
	}
	return a.seq < b.seq
}
