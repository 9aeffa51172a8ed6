package operators

import (
	"slices"
	"time"

	"github.com/edgedio/edged/state"
)

// SessionWindow is the operator of session windows: each record opens the
// window [ts, ts+gap), which merges with every window of its key it
// overlaps or touches, so a session closes after gap without records.
type SessionWindow[K comparable, T any] struct {
	windowCore[K, T]
	contents contents[K, Window, T]
	sessions state.Value[[]Window] // the current key's windows, sorted
	gap      int64
	absorbed []Window
	one      [1]Window
}

func newSession[K comparable, T any](name string, key func(T) K, a WindowAssigner, lateness time.Duration, lateTag string, c contents[K, Window, T]) *SessionWindow[K, T] {
	o := &SessionWindow[K, T]{contents: c, gap: a.gap}
	o.name, o.key, o.assigner, o.lateness, o.lateTag = name, key, a, lateness.Milliseconds(), lateTag
	return o
}

// Open registers the window state.
func (o *SessionWindow[K, T]) Open(ctx *Context) error {
	if err := o.openCore(ctx, o.onTimer); err != nil {
		return err
	}
	if err := o.contents.open(ctx.State, &o.keys, o.name+"/contents"); err != nil {
		return err
	}
	s, err := state.NewValue[K, []Window](ctx.State, &o.keys, state.ValueDescriptor[[]Window]{Name: o.name + "/sessions"})
	o.sessions = s
	return err
}

func intersects(a, b Window) bool { return a.Start <= b.End && b.Start <= a.End }

// Collect adds a record to its session, merging sessions it joins.
func (o *SessionWindow[K, T]) Collect(v T) {
	o.setKey(o.key(v))
	ts, current := o.times()
	if !windowTime(ts) {
		o.dropLate(v)
		return
	}
	merged := Window{Start: ts, End: ts + o.gap}
	wins, _ := o.sessions.Get()
	o.absorbed = o.absorbed[:0]
	for _, x := range wins {
		if intersects(x, merged) {
			merged = Window{Start: min(merged.Start, x.Start), End: max(merged.End, x.End)}
			o.absorbed = append(o.absorbed, x)
		}
	}
	if o.assigner.eventTime && merged.MaxTimestamp()+o.lateness <= current {
		o.dropLate(v)
		return
	}
	// Move the state of every absorbed window into the merged one.
	sources := o.absorbed[:0:0]
	for _, x := range o.absorbed {
		if x != merged {
			sources = append(sources, x)
		}
	}
	if len(sources) > 0 {
		o.contents.merge(merged, sources)
	}
	o.contents.add(merged, v)
	keep := wins[:0]
	for _, x := range wins {
		if !intersects(x, merged) {
			keep = append(keep, x)
		}
	}
	i, _ := slices.BinarySearchFunc(keep, merged, func(a, b Window) int { return int(min(max(a.Start-b.Start, -1), 1)) })
	keep = slices.Insert(keep, i, merged)
	o.sessions.Update(keep)
	// The timers of the absorbed windows go, unless a session of the key
	// still needs one of them: a timer is per key and time, and the end
	// of one session can be the cleanup time of another. Left behind, a
	// session extended by every record (a sensor that never pauses for
	// gap) would keep a timer per record until the watermark passed them.
	for _, x := range sources {
		o.dropTimer(x.MaxTimestamp(), keep)
		if o.lateness > 0 {
			o.dropTimer(x.MaxTimestamp()+o.lateness, keep)
		}
	}
	if merged.MaxTimestamp() > current {
		o.register(merged.MaxTimestamp())
	} else {
		// Late within the allowed lateness: fire again now, clean up later.
		o.fire(merged)
		o.register(merged.MaxTimestamp() + o.lateness)
	}
}

// dropTimer deletes the current key's timer at ts, unless one of the
// key's sessions (wins) fires or is cleaned up at ts.
func (o *SessionWindow[K, T]) dropTimer(ts int64, wins []Window) {
	for _, w := range wins {
		if w.MaxTimestamp() == ts || w.MaxTimestamp()+o.lateness == ts {
			return
		}
	}
	o.unregister(ts)
}

func (o *SessionWindow[K, T]) fire(w Window) {
	o.emitAt(w)
	o.one[0] = w
	if err := o.contents.fire(o.keys.Key(), w, o.one[:]); err != nil {
		Fail(err)
	}
}

// onTimer fires the sessions ending at ts+1 and cleans up those whose
// lateness has passed.
func (o *SessionWindow[K, T]) onTimer(ts int64, _ TimeDomain) error {
	wins, _ := o.sessions.Get()
	keep := wins[:0]
	for _, x := range wins {
		if x.MaxTimestamp() == ts {
			o.fire(x)
			if o.lateness > 0 {
				o.register(ts + o.lateness)
			}
		}
		if x.MaxTimestamp()+o.lateness <= ts {
			o.contents.clear(x)
		} else {
			keep = append(keep, x)
		}
	}
	if len(keep) == 0 {
		o.sessions.Clear()
	} else if len(keep) != len(wins) {
		o.sessions.Update(keep)
	}
	return nil
}
