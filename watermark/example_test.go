package watermark_test

import (
	"fmt"
	"time"

	"github.com/edgedio/edged/watermark"
)

// A task with three input channels: its watermark is the minimum over the
// channels that are not idle.
func ExampleMerger() {
	m := watermark.NewMerger(3)
	show := func(combined int64, advanced bool) {
		if idle, changed := m.StatusChanged(); changed {
			fmt.Println("forward status, idle:", idle)
		}
		if advanced {
			fmt.Println("forward watermark", combined)
		}
	}
	show(m.Watermark(0, 100))
	show(m.Watermark(1, 80))
	show(m.Watermark(2, 120)) // every channel has a watermark: min is 80
	show(m.SetIdle(1, true))  // channel 1 is left out: min is 100
	show(m.SetIdle(0, true))
	show(m.SetIdle(2, true))  // every channel idle: the task is idle
	show(m.SetIdle(1, false)) // channel 1 is back, held at 120
	show(m.Watermark(1, 130))
	// Output:
	// forward watermark 80
	// forward watermark 100
	// forward watermark 120
	// forward status, idle: true
	// forward status, idle: false
	// forward watermark 130
}

type reading struct {
	Sensor string
	At     time.Time
}

// A timestamp assigner: records feed the generator and the idle detector,
// and every interval of processing time the subtask emits what they say.
func ExampleStrategy() {
	s := watermark.ForBoundedOutOfOrderness(2*time.Second, func(r reading) int64 { return r.At.UnixMilli() }).
		WithIdleness(time.Minute)
	if err := s.Validate(); err != nil {
		fmt.Println(err)
		return
	}
	gen := s.NewGenerator()
	idle := watermark.NewIdleDetector(s.IdleTimeout)

	t0 := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	now := t0.UnixMilli() // processing time, from the task's clock
	for _, sec := range []int{10, 7, 12} {
		r := reading{Sensor: "s1", At: t0.Add(time.Duration(sec) * time.Second)}
		gen.OnEvent(s.Timestamp(r))
		idle.OnEvent(now)
	}
	tick := func(now int64) {
		if isIdle, changed := idle.Check(now); changed && isIdle {
			fmt.Println("emit status idle")
		}
		if wm, ok := gen.OnPeriodicEmit(); ok {
			fmt.Println("emit watermark", time.UnixMilli(wm).UTC().Format(time.TimeOnly+".000"))
		}
	}
	tick(now + s.Interval.Milliseconds())
	tick(now + time.Minute.Milliseconds())
	// Output:
	// emit watermark 12:00:09.999
	// emit status idle
}
