// Command window-average computes the average temperature of every sensor
// in 10-second tumbling event-time windows, Flink's "windowed average".
//
// The readings come from the built-in sensor generator (-n readings of
// -sensors sensors, one reading per sensor per second of event time),
// mapped to shift some timestamps back by up to two seconds, as readings
// that reach a gateway out of order do. Event time is the reading's
// timestamp; every 200 ms of processing time each source subtask emits a
// watermark of the largest timestamp it has seen minus a bounded
// out-of-orderness of 2 s, so a window [t0,t1) fires once every subtask
// has seen a reading stamped t1+2s or later (and every window still open
// fires when the input ends). Because no reading is more than 2 s out of
// order, none is late: whatever the watermarks' timing, every reading
// lands in its window and the output is the same on every run.
//
// The window operator folds each window's readings into a count and a sum
// (WindowAggregate with an AggregateFunction), so it keeps two numbers per
// sensor and window rather than the readings. It runs with -p subtasks
// (default 2) and prints with Flink's "2> " subtask prefix; lines of
// different subtasks interleave in any order.
//
//	go run ./examples/window-average
//	1> sensor_3 [09:43:30,09:43:40) count=11 avg=29.59
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"sync"
	"time"

	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/stream"
	"github.com/edgedio/edged/watermark"
)

// start is the event time, in unix seconds, of the first reading: a
// multiple of the window size, so that windows start with the input.
const start int64 = 1547718200

// windowSize is the length of the tumbling windows.
const windowSize = 10 * time.Second

// maxOutOfOrderness bounds how far a reading's timestamp may lag behind the
// largest timestamp seen before it.
const maxOutOfOrderness = 2 * time.Second

// countSum is the accumulator of a window: the number of readings and the
// sum of their temperatures in hundredths of a degree, so that the sum is
// exact and does not depend on the order of the readings.
type countSum struct {
	Count int64
	Sum   int64
}

// average folds readings into a countSum; the window operator keeps one
// accumulator per sensor and window.
type average struct{}

func (average) CreateAccumulator() countSum { return countSum{} }

func (average) Add(r operators.SensorReading, acc countSum) countSum {
	return countSum{Count: acc.Count + 1, Sum: acc.Sum + centi(r.Temperature)}
}

func (average) Result(acc countSum) countSum { return acc }

// centi returns t in hundredths of a degree.
func centi(t float64) int64 { return int64(math.Round(t * 100)) }

// format prints one window result: "sensor_3 [09:43:30,09:43:40) count=10
// avg=29.87" (times of day in UTC).
func format(r operators.WindowResult[string, countSum]) string {
	avg := float64(r.Value.Sum) / float64(r.Value.Count) / 100
	return fmt.Sprintf("%s [%s,%s) count=%d avg=%.2f",
		r.Key, clock(r.Window.Start), clock(r.Window.End), r.Value.Count, avg)
}

// clock formats an event time in milliseconds as a UTC time of day.
func clock(ms int64) string { return time.UnixMilli(ms).UTC().Format("15:04:05") }

// jitter moves a reading's timestamp back by 0, 1 or 2 seconds, chosen by
// a hash of the sensor and the time, so the stream is out of order by at
// most maxOutOfOrderness.
func jitter(r operators.SensorReading) operators.SensorReading {
	h := uint64(r.Timestamp)*0x9e3779b97f4a7c15 ^ uint64(len(r.ID))
	for _, c := range []byte(r.ID) {
		h = (h ^ uint64(c)) * 0x100000001b3
	}
	r.Timestamp -= int64(h>>33) % 3
	return r
}

// generator returns the source of n readings of the given number of
// sensors, one reading per sensor per second from start.
func generator(n int64, sensors int) *operators.Generator[operators.SensorReading] {
	return operators.SensorGenerator(operators.GeneratorConfig{Count: n, Keys: sensors, Start: start})
}

func main() {
	n := flag.Int64("n", 300, "readings to generate")
	sensors := flag.Int("sensors", 5, "number of sensors")
	parallelism := flag.Int("p", 2, "parallelism of the source and the window operator")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Stdout, *n, *sensors, *parallelism); err != nil {
		fmt.Fprintln(os.Stderr, "window-average:", err)
		os.Exit(1)
	}
}

// run executes the job and writes one line per sensor and window to out.
func run(ctx context.Context, out io.Writer, n int64, sensors, parallelism int) error {
	if n <= 0 || sensors <= 0 || parallelism <= 0 {
		return fmt.Errorf("-n (%d), -sensors (%d) and -p (%d) must be positive", n, sensors, parallelism)
	}
	out = &syncWriter{w: out} // the print subtasks share it

	env := stream.NewEnvironment("window-average", stream.WithParallelism(parallelism))
	readings := stream.FromSource(env, "sensors", func() operators.Source[operators.SensorReading] {
		return generator(n, sensors)
	})
	shuffled := stream.Map(readings, "jitter", func(r operators.SensorReading) (operators.SensorReading, error) {
		return jitter(r), nil
	})
	timed := shuffled.AssignTimestampsAndWatermarks("event-time",
		watermark.ForBoundedOutOfOrderness(maxOutOfOrderness, func(r operators.SensorReading) int64 {
			return r.Timestamp * 1000 // unix seconds to event-time milliseconds
		}))
	bySensor := stream.KeyBy(timed, func(r operators.SensorReading) string { return r.ID })
	windows := stream.Window(bySensor, operators.TumblingEventTimeWindows(windowSize))
	averages := stream.WindowAggregate(windows, "average", average{}).UID("window-average")
	averages.To("print", func() operators.Sink[operators.WindowResult[string, countSum]] {
		return operators.NewPrintSink(out, format)
	})
	return env.Execute(ctx)
}

// syncWriter serialises the Writes of the print subtasks.
type syncWriter struct {
	mu sync.Mutex // guards w
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
