package stream_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/state"
	"github.com/edgedio/edged/stream"
)

// listSplit is a split of listSplitSource: its id and the offset of its
// next record.
type listSplit struct {
	ID  int
	Off int
}

// nSplits splits of perSplit records each.
const nSplits, perSplit = 7, 200

// splitProgress is the offset each split has reached, over the subtasks.
type splitProgress struct {
	mu  sync.Mutex
	off map[int]int
}

func (p *splitProgress) set(id, off int) {
	p.mu.Lock()
	p.off[id] = off
	p.mu.Unlock()
}

func (p *splitProgress) allAt(n int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for id := range nSplits {
		if p.off[id] < min(n, perSplit) {
			return false
		}
	}
	return true
}

// listSplitSource reads the splits it owns round robin, emitting
// "s<id>-<offset>" as far as its gate lets each split go, and keeps its
// splits and offsets in operator state the way the README says: a
// ListState, split among the new subtasks on a restore at another
// parallelism, or a UnionListState, of which each subtask takes the
// splits id mod parallelism. It tells a restore from a first start by
// OperatorState.Len() in Open.
type listSplitSource struct {
	operators.Base
	union bool
	g     *gate
	prog  *splitProgress
	list  state.OperatorList[listSplit]
	mine  []listSplit
	wait  <-chan struct{}
	rr    int
}

func (s *listSplitSource) Replayable() bool { return true }

func (s *listSplitSource) Open(ctx *operators.Context) error {
	restored := ctx.OperatorState.Len() > 0
	var err error
	if s.union {
		s.list, err = state.UnionListState[listSplit](ctx.OperatorState, "splits")
	} else {
		s.list, err = state.ListState[listSplit](ctx.OperatorState, "splits")
	}
	if err != nil {
		return err
	}
	if restored {
		for _, sp := range s.list.Get() {
			if !s.union || sp.ID%ctx.Parallelism == ctx.Subtask {
				s.mine = append(s.mine, sp)
			}
		}
	} else {
		for id := range nSplits {
			if id%ctx.Parallelism == ctx.Subtask {
				s.mine = append(s.mine, listSplit{ID: id})
			}
		}
	}
	return nil
}

func (s *listSplitSource) SnapshotState(int64) ([]byte, error) {
	s.list.Update(s.mine)
	return nil, nil
}

func (s *listSplitSource) Poll(out operators.Collector[string], limit int) (operators.Status, error) {
	n, bell := s.g.state()
	emitted := 0
	for emitted < limit {
		progressed := false
		for range s.mine {
			s.rr = (s.rr + 1) % len(s.mine)
			sp := &s.mine[s.rr]
			if sp.Off < perSplit && sp.Off < n {
				out.Collect(fmt.Sprintf("s%d-%d", sp.ID, sp.Off))
				sp.Off++
				s.prog.set(sp.ID, sp.Off)
				emitted++
				progressed = true
				break
			}
		}
		if !progressed {
			break
		}
	}
	done := true
	more := false
	for _, sp := range s.mine {
		if sp.Off < perSplit {
			done = false
			if sp.Off < n {
				more = true
			}
		}
	}
	switch {
	case done:
		return operators.EndOfInput, nil
	case more:
		return operators.MoreAvailable, nil
	}
	s.wait = bell
	return operators.NothingAvailable, nil
}

func (s *listSplitSource) Available() <-chan struct{} {
	if s.wait == nil {
		ch := make(chan struct{})
		close(ch)
		return ch
	}
	return s.wait
}

// groupsOfSeven emits its input in groups of 7, joined by commas, holding
// the partial group in list state (split among the new subtasks on a
// restore at another parallelism), and the last partial group at the end.
type groupsOfSeven struct {
	operators.Base
	out     operators.Collector[string]
	pending state.OperatorList[string]
}

func (b *groupsOfSeven) Open(ctx *operators.Context) error {
	var err error
	b.pending, err = state.ListState[string](ctx.OperatorState, "pending")
	return err
}

func (b *groupsOfSeven) Collect(v string) {
	b.pending.Add(v)
	if p := b.pending.Get(); len(p) >= 7 {
		b.out.Collect(strings.Join(p, ","))
		b.pending.Clear()
	}
}

func (b *groupsOfSeven) Finish() error {
	if p := b.pending.Get(); len(p) > 0 {
		b.out.Collect(strings.Join(p, ","))
		b.pending.Clear()
	}
	return nil
}

// failAfterCheckpoints passes records through; subtask 0 fails once per
// failer at the first record after its attempt saw two checkpoints
// complete, so a restart restores a checkpoint of the attempt.
type failAfterCheckpoints[T any] struct {
	operators.Base
	f         *failer
	out       operators.Collector[T]
	completed int
	subtask   int
}

func (o *failAfterCheckpoints[T]) Open(ctx *operators.Context) error {
	o.subtask = ctx.Subtask
	return nil
}

