package actors

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/edgedio/edged/codec"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/watermark"
)

// timeHandle is the handle of a head operator whose task saved tt.
func timeHandle(t *testing.T, tt *taskTime) snapshot.Handle {
	t.Helper()
	kg, err := codec.For[sections]().Append(nil, sections{})
	if err != nil {
		t.Fatal(err)
	}
	if tt != nil {
		if kg, err = appendTaskTime(kg, tt); err != nil {
			t.Fatal(err)
		}
	}
	return snapshot.Handle{KeyGroups: kg}
}

// A restored task's processing time starts one millisecond after the
// latest processing time of the old subtasks (Proc, kept after the rest of
// the task time), at the same parallelism and rescaled; a snapshot
// without it (taken before it was kept) sets no floor, and a damaged one
// is refused.
func TestRestoreProcessingTimeFloor(t *testing.T) {
	r := &host{maxP: 128}
	at := func(proc int64) *taskTime { return &taskTime{Output: 5, Proc: proc} }
	md := &snapshot.Metadata{Operators: []snapshot.Operator{{UID: "w", Parallelism: 2,
		Subtasks: []snapshot.Handle{timeHandle(t, at(7000)), timeHandle(t, at(5000))}}}}
	for _, p := range []int{1, 2, 3} {
		for sub := range p {
			tk := testTask(r, p, sub)
			if err := r.restoreTime(md, tk); err != nil {
				t.Fatal(err)
			}
			if tk.procFloor != 7001 {
				t.Fatalf("parallelism %d subtask %d: processing time floor %d, want 7001", p, sub, tk.procFloor)
			}
		}
	}
	tt, err := decodeTaskTime(md.Operators[0].Subtasks[1].KeyGroups)
	if err != nil || tt.Proc != 5000 || tt.Output != 5 {
		t.Fatalf("decoded %+v, %v; want Proc 5000, Output 5", tt, err)
	}
	// Without Proc the handle is what it was before Proc was kept.
	md.Operators[0].Subtasks = []snapshot.Handle{timeHandle(t, at(0)), timeHandle(t, at(0))}
	tk := testTask(r, 2, 0)
	if err := r.restoreTime(md, tk); err != nil || tk.procFloor != 0 {
		t.Fatalf("without processing time: %v, floor %d", err, tk.procFloor)
	}
	kg, err := codec.For[sections]().Append(nil, sections{})
	if err != nil {
		t.Fatal(err)
	}
	if kg, err = taskTimeCodec.Append(kg, *at(0)); err != nil || string(kg) != string(md.Operators[0].Subtasks[0].KeyGroups) {
		t.Fatalf("a task time without Proc is not encoded as before (%v)", err)
	}
	// A trailer cut short is corrupt.
	damaged := timeHandle(t, at(1<<40)).KeyGroups
	damaged = damaged[:len(damaged)-1]
	if _, err := decodeTaskTime(damaged); err == nil {
		t.Fatal("a cut processing time decoded")
	}
}

// testTask is subtask sub of a one-vertex chain "w" of parallelism p with
// two input channels.
func testTask(r *host, p, sub int) *task {
	chain := &Chain{Vertices: []*Vertex{{UID: "w", Parallelism: p}}}
	return &task{run: r, chain: chain, subtask: sub, inChans: make([]*channel, 2), merger: watermark.NewMerger(2)}
}

