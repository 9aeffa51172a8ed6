package daemon

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/cluster"
	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/stream"
)

// A savepoint or a stop with a savepoint asked through the REST API (the
// handlers edged savepoint and edged stop call) while a rebalance hands a
// subtask of the job over: the join of node c moves count-sum[2] to it by
// handover, held at its restore step on c (the subtask retired on its old
// node, not yet restored on c) until the request waits in the job master.
// The request waits for the handover and then completes: the savepoint is
// taken after the handover's and restorable, a stop ends the job with it,
// and a stop that outlives a failed handover stops the restarted attempt.

// restoreHold holds a handover at its restore step on node c until
// released; failing makes that step fail once released.
type restoreHold struct {
	reached chan struct{}
	release chan struct{}
	once    sync.Once
	free    func()
	failing atomic.Bool
}

func newRestoreHold(t *testing.T) *restoreHold {
	h := &restoreHold{reached: make(chan struct{}), release: make(chan struct{})}
	var once sync.Once
	h.free = func() { once.Do(func() { close(h.release) }) }
	t.Cleanup(h.free)
	return h
}

// hook is the cluster's handover hook.
func (h *restoreHold) hook(*hoCluster) func(actors.HandoverStep, string) error {
	return func(step actors.HandoverStep, node string) error {
		if step != actors.HandoverRestore || node != "c" {
			return nil
		}
		h.once.Do(func() { close(h.reached) })
		<-h.release
		if h.failing.Load() {
			return errors.New("new owner died while it restored the moved subtask")
		}
		return nil
	}
}

// hoAPI serves the REST API of the job masters' node of h, whose job is
// recorded as the daemon records it (watched until it ends), and returns
// a client of it and the job's record.
func hoAPI(t *testing.T, h *hoCluster) (*Client, *job) {
	t.Helper()
	n := &node{opts: Options{Logger: h.c.log, PollInterval: 50 * time.Millisecond}.withDefaults(), byName: map[string]*job{}}
	n.log = n.opts.Logger
	j := &job{name: "moved", checkpointing: true, run: h.job, cancelFn: func() {}, status: StatusRunning}
	n.addJob(j)
	go n.watch(j)
	srv := httptest.NewServer(newAPI(n))
	hc := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(func() {
		hc.CloseIdleConnections()
		srv.Close()
	})
	return &Client{Addr: srv.URL, HTTP: hc}, j
}

// heldRebalance is a join of c whose handover is held at its restore
// step.
type heldRebalance struct {
	h    *hoCluster
	hold *restoreHold
	api  *Client
	j    *job
	// handover is the newest completed checkpoint or savepoint when the
	// handover was held: the handover's savepoint.
	handover snapshot.ID
	// undrain is the undrain's outcome; ran reports whether the gate
	// opened and the rebalance ran.
	undrain <-chan error
	ran     <-chan bool
}

// startHeldRebalance starts the job (no periodic checkpoint) and a join
// of c, and returns once its handover is held at its restore step.
func startHeldRebalance(t *testing.T, shape *hoShape) *heldRebalance {
	t.Helper()
	hold := newRestoreHold(t)
	h := startHoCluster(t, shape, hoOptions{hook: hold.hook, interval: time.Hour})
	r0 := h.runner(t)
	api, j := hoAPI(t, h)
	undrain := h.undrain(t)
	h.settle()
	ran := make(chan bool, 1)
	go func() {
		// As the rebalancer's loop does: the step that opens the gate
		// runs the rebalance, and returns once the handover ended. A
		// checkpoint in progress (the run's first, brought forward by
		// the sink's first held result) holds the gate for a moment.
		ran <- testutil.Within(0, func() bool {
			if h.step() {
				return true
			}
			h.clock.Advance(rebalancePoll)
			return false
		})
	}()
	select {
	case <-hold.reached:
	case ok := <-ran:
		t.Fatalf("the rebalance ended (ran %v) before its handover reached its restore step", ok)
	case <-time.After(testutil.DefaultTimeout):
		t.Fatal("the handover did not reach its restore step")
	}
	return &heldRebalance{h: h, hold: hold, api: api, j: j, handover: latestCompleted(r0), undrain: undrain, ran: ran}
}

