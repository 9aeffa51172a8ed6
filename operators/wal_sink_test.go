package operators_test

import (
	"errors"
	"maps"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/jonboulle/clockwork"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/operators"
)

// gatedPublish records what a write-ahead sink publishes, from any
// goroutine, and holds every publish until the gate opens.
type gatedPublish struct {
	mu      sync.Mutex
	out     []string
	ids     map[string]string
	entered chan struct{} // capacity 1: a publish started
	gate    chan struct{} // closed: publishes may finish
}

func newGatedPublish() *gatedPublish {
	return &gatedPublish{ids: map[string]string{}, entered: make(chan struct{}, 1), gate: make(chan struct{})}
}

func (g *gatedPublish) publish(vs []string, id func(int) string) error {
	select {
	case g.entered <- struct{}{}:
	default:
	}
	<-g.gate
	g.mu.Lock()
	defer g.mu.Unlock()
	for i, v := range vs {
		g.out = append(g.out, v)
		g.ids[v] = id(i)
	}
	return nil
}

func (g *gatedPublish) published() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.out)
}

// heldState is the state of a write-ahead sink whose checkpoints 1 and 2
// completed while it was killed before publishing them: it holds a and b
// (checkpoint 1) and c (checkpoint 2). It also returns the ids a sink
// restored from it without WithBackgroundPublish publishes.
func heldState(t *testing.T) ([]byte, map[string]string) {
	t.Helper()
	s := operators.NewWriteAheadSink[string](func([]string, func(int) string) error {
		t.Fatal("published before any completion")
		return nil
	}, nil)
	if err := s.Open(sinkContext(0)); err != nil {
		t.Fatal(err)
	}
	s.Collect("a")
	s.Collect("b")
	if _, err := s.SnapshotState(1); err != nil {
		t.Fatal(err)
	}
	s.Collect("c")
	st, err := s.SnapshotState(2)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]string{}
	sync := operators.NewWriteAheadSink(func(vs []string, id func(int) string) error {
		for i, v := range vs {
			ids[v] = id(i)
		}
		return nil
	}, nil)
	if err := sync.Open(sinkContext(0)); err != nil {
		t.Fatal(err)
	}
	if err := sync.RestoreState([][]byte{st}, 1); err != nil {
		t.Fatal(err)
	}
	if len(ids) != 3 {
		t.Fatalf("synchronous restore published %v", ids)
	}
	return st, ids
}

// With WithBackgroundPublish, the held results of the restored (completed)
// checkpoint are published right after the restore, before any new
// checkpoint, without holding up the restore; results collected after
// the restore are published only once a checkpoint covering them
// completes, after the held ones; and until the held ones are out every
// snapshot still holds them.
func TestWriteAheadSinkBackgroundRestore(t *testing.T) {
	st, wantIDs := heldState(t)
	g := newGatedPublish()
	r := operators.NewWriteAheadSink(g.publish, nil).WithBackgroundPublish()
	ctx := sinkContext(0)
	clock := ctx.Clock.(*clockwork.FakeClock)
	if err := r.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	restored := make(chan error, 1)
	go func() { restored <- r.RestoreState([][]byte{st}, 1) }()
	select {
	case err := <-restored:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		close(g.gate)
		t.Fatal("RestoreState waited for the held results to be published")
	}
	// The re-publish started without any new checkpoint.
	select {
	case <-g.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("held results not being published after the restore")
	}
	r.Collect("d") // computed after the restore: no completed checkpoint covers it
	mid, err := r.SnapshotState(3)
	if err != nil {
		t.Fatal(err)
	}
	close(g.gate)
	testutil.Eventually(t, 10*time.Second, "held results published", func() bool { return len(g.published()) >= 3 })
	if got := g.published(); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("published %v before checkpoint 3 completed, want the held a b c only", got)
	}
	if err := r.NotifyCheckpointComplete(3); err != nil {
		t.Fatal(err)
	}
	if err := r.WaitCommitted(3); err != nil {
		t.Fatal(err)
	}
	if got := g.published(); !slices.Equal(got, []string{"a", "b", "c", "d"}) {
		t.Fatalf("after checkpoint 3: %v", got)
	}
	g.mu.Lock()
	for v, id := range wantIDs {
		if g.ids[v] != id {
			t.Fatalf("%s re-published with id %s, a synchronous restore gives %s", v, g.ids[v], id)
		}
	}
	g.mu.Unlock()

	// Snapshot 3, taken while a b c were still going out, holds them
	// (and d); a snapshot after they went out holds them too, however
	// long after (d is the latest publish, and a b c went out within 2 s
	// before it: a broker killed may have lost them), until a publish
	// more than 2 s after them.
	if got := restoredFrom(t, mid); !slices.Equal(got, []string{"a", "b", "c", "d"}) {
		t.Fatalf("snapshot during the re-publish holds %v, want a b c d", got)
	}
	r.Collect("e")
	clock.Advance(10 * time.Second)
	after, err := r.SnapshotState(4)
	if err != nil {
		t.Fatal(err)
	}
	if got := restoredFrom(t, after); !slices.Equal(got, []string{"a", "b", "c", "d", "e"}) {
		t.Fatalf("snapshot 10 s after the re-publish holds %v, want a b c d (the latest publish and those within 2 s before it) and e", got)
	}
	if err := r.NotifyCheckpointComplete(4); err != nil {
		t.Fatal(err)
	}
	if err := r.WaitCommitted(4); err != nil {
		t.Fatal(err)
	}
	later, err := r.SnapshotState(5)
	if err != nil {
		t.Fatal(err)
	}
	if got := restoredFrom(t, later); !slices.Equal(got, []string{"e"}) {
		t.Fatalf("snapshot after e was published, 10 s after the rest, holds %v, want e", got)
	}
}