// A task restored at the same parallelism with the same inputs gets its
// watermarks back: each channel's, the task's and its output's; stream
// status is not restored: an idle channel comes back active at the task's
// watermark, and the output active.
func TestRestoreTimeExact(t *testing.T) {
	r := &host{maxP: 128}
	orig := testTask(r, 1, 0)
	orig.merger.Watermark(0, 300)
	orig.merger.Watermark(1, 200)
	orig.merger.SetIdle(1, true)
	orig.merger.StatusChanged()
	orig.live.watermark.Store(300)
	orig.idle = true
	tt := orig.captureTime()
	md := &snapshot.Metadata{Operators: []snapshot.Operator{{UID: "w", Parallelism: 1, Subtasks: []snapshot.Handle{timeHandle(t, tt)}}}}
	got := testTask(r, 1, 0)
	if err := r.restoreTime(md, got); err != nil {
		t.Fatal(err)
	}
	if !got.restoredTime || got.merger.Current() != 300 || got.live.watermark.Load() != 300 {
		t.Fatalf("restored watermark %d output %d (restored %t), want 300", got.merger.Current(), got.live.watermark.Load(), got.restoredTime)
	}
	for ch, want := range []watermark.ChannelState{{Watermark: 300}, {Watermark: 300}} {
		if wm, idle := got.merger.Channel(ch); wm != want.Watermark || idle != want.Idle {
			t.Fatalf("channel %d: %d idle=%t, want %+v", ch, wm, idle, want)
		}
	}
	if got.idle {
		t.Fatal("the output was restored idle")
	}
	// The channel that was idle holds the watermark back: channel 0 racing
	// ahead (its backlog, read first after the restore) does not move the
	// task past what channel 1 may still send, until channel 1 says it is
	// idle again.
	if wm, adv := got.merger.Watermark(0, 900); adv || wm != 300 {
		t.Fatalf("channel 0 at 900 moved the restored task to %d", wm)
	}
	if wm, adv := got.merger.SetIdle(1, true); !adv || wm != 900 {
		t.Fatalf("channel 1 idle again: task at %d (advanced %t), want 900", wm, adv)
	}
	// A record at 250 is late for the restored task as for the original;
	// a fresh task would take it as on time.
	if got.merger.Current() < 250 {
		t.Fatal("a record late before the failure is on time after it")
	}
	// A snapshot without task time (older versions) restores nothing.
	md.Operators[0].Subtasks[0] = timeHandle(t, nil)
	fresh := testTask(r, 1, 0)
	if err := r.restoreTime(md, fresh); err != nil || fresh.restoredTime || fresh.merger.Current() != watermark.MinWatermark {
		t.Fatalf("restore without task time: %v, restored %t, watermark %d", err, fresh.restoredTime, fresh.merger.Current())
	}
}

// Rescaled, a subtask starts at the smallest watermark of the old
// subtasks whose key groups it takes over, on every channel.
func TestRestoreTimeRescaled(t *testing.T) {
	r := &host{maxP: 128}
	old := func(wm int64) *taskTime {
		return &taskTime{HasMerger: true, Merger: watermark.MergerState{Combined: wm, Channels: []watermark.ChannelState{{Watermark: wm}, {Watermark: wm + 5}}}}
	}
	md := &snapshot.Metadata{Operators: []snapshot.Operator{{UID: "w", Parallelism: 2,
		Subtasks: []snapshot.Handle{timeHandle(t, old(100)), timeHandle(t, old(200))}}}}
	// Old subtask 0 had key groups [0,64), 1 [64,128); new 0 [0,43),
	// 1 [43,86), 2 [86,128).
	for sub, want := range []int64{100, 100, 200} {
		tk := testTask(r, 3, sub)
		if err := r.restoreTime(md, tk); err != nil {
			t.Fatal(err)
		}
		if tk.merger.Current() != want || !tk.restoredTime {
			t.Fatalf("new subtask %d: watermark %d, want %d", sub, tk.merger.Current(), want)
		}
		for ch := range 2 {
			if wm, idle := tk.merger.Channel(ch); wm != want || idle {
				t.Fatalf("new subtask %d channel %d: %d idle=%t", sub, ch, wm, idle)
			}
		}
	}
	// Same parallelism, other inputs: the subtask's own watermark, on
	// every channel.
	tk := testTask(r, 2, 1)
	if err := r.restoreTime(md, tk); err != nil || tk.merger.Current() != 200 {
		t.Fatalf("other inputs: %v, watermark %d, want 200", err, tk.merger.Current())
	}
}

// An operator that left only its task's event time in a snapshot (no
// state file) is not state the job would lose: a job without it restores
// without allowing non-restored state; one with a state file still
// needs the permission.
func TestCheckRestoreIgnoresEventTimeOnly(t *testing.T) {
	job := &Job{Name: "j", Vertices: []*Vertex{{UID: "kept", Parallelism: 1}}}
	md := &snapshot.Metadata{MaxParallelism: 128, Operators: []snapshot.Operator{
		{UID: "kept", Parallelism: 1, Subtasks: []snapshot.Handle{{File: "kept.0.state"}}},
		{UID: "removed-map", Parallelism: 1, Subtasks: []snapshot.Handle{timeHandle(t, &taskTime{})}},
	}}
	if err := checkRestore(job, md, false); err != nil {
		t.Fatalf("restore without a stateless operator: %v", err)
	}
	md.Operators[1].Subtasks[0].File = "removed-map.0.state"
	if err := checkRestore(job, md, false); err == nil {
		t.Fatal("restore without an operator with state succeeded")
	}
}

