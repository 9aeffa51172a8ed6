package mqtt

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
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

// A completed checkpoint records the source's offset in the ingest log's
// directory, so that a log whose tail was later cut below it (a damaged
// last segment, which recovery cuts as torn) is refused when it is
// opened again, before any device can publish into the offsets the
// checkpoint names. Before, the log opened and the restore landed on
// whatever records took those offsets.
func TestCheckpointedOffsetGuardsTheLogsEnd(t *testing.T) {
	cfg := snapshot.DefaultConfig()
	cfg.Dir = t.TempDir()
	var read atomic.Int64
	l := smallLog(t)
	appendSeq(t, l, 0, 100)
	env := stream.NewEnvironment("guard", stream.WithCheckpointing(cfg))
	msgs := stream.FromSource(env, "mqtt", func() operators.Source[Message] { return NewSource(l) }).UID("mqtt")
	msgs.ForEach("count", func(Message) error { read.Add(1); return nil })
	job, err := env.ExecuteAsync(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, waitBound, "100 records read", func() bool { return read.Load() == 100 })
	if _, err := job.StopWithSavepoint(context.Background(), ""); err != nil {
		t.Fatal(err)
	}
	if err := job.Wait(); err != nil {
		t.Fatal(err)
	}
	dir := l.Dir()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	segs, err := filepath.Glob(filepath.Join(dir, "*.seg"))
	if err != nil || len(segs) == 0 {
		t.Fatalf("segments %v, %v", segs, err)
	}
	// The newest segment cut inside its first record: a torn tail to
	// recovery, which cannot tell it from one.
	last := segs[len(segs)-1]
	if base, err := strconv.ParseUint(strings.TrimSuffix(filepath.Base(last), ".seg"), 10, 64); err != nil || base >= 100 {
		t.Fatalf("newest segment %s: want one that holds records below 100", last)
	}
	if err := os.Truncate(last, 30); err != nil {
		t.Fatal(err)
	}
	_, err = ingestlog.Open(dir, smallLogOptions(), nil)
	if !errors.Is(err, ingestlog.ErrRecordsGone) || !strings.Contains(err.Error(), "up to offset 100") {
		t.Fatalf("Open of the cut log: %v, want ErrRecordsGone naming offset 100", err)
	}
}

// A savepoint restored onto another ingest log than the one it read
// (another node's, or another data_dir's) fails at once, whatever the
// restart strategy, even where that log holds more records than the
// savepoint's offset. Before, the job read that log from the offset: it
// skipped the records below it and read again the ones above, which that
// node's own job had read and committed already (seen through edged run
// --from-savepoint with another node's savepoint: 160 of 480 windows
// committed twice).
func TestSourceRestoreOntoAnotherLogFailsWithoutRestarts(t *testing.T) {
	cfg := snapshot.DefaultConfig()
	cfg.Dir = t.TempDir()
	build := func(l *ingestlog.Log, read *atomic.Int64, opts ...stream.Option) *stream.Environment {
		env := stream.NewEnvironment("other", append([]stream.Option{stream.WithCheckpointing(cfg)}, opts...)...)
		msgs := stream.FromSource(env, "mqtt", func() operators.Source[Message] { return NewSource(l) }).UID("mqtt")
		msgs.ForEach("count", func(Message) error { read.Add(1); return nil })
		return env
	}
	var read atomic.Int64
	l := smallLog(t)
	appendSeq(t, l, 0, 40)
	job, err := build(l, &read).ExecuteAsync(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, waitBound, "40 records read", func() bool { return read.Load() == 40 })
	path, err := job.StopWithSavepoint(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	if err := job.Wait(); err != nil {
		t.Fatal(err)
	}

	// Another node's log, further along than the savepoint's offset.
	other := smallLog(t)
	appendSeq(t, other, 0, 100)
	if l.ID() == "" || other.ID() == "" || l.ID() == other.ID() {
		t.Fatalf("log identities %q and %q: want two different ones", l.ID(), other.ID())
	}
	read.Store(0)
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	resumed, err := build(other, &read, stream.WithSavepoint(path, false), stream.WithClock(clockwork.NewFakeClock()),
		stream.WithRestartStrategy(&snapshot.FixedDelay{Attempts: 3, Delay: time.Hour})).ExecuteAsync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	err = resumed.Wait()
	if !errors.Is(err, ErrOtherLog) || !errors.Is(err, operators.ErrSourcePositionGone) || ctx.Err() != nil {
		t.Fatalf("got %v (context: %v), want the restore's ErrOtherLog at once", err, ctx.Err())
	}
	if !strings.Contains(err.Error(), l.ID()) || !strings.Contains(err.Error(), other.ID()) {
		t.Errorf("the error %q does not name both logs", err)
	}
	if n := resumed.Attempts(); n != 1 {
		t.Fatalf("%d attempts, want 1", n)
	}
	if n := read.Load(); n != 0 {
		t.Fatalf("%d records of the other log read, want none", n)
	}
}

// A log keeps its identity across opens; a log whose identity's file is
// damaged has none (the restore then checks nothing, as before the file
// existed), and opens all the same.
func TestIngestLogIdentityOutlivesReopen(t *testing.T) {
	dir := t.TempDir()
	l, err := ingestlog.Open(dir, smallLogOptions(), nil)
	if err != nil {
		t.Fatal(err)
	}
	id := l.ID()
	if len(id) != 32 {
		t.Fatalf("identity %q, want 32 hex digits", id)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if l, err = ingestlog.Open(dir, smallLogOptions(), nil); err != nil || l.ID() != id {
		t.Fatalf("reopened: %v, identity %q, want %q", err, l.ID(), id)
	}
	l.Close()
	if err := os.WriteFile(filepath.Join(dir, "ID"), []byte("damaged"), 0o644); err != nil {
		t.Fatal(err)
	}
	if l, err = ingestlog.Open(dir, smallLogOptions(), nil); err != nil || l.ID() != "" {
		t.Fatalf("damaged: %v, identity %q, want none", err, l.ID())
	}
	l.Close()
}
