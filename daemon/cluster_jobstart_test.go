package daemon

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgedio/edged/internal/testutil"
)

// Script: a job master is asked for its job the moment it starts. a
// leads; the job runs on a, b and c, each state file copied to one peer
// (cluster.replicas 1). a dies and b takes over; b's start of the job is
// held between the job master's start (which invites c at once) and the
// node's record of the job. c, restoring a's subtasks placed on it,
// fetches the state files it holds no copy of from b's restore route
// meanwhile. b must not answer that it runs no such job: the fetch waits
// for the start and the job master serves it; the committed window counts
// are exact.
func TestFetchFromAJobMasterBeingStarted(t *testing.T) {
	fc := newFailoverCluster(t, foOptions{replicas: 1})
	b := fc.nodes["b"]
	_, epoch0 := fc.startedPlacement("a", 0)
	fc.waitCheckpoint("a", 0)
	fc.kill("a")
	held, release := make(chan struct{}), make(chan struct{})
	var heldOnce, releaseOnce sync.Once
	free := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(free)
	b.n.startHook = func(string) {
		heldOnce.Do(func() { close(held) })
		<-release
	}
	b.c.live.maybeTakeOver(fc.declareDead("a"))
	testutil.Receive(t, time.Minute, "b starts the job", held)
	testutil.Eventually(t, time.Minute, "c asks b's restore route for a state file while b starts the job", func() bool {
		return b.restoreGets.Load() > 0 && (len(b.answers()) > 0 || b.n.startWaits.Load() > 0)
	})
	if got := b.answers(); len(got) > 0 {
		t.Fatalf("b answered c's fetch while it started the job: %q", got)
	}
	free()
	fc.startedPlacement("b", epoch0)
	fc.finish("b")
	fc.checkTotals()
	got := b.answers()
	if len(got) == 0 {
		t.Fatal("b's restore route answered nothing: the fetch under test was not made")
	}
	for _, a := range got {
		if !strings.HasPrefix(a, "200 ") {
			t.Fatalf("b's restore route answered %q (all: %q)", a, got)
		}
	}
	t.Logf("b's restore route answered %d fetches, the first while it started the job", len(got))
}

// A lookup by name of a job being started waits for its record: it gets
// the job once recorded, an unknown job (404) when the start failed, and
// a "being started" error (503) when its caller gives up first.
func TestLookupWaitsForAJobBeingStarted(t *testing.T) {
	n := &node{byName: map[string]*job{}}
	lookup := func() <-chan error {
		out := make(chan error, 1)
		before := n.startWaits.Load()
		go func() {
			_, err := n.job(context.Background(), "x")
			out <- err
		}()
		testutil.Eventually(t, 0, "the lookup waits for the start", func() bool { return n.startWaits.Load() > before })
		select {
		case err := <-out:
			t.Fatalf("the lookup answered while the job was being started: %v", err)
		default:
		}
		return out
	}

	record := n.beginStart("x")
	got := lookup()
	record(nil)
	if err := testutil.Receive(t, 0, "the lookup's answer after a failed start", got); !errors.Is(err, ErrUnknownJob) || statusOf(err) != http.StatusNotFound {
		t.Fatalf("after a failed start: %v, want an unknown job", err)
	}

	record = n.beginStart("x")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := n.job(ctx, "x"); !errors.Is(err, ErrStarting) || statusOf(err) != http.StatusServiceUnavailable {
		t.Fatalf("a lookup whose caller gave up: %v, want ErrStarting", err)
	}
	got = lookup()
	x := &job{name: "x", status: StatusRunning}
	record(x)
	if err := testutil.Receive(t, 0, "the lookup's answer after the start", got); err != nil {
		t.Fatalf("after the start: %v", err)
	}
	if j, err := n.job(context.Background(), "x"); err != nil || j != x || len(n.jobList()) != 1 {
		t.Fatalf("the started job: %v, %v; %d jobs listed", j, err, len(n.jobList()))
	}
}
