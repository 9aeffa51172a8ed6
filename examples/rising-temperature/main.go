// Command rising-temperature raises an alert when a sensor's temperature
// has risen continuously for 10 seconds of event time: Flink's classic
// KeyedProcessFunction example, on event time instead of processing time.
//
// For every sensor the function keeps, in keyed Value state, the last
// temperature and the pending timer. A reading warmer than the last one
// registers an event-time timer 10 s after it, unless one is pending; a
// colder one deletes the pending timer. When the watermark passes a timer,
// no colder reading came in those 10 s, and OnTimer emits the alert.
//
// Two things make the alerts depend on event time only, not on when the
// periodic watermark happens to be emitted:
//
//   - The watermark lags behind the readings, so a reading stamped after a
//     pending timer can arrive before the timer fires; a colder one would
//     then delete a timer whose 10 s had already passed. So a reading
//     stamped after the pending timer first emits that timer's alert, as
//     the timer would have if the watermark had been on time.
//   - When the input ends, the final watermark fires every pending timer,
//     including those whose 10 s had not passed by the last reading. Those
//     fire with the watermark at its maximum and are printed as "still
//     rising at end of input" rather than as alerts. (A timer stamped
//     before the last reading fires at the latest with the watermark just
//     below that reading's timestamp, which the timestamp assigner emits
//     right before the final one.)
//
// The detector compares consecutive readings of a sensor, so it needs each
// sensor's readings in timestamp order: the simulated feed is ordered and
// is read by one source subtask (a source with several subtasks could
// interleave one sensor's readings). The detector itself runs with -p
// subtasks, each owning a share of the sensors.
//
// The feed has -sensors sensors reporting every second for -seconds
// seconds; sensor_k's temperature climbs by 0.5 °C a second and drops back
// every 4k seconds, so sensor_1 and sensor_2 never rise for 10 s and the
// others do, more often the longer their cycle. By default the feed is
// sent as fast as the job takes it, so most timers are overtaken by later
// readings or fire at the end; with -rate 20 it is paced and alerts come
// as the watermark advances. Either way the alerts are the same.
//
//	go run ./examples/rising-temperature
//	sensor_3 rising since 09:43:21 for 10s at 09:43:31
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

// watermarkInterval is how often, in processing time, the watermark is
// emitted.
const watermarkInterval = 10 * time.Millisecond

// riseFor is how long a temperature must keep rising to raise an alert.
const riseFor = 10 * time.Second

// alert says that Sensor's temperature rose from Since to At (event times
// in milliseconds); EndOfInput marks a rise that was still going on, for
// less than riseFor, when the input ended.
type alert struct {
	Sensor     string
	Since      int64
	At         int64
	EndOfInput bool
}

func (a alert) String() string {
	if a.EndOfInput {
		return fmt.Sprintf("%s still rising at end of input (since %s)", a.Sensor, clock(a.Since))
	}
	return fmt.Sprintf("%s rising since %s for %s at %s", a.Sensor, clock(a.Since), riseFor, clock(a.At))
}

// clock formats an event time in milliseconds as a UTC time of day.
func clock(ms int64) string { return time.UnixMilli(ms).UTC().Format("15:04:05") }

// risingDetector is the KeyedProcessFunction: one instance per subtask,
// with the state of the sensors that subtask owns.
type risingDetector struct {
	last  state.Value[float64] // the sensor's last temperature
	timer state.Value[int64]   // the pending event-time timer, if any
}

func (d *risingDetector) Open(rt *operators.KeyedRuntime[string]) error {
	var err error
	d.last, err = state.NewValue(rt.Backend(), rt.Keys(), state.ValueDescriptor[float64]{Name: "last-temperature"})
	if err != nil {
		return err
	}
	d.timer, err = state.NewValue(rt.Backend(), rt.Keys(), state.ValueDescriptor[int64]{Name: "timer"})
	return err
}

func (d *risingDetector) ProcessElement(r operators.SensorReading, ctx *operators.KeyedContext[string, alert]) error {
	ts := ctx.Timestamp()
	timer, pending := d.timer.Get()
	if pending && timer < ts {
		// The rise outlasted the timer, which the watermark has not
		// reached yet: fire it now.
		ctx.Timers().DeleteEventTimeTimer(timer)
		d.timer.Clear()
		pending = false
		ctx.Emit(alert{Sensor: r.ID, Since: timer - riseFor.Milliseconds(), At: timer})
	}
	prev, seen := d.last.Get()
	d.last.Update(r.Temperature)
	switch {
	case !seen:
	case r.Temperature > prev && !pending:
		timer = ts + riseFor.Milliseconds()
		ctx.Timers().RegisterEventTimeTimer(timer)
		d.timer.Update(timer)
	case r.Temperature < prev && pending:
		ctx.Timers().DeleteEventTimeTimer(timer)
		d.timer.Clear()
	}
	return nil
}

func (d *risingDetector) OnTimer(ts int64, ctx *operators.KeyedContext[string, alert]) error {
	d.timer.Clear()
	ctx.Emit(alert{
		Sensor:     ctx.CurrentKey(),
		Since:      ts - riseFor.Milliseconds(),
		At:         ts,
		EndOfInput: ctx.CurrentWatermark() == watermark.MaxWatermark,
	})
	return nil
}

// feed returns the simulated readings, ordered by time: every sensor
// reports once a second; sensor_k climbs 0.5 °C a second from 20+k °C and
// drops back every 4k seconds.
func feed(sensors, seconds int) []operators.SensorReading {
	rs := make([]operators.SensorReading, 0, sensors*seconds)
	for s := range seconds {
		for k := 1; k <= sensors; k++ {
			rs = append(rs, operators.SensorReading{
				ID:          "sensor_" + strconv.Itoa(k),
				Timestamp:   start + int64(s),
				Temperature: float64(20+k) + 0.5*float64(s%(4*k)),
			})
		}
	}
	return rs
}

func main() {
	sensors := flag.Int("sensors", 6, "number of sensors")
	seconds := flag.Int("seconds", 60, "seconds of readings")
	parallelism := flag.Int("p", 2, "parallelism of the detector")
	rate := flag.Float64("rate", 0, "readings per second of processing time; 0 sends them as fast as possible")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Stdout, *sensors, *seconds, *parallelism, *rate); err != nil {
		fmt.Fprintln(os.Stderr, "rising-temperature:", err)
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

	env := stream.NewEnvironment("rising-temperature", stream.WithParallelism(parallelism))
	// One subtask, so that each sensor's readings stay in order.
	readings := stream.FromSource(env, "feed", func() operators.Source[operators.SensorReading] {
		return operators.NewGenerator(operators.GeneratorConfig{Count: int64(len(rs)), Rate: rate},
			func(i int64) operators.SensorReading { return rs[i] })
	}).SetParallelism(1)
	timed := readings.AssignTimestampsAndWatermarks("event-time",
		watermark.ForMonotonous(func(r operators.SensorReading) int64 {
			return r.Timestamp * 1000 // unix seconds to event-time milliseconds
		}).WithInterval(watermarkInterval)).SetParallelism(1)
	bySensor := stream.KeyBy(timed, func(r operators.SensorReading) string { return r.ID })
	alerts := stream.KeyedProcess(bySensor, "rising", func() operators.KeyedProcessFunction[string, operators.SensorReading, alert] {
		return &risingDetector{}
	}).UID("rising-temperature")
	alerts.To("print", func() operators.Sink[alert] {
		return operators.NewPrintSink(out, alert.String)
	}).SetParallelism(1)
	return env.Execute(ctx)
}