// publishingHeld returns heldState's state and a sink that publishes in
// the background, restored from it, once the first publish of what it
// holds (checkpoint 1's a and b) waits at g's gate.
func publishingHeld(t *testing.T) ([]byte, *operators.WriteAheadSink[string], *gatedPublish) {
	t.Helper()
	st, _ := heldState(t)
	g := newGatedPublish()
	r := operators.NewWriteAheadSink(g.publish, nil).WithBackgroundPublish()
	if err := r.Open(sinkContext(0)); err != nil {
		t.Fatal(err)
	}
	if err := r.RestoreState([][]byte{st}, 1); err != nil {
		t.Fatal(err)
	}
	<-g.entered
	return st, r, g
}

// Close stops the background publisher and waits for it, cutting short
// its wait before trying a failed publish again.
func TestWriteAheadSinkBackgroundPublishStops(t *testing.T) {
	st, r, g := publishingHeld(t)
	closed := make(chan error, 1)
	go func() { closed <- r.Close() }()
	close(g.gate)
	if err := <-closed; err != nil {
		t.Fatal(err)
	}

	ctx := sinkContext(0)
	clock := ctx.Clock.(*clockwork.FakeClock)
	f := operators.NewWriteAheadSink(func([]string, func(int) string) error { return errors.New("broker gone") }, nil).WithBackgroundPublish()
	if err := f.Open(ctx); err != nil {
		t.Fatal(err)
	}
	if err := f.RestoreState([][]byte{st}, 1); err != nil {
		t.Fatal(err)
	}
	// The publisher failed and waits on the clock to try again.
	if err := clock.BlockUntilContext(t.Context(), 1); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// A wait for the background publisher that runs on another goroutine
// than the subtask's (a handed-over subtask's bounded wait) ends when the
// sink is closed with results left unpublished: with ErrClosed, not
// spinning on the stopped publisher until the node stops.
func TestWriteAheadSinkWaitCommittedEndsWhenClosed(t *testing.T) {
	_, r, g := publishingHeld(t) // the first checkpoint's results; the second's wait
	waited := make(chan error, 1)
	go func() { waited <- r.WaitCommitted(2) }()
	closed := make(chan error, 1)
	go func() { closed <- r.Close() }()
	// Close has stopped the publisher before the first publish ends.
	testutil.Eventually(t, 0, "the publisher told to stop", func() bool {
		return operators.WriteAheadClosing(r)
	})
	close(g.gate)
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-waited:
		if !errors.Is(err, operators.ErrClosed) {
			t.Fatalf("wait after the close: %v, want ErrClosed", err)
		}
	case <-time.After(testutil.DefaultTimeout):
		t.Fatal("the wait did not end after the close")
	}
	if got := g.published(); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("published %v, want the first checkpoint's a b only", got)
	}
	// A second Close does nothing.
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
}

// A publish that hangs (a slow broker) holds up neither a completion nor
// the checkpoints after it: NotifyCheckpointComplete returns while the
// publish of its records waits, later checkpoints are taken and complete
// meanwhile, and their records go out after, in order.
func TestWriteAheadSinkSlowPublishHoldsNoBarrier(t *testing.T) {
	g := newGatedPublish()
	s := operators.NewWriteAheadSink(g.publish, nil).WithBackgroundPublish()
	if err := s.Open(sinkContext(0)); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	returned := make(chan error, 1)
	go func() {
		for id, v := range []string{"a", "b", "c"} {
			s.Collect(v)
			if _, err := s.SnapshotState(int64(id + 1)); err != nil {
				returned <- err
				return
			}
			if err := s.NotifyCheckpointComplete(int64(id + 1)); err != nil {
				returned <- err
				return
			}
		}
		returned <- nil
	}()
	<-g.entered // the publish of a waits
	select {
	case err := <-returned:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(testutil.DefaultTimeout):
		close(g.gate)
		t.Fatal("checkpoints 1 to 3 still wait for the publish of checkpoint 1")
	}
	if got := g.published(); len(got) != 0 {
		t.Fatalf("published %v while the broker hung", got)
	}
	close(g.gate)
	if err := s.WaitCommitted(3); err != nil {
		t.Fatal(err)
	}
	if got := g.published(); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("published %v, want a b c in order", got)
	}
}

