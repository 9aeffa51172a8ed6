package actors

import (
	"testing"
	"time"
)

// A reader of a moved subtask takes the new instance's channel after the
// old one's barrier and takes it active, as a restored task takes its
// inputs: a source split that was idle while away from its node (its
// input idle here) holds the reader's watermark again once it is back,
// instead of being left out of it while the other input races ahead and
// makes its records late. An idle new instance says so again.
func TestSwapTakesTheNewChannelActive(t *testing.T) {
	rt := &recordingRouter{}
	tk := testTask(&host{maxP: 128}, 1, 0)
	tk.routers = []router{rt}
	oldCh, newCh := newChannel(0, tk, nil), newChannel(0, tk, nil)
	tk.inChans[0], tk.inChans[1] = oldCh, newChannel(1, tk, nil)

	// Input 0 (the split away from its node) is idle, input 1 at 100.
	tk.inputTime(tk.merger.SetIdle(0, true))
	tk.inputTime(tk.merger.Watermark(1, 100))
	if tk.merger.Current() != 100 {
		t.Fatalf("watermark %d, want 100", tk.merger.Current())
	}

	// Handover 7 moves the split; its new channel comes before the old
	// one's barrier: it waits for it.
	tk.prepareHandover(handoverMsg{id: 7, moved: map[TaskKey]bool{{UID: "split", Subtask: 0}: true}})
	if len(tk.ho.swaps) != 0 {
		t.Fatal("a swap prepared for an input that is not from the moved subtask")
	}
	oldCh.from = TaskKey{UID: "split", Subtask: 0}
	tk.prepareHandover(handoverMsg{id: 7, moved: map[TaskKey]bool{{UID: "split", Subtask: 0}: true}})
	tk.installSwap(newCh)
	if tk.inChans[0] != oldCh {
		t.Fatal("the new channel was taken before the old one's barrier")
	}
	tk.oldBarrier(oldCh, 7)
	if tk.inChans[0] != newCh {
		t.Fatal("the new channel was not taken after the old one's barrier")
	}
	if wm, idle := tk.merger.Channel(0); idle || wm != 100 {
		t.Fatalf("input 0 after the swap: watermark %d idle %t, want active at 100", wm, idle)
	}
	// Input 1 racing ahead no longer moves the task past the split.
	if wm, adv := tk.merger.Watermark(1, 900); adv || wm != 100 {
		t.Fatalf("input 1 at 900 moved the task to %d with the split back active", wm)
	}
	tk.inputTime(tk.merger.Watermark(0, 400))
	if tk.merger.Current() != 400 {
		t.Fatalf("watermark %d after the split's 400, want 400", tk.merger.Current())
	}
	// The new instance, idle after all, says so: the task goes on with
	// input 1.
	tk.inputTime(tk.merger.SetIdle(0, true))
	if tk.merger.Current() != 900 {
		t.Fatalf("watermark %d with the split idle again, want 900", tk.merger.Current())
	}
}

// chanRouter is a router over given channels that replaces them as a
// handover re-points one.
type chanRouter struct {
	recordingRouter
	chans []*channel
}

func (r *chanRouter) channels() []*channel { return r.chans }

func (r *chanRouter) replace(i int, ch *channel) error {
	r.chans[i] = ch
	return nil
}

// The task's backpressure counts the channel a sender parks for a moved
// subtask, beside the time the old one's sender spent blocked: it keeps
// counting what the task sends on and stays a running total (before, it
// counted the old channel, which no longer carried anything, and missed
// the parked one's).
func TestParkedChannelCountsInTheBackpressure(t *testing.T) {
	tk := testTask(&host{maxP: 128, cfg: Config{Credits: 4}}, 1, 0)
	moved := TaskKey{UID: "sink", Subtask: 1}
	stay, away := newChannel(0, nil, nil), newChannel(1, nil, nil)
	stay.dest, away.dest = TaskKey{UID: "sink", Subtask: 0}, moved
	stay.blocked.Store(int64(time.Second))
	away.blocked.Store(int64(3 * time.Second))
	r := &chanRouter{chans: []*channel{stay, away}}
	tk.routers = []router{r}
	tk.outChans = []*channel{stay, away}
	tk.ho = &taskHandover{id: 7, moved: map[TaskKey]bool{moved: true}}

	tk.parkMoved()
	pc := r.chans[1]
	if pc == away || pc.park == nil || pc.park.replaced != away {
		t.Fatal("the channel to the moved subtask was not parked")
	}
	if bp := taskMetrics([]*task{tk})[0].Backpressure; bp != 4*time.Second {
		t.Fatalf("backpressure right after parking %v, want the 4s so far", bp)
	}
	pc.blocked.Add(int64(2 * time.Second))
	if bp := taskMetrics([]*task{tk})[0].Backpressure; bp != 6*time.Second {
		t.Fatalf("backpressure %v after the parked channel's sender waited 2s, want 6s", bp)
	}
}
