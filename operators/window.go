package operators

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Window is the half-open event- or processing-time interval [Start, End),
// in milliseconds.
type Window struct {
	Start int64
	End   int64
}

// MaxTimestamp returns the last instant in w: End-1. A window fires when the
// watermark (or processing time) reaches it, and its results carry it as
// their timestamp.
func (w Window) MaxTimestamp() int64 { return w.End - 1 }

// String formats w as "[start,end)".
func (w Window) String() string { return fmt.Sprintf("[%d,%d)", w.Start, w.End) }

// WindowResult is what a window aggregate or reduce emits: the key, the
// window, and the result over the window's records.
type WindowResult[K comparable, R any] struct {
	Key    K
	Window Window
	Value  R
}

type windowKind uint8

const (
	tumbling windowKind = iota + 1
	sliding
	session
)

// WindowAssigner says which windows a record belongs to: tumbling, sliding
// or session windows, on event time or processing time. Make one with the
// constructors; the zero value is invalid.
type WindowAssigner struct {
	kind      windowKind
	eventTime bool
	size      int64 // ms; tumbling and sliding
	slide     int64 // ms; sliding (== size for tumbling)
	offset    int64 // ms
	gap       int64 // ms; session

	// A duration as given when it is not a whole number of milliseconds,
	// which the fields above cut, for Validate to refuse; 0 otherwise.
	sizeF, slideF, offsetF, gapF time.Duration
}

// fraction returns d when it is not a whole number of milliseconds, else 0.
func fraction(d time.Duration) time.Duration {
	if d%time.Millisecond != 0 {
		return d
	}
	return 0
}

// TumblingEventTimeWindows returns fixed, non-overlapping windows of size on
// event time, aligned to the epoch (see WithOffset).
func TumblingEventTimeWindows(size time.Duration) WindowAssigner {
	return WindowAssigner{kind: tumbling, eventTime: true, size: size.Milliseconds(), slide: size.Milliseconds(), sizeF: fraction(size), slideF: fraction(size)}
}

// TumblingProcessingTimeWindows is TumblingEventTimeWindows on processing
// time.
func TumblingProcessingTimeWindows(size time.Duration) WindowAssigner {
	a := TumblingEventTimeWindows(size)
	a.eventTime = false
	return a
}

// SlidingEventTimeWindows returns windows of size starting every slide on
// event time; a record belongs to size/slide windows but is stored once.
func SlidingEventTimeWindows(size, slide time.Duration) WindowAssigner {
	return WindowAssigner{kind: sliding, eventTime: true, size: size.Milliseconds(), slide: slide.Milliseconds(), sizeF: fraction(size), slideF: fraction(slide)}
}

// SlidingProcessingTimeWindows is SlidingEventTimeWindows on processing
// time.
func SlidingProcessingTimeWindows(size, slide time.Duration) WindowAssigner {
	a := SlidingEventTimeWindows(size, slide)
	a.eventTime = false
	return a
}

// EventTimeSessionWindows returns per-key windows that close after gap
// without records, on event time.
func EventTimeSessionWindows(gap time.Duration) WindowAssigner {
	return WindowAssigner{kind: session, eventTime: true, gap: gap.Milliseconds(), gapF: fraction(gap)}
}

// ProcessingTimeSessionWindows is EventTimeSessionWindows on processing
// time.
func ProcessingTimeSessionWindows(gap time.Duration) WindowAssigner {
	a := EventTimeSessionWindows(gap)
	a.eventTime = false
	return a
}

// WithOffset shifts the windows of a tumbling or sliding assigner by
// offset (for example to align daily windows to a time zone: -8h for
// UTC+8, as in Flink). It must be shorter than the slide (the size of
// tumbling windows) either way; a negative one is kept as the positive
// offset that cuts the same windows (-8h of 24h windows is 16h). Session
// windows have no offset: Validate refuses one.
func (a WindowAssigner) WithOffset(offset time.Duration) WindowAssigner {
	a.offset, a.offsetF = offset.Milliseconds(), fraction(offset)
	if a.offset < 0 && a.slide > 0 && -a.offset < a.slide {
		a.offset += a.slide
	}
	return a
}

// EventTime reports whether a assigns by event time.
func (a WindowAssigner) EventTime() bool { return a.eventTime }

// IsSession reports whether a makes session windows.
func (a WindowAssigner) IsSession() bool { return a.kind == session }