// failingPublish fails every publish while down is set, records the
// published values otherwise, and counts the calls.
type failingPublish struct {
	mu    sync.Mutex
	down  bool
	calls int
	out   []string
	ids   map[string]string
}

func (f *failingPublish) publish(vs []string, id func(int) string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.down {
		return errors.New("connect: connection refused")
	}
	if f.ids == nil {
		f.ids = map[string]string{}
	}
	for i, v := range vs {
		f.out = append(f.out, v)
		f.ids[v] = id(i)
	}
	return nil
}

func (f *failingPublish) state() (calls int, out []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls, slices.Clone(f.out)
}

// With WithBackgroundPublish, a completed checkpoint whose publish fails
// neither fails the sink nor holds up its checkpoints: the completion
// returns at once, the records stay in every snapshot, the publish is
// tried again after 1 s, 2 s, 4 s … (the fake clock), and once the
// broker takes them they go out in order, each under its one id, and
// leave the snapshots. WaitCommitted tries a waiting publish at once and
// reports its failure.
func TestWriteAheadSinkBackgroundPublishRetries(t *testing.T) {
	ctx := sinkContext(0)
	clock := ctx.Clock.(*clockwork.FakeClock)
	f := &failingPublish{down: true}
	s := operators.NewWriteAheadSink(f.publish, nil).WithBackgroundPublish()
	if err := s.Open(ctx); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.Collect("a")
	s.Collect("b")
	if _, err := s.SnapshotState(1); err != nil {
		t.Fatal(err)
	}
	s.Collect("c")
	if err := s.NotifyCheckpointComplete(1); err != nil {
		t.Fatalf("completion with the broker down: %v", err)
	}
	// Tries after the first: 1 s, then 2 s.
	for i, wait := range []time.Duration{time.Second, 2 * time.Second} {
		if err := clock.BlockUntilContext(t.Context(), 1); err != nil {
			t.Fatal(err)
		}
		if calls, _ := f.state(); calls != i+1 {
			t.Fatalf("%d publish calls before wait %d, want %d", calls, i, i+1)
		}
		clock.Advance(wait - time.Millisecond)
		if calls, _ := f.state(); calls != i+1 {
			t.Fatalf("tried again before %s", wait)
		}
		clock.Advance(time.Millisecond)
	}
	if err := clock.BlockUntilContext(t.Context(), 1); err != nil {
		t.Fatal(err)
	}
	// The checkpoint after the failures holds the unpublished a b and c
	// (not yet complete); the sink keeps taking checkpoints.
	st, err := s.SnapshotState(2)
	if err != nil {
		t.Fatalf("checkpoint while publishing fails: %v", err)
	}
	if got := restoredFrom(t, st); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("snapshot while publishing fails holds %v, want a b c", got)
	}
	if err := s.NotifyCheckpointComplete(2); err != nil {
		t.Fatal(err)
	}
	// A wait for the commit tries at once and reports the failure.
	if err := s.WaitCommitted(2); err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("WaitCommitted with the broker down: %v", err)
	}
	f.mu.Lock()
	f.down = false
	f.mu.Unlock()
	clock.Advance(time.Minute)
	if err := s.WaitCommitted(2); err != nil {
		t.Fatal(err)
	}
	if _, out := f.state(); !slices.Equal(out, []string{"a", "b", "c"}) {
		t.Fatalf("published %v once the broker is back, want a b c in order", out)
	}
	clock.Advance(time.Minute)
	st, err = s.SnapshotState(3)
	if err != nil {
		t.Fatal(err)
	}
	if got := restoredFrom(t, st); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("snapshot a minute after the latest publish holds %v, want a b c, published in it", got)
	}
	_, ids := heldState(t) // a b c, restored by a sink publishing as it restores
	if !maps.Equal(f.ids, ids) {
		t.Fatalf("ids after retries %v, want those of a plain publish %v", f.ids, ids)
	}
}

// After a failed publish, the latest batch however old, and the batches
// published in the 2 s before it, go out again first, under the same ids
// (a broker restarted from its persistence file lost what it acknowledged
// after its last save); older ones do not.
func TestWriteAheadSinkRepublishesRecentAfterAFailure(t *testing.T) {
	out := publishesAroundAFailure(t, 6*time.Second, time.Second)
	if !slices.Equal(out, []string{"a", "b", "c", "b", "c", "d"}) {
		t.Fatalf("published %v, want a b c, then b and c again (the latest before the failure and the one 1 s before it) and d", out)
	}
}

