package daemon

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// Jobs start once every subscription at an external broker is made, or
// after the bound with a warning when the broker does not answer.
func TestWaitSubscribed(t *testing.T) {
	ready, notYet := make(chan struct{}), make(chan struct{})
	close(ready)
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	if !waitSubscribed(context.Background(), []<-chan struct{}{ready, ready}, time.Hour, log) {
		t.Fatal("subscribed subscribers: waitSubscribed gave up")
	}
	if buf.Len() != 0 {
		t.Fatalf("logged %q for subscribers that had subscribed", buf.String())
	}
	if waitSubscribed(context.Background(), []<-chan struct{}{ready, notYet}, time.Millisecond, log) {
		t.Fatal("a subscriber that never subscribed: waitSubscribed reported all subscribed")
	}
	if !strings.Contains(buf.String(), "mqtt subscriber not subscribed yet") {
		t.Fatalf("no warning logged: %q", buf.String())
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if waitSubscribed(ctx, []<-chan struct{}{notYet}, time.Hour, log) {
		t.Fatal("a cancelled start: waitSubscribed reported all subscribed")
	}
}
