package pipeline

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/keygroup"
	"github.com/edgedio/edged/snapshot"
)

// boundedMQTTPipeline counts the generator's readings per sensor in 10 s
// windows and publishes the results to agg/<sensor> through the
// write-ahead MQTT sink, with checkpoints in checkpointDir.
func boundedMQTTPipeline(checkpointDir string) string {
	return fmt.Sprintf(`
pipelines:
  - name: bounded
    parallelism: 2
    source:
      generator: {count: 2000, rate: 0, keys: 10}
    event_time: {field: ts}
    key: id
    window:
      type: tumbling
      size: 10s
      aggregates: [{name: n, fn: count}]
    sinks:
      - mqtt: {topic: "agg/{id}"}
    checkpoint: {dir: %s, interval: 20ms}
    restart: {strategy: none}
`, checkpointDir)
}

// A bounded pipeline publishing over MQTT runs to its end, publishing
// each window result once; started again on the same checkpoint
// directory (a node restarted with the same config and data dir) it
// publishes nothing: the final checkpoint is marked committed once every
// sink published it, so the second start restores nothing and a consumer
// that does not drop repeated msg_ids sees no duplicate. Before the mark,
// the second start published every result the final checkpoint held
// again, with the same msg_ids.
func TestFinishedPipelineDoesNotPublishAgain(t *testing.T) {
	contend(t)
	h := newMQTTHarness(t)
	pc := parsePipeline(t, boundedMQTTPipeline(t.TempDir()))
	for run := range 2 {
		job, _, _ := h.start(pc)
		if err := job.Wait(); err != nil {
			t.Fatalf("run %d: %v", run, err)
		}
		h.sync()
		got := h.published("agg/")
		switch run {
		case 0:
			// 2,000 readings of 10 sensors, one a second per sensor: at
			// least 20 windows of 10 s per sensor (21 when the first
			// reading is not on a window's start).
			ids := map[string]bool{}
			for _, p := range got {
				if p.id == "" || ids[p.id] {
					t.Fatalf("run 0: result %s has no msg_id or a repeated one", p.payload)
				}
				ids[p.id] = true
			}
			if len(ids) < 10*20 {
				t.Fatalf("run 0 published %d results, want at least %d", len(ids), 10*20)
			}
			if fin := job.AlreadyFinished(); fin != nil {
				t.Fatalf("run 0 found the job finished at %s", fin.Dir)
			}
		case 1:
			if len(got) > 0 {
				t.Fatalf("the second start published %d results again (first %s: %s)", len(got), got[0].topic, got[0].payload)
			}
			if fin := job.AlreadyFinished(); fin == nil || !fin.Committed {
				t.Fatalf("the second start: AlreadyFinished = %+v, want the committed final checkpoint", fin)
			}
		}
		h.reset()
	}
}

// A bounded pipeline whose process died after its final checkpoint's
// metadata and before its sinks published it (here: the committed mark
// removed, which is what such a crash leaves) publishes that checkpoint's
// results when started again, with the msg_ids of the first run, and
// marks it committed: a third start publishes nothing. Before, the
// second start's re-publish ran on a goroutine that closing the sink cut
// short, so the results could be lost.
func TestFinishedPipelineNotCommittedPublishesItsFinalCheckpoint(t *testing.T) {
	contend(t)
	h := newMQTTHarness(t)
	pc := parsePipeline(t, boundedMQTTPipeline(t.TempDir()))
	var first map[string]bool
	var firstPayloads []published
	for run := range 3 {
		job, _, _ := h.start(pc)
		if err := job.Wait(); err != nil {
			t.Fatalf("run %d: %v", run, err)
		}
		h.sync()
		got := h.published("agg/")
		h.reset()
		switch run {
		case 0:
			first, firstPayloads = map[string]bool{}, got
			for _, p := range got {
				first[p.id] = true
			}
			fin, err := actors.FinishedCheckpoint(pc.Checkpoint.Dir, pc.Name, keygroup.DefaultMaxParallelism, nil)
			if err != nil || fin == nil {
				t.Fatalf("run 0 left no final checkpoint: %v", err)
			}
			if err := os.Remove(filepath.Join(fin.Dir, snapshot.CommittedFile)); err != nil {
				t.Fatal(err)
			}
		case 1:
			if len(got) == 0 {
				t.Fatal("the start after the crash published nothing of the final checkpoint")
			}
			seen := map[string]bool{}
			for _, p := range got {
				if !first[p.id] || seen[p.id] {
					t.Fatalf("the start after the crash published %s, which run 0 did not, or twice", p.payload)
				}
				seen[p.id] = true
			}
			finalWindows(t, firstPayloads, got)
		case 2:
			if len(got) > 0 {
				t.Fatalf("the third start published %d results again", len(got))
			}
		}
	}
}

// finalWindows fails t unless again, the results a start on a finished
// job's final checkpoint published, are for each sensor a tail of its
// windows in all (every result of the run), the last one included: the
// final watermark fired every sensor's last window after the checkpoint
// before the final one, so the final checkpoint holds those, and a
// checkpoint holds the windows fired since the one before it, never an
// older window without the newer ones.
func finalWindows(t *testing.T, all, again []published) {
	t.Helper()
	ends := func(ps []published) map[string][]int64 {
		out := map[string][]int64{}
		for _, p := range ps {
			var r struct {
				ID  string `json:"id"`
				End int64  `json:"window_end"`
			}
			if err := json.Unmarshal([]byte(p.payload), &r); err != nil || r.ID == "" {
				t.Fatalf("result %s: %v", p.payload, err)
			}
			out[r.ID] = append(out[r.ID], r.End)
		}
		for _, e := range out {
			slices.Sort(e)
		}
		return out
	}
	want, got := ends(all), ends(again)
	for id, w := range want {
		g := got[id]
		if len(g) == 0 || len(g) > len(w) || !slices.Equal(g, w[len(w)-len(g):]) {
			t.Errorf("sensor %s: published windows ending %v again, want a tail of %v with the last one", id, g, w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("published windows of %d sensors again, the run had %d", len(got), len(want))
	}
}