func (o *failAfterCheckpoints[T]) Collect(v T) {
	if o.subtask == 0 && o.completed >= 2 && o.f.take() {
		panic(fmt.Sprintf("injected failure after %d checkpoints", o.completed))
	}
	o.out.Collect(v)
}

func (o *failAfterCheckpoints[T]) NotifyCheckpointComplete(int64) error { o.completed++; return nil }
func (o *failAfterCheckpoints[T]) NotifyCheckpointAborted(int64) error  { return nil }

// listSplitJob is listSplitSource -> a map that fails as fail says ->
// groupsOfSeven -> exactly-once file sink in out, all chained.
func listSplitJob(union bool, g *gate, prog *splitProgress, fail *failer, out string, opts ...stream.Option) *stream.Environment {
	env := stream.NewEnvironment("splits", opts...)
	src := stream.FromSource(env, "src", func() operators.Source[string] {
		return &listSplitSource{union: union, g: g, prog: prog}
	}).UID("src")
	m := stream.Transform(src, "fail", func(out operators.Collector[string]) operators.OneInput[string] {
		return &failAfterCheckpoints[string]{f: fail, out: out}
	})
	b := stream.Transform(m, "batch", func(out operators.Collector[string]) operators.OneInput[string] { return &groupsOfSeven{out: out} }).UID("batch")
	b.To("out", func() operators.Sink[string] { return operators.NewFileSink(out, func(s string) string { return s }) }).UID("out")
	return env
}

// Operator state of a user's source (its splits and offsets, in a
// ListState or a UnionListState) and of a user's operator (a partial group
// in a ListState) is restored exactly across a failure at every
// parallelism and across stops with a savepoint that change it (2 -> 3 ->
// 1, 3 -> 1 -> 2, 1 -> 4 -> 2): every record is committed once, in one
// group, whatever subtask took its split and the partial group it was in.
func TestOperatorListStatesAcrossFailuresAndRescales(t *testing.T) {
	for _, union := range []bool{false, true} {
		for _, pars := range [][]int{{2, 3, 1}, {3, 1, 2}, {1, 4, 2}} {
			t.Run(fmt.Sprintf("union=%v/%v", union, pars), func(t *testing.T) {
				out := t.TempDir()
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				sp := ""
				limits := []int{60, 130, perSplit}
				for i, p := range pars {
					cfg := checkpointConfig(t, snapshot.ExactlyOnce)
					g := newGate()
					prog := &splitProgress{off: map[int]int{}}
					fail := newFailer(1)
					opts := []stream.Option{stream.WithParallelism(p), stream.WithCheckpointing(cfg), stream.WithRestartStrategy(&snapshot.FixedDelay{Attempts: 3})}
					if sp != "" {
						opts = append(opts, stream.WithSavepoint(sp, false))
					}
					job, err := listSplitJob(union, g, prog, fail, out, opts...).ExecuteAsync(ctx)
					if err != nil {
						t.Fatal(err)
					}
					// Part of the phase's input, checkpoints covering it,
					// then the rest, whose first record fails the job once.
					from := 0
					if i > 0 {
						from = limits[i-1]
					}
					half := (from + limits[i]) / 2
					g.allow(half)
					testutil.Eventually(t, 30*time.Second, "half the phase read", func() bool { return prog.allAt(half) })
					h0 := len(job.History())
					testutil.Eventually(t, 30*time.Second, "checkpoints", func() bool {
						done := 0
						for _, s := range job.History()[h0:] {
							if s.Status == snapshot.Completed {
								done++
							}
						}
						return done >= 3
					})
					g.allow(limits[i])
					if i == len(pars)-1 {
						if err := job.Wait(); err != nil {
							t.Fatal(err)
						}
					} else {
						testutil.Eventually(t, 30*time.Second, "the phase read after a restart", func() bool {
							return job.Attempts() == 2 && prog.allAt(limits[i])
						})
						if sp, err = job.StopWithSavepoint(ctx, ""); err != nil {
							t.Fatal(err)
						}
						if err := job.Wait(); err != nil {
							t.Fatal(err)
						}
					}
					if r := job.Restores(); fail.fired.Load() != 1 || len(r) != 1 || r[0] == 0 {
						t.Fatalf("phase %d at parallelism %d: %d failures, restores %v: want one, restoring a checkpoint", i, p, fail.fired.Load(), r)
					}
				}
				count := map[string]int{}
				for _, l := range committedLines(t, out) {
					for r := range strings.SplitSeq(l, ",") {
						count[r]++
					}
				}
				bad := 0
				for id := range nSplits {
					for o := range perSplit {
						r := fmt.Sprintf("s%d-%d", id, o)
						if count[r] != 1 {
							if bad++; bad <= 10 {
								t.Errorf("%s committed %d times", r, count[r])
							}
						}
						delete(count, r)
					}
				}
				if bad > 0 || len(count) > 0 {
					t.Errorf("%d records not committed once, %d unexpected ones", bad, len(count))
				}
			})
		}
	}
}
