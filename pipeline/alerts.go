package pipeline

import (
	"cmp"
	"math"
	"slices"
	"strings"

	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/state"
)

// AlertState is a key's alert state. It is exported only so that the
// runtime's codec can encode it.
type AlertState struct {
	// Since is when alert i's condition became true; valid if Active[i].
	Since  [maxAlerts]int64
	Active [maxAlerts]bool
	Fired  [maxAlerts]bool
	// Last is the time of the key's latest record looked at; valid if
	// Seen.
	Last        int64
	Seen        bool
	SilentFired bool
}

// lateAlertError is the error of a dead letter that reached the alerts
// behind the watermark and not after the latest reading of its key they
// looked at.
const lateAlertError = "late: behind the watermark, and the alerts had already looked at a reading of its key at or after its event time"

// alertFn is the keyed process function of alerts and silent. A condition
// "held for D" means it was true on every record of the key from the
// record that made it true (at Since) until Since+D; the alert fires once
// time reaches Since+D: either a record of the key with a timestamp at or
// after it (before that record is looked at), or a timer when the
// watermark (processing time without event time) passes it. A false record
// re-arms the alert. Silent fires at Last+D when no record came by then.
//
// With event time the records of a key are looked at in timestamp order,
// not in arrival order: a record ahead of the watermark waits in pending
// until the watermark passes its timestamp. The records of one key reach
// this operator over as many channels as the pipeline has decoding
// subtasks, interleaved differently in every run; in arrival order a
// replay after a restore would see another sequence, and fire other
// alerts, than the run before it. A record that comes behind the
// watermark is looked at at once if it is after the key's latest record
// looked at (Last), and is a late dead letter otherwise: the key's state
// has moved past its time.
type alertFn struct {
	pl      *plan
	name    string
	dead    operators.OutputTag[DeadLetter]
	count   *counters
	ev      *evaluator
	st      state.Value[AlertState]
	pending state.List[Row]
	// pendingAt is the earliest timestamp in pending, the one event-time
	// timer that wakes the key for them.
	pendingAt state.Value[int64]
}

func (f *alertFn) Open(rt *operators.KeyedRuntime[string]) error {
	f.ev = newEvaluator(f.pl.schema)
	var err error
	f.st, err = state.NewValue(rt.Backend(), rt.Keys(), state.ValueDescriptor[AlertState]{Name: "alerts"})
	if err != nil || !f.pl.eventTime {
		return err
	}
	f.pending, err = state.NewList(rt.Backend(), rt.Keys(), state.ListDescriptor[Row]{Name: "alerts-pending"})
	if err != nil {
		return err
	}
	f.pendingAt, err = state.NewValue(rt.Backend(), rt.Keys(), state.ValueDescriptor[int64]{Name: "alerts-pending-at"})
	return err
}

func (f *alertFn) now(ctx *operators.KeyedContext[string, Row]) int64 {
	if f.pl.eventTime {
		return ctx.Timestamp()
	}
	return ctx.CurrentProcessingTime()
}

func (f *alertFn) register(ctx *operators.KeyedContext[string, Row], ts int64) {
	if f.pl.eventTime {
		ctx.Timers().RegisterEventTimeTimer(ts)
	} else {
		ctx.Timers().RegisterProcessingTimeTimer(ts)
	}
}

func (f *alertFn) emit(ctx *operators.KeyedContext[string, Row], name string, since, at int64) {
	var r Row
	pl := f.pl
	r.SetStr(pl.alKey.Slot, ctx.CurrentKey())
	r.SetStr(pl.alName.Slot, name)
	r.SetInt(pl.alSince.Slot, since)
	r.SetInt(pl.alAt.Slot, at)
	ctx.Emit(r)
}

// fireDue emits what is due at time now.
func (f *alertFn) fireDue(ctx *operators.KeyedContext[string, Row], s *AlertState, now int64) {
	for i := range f.pl.alerts {
		a := &f.pl.alerts[i]
		if s.Active[i] && !s.Fired[i] && now >= s.Since[i]+a.forMs {
			f.emit(ctx, a.name, s.Since[i], s.Since[i]+a.forMs)
			s.Fired[i] = true
		}
	}
	if f.pl.silentMs > 0 && s.Seen && !s.SilentFired && now >= s.Last+f.pl.silentMs {
		f.emit(ctx, f.pl.silentName, s.Last, s.Last+f.pl.silentMs)
		s.SilentFired = true
	}
}