// publishesAroundAFailure completes checkpoints 1 to 3 with a, b and c,
// each published at once, b's publish beforeB after a's and c's beforeC
// after b's; then, 10 s later, with the broker down, checkpoint 4 with
// d, and publishes it once the broker is back. It returns what was
// published, in order.
func publishesAroundAFailure(t *testing.T, beforeB, beforeC time.Duration) []string {
	t.Helper()
	s, f, clock := backgroundSink(t)
	for i, v := range []string{"a", "b", "c"} {
		clock.Advance([]time.Duration{0, beforeB, beforeC}[i])
		id := int64(i + 1)
		completeCheckpoint(t, s, id, v)
		if err := s.WaitCommitted(id); err != nil {
			t.Fatal(err)
		}
	}
	clock.Advance(10 * time.Second) // quiet; c, the latest, is kept however old
	f.mu.Lock()
	f.down = true
	f.mu.Unlock()
	completeCheckpoint(t, s, 4, "d")
	if err := clock.BlockUntilContext(t.Context(), 1); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	f.down = false
	f.mu.Unlock()
	clock.Advance(time.Second)
	if err := s.WaitCommitted(4); err != nil {
		t.Fatal(err)
	}
	_, out := f.state()
	return out
}

// A broker killed loses what it acknowledged since its last save, and
// the sink sees the lost connection only at its next publish, which may
// come long after (a quiet stretch: no window fired, no alert). So the
// batches published in the 2 s before the latest one go out again after
// the failure too, not only the latest: here b's, 500 ms before c, both
// acknowledged by a broker that saved neither (autosave_interval 1) and
// was killed just after c, and the next publish, d's, 10 s later. Before,
// only c went out again, and b was lost for the consumer.
func TestWriteAheadSinkRepublishesTheBatchesBeforeTheLatestAfterAQuietStretch(t *testing.T) {
	out := publishesAroundAFailure(t, 5*time.Second, 500*time.Millisecond)
	if !slices.Equal(out, []string{"a", "b", "c", "b", "c", "d"}) {
		t.Fatalf("published %v, want a b c, then b and c again (published within 2 s of the latest) and d", out)
	}
}

// A checkpoint of more results than one call of publish takes (65,536)
// is published in several calls. When the broker is killed after the
// first call was acknowledged and the second call fails, the first
// call's results are what the broker acknowledged last, and a broker
// killed before its next save has lost them: the batch goes out again
// from its start, not from the call that failed. Before, with no earlier
// batch (the sink's first publish of a run: the results a restore
// brought back), only the failed call's results went out again, and the
// first 65,536 were lost for the consumer.
func TestWriteAheadSinkRepublishesTheBatchesEarlierCallsAfterAFailure(t *testing.T) {
	ctx := sinkContext(0)
	clock := ctx.Clock.(*clockwork.FakeClock)
	var mu sync.Mutex
	calls := 0
	var out []string
	publish := func(vs []string, _ func(int) string) error {
		mu.Lock()
		defer mu.Unlock()
		calls++
		if calls == 2 {
			return errors.New("read: EOF")
		}
		out = append(out, vs...)
		return nil
	}
	s := operators.NewWriteAheadSink(publish, nil).WithBackgroundPublish()
	if err := s.Open(ctx); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const n = 70_000
	for i := range n {
		s.Collect(strconv.Itoa(i))
	}
	completeCheckpoint(t, s, 1)
	if err := clock.BlockUntilContext(t.Context(), 1); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Second)
	if err := s.WaitCommitted(1); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	count := map[string]int{}
	for _, v := range out {
		count[v]++
	}
	if len(count) != n {
		t.Fatalf("%d distinct results published, want %d", len(count), n)
	}
	if count["0"] != 2 || count[strconv.Itoa(n-1)] != 1 {
		t.Fatalf("result 0 published %d times, result %d %d times: want the whole batch again after the failed second call (0 twice, the last once)",
			count["0"], n-1, count[strconv.Itoa(n-1)])
	}
}

// restoredFrom returns the records a write-ahead sink restored from state
// publishes.
func restoredFrom(t *testing.T, state []byte) []string {
	t.Helper()
	var got []string
	s := operators.NewWriteAheadSink(func(vs []string, _ func(int) string) error {
		got = append(got, vs...)
		return nil
	}, nil)
	if err := s.Open(sinkContext(0)); err != nil {
		t.Fatal(err)
	}
	if err := s.RestoreState([][]byte{state}, 1); err != nil {
		t.Fatal(err)
	}
	return got
}

