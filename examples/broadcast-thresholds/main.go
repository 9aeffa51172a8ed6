// Command broadcast-thresholds checks sensor readings against per-sensor
// thresholds that arrive on a second stream: Flink's broadcast-state
// pattern.
//
// The readings are keyed by sensor; the thresholds ("sensor_3 above
// 35.5 °C") are a small stream broadcast to every subtask of the checking
// operator, which keeps them in broadcast state: a map that every subtask
// holds the same, written only by the broadcast side. A reading above its
// sensor's threshold, or above -default for a sensor without one, is
// printed as an alert.
//
// The two inputs interleave arbitrarily: a subtask may see readings
// before the thresholds they should be checked against (and often does:
// checking each reading as it arrives gives different alerts from run to
// run). Rather than check those against the default, the operator holds
// each reading in keyed List state and registers an event-time timer at
// its timestamp, and checks the readings when their timers fire. The
// operator's watermark is the minimum of its two inputs', and the
// thresholds stream has no timestamps: its watermark stays at the minimum
// until it ends, then jumps to the maximum. So no timer fires before every
// threshold is in broadcast state, and from then on the readings are
// checked as their watermark advances. The alerts are the same on every
// run, whatever the interleaving; -threshold-rate sends the thresholds
// slowly to show it. A sensor given two thresholds gets the later one.
//
// This suits thresholds that are configuration, known at start. Rules
// that keep changing would come on an unbounded stream, which would hold
// the watermark back for ever: give it timestamps and watermarks and keep
// each sensor's thresholds by the time they take effect, or check the
// readings at once and accept that those before an update see the old
// value.
//
// The readings are -n generated readings of -sensors sensors, from a
// source with -p subtasks, checked by -p subtasks.
//
//	go run ./examples/broadcast-thresholds
//	sensor_3 at 09:43:27: 37.12 above threshold 35.50
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"time"

	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/state"
	"github.com/edgedio/edged/stream"
	"github.com/edgedio/edged/watermark"
)

// start is the event time, in unix seconds, of the first readings.
const start int64 = 1547718200

// threshold is a broadcast record: readings of Sensor above Max alert.
type threshold struct {
	Sensor string
	Max    float64
}

// alert is a reading above its threshold; Default is set when the sensor
// has no threshold of its own.
type alert struct {
	Reading operators.SensorReading
	Max     float64
	Default bool
}

func (a alert) String() string {
	which := "threshold"
	if a.Default {
		which = "default threshold"
	}
	at := time.Unix(a.Reading.Timestamp, 0).UTC().Format("15:04:05")
	return fmt.Sprintf("%s at %s: %.2f above %s %.2f", a.Reading.ID, at, a.Reading.Temperature, which, a.Max)
}

// thresholdCheck is the KeyedBroadcastProcessFunction: one instance per
// subtask, with the broadcast thresholds and the pending readings of the
// sensors the subtask owns.
type thresholdCheck struct {
	def        float64
	thresholds state.Broadcast[string, float64]         // written by the broadcast side
	view       state.ReadOnlyBroadcast[string, float64] // read by the keyed side
	pending    state.List[operators.SensorReading]      // readings not checked yet
}

func (c *thresholdCheck) Open(rt *operators.BroadcastRuntime[string]) error {
	var err error
	if c.thresholds, err = state.BroadcastState[string, float64](rt.Store(), "thresholds"); err != nil {
		return err
	}
	if c.view, err = state.ReadOnlyBroadcastState[string, float64](rt.Store(), "thresholds"); err != nil {
		return err
	}
	c.pending, err = state.NewList(rt.Backend(), rt.Keys(), state.ListDescriptor[operators.SensorReading]{Name: "pending"})
	return err
}

func (c *thresholdCheck) ProcessBroadcastElement(t threshold, _ *operators.BroadcastContext[alert]) error {
	c.thresholds.Put(t.Sensor, t.Max)
	return nil
}

// ProcessElement holds r until the watermark passes it.
func (c *thresholdCheck) ProcessElement(r operators.SensorReading, ctx *operators.KeyedContext[string, alert]) error {
	c.pending.Add(r)
	ctx.Timers().RegisterEventTimeTimer(ctx.Timestamp())
	return nil
}

// OnTimer checks the sensor's readings stamped up to ts and keeps the
// others.
func (c *thresholdCheck) OnTimer(ts int64, ctx *operators.KeyedContext[string, alert]) error {
	limit, ok := c.view.Get(ctx.CurrentKey())
	var keep []operators.SensorReading
	for r := range c.pending.All() {
		switch {
		case r.Timestamp*1000 > ts:
			keep = append(keep, r)
		case ok && r.Temperature > limit:
			ctx.Emit(alert{Reading: r, Max: limit})
		case !ok && r.Temperature > c.def:
			ctx.Emit(alert{Reading: r, Max: c.def, Default: true})
		}
	}
	c.pending.Update(keep)
	return nil
}

