package daemon

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/snapshot"
)

// failingTakeover makes n's takeover (restarting its jobs) fail its first
// fails calls; it returns the number of calls so far.
func failingTakeover(n *handbackNode, fails int) func() int {
	var mu sync.Mutex
	calls := 0
	n.takeover = func(from string) error {
		mu.Lock()
		defer mu.Unlock()
		calls++
		if calls <= fails {
			return errors.New("disk full")
		}
		n.mu.Lock()
		n.took = append(n.took, from)
		n.mu.Unlock()
		return nil
	}
	return func() int {
		mu.Lock()
		defer mu.Unlock()
		return calls
	}
}

// blockUntil waits until n goroutines wait on clock's timers.
func blockUntil(t *testing.T, clock *clockwork.FakeClock, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := clock.BlockUntilContext(ctx, n); err != nil {
		t.Fatalf("waiting for %d timers: %v", n, err)
	}
}

// A hand-back that fails after the leader stopped its jobs, whose restart
// of the jobs fails too: the leader retries the restart on a fake clock,
// after resume_backoff and then twice as long each time, until it
// succeeds; no hand-back starts meanwhile.
func TestResumeLeadingRetriedWithBackoff(t *testing.T) {
	nodes := handbackCluster(t)
	a, b := nodes["a"], nodes["b"]
	clock := clockwork.NewFakeClock()
	b.hb.clock = clock
	calls := failingTakeover(b, 2)
	b.stop = func(ctx context.Context) (map[string]snapshot.ID, bool, error) {
		b.commit(t, 8, true, true)
		return map[string]snapshot.ID{handbackJob: 8}, true, nil
	}
	b.commit(t, 6, false, true)
	a.lead.mu.Lock()
	a.lead.id = "c" // a refuses: it follows another node
	a.lead.mu.Unlock()
	if err := b.handBack(context.Background(), "a", time.Now()); !errors.Is(err, ErrHandback) {
		t.Fatalf("hand-back: %v", err)
	}
	if calls() != 1 || !b.isMaster() {
		t.Fatalf("after the failed hand-back: %d restarts, master %v", calls(), b.isMaster())
	}
	b.hb.mu.Lock()
	resuming := b.hb.resuming
	b.hb.mu.Unlock()
	if !resuming {
		t.Fatal("the failed restart is not retried")
	}
	// No hand-back starts while the jobs are being restarted.
	b.live.maybeHandBack([]string{"a", "b", "c"})
	b.hb.mu.Lock()
	running := b.hb.running
	b.hb.mu.Unlock()
	if running {
		t.Fatal("a hand-back started while the leader restarts its jobs")
	}
	backoff := b.hb.cfg.ResumeBackoff
	blockUntil(t, clock, 1)
	clock.Advance(backoff - time.Millisecond)
	if calls() != 1 {
		t.Fatalf("retried before the backoff: %d calls", calls())
	}
	clock.Advance(time.Millisecond)
	testutilEventually(t, "the first retry", func() bool { return calls() == 2 })
	// It failed again: the next wait is twice as long.
	blockUntil(t, clock, 1)
	clock.Advance(2*backoff - time.Millisecond)
	if calls() != 2 {
		t.Fatalf("retried before the doubled backoff: %d calls", calls())
	}
	clock.Advance(time.Millisecond)
	testutilEventually(t, "the second retry", func() bool { return calls() == 3 })
	testutilEventually(t, "the retries end once the jobs run", func() bool {
		b.hb.mu.Lock()
		defer b.hb.mu.Unlock()
		return !b.hb.resuming
	})
	if tk := b.takeovers(); len(tk) != 1 || tk[0] != "b" || !b.isMaster() || b.hb.resumeRetries != 2 {
		t.Fatalf("restarted %v, master %v, %d retries", tk, b.isMaster(), b.hb.resumeRetries)
	}
}

// The retries of a leader restarting its jobs end once it no longer
// leads (it stepped down, or stops), without restarting them.
func TestResumeLeadingRetriesEndWhenLeadershipLost(t *testing.T) {
	for _, lose := range []string{"step down", "stop"} {
		t.Run(lose, func(t *testing.T) {
			nodes := handbackCluster(t)
			b := nodes["b"]
			clock := clockwork.NewFakeClock()
			b.hb.clock = clock
			calls := failingTakeover(b, 100)
			b.resumeLeading(b.log, "test")
			if calls() != 1 {
				t.Fatalf("%d restarts", calls())
			}
			blockUntil(t, clock, 1)
			if lose == "stop" {
				b.stopTakeover()
			} else {
				b.stepDown("a")
			}
			clock.Advance(b.hb.cfg.ResumeBackoff)
			testutilEventually(t, "the retries end", func() bool {
				b.hb.mu.Lock()
				defer b.hb.mu.Unlock()
				return !b.hb.resuming
			})
			if calls() != 1 || len(b.takeovers()) != 0 {
				t.Fatalf("restarted the jobs after the leadership was lost: %d calls", calls())
			}
		})
	}
}