// ask asks the API for a savepoint (stop: a stop with a savepoint) from
// another goroutine, as edged does, and returns its outcome once the
// request waits in the job master.
func (hr *heldRebalance) ask(t *testing.T, stop bool) <-chan savepointAnswer {
	t.Helper()
	return testutil.CallUntilWaiting(t, "actors.(*Runner).TriggerSavepoint", func() savepointAnswer {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if stop {
			p, err := hr.api.Stop(ctx, "moved", "")
			return savepointAnswer{p, err}
		}
		p, err := hr.api.Savepoint(ctx, "moved", "")
		return savepointAnswer{p, err}
	})
}

type savepointAnswer struct {
	path string
	err  error
}

// answered returns the path the API answered, failing t unless it
// answered one of a complete savepoint newer than the handover's.
func (hr *heldRebalance) answered(t *testing.T, out <-chan savepointAnswer) string {
	t.Helper()
	a := testutil.Receive(t, time.Minute, "the API's answer", out)
	if a.err != nil {
		t.Fatalf("the API answered %v", a.err)
	}
	md, err := snapshot.Load(a.path)
	if err != nil {
		t.Fatal(err)
	}
	if md.Checkpoint <= hr.handover || hr.handover == 0 {
		t.Fatalf("the savepoint %d is not newer than the handover's %d", md.Checkpoint, hr.handover)
	}
	if miss := snapshot.Missing(md); len(miss) > 0 {
		t.Fatalf("the savepoint %d lacks state files %v", md.Checkpoint, miss)
	}
	return a.path
}