// config is what a run checks.
type config struct {
	n             int64       // readings
	sensors       int         // distinct sensors
	parallelism   int         // subtasks of the reading source and the check
	thresholds    []threshold // the broadcast stream
	def           float64     // threshold of sensors without one
	thresholdRate float64     // thresholds per second; 0: all at once
}

// validate reports every invalid field at once, by flag name.
func (c config) validate() error {
	var errs []error
	if c.n <= 0 {
		errs = append(errs, fmt.Errorf("-n (%d) must be positive", c.n))
	}
	if c.sensors <= 0 {
		errs = append(errs, fmt.Errorf("-sensors (%d) must be positive", c.sensors))
	}
	if c.parallelism <= 0 {
		errs = append(errs, fmt.Errorf("-p (%d) must be positive", c.parallelism))
	}
	if c.thresholdRate < 0 {
		errs = append(errs, fmt.Errorf("-threshold-rate (%g) must not be negative", c.thresholdRate))
	}
	return errors.Join(errs...)
}

// parseThresholds parses "sensor_1=37,sensor_3=35.5".
func parseThresholds(s string) ([]threshold, error) {
	var ts []threshold
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		id, v, ok := strings.Cut(f, "=")
		deg, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if !ok || strings.TrimSpace(id) == "" || err != nil {
			return nil, fmt.Errorf("-thresholds: %q: want sensor=degrees", f)
		}
		ts = append(ts, threshold{Sensor: strings.TrimSpace(id), Max: deg})
	}
	return ts, nil
}

func main() {
	var cfg config
	flag.Int64Var(&cfg.n, "n", 300, "readings to generate")
	flag.IntVar(&cfg.sensors, "sensors", 5, "number of sensors (sensor_0, sensor_1, ...)")
	flag.IntVar(&cfg.parallelism, "p", 2, "parallelism of the readings and the check")
	flag.Float64Var(&cfg.def, "default", 39, "threshold of sensors without one, in °C")
	flag.Float64Var(&cfg.thresholdRate, "threshold-rate", 0, "thresholds sent per second; 0 sends them all at once")
	thresholds := flag.String("thresholds", "sensor_1=37,sensor_3=35.5", "per-sensor thresholds, sensor=degrees,...")
	flag.Parse()

	var err error
	if cfg.thresholds, err = parseThresholds(*thresholds); err != nil {
		fmt.Fprintln(os.Stderr, "broadcast-thresholds:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Stdout, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "broadcast-thresholds:", err)
		os.Exit(1)
	}
}

// run executes the job and writes one line per alert to out.
func run(ctx context.Context, out io.Writer, cfg config) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	env := stream.NewEnvironment("broadcast-thresholds", stream.WithParallelism(cfg.parallelism))
	readings := stream.FromSource(env, "sensors", func() operators.Source[operators.SensorReading] {
		return operators.SensorGenerator(operators.GeneratorConfig{Count: cfg.n, Keys: cfg.sensors, Start: start})
	}).AssignTimestampsAndWatermarks("event-time",
		// Each generator subtask emits its readings in timestamp order.
		watermark.ForMonotonous(func(r operators.SensorReading) int64 {
			return r.Timestamp * 1000 // unix seconds to event-time milliseconds
		}))
	thresholds := stream.FromSource(env, "thresholds", func() operators.Source[threshold] {
		return newSliceSource(cfg.thresholds, cfg.thresholdRate)
	}).SetParallelism(1)

	bySensor := stream.KeyBy(readings, func(r operators.SensorReading) string { return r.ID })
	alerts := stream.ConnectBroadcast(bySensor, thresholds, "check",
		func() operators.KeyedBroadcastProcessFunction[string, operators.SensorReading, threshold, alert] {
			return &thresholdCheck{def: cfg.def}
		}).UID("threshold-check")
	alerts.To("print", func() operators.Sink[alert] {
		return operators.NewPrintSink(out, alert.String)
	}).SetParallelism(1)
	return env.Execute(ctx)
}

// newSliceSource returns a source of the records of s, rate a second (0:
// as fast as possible), for one subtask.
func newSliceSource[T any](s []T, rate float64) operators.Source[T] {
	if len(s) == 0 {
		return emptySource[T]{}
	}
	return operators.NewGenerator(operators.GeneratorConfig{Count: int64(len(s)), Rate: rate},
		func(i int64) T { return s[i] })
}

// emptySource is a source that ends at once (a Generator with Count 0
// would never end).
type emptySource[T any] struct{ operators.Base }

func (emptySource[T]) Poll(operators.Collector[T], int) (operators.Status, error) {
	return operators.EndOfInput, nil
}

func (emptySource[T]) Available() <-chan struct{} { return nil }
