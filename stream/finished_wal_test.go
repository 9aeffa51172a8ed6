package stream_test

import (
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/stream"
	"github.com/edgedio/edged/watermark"
)

// published records the ids a write-ahead sink published, over every run
// of a job.
type published struct {
	mu  sync.Mutex // guards ids
	ids []string
}

func (p *published) publish(vs []operators.WindowResult[string, countSum], id func(int) string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range vs {
		p.ids = append(p.ids, id(i))
	}
	return nil
}

func (p *published) take() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	ids := p.ids
	p.ids = nil
	return ids
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
		return operators.NewWriteAheadSink(p.publish, nil)
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
		ids := p.take()
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
	first := map[string]bool{}
	for _, id := range p.take() {
		first[id] = true
	}
	md := finalCheckpoint(t, cfg.Dir, "wal-bounded")
	if err := os.Remove(filepath.Join(md.Dir, snapshot.CommittedFile)); err != nil {
		t.Fatal(err)
	}
	if err := execute(t, walJob(n, keys, &p, stream.WithParallelism(2), stream.WithCheckpointing(cfg))); err != nil {
		t.Fatal(err)
	}
	again := p.take()
	if len(again) == 0 {
		t.Fatal("the start after the crash published nothing: the final checkpoint's results could be lost")
	}
	for _, id := range again {
		if !first[id] {
			t.Fatalf("the start after the crash published %s, which the first run did not", id)
		}
	}
	if md := finalCheckpoint(t, cfg.Dir, "wal-bounded"); !md.Committed {
		t.Fatalf("the final checkpoint %s is not marked committed after the second start", md.Dir)
	}
}
