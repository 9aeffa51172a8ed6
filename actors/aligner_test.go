package actors

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// alignScript runs a script of steps against an aligner and returns what it
// did, one line per step.
func alignScript(a *Aligner, steps string) string {
	var out strings.Builder
	now := time.Unix(0, 0)
	for _, s := range strings.Fields(steps) {
		now = now.Add(time.Millisecond)
		var act AlignAction
		var ch int
		var id int64
		switch {
		case strings.HasPrefix(s, "b"): // b<ch>:<id> barrier
			fmt.Sscanf(s, "b%d:%d", &ch, &id)
			act = a.Barrier(now, ch, id)
		case strings.HasPrefix(s, "e"): // e<ch> end of stream
			fmt.Sscanf(s, "e%d", &ch)
			act = a.EndOfStream(now, ch)
		case strings.HasPrefix(s, "x"): // x<id> abort
			fmt.Sscanf(s, "x%d", &id)
			act = a.Abort(id)
		}
		fmt.Fprintf(&out, "%s:", s)
		if act.Snapshot != 0 {
			fmt.Fprintf(&out, " snapshot=%d align=%s", act.Snapshot, act.Alignment)
		}
		if act.Aborted != 0 {
			fmt.Fprintf(&out, " aborted=%d", act.Aborted)
		}
		if act.Release {
			out.WriteString(" release")
		}
		var blocked []string
		for c := range a.arrived {
			if a.Blocked(c) {
				blocked = append(blocked, fmt.Sprint(c))
			}
		}
		if len(blocked) > 0 {
			fmt.Fprintf(&out, " blocked=%s", strings.Join(blocked, ","))
		}
		out.WriteString("\n")
	}
	return out.String()
}

func TestAligner(t *testing.T) {
	for _, tc := range []struct {
		name        string
		channels    int
		exactlyOnce bool
		steps       string
		want        string
	}{
		{"exactly-once blocks until all arrived", 3, true, "b0:1 b2:1 b1:1",
			"b0:1: blocked=0\nb2:1: blocked=0,2\nb1:1: snapshot=1 align=2ms release\n"},
		{"at-least-once never blocks", 3, false, "b0:1 b2:1 b1:1",
			"b0:1:\nb2:1:\nb1:1: snapshot=1 align=2ms\n"},
		{"single channel snapshots at once", 1, true, "b0:1 b0:2",
			"b0:1: snapshot=1 align=0s release\nb0:2: snapshot=2 align=0s release\n"},
		{"ended channel does not hold up", 2, true, "b0:1 e1",
			"b0:1: blocked=0\ne1: snapshot=1 align=1ms release\n"},
		{"ended before barrier", 2, true, "e1 b0:1",
			"e1:\nb0:1: snapshot=1 align=0s release\n"},
		{"newer barrier aborts older", 2, true, "b0:1 b1:2 b0:2",
			"b0:1: blocked=0\nb1:2: aborted=1 release blocked=1\nb0:2: snapshot=2 align=1ms release\n"},
		{"late barrier of aborted checkpoint ignored", 2, true, "b0:1 x1 b1:1 b1:2 b0:2",
			"b0:1: blocked=0\nx1: aborted=1 release\nb1:1:\nb1:2: blocked=1\nb0:2: snapshot=2 align=1ms release\n"},
		{"abort of another checkpoint changes nothing", 2, true, "b0:3 x2",
			"b0:3: blocked=0\nx2: blocked=0\n"},
		{"abort of a newer checkpoint keeps an older one aligning", 2, true, "x2 b0:1 b1:1",
			"x2:\nb0:1: blocked=0\nb1:1: snapshot=1 align=1ms release\n"},
		{"barriers of a checkpoint aborted before they came ignored", 2, true, "x2 b0:1 b1:1 b0:2 b1:2 b0:3 b1:3",
			"x2:\nb0:1: blocked=0\nb1:1: snapshot=1 align=1ms release\nb0:2:\nb1:2:\nb0:3: blocked=0\nb1:3: snapshot=3 align=1ms release\n"},
		{"abort of a newer checkpoint while aligning ignores its barriers", 2, true, "b0:1 x2 b1:1 b0:2 b1:2",
			"b0:1: blocked=0\nx2: blocked=0\nb1:1: snapshot=1 align=2ms release\nb0:2:\nb1:2:\n"},
		{"overlapping checkpoints in order", 2, true, "b0:1 b1:1 b1:2 b0:2",
			"b0:1: blocked=0\nb1:1: snapshot=1 align=1ms release\nb1:2: blocked=1\nb0:2: snapshot=2 align=1ms release\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := alignScript(NewAligner(tc.channels, tc.exactlyOnce), tc.steps)
			if got != tc.want {
				t.Fatalf("steps %q:\ngot\n%swant\n%s", tc.steps, got, tc.want)
			}
		})
	}
}

// Checkpoints aborted before their barriers came are remembered, at most
// maxAborted of them (the newest): a task where every checkpoint is
// aborted first (a sink that declines each) does not grow the set.
func TestAlignerRemembersBoundedAborts(t *testing.T) {
	a := NewAligner(2, true)
	for id := int64(1); id <= 10*maxAborted; id++ {
		a.Abort(id)
	}
	if n := len(a.aborted); n != maxAborted {
		t.Fatalf("%d aborted checkpoints remembered, want %d", n, maxAborted)
	}
	now := time.Now()
	if act := a.Barrier(now, 0, 10*maxAborted); act != (AlignAction{}) || a.Blocked(0) {
		t.Fatalf("a barrier of the newest aborted checkpoint: %+v, blocked %v, want it ignored", act, a.Blocked(0))
	}
	// The next checkpoint aligns and completes, and the set empties.
	a.Barrier(now, 0, 10*maxAborted+1)
	if act := a.Barrier(now, 1, 10*maxAborted+1); act.Snapshot != 10*maxAborted+1 {
		t.Fatalf("the next checkpoint: %+v, want its snapshot", act)
	}
	if n := len(a.aborted); n != 0 {
		t.Fatalf("%d aborted checkpoints remembered after a later one completed, want 0", n)
	}
}