// String describes a.
func (a WindowAssigner) String() string {
	domain := "event-time"
	if !a.eventTime {
		domain = "processing-time"
	}
	switch a.kind {
	case tumbling:
		return fmt.Sprintf("tumbling %s windows of %dms", domain, a.size)
	case sliding:
		return fmt.Sprintf("sliding %s windows of %dms every %dms", domain, a.size, a.slide)
	case session:
		return fmt.Sprintf("%s session windows with gap %dms", domain, a.gap)
	}
	return "invalid window assigner"
}

// StateDigest describes what of a shapes a window operator's state, for
// its state settings (actors.Vertex.StateSettings): the slices of
// tumbling and sliding windows are cut by size, slide and offset, and
// kept in event or processing time; session windows only by their time
// domain (a new gap applies to the sessions restored).
func (a WindowAssigner) StateDigest() string {
	domain := "event-time"
	if !a.eventTime {
		domain = "processing-time"
	}
	if a.kind == session {
		return "session " + domain
	}
	return fmt.Sprintf("sliced %s size=%dms slide=%dms offset=%dms", domain, a.size, a.slide, a.offset)
}

// Validate reports every problem of a at once. A duration that is not a
// whole number of milliseconds is refused, as a declared pipeline's is,
// rather than cut to the milliseconds below it (1.5ms windows of 1ms).
func (a WindowAssigner) Validate() error {
	var errs []error
	notWhole := func(key string, d time.Duration) bool {
		if d == 0 {
			return false
		}
		errs = append(errs, fmt.Errorf("%s (%s) must be a whole number of milliseconds (window times are whole milliseconds)", key, d))
		return true
	}
	switch a.kind {
	case tumbling, sliding:
		if !notWhole("window.size", a.sizeF) && a.size <= 0 {
			errs = append(errs, fmt.Errorf("window.size (%dms) must be at least 1ms (window times are whole milliseconds)", a.size))
		}
		// A tumbling window's slide is its size: the size's error says it.
		sizeIsSlide := a.kind == tumbling && a.slide == a.size
		switch {
		case a.kind == sliding && notWhole("window.slide", a.slideF):
		case a.slide <= 0 && !sizeIsSlide:
			errs = append(errs, fmt.Errorf("window.slide (%dms) must be at least 1ms", a.slide))
		case a.size > 0 && a.slide > a.size:
			errs = append(errs, fmt.Errorf("window.slide (%dms) must not exceed window.size (%dms)", a.slide, a.size))
		}
		if !notWhole("window.offset", a.offsetF) && a.slide > 0 && (a.offset < 0 || a.offset >= a.slide) {
			errs = append(errs, fmt.Errorf("window.offset (%dms) must be shorter than the slide (%dms; the size of tumbling windows), either way", a.offset, a.slide))
		}
	case session:
		if !notWhole("window.gap", a.gapF) && a.gap <= 0 {
			errs = append(errs, fmt.Errorf("window.gap (%dms) must be at least 1ms", a.gap))
		}
		// A session starts at its first record: there is nothing to shift.
		if a.offset != 0 || a.offsetF != 0 {
			given := a.offsetF
			if given == 0 {
				given = time.Duration(a.offset) * time.Millisecond
			}
			errs = append(errs, fmt.Errorf("window.offset (%s) is for tumbling and sliding windows: session windows start at their first record", given))
		}
	default:
		errs = append(errs, errors.New("window: assigner not set"))
	}
	return errors.Join(errs...)
}

// pane returns the length of the slices that tumbling and sliding windows
// are made of: gcd(size, slide).
func (a WindowAssigner) pane() int64 {
	x, y := a.size, a.slide
	for y != 0 {
		x, y = y, x%y
	}
	return x
}

// The record times a window operator accepts: for any size, slide, gap,
// offset and allowed lateness a time.Duration can express (less than
// 2^44 ms), a window's start, end and cleanup time (end + lateness) of a
// record in [minWindowTime, maxWindowTime] stay within int64. A record
// outside (an event time at the int64 extremes) has no window: it goes to
// the late-data side output, counted with the late records, instead of
// landing in a window whose bounds overflowed.
const (
	minWindowTime = math.MinInt64 / 4
	maxWindowTime = math.MaxInt64 / 4
)

// windowTime reports whether a record at ts can be put in a window.
func windowTime(ts int64) bool { return ts >= minWindowTime && ts <= maxWindowTime }

// floorTo returns the largest t' <= t with t' ≡ offset (mod step).
func floorTo(t, offset, step int64) int64 {
	r := (t - offset) % step
	if r < 0 {
		r += step
	}
	return t - r
}
