package stream_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/stream"
	"github.com/edgedio/edged/watermark"
)

// published records the ids a write-ahead sink published, over every run
// of a job, and for each sink instance the ids of its last publish.
type published struct {
	mu   sync.Mutex // guards ids and last
	ids  []string
	last map[int][]string
	n    int // sink instances created
	// background makes the sinks publish on a goroutine of their own
	// (WithBackgroundPublish).
	background bool
	down       atomic.Bool // every publish fails: the broker is down
	// gate, when set, is called first by every publish (a broker that
	// stalls).
	gate func()
}

// setDown makes every publish fail (down) or succeed again.
func (p *published) setDown(down bool) { p.down.Store(down) }

// sink returns a write-ahead sink publishing to p as a new instance.
func (p *published) sink() *operators.WriteAheadSink[operators.WindowResult[string, countSum]] {
	p.mu.Lock()
	inst := p.n
	p.n++
	p.mu.Unlock()
	s := operators.NewWriteAheadSink(func(vs []operators.WindowResult[string, countSum], id func(int) string) error {
		if p.gate != nil {
			p.gate()
		}
		if p.down.Load() {
			return errors.New("broker down")
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.last == nil {
			p.last = map[int][]string{}
		}
		p.last[inst] = p.last[inst][:0]
		for i := range vs {
			p.ids = append(p.ids, id(i))
			p.last[inst] = append(p.last[inst], id(i))
		}
		return nil
	}, nil)
	if p.background {
		s = s.WithBackgroundPublish()
	}
	return s
}

// take returns the ids published since the last take and, sorted, the
// union of each sink instance's last publish among them.
func (p *published) take() (ids, last []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ids = p.ids
	for _, l := range p.last {
		last = append(last, l...)
	}
	slices.Sort(last)
	p.ids, p.last = nil, nil
	return ids, last
}

// walJob is a bounded windowed count whose results go to a write-ahead
// sink publishing to p.
func walJob(n int64, keys int, p *published, opts ...stream.Option) *stream.Environment {
	env := stream.NewEnvironment("wal-bounded", opts...)
	src := stream.FromSource(env, "generator", generator(n, keys)).SetParallelism(1).UID("generator").
		AssignTimestampsAndWatermarks("timestamps", watermark.ForMonotonous(eventTime))
	w := stream.Window(stream.KeyBy(src, bySensor), operators.TumblingEventTimeWindows(10*time.Second))
	res := stream.WindowAggregate(w, "count-sum", countSumWin{}).UID("count-sum")
	res.To("publish", func() operators.Sink[operators.WindowResult[string, countSum]] {
		return p.sink()
	}).UID("publish")
	return env
}

// A bounded job whose results go to a write-ahead sink (the MQTT sink's
// kind), started again on its checkpoint directory after it finished,
// publishes nothing: its final checkpoint was marked committed once every
// sink had published it, so the second run restores nothing and re-emits
// nothing, while the first run published every result once.
func TestFinishedJobDoesNotPublishAgain(t *testing.T) {
	const n, keys = 5_000, 20
	cfg := checkpointConfig(t, snapshot.ExactlyOnce)
	var p published
	for run := range 2 {
		env := walJob(n, keys, &p, stream.WithParallelism(2), stream.WithCheckpointing(cfg))
		if err := execute(t, env); err != nil {
			t.Fatalf("run %d: %v", run, err)
		}
		ids, _ := p.take()
		if run == 0 {
			seen := map[string]bool{}
			for _, id := range ids {
				if seen[id] {
					t.Fatalf("run 0 published %s twice", id)
				}
				seen[id] = true
			}
			if len(ids) == 0 {
				t.Fatal("run 0 published nothing")
			}
			continue
		}
		if len(ids) > 0 {
			t.Fatalf("run %d, on the finished job's checkpoints, published %d results again (first %s)", run, len(ids), ids[0])
		}
	}
	md := finalCheckpoint(t, cfg.Dir, "wal-bounded")
	if !md.Committed {
		t.Fatalf("the final checkpoint %s is not marked committed", md.Dir)
	}
}

// A job that died between its final checkpoint's metadata and its sinks'
// commits (here: the committed mark removed, as the crash leaves it) is
// still completed by a start on its checkpoint directory: the sinks
// publish what the final checkpoint holds, again with the same ids.
func TestFinishedJobNotCommittedPublishesTheFinalCheckpoint(t *testing.T) {
	const n, keys = 5_000, 20
	cfg := checkpointConfig(t, snapshot.ExactlyOnce)
	var p published
	if err := execute(t, walJob(n, keys, &p, stream.WithParallelism(2), stream.WithCheckpointing(cfg))); err != nil {
		t.Fatal(err)
	}
	// Every sink published the final checkpoint's records last (the
	// final watermark fires every key's last window after the checkpoint
	// before): those, and only those, are published again.
	_, final := p.take()
	if len(final) == 0 {
		t.Fatal("the first run published nothing")
	}
	md := finalCheckpoint(t, cfg.Dir, "wal-bounded")
	if err := os.Remove(filepath.Join(md.Dir, snapshot.CommittedFile)); err != nil {
		t.Fatal(err)
	}
	if err := execute(t, walJob(n, keys, &p, stream.WithParallelism(2), stream.WithCheckpointing(cfg))); err != nil {
		t.Fatal(err)
	}
	again, _ := p.take()
	slices.Sort(again)
	if !slices.Equal(again, final) {
		t.Fatalf("the start after the crash published %d results, want exactly the %d the final checkpoint held\n got %v\nwant %v",
			len(again), len(final), again, final)
	}
	if md := finalCheckpoint(t, cfg.Dir, "wal-bounded"); !md.Committed {
		t.Fatalf("the final checkpoint %s is not marked committed after the second start", md.Dir)
	}
}