func (f *alertFn) ProcessElement(r Row, ctx *operators.KeyedContext[string, Row]) error {
	if f.pl.eventTime {
		if ts := ctx.Timestamp(); ts > ctx.CurrentWatermark() {
			f.pending.Add(r)
			if at, ok := f.pendingAt.Get(); !ok || ts < at {
				if ok {
					ctx.Timers().DeleteEventTimeTimer(at)
				}
				f.pendingAt.Update(ts)
				ctx.Timers().RegisterEventTimeTimer(ts)
			}
			return nil
		}
	}
	// Without event time, or behind the watermark: at once.
	s, _ := f.st.Get()
	if f.pl.eventTime && s.Seen && ctx.Timestamp() <= s.Last {
		// Behind the watermark and not after the key's latest reading
		// looked at: the key's alert state moved past its time, so it
		// cannot be put in its place.
		d := newDeadLetter(f.name, r.withOrigin(lateAlertError), string(r.AppendJSON(nil, f.pl.schema)))
		f.count.deadLetter(d)
		f.dead.Emit(ctx, d)
		return nil
	}
	f.apply(ctx, &s, []Row{r}, f.now(ctx))
	f.st.Update(s)
	return nil
}

// apply fires what is due at now, the time of records rs, and then looks
// at rs, which all have that time. They count together, whatever their
// order: an alert is re-armed if its condition is false on one of them,
// and made true at now if it is true on every one. A record whose
// condition fails to evaluate is a dead letter, and re-arms the alert as
// a false one does: the condition was not true on it.
func (f *alertFn) apply(ctx *operators.KeyedContext[string, Row], s *AlertState, rs []Row, now int64) {
	f.fireDue(ctx, s, now)
	for i := range f.pl.alerts {
		a := &f.pl.alerts[i]
		anyTrue, anyFalse := false, false
		for j := range rs {
			ok, err := f.ev.test(&a.program, &rs[j])
			if err != nil {
				d := newDeadLetter(f.name, rs[j].withOrigin("alert "+a.name+": "+err.Error()), string(rs[j].AppendJSON(nil, f.pl.schema)))
				f.count.deadLetter(d)
				f.dead.Emit(ctx, d)
				anyFalse = true // not true on it: it re-arms the alert
				continue
			}
			anyTrue, anyFalse = anyTrue || ok, anyFalse || !ok
		}
		switch {
		case anyFalse:
			s.Active[i], s.Fired[i] = false, false
		case anyTrue && !s.Active[i]:
			s.Active[i], s.Fired[i], s.Since[i] = true, false, now
			f.register(ctx, now+a.forMs)
		}
	}
	if !s.Seen || now >= s.Last {
		s.Last, s.Seen, s.SilentFired = now, true, false
		if f.pl.silentMs > 0 {
			f.register(ctx, now+f.pl.silentMs)
		}
	}
}

func (f *alertFn) OnTimer(ts int64, ctx *operators.KeyedContext[string, Row]) error {
	s, ok := f.st.Get()
	if f.pl.eventTime && ctx.TimeDomain() == operators.EventTime && f.takePending(ctx, &s) {
		ok = true
	}
	if !ok {
		return nil
	}
	f.fireDue(ctx, &s, ts)
	f.st.Update(s)
	return nil
}

// takePending looks at the pending records the watermark passed, in
// timestamp order (those of one timestamp together, see apply), and reports
// whether there were any; the key's timer then moves to the earliest of
// the records left.
func (f *alertFn) takePending(ctx *operators.KeyedContext[string, Row], s *AlertState) bool {
	wm, slot := ctx.CurrentWatermark(), f.pl.ts.Slot
	if at, ok := f.pendingAt.Get(); !ok || at > wm {
		return false
	}
	var take, rest []Row
	next := int64(math.MaxInt64)
	for r := range f.pending.All() {
		if ts := r.Int(slot); ts <= wm {
			take = append(take, r)
		} else {
			rest = append(rest, r)
			next = min(next, ts)
		}
	}
	slices.SortStableFunc(take, func(a, b Row) int { return cmp.Compare(a.Int(slot), b.Int(slot)) })
	for i := 0; i < len(take); {
		ts, j := take[i].Int(slot), i+1
		for j < len(take) && take[j].Int(slot) == ts {
			j++
		}
		f.apply(ctx, s, take[i:j], ts)
		i = j
	}
	f.pending.Update(rest)
	if len(rest) == 0 {
		f.pendingAt.Clear()
	} else {
		f.pendingAt.Update(next)
		ctx.Timers().RegisterEventTimeTimer(next)
	}
	return len(take) > 0
}

// alertsDigest is the alerts operator's state settings
// (stream.StateSettings): its state keeps each alert's progress by
// position, so a snapshot restores only into the same alerts, by name, in
// the same order (their conditions and durations may change).
func alertsDigest(alerts []AlertConfig) string {
	names := make([]string, len(alerts))
	for i, a := range alerts {
		names[i] = a.Name
	}
	return "alerts " + strings.Join(names, ",")
}