// WithMaxHeld: once the publisher holds max records of completed
// checkpoints, Collect waits (back-pressure) until a publish makes room;
// records of checkpoints not yet complete do not count. A stopping
// subtask (Context.Done) ends the wait.
func TestWriteAheadSinkMaxHeld(t *testing.T) {
	ctx := sinkContext(0)
	clock := ctx.Clock.(*clockwork.FakeClock)
	done := make(chan struct{})
	ctx.Done = done
	f := &failingPublish{down: true}
	s := operators.NewWriteAheadSink(f.publish, nil).WithBackgroundPublish().WithMaxHeld(3)
	if err := s.Open(ctx); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, v := range []string{"a", "b", "c", "d"} {
		s.Collect(v) // none complete yet: no wait
	}
	completeCheckpoint(t, s, 1)
	// The publish failed: the publisher waits to try again, holding 4.
	if err := clock.BlockUntilContext(t.Context(), 1); err != nil {
		t.Fatal(err)
	}
	collected := make(chan struct{})
	go func() {
		defer close(collected)
		s.Collect("e")
	}()
	// Collect waits: its ticker and the publisher's retry timer.
	if err := clock.BlockUntilContext(t.Context(), 2); err != nil {
		t.Fatal(err)
	}
	select {
	case <-collected:
		t.Fatal("Collect took a record while 4 waited for the broker, at most 3")
	default:
	}
	f.mu.Lock()
	f.down = false
	f.mu.Unlock()
	clock.Advance(time.Second) // the retry, which succeeds
	select {
	case <-collected:
	case <-time.After(testutil.DefaultTimeout):
		t.Fatal("Collect still waits after the publisher made room")
	}
	if _, out := f.state(); !slices.Equal(out, []string{"a", "b", "c", "d"}) {
		t.Fatalf("published %v", out)
	}

	// The broker down again, the bound reached again: a stop ends the wait.
	f.mu.Lock()
	f.down = true
	f.mu.Unlock()
	for _, v := range []string{"f", "g"} {
		s.Collect(v)
	}
	completeCheckpoint(t, s, 2)
	if err := clock.BlockUntilContext(t.Context(), 1); err != nil {
		t.Fatal(err)
	}
	collected = make(chan struct{})
	go func() {
		defer close(collected)
		s.Collect("h")
	}()
	if err := clock.BlockUntilContext(t.Context(), 2); err != nil {
		t.Fatal(err)
	}
	close(done)
	select {
	case <-collected:
	case <-time.After(testutil.DefaultTimeout):
		t.Fatal("Collect still waits after the subtask stopped")
	}
}

// walRow is a large record, like a pipeline's Row (256 bytes).
type walRow struct {
	A [31]uint64
	N int64
}

// A checkpoint holding many large records (every key's window firing at
// once after a restart) is held without being copied to grow one slice:
// what Collect allocates stays close to the records' own size, where
// append's growth allocates several times it (and copies as much). The
// checkpoint's records are still published in one call (one wait for the
// broker's acknowledgements), and keep their order in the publish and
// through a snapshot and a restore.
func TestWriteAheadSinkHoldsALargeFiringWithoutRegrowing(t *testing.T) {
	const n = 100_000
	var published []int64
	calls := 0
	s := operators.NewWriteAheadSink(func(vs []walRow, id func(int) string) error {
		calls++
		if id(0) == "" {
			t.Error("empty id")
		}
		for _, v := range vs {
			published = append(published, v.N)
		}
		return nil
	}, nil)
	if err := s.Open(sinkContext(0)); err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := range n {
		s.Collect(walRow{N: int64(i)})
	}
	runtime.ReadMemStats(&after)
	size := uint64(n) * uint64(unsafe.Sizeof(walRow{}))
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > size*11/10 {
		t.Fatalf("collecting %d records of %d bytes allocated %d bytes, %.2f× their size; want at most 1.1×",
			n, unsafe.Sizeof(walRow{}), alloc, float64(alloc)/float64(size))
	}
	st, err := s.SnapshotState(1)
	if err != nil {
		t.Fatal(err)
	}
	inOrder := func(what string) {
		t.Helper()
		if len(published) != n {
			t.Fatalf("%s: published %d records, want %d", what, len(published), n)
		}
		for i, v := range published {
			if v != int64(i) {
				t.Fatalf("%s: record %d is %d", what, i, v)
			}
		}
	}
	if err := s.NotifyCheckpointComplete(1); err != nil {
		t.Fatal(err)
	}
	inOrder("checkpoint 1 completed")
	if calls != 1 {
		t.Fatalf("checkpoint 1's records published in %d calls, want 1 (one wait for the acknowledgements)", calls)
	}
	published = nil
	r := operators.NewWriteAheadSink(func(vs []walRow, _ func(int) string) error {
		for _, v := range vs {
			published = append(published, v.N)
		}
		return nil
	}, nil)
	if err := r.Open(sinkContext(0)); err != nil {
		t.Fatal(err)
	}
	if err := r.RestoreState([][]byte{st}, 1); err != nil {
		t.Fatal(err)
	}
	inOrder("restored")
}