// recordingRouter records what a task broadcasts.
type recordingRouter struct{ sent []message }

func (r *recordingRouter) flush()                      {}
func (r *recordingRouter) opened() bool                { return false }
func (r *recordingRouter) channels() []*channel        { return nil }
func (r *recordingRouter) replace(int, *channel) error { return nil }
func (r *recordingRouter) broadcast(m func(ch *channel) message) {
	r.sent = append(r.sent, m(nil))
}

// A task whose output is idle holds the watermarks its operators emit
// (an idle output must not become active by itself: nothing would make it
// idle again), and sends the latest once its output is active again; the
// final watermark makes it active and goes out.
func TestWatermarkOutOfIdleTaskIsHeldUntilActive(t *testing.T) {
	rt := &recordingRouter{}
	tk := testTask(&host{maxP: 128}, 1, 0)
	tk.routers = []router{rt}
	tk.live.watermark.Store(math.MinInt64)
	tk.status(true)
	tk.watermark(0, 500)
	tk.watermark(0, 600)
	tk.watermark(0, 550)
	if len(rt.sent) != 1 || !tk.idle {
		t.Fatalf("an idle task sent %d messages after its idle status (idle %t), want none", len(rt.sent)-1, tk.idle)
	}
	tk.status(false)
	if len(rt.sent) != 3 {
		t.Fatalf("sent %d messages on becoming active, want the status then the held watermark", len(rt.sent)-1)
	}
	st, ok := rt.sent[1].(*statusMsg)
	wm, ok2 := rt.sent[2].(*watermarkMsg)
	if !ok || st.idle || !ok2 || wm.wm != 600 {
		t.Fatalf("sent %#v, %#v, want active status then watermark 600", rt.sent[1], rt.sent[2])
	}
	// Idle again with nothing held: becoming active sends the status only.
	tk.status(true)
	tk.status(false)
	if len(rt.sent) != 5 {
		t.Fatalf("sent %d messages, want two statuses", len(rt.sent)-3)
	}
	// A held watermark not above the one sent is not sent again.
	tk.status(true)
	tk.watermark(0, 600)
	tk.status(false)
	if len(rt.sent) != 7 {
		t.Fatalf("sent %d messages, want two statuses", len(rt.sent)-5)
	}
	tk.status(true)
	tk.watermark(0, watermark.MaxWatermark)
	if len(rt.sent) != 10 || tk.idle {
		t.Fatalf("the final watermark out of an idle task: %d messages (idle %t), want active status then the watermark", len(rt.sent)-8, tk.idle)
	}
	if st, ok := rt.sent[8].(*statusMsg); !ok || st.idle {
		t.Fatalf("sent %#v, want the active status", rt.sent[8])
	}
	if wm, ok := rt.sent[9].(*watermarkMsg); !ok || wm.wm != watermark.MaxWatermark {
		t.Fatalf("sent %#v, want the final watermark", rt.sent[9])
	}
}

// sentTime renders what a task broadcast: "wm=N", "idle" or "active".
func sentTime(t *testing.T, sent []message) []string {
	t.Helper()
	out := make([]string, 0, len(sent))
	for _, m := range sent {
		switch m := m.(type) {
		case *watermarkMsg:
			out = append(out, fmt.Sprintf("wm=%d", m.wm))
		case *statusMsg:
			if m.idle {
				out = append(out, "idle")
			} else {
				out = append(out, "active")
			}
		default:
			t.Fatalf("sent %T", m)
		}
	}
	return out
}

