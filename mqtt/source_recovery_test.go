package mqtt

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/stream"
)

// topicTotal is a rolling count and sum of offsets per topic.
type topicTotal struct {
	Topic      string
	Count, Sum int64
}

type topicTotals struct{}

func (topicTotals) CreateAccumulator() topicTotal { return topicTotal{} }
func (topicTotals) Add(m Message, a topicTotal) topicTotal {
	return topicTotal{Topic: m.Topic, Count: a.Count + 1, Sum: a.Sum + int64(m.Offset)}
}
func (topicTotals) Result(a topicTotal) topicTotal { return a }

// upserts keeps the latest total per topic, as an idempotent sink does.
type upserts struct {
	mu   sync.Mutex
	last map[string]topicTotal
}

func (u *upserts) put(v topicTotal) error {
	u.mu.Lock()
	u.last[v.Topic] = v
	u.mu.Unlock()
	return nil
}

func (u *upserts) records() int64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	var n int64
	for _, v := range u.last {
		n += v.Count
	}
	return n
}

// check compares the totals with those of records 0..n-1 as appendSeq
// wrote them (topic sensors/<i%5>, offset i).
func (u *upserts) check(t *testing.T, n int) {
	t.Helper()
	want := map[string]topicTotal{}
	for i := range n {
		k := fmt.Sprintf("sensors/%d", i%5)
		w := want[k]
		want[k] = topicTotal{Topic: k, Count: w.Count + 1, Sum: w.Sum + int64(i)}
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if fmt.Sprint(u.last) != fmt.Sprint(want) {
		t.Fatalf("totals %v, want %v", u.last, want)
	}
}

// askedStore counts the times the source asked the store what it retains,
// once per completed checkpoint it was told of.
type askedStore struct {
	*snapshot.Store
	mu    sync.Mutex
	asked int
}

func (a *askedStore) Progress() (snapshot.Progress, error) {
	a.mu.Lock()
	a.asked++
	a.mu.Unlock()
	return a.Store.Progress()
}

func (a *askedStore) times() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.asked
}

// An MQTT source pipeline whose newest checkpoint is damaged falls back to
// the retained one before it: the ingest log still holds the records that
// checkpoint needs, and the totals are exact.
func TestSourcePipelineFallsBackToOlderCheckpoint(t *testing.T) {
	testutil.Burn(t, 1)
	l := smallLog(t)
	dir := t.TempDir()
	cfg := snapshot.DefaultConfig()
	cfg.Dir, cfg.Interval = dir, time.Hour // triggered by the fake clock
	st, err := snapshot.OpenStore(dir, "mqtt-fallback", 128, nil)
	if err != nil {
		t.Fatal(err)
	}
	store := &askedStore{Store: st}
	newJob := func(clock clockwork.Clock, sink *upserts, opts ...stream.Option) *stream.Environment {
		env := stream.NewEnvironment("mqtt-fallback", append([]stream.Option{
			stream.WithCheckpointing(cfg), stream.WithClock(clock), stream.WithParallelism(2)}, opts...)...)
		msgs := stream.FromSource(env, "mqtt", func() operators.Source[Message] {
			return NewSource(l, WithCheckpointStore(store))
		}).UID("mqtt").SetParallelism(1)
		totals := stream.Aggregate(stream.KeyBy(msgs, func(m Message) string { return m.Topic }), "totals", topicTotals{}).UID("totals")
		totals.ForEach("upsert", sink.put)
		return env
	}
	completed := func(job *stream.Job) int {
		n := 0
		for _, s := range job.History() {
			if s.Status == snapshot.Completed {
				n++
			}
		}
		return n
	}
	// checkpoint triggers one periodic checkpoint and waits for it.
	checkpoint := func(job *stream.Job, fc *clockwork.FakeClock) {
		t.Helper()
		before := completed(job)
		ctx, cancel := context.WithTimeout(context.Background(), waitBound)
		defer cancel()
		if err := fc.BlockUntilContext(ctx, 1); err != nil {
			t.Fatal(err)
		}
		fc.Advance(time.Hour)
		testutil.Eventually(t, waitBound, "checkpoint completes", func() bool { return completed(job) > before })
	}

	// Attempt 1 reads 300 records, checkpoints (A), reads 300 more,
	// checkpoints (B), and crashes.
	fc := clockwork.NewFakeClock()
	sink := &upserts{last: map[string]topicTotal{}}
	ctx, cancel := context.WithCancel(context.Background())
	job, err := newJob(fc, sink).ExecuteAsync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	appendSeq(t, l, 0, 300)
	testutil.Eventually(t, waitBound, "300 records counted", func() bool { return sink.records() == 300 })
	checkpoint(job, fc)
	appendSeq(t, l, 300, 300)
	testutil.Eventually(t, waitBound, "600 records counted", func() bool { return sink.records() == 600 })
	checkpoint(job, fc)
	// B's completion reached the source, which kept what A needs.
	testutil.Eventually(t, waitBound, "the source told of B", func() bool { return store.times() >= 2 })
	if r := l.Stats().ReleasedOffset; r != 300 {
		t.Fatalf("released %d after B completed, want 300 (A's offset)", r)
	}
	cancel()
	job.Wait()

	// B is damaged: recovery takes A, whose offset must still be in the log.
	p, err := store.Progress()
	if err != nil || len(p.Completed) != 2 {
		t.Fatalf("progress %+v, %v: want two retained checkpoints", p, err)
	}
	a, b := p.Completed[0], p.Completed[1]
	files, err := filepath.Glob(filepath.Join(store.CheckpointDir(b), "totals.*.state"))
	if err != nil || len(files) == 0 {
		t.Fatalf("state files of checkpoint %d: %v %v", b, files, err)
	}
	if err := os.WriteFile(files[0], []byte("damaged"), 0o644); err != nil {
		t.Fatal(err)
	}
	if first := l.Stats().FirstOffset; first > 300 || first == 0 {
		t.Fatalf("log first offset %d: want records from 300 kept and some before deleted", first)
	}
	md, err := store.RecoveryPoint(false)
	if err != nil || md.Checkpoint != a {
		t.Fatalf("recovery point %v, %v: want checkpoint %d", md, err, a)
	}

	// Attempt 2 restores A: it replays from 300, then reads 300 more.
	fc2 := clockwork.NewFakeClock()
	sink2 := &upserts{last: map[string]topicTotal{}}
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	job2, err := newJob(fc2, sink2, stream.WithSavepoint(md.Dir, false)).ExecuteAsync(ctx2)
	if err != nil {
		t.Fatal(err)
	}
	appendSeq(t, l, 600, 300)
	testutil.Eventually(t, waitBound, "900 records counted after the restore", func() bool {
		select {
		case <-job2.Done():
			return true
		default:
		}
		return sink2.records() == 900
	})
	select {
	case <-job2.Done():
		t.Fatalf("restored job ended: %v", job2.Wait())
	default:
	}
	sink2.check(t, 900)
	cancel2()
	job2.Wait()
}