// With WithPublishChunks a completed checkpoint holding a large firing is
// published in one call, in order, with the ids ID gives, from the chunks
// the sink holds: never joined into one slice (a copy of the whole firing
// before its first record could go out). The Publish given to the
// constructor is not called, and a restore still re-publishes them.
func TestWriteAheadSinkPublishesAFiringInItsChunks(t *testing.T) {
	const n = 100_000
	published := make([]int64, 0, n)
	calls, chunkCount := 0, 0
	s := operators.NewWriteAheadSink(func([]walRow, func(int) string) error {
		t.Error("the joined publish was called")
		return nil
	}, nil)
	s.WithPublishChunks(func(chunks [][]walRow, id func(c, i int) string) error {
		calls++
		chunkCount = len(chunks)
		for c, vs := range chunks {
			for _, v := range vs {
				published = append(published, v.N)
			}
			if len(vs) > 0 {
				if got, want := id(c, len(vs)-1), s.ID(vs[len(vs)-1]); got != want {
					t.Fatalf("id(%d, %d) = %s, want ID's %s", c, len(vs)-1, got, want)
				}
			}
		}
		return nil
	})
	if err := s.Open(sinkContext(0)); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		s.Collect(walRow{N: int64(i)})
	}
	st, err := s.SnapshotState(1)
	if err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	if err := s.NotifyCheckpointComplete(1); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	size := uint64(n) * uint64(unsafe.Sizeof(walRow{}))
	if calls != 1 || chunkCount < 2 {
		t.Fatalf("published in %d calls of %d chunks, want 1 call of the held chunks", calls, chunkCount)
	}
	if len(published) != n {
		t.Fatalf("published %d records, want %d", len(published), n)
	}
	for i, v := range published {
		if v != int64(i) {
			t.Fatalf("record %d is %d", i, v)
		}
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > size/4 {
		t.Fatalf("publishing %d records of %d bytes allocated %d bytes (%.2f× their size): they were copied",
			n, unsafe.Sizeof(walRow{}), alloc, float64(alloc)/float64(size))
	}
	var restored int
	r := operators.NewWriteAheadSink(func(vs []walRow, _ func(int) string) error {
		restored += len(vs)
		return nil
	}, nil).WithPublishChunks(func(chunks [][]walRow, _ func(c, i int) string) error {
		for _, c := range chunks {
			restored += len(c)
		}
		return nil
	})
	if err := r.Open(sinkContext(0)); err != nil {
		t.Fatal(err)
	}
	if err := r.RestoreState([][]byte{st}, 1); err != nil {
		t.Fatal(err)
	}
	if restored != n {
		t.Fatalf("restored and re-published %d records, want %d", restored, n)
	}
}

// A sink restored from a snapshot every sink committed before the job
// stopped (Context.RestoredCommitted, a stop-with-savepoint's) publishes
// none of the records it holds, with or without WithBackgroundPublish;
// what it collects afterwards it publishes as always.
func TestWriteAheadSinkRestoredCommittedPublishesNothingAgain(t *testing.T) {
	st, _ := heldState(t)
	for _, background := range []bool{false, true} {
		var got []string
		s := operators.NewWriteAheadSink(func(vs []string, _ func(int) string) error {
			got = append(got, vs...)
			return nil
		}, nil)
		if background {
			s = s.WithBackgroundPublish()
		}
		ctx := sinkContext(0)
		ctx.RestoredCommitted = true
		if err := s.Open(ctx); err != nil {
			t.Fatal(err)
		}
		if err := s.RestoreState([][]byte{st}, 1); err != nil {
			t.Fatal(err)
		}
		s.Collect("d")
		if _, err := s.SnapshotState(3); err != nil {
			t.Fatal(err)
		}
		if err := s.NotifyCheckpointComplete(3); err != nil {
			t.Fatal(err)
		}
		if err := s.WaitCommitted(3); err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, []string{"d"}) {
			t.Fatalf("background %v: published %v, want only [d], collected after the restore", background, got)
		}
	}
}

