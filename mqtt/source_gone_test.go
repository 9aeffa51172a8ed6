package mqtt

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/mqtt/ingestlog"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/stream"
)

// A job restored from a snapshot whose ingest-log offset lies past the
// end of the log (acknowledged records the snapshot read are gone: the
// last segment cut or damaged, or another log) fails at once, whatever
// its restart strategy. Before, it restarted after its delay, and once
// devices had published enough to take the log past the offset the
// restore succeeded on records the snapshot never read, skipping them
// without a word.
func TestSourceRestorePastTheLogsEndFailsWithoutRestarts(t *testing.T) {
	cfg := snapshot.DefaultConfig()
	cfg.Dir = t.TempDir()
	build := func(l *ingestlog.Log, read *atomic.Int64, opts ...stream.Option) *stream.Environment {
		env := stream.NewEnvironment("gone", append([]stream.Option{stream.WithCheckpointing(cfg)}, opts...)...)
		msgs := stream.FromSource(env, "mqtt", func() operators.Source[Message] { return NewSource(l) }).UID("mqtt")
		msgs.ForEach("count", func(Message) error { read.Add(1); return nil })
		return env
	}
	var read atomic.Int64
	l := smallLog(t)
	appendSeq(t, l, 0, 100)
	job, err := build(l, &read).ExecuteAsync(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, waitBound, "100 records read", func() bool { return read.Load() == 100 })
	path, err := job.StopWithSavepoint(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	if err := job.Wait(); err != nil {
		t.Fatal(err)
	}

	// The log the job comes back to ends at offset 40.
	short := smallLog(t)
	appendSeq(t, short, 0, 40)
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	resumed, err := build(short, &read, stream.WithSavepoint(path, false), stream.WithClock(clockwork.NewFakeClock()),
		stream.WithRestartStrategy(&snapshot.FixedDelay{Attempts: 3, Delay: time.Hour})).ExecuteAsync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	err = resumed.Wait()
	if !errors.Is(err, operators.ErrSourcePositionGone) || !errors.Is(err, ingestlog.ErrOutOfRange) || ctx.Err() != nil {
		t.Fatalf("got %v (context: %v), want the restore's ErrSourcePositionGone at once", err, ctx.Err())
	}
	if !strings.Contains(err.Error(), "offset 100") || !strings.Contains(err.Error(), "next offset is 40") {
		t.Errorf("the error %q does not name the snapshot's offset and the log's end", err)
	}
	if n := resumed.Attempts(); n != 1 {
		t.Fatalf("%d attempts, want 1", n)
	}
}
