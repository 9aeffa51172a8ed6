// Command silent-sensor raises an alert when a sensor has sent nothing for
// 30 seconds of event time, and another when it reports again: a
// KeyedProcessFunction with one event-time timer per sensor.
//
// Every reading moves its sensor's timer to 30 s after the reading:
// it deletes the timer of the previous reading and registers a new one.
// So a timer only fires when the watermark passes 30 s after the sensor's
// last reading, meaning the other sensors' readings moved event time on
// while this one stayed silent; OnTimer emits "silent since ...". The
// function keeps the time of the last reading and whether an alert is out
// in keyed Value state, and the next reading of a silent sensor emits
// "back at ...".
//
// At the end of a bounded input the final watermark fires every pending
// timer: every sensor would end up "silent", including those that
// reported until the last second. A timer that fires only because the
// input ended fires with the watermark at its maximum, and is printed as
// "last reading ..., input ended before 30s of silence" instead. A timer
// stamped before the feed's last reading fires earlier, at the latest
// with the watermark just below that reading's timestamp, which the
// timestamp assigner emits right before the final one. So a sensor is
// reported silent exactly when it sent nothing for 30 s before the feed's
// last reading. (In an unbounded job the final watermark never comes, and
// every timer that fires is a silent sensor.)
//
// As in examples/rising-temperature, the watermark lags behind the
// readings, so a sensor's next reading may arrive after its 30 s of
// silence but before the watermark fired the timer. That reading emits the
// alert itself, so the output depends on event time only, not on when the
// periodic watermark is emitted. Deciding by the watermark also needs the
// feed's last watermarks in order, so the feed is read by one source
// subtask; the detector runs with -p subtasks.
//
// The simulated feed has -sensors sensors reporting once a second for
// -seconds seconds. sensor_k with k mod 3 = 1 reports throughout; with
// k mod 3 = 2 it stops for good k seconds after the middle of the feed;
// with k mod 3 = 0 it pauses from a quarter of the way for 15 + 10k/3
// seconds (so sensor_3's 25 s pause raises no alert and
// sensor_6's 35 s one does). -rate paces the feed so that alerts come as
// event time advances.
//
//	go run ./examples/silent-sensor
//	sensor_2 silent since 09:44:22 (no reading for 30s at 09:44:52)
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"time"

	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/state"
	"github.com/edgedio/edged/stream"
	"github.com/edgedio/edged/watermark"
)

// start is the event time, in unix seconds, of the first readings.
const start int64 = 1547718200

// silence is how long a sensor may send nothing before it is reported.
const silence = 30 * time.Second

// watermarkInterval is how often, in processing time, the watermark is
// emitted.
const watermarkInterval = 10 * time.Millisecond

// kind is what an alert says.
type kind int

const (
	silent     kind = iota // no reading for silence
	back                   // a reading after an alert
	endOfInput             // the input ended less than silence after the last reading
)

// alert is about Sensor, whose last reading before the alert was at
// Since; At is when it became silent (silent) or reported again (back).
// Times are event times in milliseconds.
type alert struct {
	Sensor string
	Kind   kind
	Since  int64
	At     int64
}

func (a alert) String() string {
	switch a.Kind {
	case silent:
		return fmt.Sprintf("%s silent since %s (no reading for %s at %s)", a.Sensor, clock(a.Since), silence, clock(a.At))
	case back:
		return fmt.Sprintf("%s back at %s after silence since %s", a.Sensor, clock(a.At), clock(a.Since))
	default:
		return fmt.Sprintf("%s last reading %s, input ended before %s of silence", a.Sensor, clock(a.Since), silence)
	}
}

// clock formats an event time in milliseconds as a UTC time of day.
func clock(ms int64) string { return time.UnixMilli(ms).UTC().Format("15:04:05") }

// silenceDetector is the KeyedProcessFunction: one instance per subtask,
// with the state of the sensors that subtask owns. A sensor's timer is
// always lastSeen + silence.
type silenceDetector struct {
	lastSeen state.Value[int64] // event time of the sensor's latest reading
	alerted  state.Value[bool]  // a silent alert is out and the sensor has not reported since
}

func (d *silenceDetector) Open(rt *operators.KeyedRuntime[string]) error {
	var err error
	d.lastSeen, err = state.NewValue(rt.Backend(), rt.Keys(), state.ValueDescriptor[int64]{Name: "last-seen"})
	if err != nil {
		return err
	}
	d.alerted, err = state.NewValue(rt.Backend(), rt.Keys(), state.ValueDescriptor[bool]{Name: "alerted"})
	return err
}