// A task whose inputs all fall quiet forwards the largest of their
// watermarks, then its idle status, whichever input goes idle last: the
// window subtasks downstream of the decoding subtasks fire every window
// the readings closed once every decoding subtask is idle, as the one
// whose watermark is ahead (it took a reading far ahead, say) and the one
// behind time out together, in either order. Before, the task held the
// watermark of the input that went idle last, so that when the input
// ahead went idle first the last windows never fired while the stream was
// quiet, and two window subtasks that saw the idle statuses in other
// orders held different watermarks.
func TestIdleInputsForwardLargestWatermarkWhicheverIsLast(t *testing.T) {
	const ahead, behind = 781_999, 181_998
	for _, order := range [][2]int{{0, 1}, {1, 0}} {
		rt := &recordingRouter{}
		tk := testTask(&host{maxP: 128}, 1, 0)
		tk.routers = []router{rt}
		tk.inChans[0], tk.inChans[1] = newChannel(0, tk, nil), newChannel(1, tk, nil)
		tk.dispatch(&watermarkMsg{ch: tk.inChans[0], wm: ahead})
		tk.dispatch(&watermarkMsg{ch: tk.inChans[1], wm: behind})
		for _, ch := range order {
			tk.dispatch(&statusMsg{ch: tk.inChans[ch], idle: true})
		}
		want := []string{fmt.Sprintf("wm=%d", behind), fmt.Sprintf("wm=%d", ahead), "idle"}
		if got := sentTime(t, rt.sent); !slices.Equal(got, want) {
			t.Fatalf("input %d idle first: sent %v, want %v", order[0], got, want)
		}
		if tk.merger.Current() != ahead || !tk.idle {
			t.Fatalf("input %d idle first: watermark %d idle %t, want %d idle", order[0], tk.merger.Current(), tk.idle, ahead)
		}

		// While every input is idle, a watermark on one of them still
		// counts for the largest: the task takes it, and holds it, its
		// output idle, until an input is back; then the task's status
		// goes first, then the held watermark and the next.
		rt.sent = nil
		tk.dispatch(&watermarkMsg{ch: tk.inChans[order[1]], wm: ahead + 500})
		if got := sentTime(t, rt.sent); len(got) != 0 || !tk.idle || tk.merger.Current() != ahead+500 {
			t.Fatalf("watermark on an idle input of an idle task: sent %v (idle %t), watermark %d, want none, idle, %d", got, tk.idle, tk.merger.Current(), ahead+500)
		}
		tk.dispatch(&statusMsg{ch: tk.inChans[0], idle: false})
		tk.dispatch(&watermarkMsg{ch: tk.inChans[0], wm: ahead + 900})
		want = []string{"active", fmt.Sprintf("wm=%d", ahead+500), fmt.Sprintf("wm=%d", ahead+900)}
		if got := sentTime(t, rt.sent); !slices.Equal(got, want) || tk.idle {
			t.Fatalf("an input back: sent %v (idle %t), want %v", got, tk.idle, want)
		}
	}
}

// Rescaled, a subtask's operators learn the largest watermark of the old
// subtasks whose key groups they take over when it is ahead of the one
// they restore (operators.Context.RestoredStateWatermark): their state
// may hold windows that fired before the snapshot although they lie after
// the restored watermark. They learn nothing when the two are the same,
// and that the state's watermark is unknown (math.MaxInt64) from a
// snapshot without event time.
func TestRestoreTimeRescaledTellsTheStateWatermark(t *testing.T) {
	r := &host{maxP: 128}
	old := func(wm int64) *taskTime {
		return &taskTime{HasMerger: true, Merger: watermark.MergerState{Combined: wm, Channels: []watermark.ChannelState{{Watermark: wm}, {Watermark: wm}}}}
	}
	md := &snapshot.Metadata{Operators: []snapshot.Operator{{UID: "w", Parallelism: 2,
		Subtasks: []snapshot.Handle{timeHandle(t, old(100)), timeHandle(t, old(200))}}}}
	// Old subtask 0 had key groups [0,64), 1 [64,128); new 0 [0,43),
	// 1 [43,86), 2 [86,128): new subtask 1 restores 100 and holds state
	// written at 200.
	for sub, want := range []int64{0, 200, 0} {
		tk := testTask(r, 3, sub)
		tk.ctxs = []*operators.Context{{}}
		if err := r.restoreTime(md, tk); err != nil {
			t.Fatal(err)
		}
		got := tk.ctxs[0].RestoredStateWatermark
		switch {
		case want == 0 && got != nil:
			t.Errorf("new subtask %d: state watermark %d, want none (restored at its own)", sub, *got)
		case want != 0 && (got == nil || *got != want):
			t.Errorf("new subtask %d: state watermark %v, want %d", sub, got, want)
		}
	}
	md.Operators[0].Subtasks[1] = timeHandle(t, nil)
	md.Operators[0].Parallelism = 2
	tk := testTask(r, 2, 1)
	tk.ctxs = []*operators.Context{{}}
	if err := r.restoreTime(md, tk); err != nil {
		t.Fatal(err)
	}
	if got := tk.ctxs[0].RestoredStateWatermark; got == nil || *got != watermark.MaxWatermark {
		t.Errorf("snapshot without event time: state watermark %v, want math.MaxInt64", got)
	}
}
