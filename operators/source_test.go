package operators

import (
	"log/slog"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
)

// waitTimeout bounds every wait of a test on a channel; reaching it is a
// failure, never a way to synchronise.
const waitTimeout = 10 * time.Second

// subtaskContext returns the Context of subtask of parallelism with a fake
// clock at a fixed time and a discarding logger.
func subtaskContext(subtask, parallelism int) *Context {
	return &Context{
		Job:            "test",
		Operator:       "op",
		UID:            "op",
		Subtask:        subtask,
		Parallelism:    parallelism,
		MaxParallelism: 128,
		Logger:         slog.New(slog.DiscardHandler),
		Clock:          clockwork.NewFakeClockAt(time.Unix(1_700_000_000, 0)),
	}
}

// runSource opens src, polls it with limit until EndOfInput or an error,
// and closes it. It returns the records and Poll's error.
func runSource[T any](t *testing.T, src Source[T], ctx *Context, limit int) ([]T, error) {
	t.Helper()
	if err := src.Open(ctx); err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer func() {
		if err := src.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}()
	return pollToEnd(t, src, limit)
}

// pollToEnd polls an open src until EndOfInput or an error, waiting on
// Available (bounded by waitTimeout) when it has nothing.
func pollToEnd[T any](t *testing.T, src Source[T], limit int) ([]T, error) {
	t.Helper()
	var got []T
	out := CollectorFunc[T](func(v T) { got = append(got, v) })
	for {
		before := len(got)
		st, err := src.Poll(out, limit)
		if n := len(got) - before; n > limit {
			t.Fatalf("Poll(limit %d) emitted %d records", limit, n)
		}
		if err != nil {
			return got, err
		}
		switch st {
		case EndOfInput:
			return got, nil
		case NothingAvailable:
			waitAvailable(t, src.Available())
		}
	}
}

// waitAvailable waits until ch is ready, failing the test after waitTimeout.
func waitAvailable(t *testing.T, ch <-chan struct{}) {
	t.Helper()
	timer := time.NewTimer(waitTimeout)
	defer timer.Stop()
	select {
	case <-ch:
	case <-timer.C:
		t.Fatalf("source not available within %v", waitTimeout)
	}
}

// availableNow reports whether ch is ready now.
func availableNow(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
