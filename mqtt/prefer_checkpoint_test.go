package mqtt

import (
	"bufio"
	"context"
	"os"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/stream"
)

// committedOffsets reads the offsets the file sink committed in dir.
func committedOffsets(t *testing.T, dir string) []int {
	t.Helper()
	parts, err := operators.CommittedParts(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, p := range parts {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			n, err := strconv.Atoi(sc.Text())
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, n)
		}
		f.Close()
	}
	slices.Sort(out)
	return out
}

// A job with prefer_checkpoint_for_recovery takes a checkpoint, then a
// savepoint (whose completion commits what the file sink pre-committed),
// then fails: the restart restores the savepoint, not the older
// checkpoint, so nothing the savepoint committed is committed twice.
func TestPreferCheckpointNeverRecommitsSavepointOutput(t *testing.T) {
	testutil.Burn(t, 1)
	l := smallLog(t)
	out := t.TempDir()
	cfg := snapshot.DefaultConfig()
	cfg.Dir, cfg.Interval = t.TempDir(), time.Hour // triggered by the fake clock
	cfg.PreferCheckpointForRecovery = true
	fc := clockwork.NewFakeClock()
	var seen atomic.Int64
	var failNext atomic.Bool
	env := stream.NewEnvironment("prefer", stream.WithCheckpointing(cfg), stream.WithClock(fc),
		stream.WithRestartStrategy(&snapshot.FixedDelay{Attempts: 1}))
	msgs := stream.FromSource(env, "mqtt", func() operators.Source[Message] { return NewSource(l) }).UID("mqtt")
	offsets := stream.Map(msgs, "offset", func(m Message) (int, error) {
		if failNext.CompareAndSwap(true, false) {
			panic("injected failure")
		}
		seen.Add(1)
		return int(m.Offset), nil
	}).UID("offset")
	offsets.To("files", func() operators.Sink[int] {
		return operators.NewFileSink(out, strconv.Itoa)
	}).UID("files")

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	job, err := env.ExecuteAsync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	completed := func() []snapshot.Stats {
		var c []snapshot.Stats
		for _, s := range job.History() {
			if s.Status == snapshot.Completed {
				c = append(c, s)
			}
		}
		return c
	}
	checkpoint := func() {
		t.Helper()
		before := len(completed())
		if err := fc.BlockUntilContext(ctx, 1); err != nil {
			t.Fatal(err)
		}
		fc.Advance(time.Hour)
		testutil.Eventually(t, time.Minute, "checkpoint completes", func() bool { return len(completed()) > before })
	}

	appendSeq(t, l, 0, 100)
	testutil.Eventually(t, time.Minute, "100 records", func() bool { return seen.Load() == 100 })
	// The sink's first record brought the run's first checkpoint forward
	// (snapshot.OutputHeld); the periodic one follows an hour later.
	testutil.Eventually(t, time.Minute, "the first checkpoint completes", func() bool { return len(completed()) == 1 })
	checkpoint()
	appendSeq(t, l, 100, 100)
	testutil.Eventually(t, time.Minute, "200 records", func() bool { return seen.Load() == 200 })
	sp, err := job.TriggerSavepoint(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, time.Minute, "the savepoint's output committed", func() bool { return len(committedOffsets(t, out)) == 200 })
	c := completed()
	if len(c) != 3 || c[0].Kind != snapshot.KindCheckpoint || c[1].Kind != snapshot.KindCheckpoint || c[2].Kind != snapshot.KindSavepoint {
		t.Fatalf("completed %+v: want two checkpoints, then a savepoint", c)
	}
	c = c[1:]

	// Fail; the restart must restore the savepoint.
	failNext.Store(true)
	appendSeq(t, l, 200, 1)
	testutil.Eventually(t, time.Minute, "the restart", func() bool { return len(job.Restores()) == 1 })
	if r := job.Restores(); r[0] != c[1].Checkpoint {
		t.Fatalf("restored %v, want savepoint %d (%s); checkpoint %d is older", r, c[1].Checkpoint, sp, c[0].Checkpoint)
	}
	appendSeq(t, l, 201, 9)
	testutil.Eventually(t, time.Minute, "the restored job reads on", func() bool { return seen.Load() >= 210 })
	// The restored run's first checkpoint is brought forward too: let it
	// complete before the clock jumps an hour (past its timeout). The
	// history spans both runs.
	testutil.Eventually(t, time.Minute, "the restored run's first checkpoint completes", func() bool { return len(completed()) == 4 })
	checkpoint()
	testutil.Eventually(t, time.Minute, "the last checkpoint's output committed", func() bool { return len(committedOffsets(t, out)) >= 210 })
	got := committedOffsets(t, out)
	want := make([]int, 210)
	for i := range want {
		want[i] = i
	}
	if !slices.Equal(got, want) {
		t.Fatalf("committed %d offsets, want 0..209 once each: %v", len(got), got)
	}
	cancel()
	job.Wait()
}