// A power loss of a device that runs edged and the sink's broker kills
// both: the broker comes back from its last save, without what it
// acknowledged after it, and edged from its latest checkpoint, which
// holds only what was not yet published when it was taken. So a
// snapshot holds the batches published in the 2 s before it too, and a
// restore from it publishes them again, under the same ids: here b (in
// the window) and c (not yet published), not a (published 2.5 s before
// b). Before, the snapshot held c only, and b was lost for the consumer.
func TestWriteAheadSinkSnapshotHoldsWhatItPublishedLately(t *testing.T) {
	s, f, clock := backgroundSink(t)
	for i, v := range []string{"a", "b"} {
		id := int64(i + 1)
		completeCheckpoint(t, s, id, v)
		if err := s.WaitCommitted(id); err != nil {
			t.Fatal(err)
		}
		clock.Advance([]time.Duration{2500 * time.Millisecond, 1500 * time.Millisecond}[i])
	}
	s.Collect("c")
	st, err := s.SnapshotState(3)
	if err != nil {
		t.Fatal(err)
	}
	// edged and the broker die here; edged comes back from snapshot 3.
	g := restoreAndCommit(t, st, 3)
	if _, out := g.state(); !slices.Equal(out, []string{"b", "c"}) {
		t.Fatalf("restore published %v, want b (published 1.5 s before the snapshot) and c", out)
	}
	if g.ids["b"] != f.ids["b"] {
		t.Fatalf("b published again with id %s, first with %s", g.ids["b"], f.ids["b"])
	}
}

// restoreAndCommit restores a background-publishing write-ahead sink
// from st, as edged does after a kill, and waits until checkpoint id (the
// snapshot's) is committed: what it published is in the returned
// failingPublish.
func restoreAndCommit(t *testing.T, st []byte, id int64) *failingPublish {
	t.Helper()
	g := &failingPublish{}
	r := operators.NewWriteAheadSink(g.publish, nil).WithBackgroundPublish()
	if err := r.Open(sinkContext(0)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	if err := r.RestoreState([][]byte{st}, 1); err != nil {
		t.Fatal(err)
	}
	if err := r.WaitCommitted(id); err != nil {
		t.Fatal(err)
	}
	return g
}

// backgroundSink returns an open write-ahead sink publishing in the
// background with a failingPublish, on a fake clock; it is closed when
// the test ends.
func backgroundSink(t *testing.T) (*operators.WriteAheadSink[string], *failingPublish, *clockwork.FakeClock) {
	t.Helper()
	ctx := sinkContext(0)
	f := &failingPublish{}
	s := operators.NewWriteAheadSink(f.publish, nil).WithBackgroundPublish()
	if err := s.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, f, ctx.Clock.(*clockwork.FakeClock)
}

// completeCheckpoint collects vs into s, snapshots them as checkpoint id
// and completes it.
func completeCheckpoint(t *testing.T, s *operators.WriteAheadSink[string], id int64, vs ...string) {
	t.Helper()
	for _, v := range vs {
		s.Collect(v)
	}
	if _, err := s.SnapshotState(id); err != nil {
		t.Fatal(err)
	}
	if err := s.NotifyCheckpointComplete(id); err != nil {
		t.Fatal(err)
	}
}

// The sink's broker is killed a moment after the sink published a and b
// (acknowledged, not yet saved: the broker comes back without them), and
// no result follows for a while: the sink does not see the lost
// connection, which it would at its next publish. Checkpoints go on
// meanwhile, and edged is killed before that publish. The restored
// checkpoint, taken 10 s after b, must hold b (the latest publish) and a
// (published 500 ms before it), so that the restore publishes them
// again, under the same ids. Before, a snapshot held what was published
// in the 2 s before it, here nothing, and a and b were lost for the
// consumer.
func TestWriteAheadSinkSnapshotHoldsTheLatestPublishAfterAQuietStretch(t *testing.T) {
	s, f, clock := backgroundSink(t)
	for i, v := range []string{"a", "b"} {
		id := int64(i + 1)
		if i > 0 {
			clock.Advance(500 * time.Millisecond)
		}
		completeCheckpoint(t, s, id, v)
		if err := s.WaitCommitted(id); err != nil {
			t.Fatal(err)
		}
	}
	clock.Advance(10 * time.Second) // quiet: no result, checkpoints go on
	s.Collect("c")
	st, err := s.SnapshotState(3)
	if err != nil {
		t.Fatal(err)
	}
	// edged is killed here and comes back from snapshot 3.
	g := restoreAndCommit(t, st, 3)
	if _, out := g.state(); !slices.Equal(out, []string{"a", "b", "c"}) {
		t.Fatalf("restore published %v, want a and b (the latest publish, 10 s before the snapshot, and the one 500 ms before it) and c", out)
	}
	for _, v := range []string{"a", "b"} {
		if g.ids[v] != f.ids[v] {
			t.Fatalf("%s published again with id %s, first with %s", v, g.ids[v], f.ids[v])
		}
	}
}

// fakeWatch is a connection the test loses (operators.ConnectionWatch).
type fakeWatch struct {
	mu    sync.Mutex
	lost  chan struct{} // nil: no connection
	drops int
}

func (f *fakeWatch) Lost() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lost
}

func (f *fakeWatch) Drop() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lost = nil
	f.drops++
}

