package daemon

import (
	"context"
	"strings"
	"testing"

	"github.com/edgedio/edged/cluster"
	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/snapshot"
)

// A rebalance while node c is absent (drained, or dead and not drained)
// finds every subtask on the placement it would make: the placement
// spreads c's operators one by one, but a chain runs where its first
// operator is placed, as the running attempt does already. It moves
// nothing and restarts nothing (no savepoint, no new attempt, no new
// epoch), and is recorded as done with no mode and its note; so is a
// join whose node died again before it ran, and a drain of the dead node
// (which runs nothing).
func TestRebalanceWithAnAbsentNodeMovesNothing(t *testing.T) {
	for _, tc := range []struct {
		name    string
		dead    bool
		trigger cluster.Trigger
	}{
		{"drained/manual", false, cluster.TriggerManual},
		{"dead/manual", true, cluster.TriggerManual},
		{"dead/join", true, cluster.TriggerJoin},
		{"dead/drain", true, cluster.TriggerDrain},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testutil.Burn(t, 1)
			want := hoReference(t, hoN, hoKeys)
			h := startHoCluster(t, newHoShape(hoN, hoKeys, hoRate, t.TempDir()), hoOptions{})
			r0 := h.runner(t)
			if tc.dead {
				// c is dead rather than drained: not alive, not drained.
				h.c.live.mu.Lock()
				h.c.live.aliveFn = func() []string { return []string{"a", "b"} }
				delete(h.c.live.drained, "c")
				h.c.live.mu.Unlock()
			}
			h.syncClock()
			done := make(chan error, 1)
			go func() {
				node := ""
				if tc.trigger != cluster.TriggerManual {
					node = "c"
				}
				done <- h.c.rb.ask(context.Background(), tc.trigger, node)
			}()
			testutil.Eventually(t, 0, "the rebalance is queued", func() bool {
				h.c.rb.gateMu.Lock()
				defer h.c.rb.gateMu.Unlock()
				return len(h.c.rb.waiters) == 1
			})
			h.clock.Advance(cluster.DefaultGateConfig().MaxInterval + cluster.DefaultGateConfig().Settle)
			h.open(t)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			rec := h.onlyRebalance(t)
			note := nothingMoved
			if tc.trigger == cluster.TriggerDrain {
				// The dead node is in no running deployment: the drain
				// has nothing to hand over.
				note = nothingHosted
			}
			if rec.Outcome != cluster.RebalanceDone || rec.Mode != "" || rec.MovedKeyGroups != 0 || rec.Trigger != tc.trigger || rec.Note != note {
				t.Fatalf("rebalance %+v, want a %s rebalance done with nothing moved, no mode and the note %q", rec, tc.trigger, note)
			}
			if r1 := h.runner(t); r1 != r0 || h.job.Attempts() != 1 || r1.Epoch() != r0.Epoch() {
				t.Fatalf("the job restarted: %d attempts", h.job.Attempts())
			}
			for _, s := range r0.History() {
				if s.Kind == snapshot.KindSavepoint {
					t.Fatalf("a savepoint was taken: %+v", s)
				}
			}
			if m := h.scrapeTally(t); !strings.Contains(m, `edged_cluster_rebalances_by_mode_total{mode="none",outcome="done",trigger="`+string(tc.trigger)+`"} 1`+"\n") {
				t.Fatalf("metrics:\n%s", m)
			}
			h.finish(t, want)
			if h.job.Attempts() != 1 {
				t.Fatalf("%d attempts", h.job.Attempts())
			}
		})
	}
}