// A leader that yields and whose jobs do not end when cancelled keeps
// them accounted (recorded in the yield, counted as lingering) and
// cancels them again, backing off, until they end; then it forgets them.
func TestYieldRetriesJobsThatDidNotEnd(t *testing.T) {
	nodes := handbackCluster(t)
	a, b := nodes["a"], nodes["b"]
	a.master, a.lead.id = true, "a"
	clock := clockwork.NewFakeClock()
	b.hb.clock = clock
	var mu sync.Mutex
	running := 2 // jobs of b that do not end when cancelled
	recancels := 0
	b.hb.cancel = func(context.Context) int {
		mu.Lock()
		defer mu.Unlock()
		return running
	}
	b.hb.recancel = func(context.Context) int {
		mu.Lock()
		defer mu.Unlock()
		recancels++
		if recancels == 2 {
			running = 0 // they end at the second retry
		}
		return running
	}
	if err := b.rep.publish(context.Background(), b.seen.Load(), mustLatestOrCommit(t, b)); err != nil {
		t.Fatal(err)
	}
	if !b.yield(context.Background(), "a", a.highestEpoch(), a.latestCheckpoints()) {
		t.Fatal("b did not yield to a")
	}
	if b.isMaster() || b.leader() != "a" {
		t.Fatalf("b master %v follows %q", b.isMaster(), b.leader())
	}
	if n := b.hb.lingeringJobs(); n != 2 {
		t.Fatalf("%d lingering jobs, want 2: the jobs whose cancel timed out are forgotten", n)
	}
	recs, _ := b.hb.status()
	if len(recs) != 1 || recs[0].Outcome != "yielded" || !strings.Contains(recs[0].Error, "2 jobs not ended yet") {
		t.Fatalf("records %+v", recs)
	}
	backoff := b.hb.cfg.ResumeBackoff
	blockUntil(t, clock, 1)
	clock.Advance(backoff)
	testutilEventually(t, "the first recancel", func() bool { mu.Lock(); defer mu.Unlock(); return recancels == 1 })
	if n := b.hb.lingeringJobs(); n != 2 {
		t.Fatalf("%d lingering after a recancel that ended none", n)
	}
	blockUntil(t, clock, 1)
	clock.Advance(2*backoff - time.Millisecond)
	mu.Lock()
	early := recancels
	mu.Unlock()
	if early != 1 {
		t.Fatalf("recancelled before the doubled backoff: %d", early)
	}
	clock.Advance(time.Millisecond)
	testutilEventually(t, "every lingering job ended", func() bool { return b.hb.lingeringJobs() == 0 })
	testutilEventually(t, "the retries end", func() bool {
		b.hb.mu.Lock()
		defer b.hb.mu.Unlock()
		return !b.hb.recancelling
	})
}

func mustLatestOrCommit(t *testing.T, h *handbackNode) *snapshot.Metadata {
	t.Helper()
	h.commit(t, 3, false, false)
	return mustLatest(t, h)
}

func testutilEventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, what, cond)
}

// A hand-back whose receiver fails to take over some jobs: the receiver
// tries again after resume_backoff (a fake clock) while it leads, and
// records the hand-back done once every job runs. Before, those jobs
// stayed down until the leadership changed.
func TestHandbackTakeoverThatFailedIsRetried(t *testing.T) {
	nodes := handbackCluster(t)
	a, b := nodes["a"], nodes["b"]
	clock := clockwork.NewFakeClock()
	a.hb.clock = clock
	calls := failingTakeover(a, 1)
	b.stop = func(ctx context.Context) (map[string]snapshot.ID, bool, error) {
		b.commit(t, 8, true, true)
		return map[string]snapshot.ID{handbackJob: 8}, true, nil
	}
	b.commit(t, 6, false, true)
	if err := b.handBack(context.Background(), "a", time.Now()); err != nil {
		t.Fatalf("hand-back: %v", err)
	}
	testutilEventually(t, "a's first takeover", func() bool { return calls() == 1 })
	blockUntil(t, clock, 1)
	if len(a.takeovers()) != 0 {
		t.Fatalf("a took over %v on its failed try", a.takeovers())
	}
	clock.Advance(a.hb.cfg.ResumeBackoff)
	testutilEventually(t, "a's takeover retried", func() bool { return calls() == 2 })
	testutilEventually(t, "a records the hand-back done", func() bool {
		ra, _ := a.hb.status()
		return len(ra) == 1 && ra[0].Outcome == "done"
	})
	if tk := a.takeovers(); len(tk) != 1 || tk[0] != "b" || !a.isMaster() {
		t.Fatalf("a took over from %v, master %v", tk, a.isMaster())
	}
}