// The sink's broker is killed a moment after the sink published a and b
// (acknowledged, not yet saved: the broker comes back without them), and
// no result follows for a while. The lost connection is seen at once
// (ConnectionWatch), not at the next publish: a and b go out again,
// under the same ids, without any new checkpoint, and a stop in the
// quiet stretch (the job's last checkpoint, whose WaitCommitted makes it
// committed) comes after them. Before, the sink noticed the loss only at
// its next publish: a job stopped in the quiet stretch committed its
// savepoint as published, a job resumed from it published nothing again,
// and a and b were lost for the consumer.
func TestWriteAheadSinkPublishesAgainWhenTheConnectionIsLostWhileIdle(t *testing.T) {
	ctx := sinkContext(0)
	clock := ctx.Clock.(*clockwork.FakeClock)
	f := &failingPublish{}
	w := &fakeWatch{lost: make(chan struct{})}
	s := operators.NewWriteAheadSink(f.publish, nil).WithBackgroundPublish().WithConnectionWatch(w)
	if err := s.Open(ctx); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i, v := range []string{"a", "b"} {
		id := int64(i + 1)
		if i > 0 {
			clock.Advance(500 * time.Millisecond)
		}
		completeCheckpoint(t, s, id, v)
		if err := s.WaitCommitted(id); err != nil {
			t.Fatal(err)
		}
	}
	first := map[string]string{}
	f.mu.Lock()
	maps.Copy(first, f.ids)
	f.mu.Unlock()
	clock.Advance(10 * time.Second) // quiet
	w.mu.Lock()
	close(w.lost)
	w.mu.Unlock()
	testutil.Eventually(t, 10*time.Second, "a and b published again", func() bool {
		_, out := f.state()
		return len(out) >= 4
	})
	if _, out := f.state(); !slices.Equal(out, []string{"a", "b", "a", "b"}) {
		t.Fatalf("published %v, want a b, then a b again once the connection was lost", out)
	}
	f.mu.Lock()
	for v, id := range first {
		if f.ids[v] != id {
			t.Errorf("%s published again with id %s, first with %s", v, f.ids[v], id)
		}
	}
	f.mu.Unlock()
	w.mu.Lock()
	drops := w.drops
	w.mu.Unlock()
	if drops != 1 {
		t.Fatalf("lost connection dropped %d times, want once", drops)
	}
	// The stop's checkpoint: committed once what it holds is out.
	completeCheckpoint(t, s, 3, "c")
	if err := s.WaitCommitted(3); err != nil {
		t.Fatal(err)
	}
	if _, out := f.state(); !slices.Equal(out, []string{"a", "b", "a", "b", "c"}) {
		t.Fatalf("published %v by the stop, want a b a b c", out)
	}
}

// Held counts what the background publisher holds for the broker, for
// the node's metrics: the records of completed checkpoints it has not
// published, not those of a checkpoint not yet complete; a publish that
// goes through takes them off, and a failure puts the latest publish
// back (it goes out again first), which counts again. Held is read from
// another goroutine than the subtask's (a scrape of /metrics).
func TestWriteAheadSinkHeld(t *testing.T) {
	ctx := sinkContext(0)
	clock := ctx.Clock.(*clockwork.FakeClock)
	f := &failingPublish{down: true}
	s := operators.NewWriteAheadSink(f.publish, nil).WithBackgroundPublish()
	if err := s.Open(ctx); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	held := func() int64 {
		n := make(chan int64)
		go func() { n <- s.Held() }()
		return <-n
	}
	if n := held(); n != 0 {
		t.Fatalf("Held() = %d before any record, want 0", n)
	}
	completeCheckpoint(t, s, 1, "a", "b", "c")
	// The publish failed: the publisher waits to try again.
	if err := clock.BlockUntilContext(t.Context(), 1); err != nil {
		t.Fatal(err)
	}
	if n := held(); n != 3 {
		t.Fatalf("Held() = %d with a completed checkpoint of 3 waiting for the broker, want 3", n)
	}
	s.Collect("d")
	if _, err := s.SnapshotState(2); err != nil {
		t.Fatal(err)
	}
	if n := held(); n != 3 {
		t.Fatalf("Held() = %d with checkpoint 2 (1 record) not yet complete, want 3", n)
	}
	f.mu.Lock()
	f.down = false
	f.mu.Unlock()
	clock.Advance(time.Second) // the retry, which succeeds
	testutil.Eventually(t, 0, "the held records published", func() bool { return held() == 0 })

	f.mu.Lock()
	f.down = true
	f.mu.Unlock()
	if err := s.NotifyCheckpointComplete(2); err != nil {
		t.Fatal(err)
	}
	// Checkpoint 2's record fails, and the latest publish (checkpoint 1's
	// 3, just before) goes out again first: 4 wait.
	testutil.Eventually(t, 0, "the failed publish's records counted", func() bool { return held() == 4 })
}