func (d *silenceDetector) ProcessElement(r operators.SensorReading, ctx *operators.KeyedContext[string, alert]) error {
	ts := ctx.Timestamp()
	last, seen := d.lastSeen.Get()
	if seen {
		if ts <= last {
			return nil // an older or repeated reading does not move the deadline
		}
		timer := last + silence.Milliseconds()
		alerted, _ := d.alerted.Get()
		if timer < ts && !alerted {
			// The sensor was silent for 30 s, but the watermark has not
			// fired the timer yet: alert now.
			ctx.Emit(alert{Sensor: r.ID, Kind: silent, Since: last, At: timer})
			alerted = true
		}
		if alerted {
			ctx.Emit(alert{Sensor: r.ID, Kind: back, Since: last, At: ts})
			d.alerted.Clear()
		}
		ctx.Timers().DeleteEventTimeTimer(timer) // does nothing if it fired
	}
	d.lastSeen.Update(ts)
	ctx.Timers().RegisterEventTimeTimer(ts + silence.Milliseconds())
	return nil
}

func (d *silenceDetector) OnTimer(ts int64, ctx *operators.KeyedContext[string, alert]) error {
	a := alert{Sensor: ctx.CurrentKey(), Kind: silent, Since: ts - silence.Milliseconds(), At: ts}
	if ctx.CurrentWatermark() == watermark.MaxWatermark {
		a.Kind = endOfInput
	} else {
		d.alerted.Update(true)
	}
	ctx.Emit(a)
	return nil
}

// feed returns the simulated readings, ordered by time (see the package
// comment for which sensor reports when).
func feed(sensors, seconds int) []operators.SensorReading {
	var rs []operators.SensorReading
	for s := range seconds {
		for k := 1; k <= sensors; k++ {
			if !reports(k, s, seconds) {
				continue
			}
			rs = append(rs, operators.SensorReading{
				ID:          "sensor_" + strconv.Itoa(k),
				Timestamp:   start + int64(s),
				Temperature: float64(20+k) + float64(s%7)/10,
			})
		}
	}
	return rs
}

// reports says whether sensor_k sends a reading at second s of the feed.
func reports(k, s, seconds int) bool {
	switch k % 3 {
	case 2: // stops
		return s <= seconds/2+k
	case 0: // pauses
		from := seconds / 4
		return s < from || s >= from+15+10*k/3
	}
	return true
}

func main() {
	sensors := flag.Int("sensors", 6, "number of sensors")
	seconds := flag.Int("seconds", 120, "seconds of readings")
	parallelism := flag.Int("p", 2, "parallelism of the detector")
	rate := flag.Float64("rate", 0, "readings per second of processing time; 0 sends them as fast as possible")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Stdout, *sensors, *seconds, *parallelism, *rate); err != nil {
		fmt.Fprintln(os.Stderr, "silent-sensor:", err)
		os.Exit(1)
	}
}

// run executes the job and writes one line per alert to out. With a rate
// the feed sends that many readings per second, so watermarks (every
// watermarkInterval) advance while it runs; the alerts are the same.
func run(ctx context.Context, out io.Writer, sensors, seconds, parallelism int, rate float64) error {
	if sensors <= 0 || seconds <= 0 || parallelism <= 0 || rate < 0 {
		return fmt.Errorf("-sensors (%d), -seconds (%d) and -p (%d) must be positive, -rate (%g) not negative", sensors, seconds, parallelism, rate)
	}
	rs := feed(sensors, seconds)

	env := stream.NewEnvironment("silent-sensor", stream.WithParallelism(parallelism))
	// One subtask, so that the watermarks follow the whole feed in order.
	readings := stream.FromSource(env, "feed", func() operators.Source[operators.SensorReading] {
		return operators.NewGenerator(operators.GeneratorConfig{Count: int64(len(rs)), Rate: rate},
			func(i int64) operators.SensorReading { return rs[i] })
	}).SetParallelism(1)
	timed := readings.AssignTimestampsAndWatermarks("event-time",
		watermark.ForMonotonous(func(r operators.SensorReading) int64 {
			return r.Timestamp * 1000 // unix seconds to event-time milliseconds
		}).WithInterval(watermarkInterval)).SetParallelism(1)
	bySensor := stream.KeyBy(timed, func(r operators.SensorReading) string { return r.ID })
	alerts := stream.KeyedProcess(bySensor, "silence", func() operators.KeyedProcessFunction[string, operators.SensorReading, alert] {
		return &silenceDetector{}
	}).UID("silent-sensor")
	alerts.To("print", func() operators.Sink[alert] {
		return operators.NewPrintSink(out, alert.String)
	}).SetParallelism(1)
	return env.Execute(ctx)
}