// stopped checks that the job ended stopped with the savepoint at path,
// as the API reports it, after attempts attempts.
func (hr *heldRebalance) stopped(t *testing.T, path string, attempts int) {
	t.Helper()
	hr.h.shape.releaseInput()
	if err := hr.h.job.Wait(); err != nil {
		t.Fatalf("the stopped job: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testutil.DefaultTimeout)
	defer cancel()
	if st := hr.j.finalStatus(ctx); st != StatusFinished || hr.j.snapshot().Savepoint != path {
		t.Fatalf("the job's record: %s with savepoint %q, want finished with %q", st, hr.j.snapshot().Savepoint, path)
	}
	if got := hr.h.job.Attempts(); got != attempts {
		t.Fatalf("%d attempts, want %d", got, attempts)
	}
	var ae *APIError
	if _, err := hr.api.Stop(ctx, "moved", ""); !errors.As(err, &ae) || ae.StatusCode != http.StatusConflict {
		t.Fatalf("a second stop: %v, want 409 (not running)", err)
	}
}

// restartFromSavepoint runs the job from the savepoint at path in one
// process, to the end of its input, writing to out, and returns what it
// committed there.
func restartFromSavepoint(t *testing.T, path string, out string) []string {
	t.Helper()
	s := newHoShape(hoN, hoKeys, 0, out)
	s.releaseInput()
	cp := snapshot.DefaultConfig()
	cp.Dir = t.TempDir()
	cp.Interval = 50 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := s.env(stream.WithCheckpointing(cp), stream.WithSavepoint(path, false)).Execute(ctx); err != nil {
		t.Fatalf("the job restarted from the savepoint %s: %v", path, err)
	}
	return hoCommitted(t, out)
}

// duringHandover asks the API for a savepoint (stop: a stop with a
// savepoint) while a join's handover is held, frees the handover
// (failing: to fail at its restore step) and checks the rebalance's
// outcome (done, or fell back with the handover's error) and the
// savepoint answered (complete, newer than the handover's; a savepoint
// leaves the job running). It returns the run, the savepoint's path and
// the output of a run without a move.
func duringHandover(t *testing.T, stop, failing bool) (*heldRebalance, string, []string) {
	t.Helper()
	testutil.Burn(t, 1)
	want := hoReference(t, hoN, hoKeys)
	hr := startHeldRebalance(t, newHoShape(hoN, hoKeys, hoRate, t.TempDir()))
	asked := hr.ask(t, stop)
	hr.hold.failing.Store(failing)
	hr.hold.free()
	if !testutil.Receive(t, time.Minute, "the rebalance's end", hr.ran) {
		t.Fatal("the gate did not open")
	}
	err := testutil.Receive(t, time.Minute, "the undrain's answer", hr.undrain)
	recs := hr.h.history()
	if len(recs) != 1 || recs[0].Mode != cluster.RebalanceHandover {
		t.Fatalf("history %+v, want one rebalance by handover", recs)
	}
	switch rec := recs[0]; {
	case failing && (err == nil || !strings.Contains(err.Error(), "handover of job") || rec.Outcome != cluster.RebalanceFellBack):
		t.Fatalf("undrain: %v; rebalance %+v, want the handover's failure and a fallback", err, rec)
	case !failing && (err != nil || rec.Outcome != cluster.RebalanceDone):
		t.Fatalf("undrain: %v; rebalance %+v, want done", err, rec)
	}
	path := hr.answered(t, asked)
	if st := hr.j.snapshot(); !stop && (st.Status != StatusRunning || st.Savepoint != path) {
		t.Fatalf("after the savepoint the job's record says %s with savepoint %q", st.Status, st.Savepoint)
	}
	return hr, path, want
}

// A stop with a savepoint through the API during a rebalance's handover
// waits for the handover and ends the job with a savepoint taken after
// the handover's, from which the job restarts and commits, with what the
// first run committed, exactly the output of a run without a move. So
// too when the handover then fails (the new owner dies while it
// restores): the rebalance falls back, the job restarts from the
// handover's savepoint, and the stop stops the restarted attempt.
func TestAPIStopDuringHandover(t *testing.T) {
	for _, tc := range []struct {
		name     string
		failing  bool
		attempts int
	}{
		{name: "handover done", attempts: 1},
		{name: "handover failed", failing: true, attempts: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hr, path, want := duringHandover(t, true, tc.failing)
			hr.stopped(t, path, tc.attempts)
			sameLines(t, "the first run and the run from the stop's savepoint", restartFromSavepoint(t, path, hr.h.shape.out), want)
		})
	}
}

// A savepoint through the API during a rebalance's handover waits for the
// handover, which completes; the savepoint is taken after the handover's,
// the job runs on in the same attempt to an exact output, and the job
// restarted from the savepoint (elsewhere) commits what the job
// committed after it: lines of the run without a move.
func TestAPISavepointDuringHandover(t *testing.T) {
	hr, path, want := duringHandover(t, false, false)
	hr.h.finish(t, want)
	if hr.h.job.Attempts() != 1 {
		t.Fatalf("%d attempts", hr.h.job.Attempts())
	}
	// The savepoint's pending output was committed by the job in its
	// output directory: the run from it goes on in a copy of that, and
	// commits again (beside the job's output) what the job committed
	// after the savepoint.
	out := t.TempDir()
	if err := os.CopyFS(out, os.DirFS(hr.h.shape.out)); err != nil {
		t.Fatal(err)
	}
	after := restartFromSavepoint(t, path, out)
	again := slices.Clone(after)
	for _, l := range want {
		if i := slices.Index(again, l); i >= 0 {
			again = slices.Delete(again, i, i+1)
		}
	}
	if len(again) == 0 || len(after) != len(want)+len(again) {
		t.Fatalf("the run from the savepoint committed %d lines beside the job's %d (%d lines in all)", len(again), len(want), len(after))
	}
	for _, l := range again {
		if !slices.Contains(want, l) {
			t.Fatalf("the run from the savepoint committed %q, not a line of the run without a move", l)
		}
	}
	t.Logf("the run from the savepoint committed %d of the job's %d lines again", len(again), len(want))
}

// A savepoint through the API during a rebalance's handover that then
// fails: the rebalance falls back, the job restarts from the handover's
// savepoint, and the savepoint is taken of the restarted attempt, which
// runs on to an exact output.
func TestAPISavepointOutlivesAFailedHandover(t *testing.T) {
	hr, _, want := duringHandover(t, false, true)
	hr.h.finish(t, want)
	if hr.h.job.Attempts() != 2 {
		t.Fatalf("%d attempts, want 2 (the handover's fallback)", hr.h.job.Attempts())
	}
}
