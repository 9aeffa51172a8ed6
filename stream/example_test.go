package stream_test

import (
	"context"
	"fmt"
	"os"

	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/stream"
)

// average is a running count and sum of one sensor's temperatures.
type average struct {
	ID    string
	Count int
	Sum   float64
}

// String formats a as "<sensor>: <n> readings, average <avg>".
func (a average) String() string {
	return fmt.Sprintf("%s: %d readings, average %.2f", a.ID, a.Count, a.Sum/float64(a.Count))
}

type averager struct{}

func (averager) CreateAccumulator() average { return average{} }

func (averager) Add(r operators.SensorReading, a average) average {
	return average{ID: r.ID, Count: a.Count + 1, Sum: a.Sum + r.Temperature}
}

func (averager) Result(a average) average { return a }

// A rolling average per sensor over a bounded generator, printed by a
// sink; the package documentation shows the same job.
func Example() {
	env := stream.NewEnvironment("rolling-average")
	readings := stream.FromSource(env, "sensors", func() operators.Source[operators.SensorReading] {
		return operators.SensorGenerator(operators.GeneratorConfig{Count: 4, Keys: 2})
	})
	bySensor := func(r operators.SensorReading) string { return r.ID }
	avg := stream.Aggregate(stream.KeyBy(readings, bySensor), "avg", averager{}).UID("avg")
	avg.To("print", func() operators.Sink[average] {
		return operators.NewPrintSink(os.Stdout, average.String)
	})
	if err := env.Execute(context.Background()); err != nil {
		fmt.Println(err)
	}
	// Output:
	// sensor_0: 1 readings, average 35.35
	// sensor_1: 1 readings, average 24.65
	// sensor_0: 2 readings, average 28.23
	// sensor_1: 2 readings, average 27.59
}
