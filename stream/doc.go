// Package stream is the typed API of edged: an Environment builds a job
// graph from sources, transformations, keyed streams and sinks, and
// Execute runs it on the actor runtime.
//
//	env := stream.NewEnvironment("rolling-average")
//	readings := stream.FromSource(env, "sensors", func() operators.Source[operators.SensorReading] {
//		return operators.SensorGenerator(operators.GeneratorConfig{Count: 1_000_000})
//	})
//	avg := stream.Aggregate(stream.KeyBy(readings, bySensor), "avg", averager{}).UID("avg")
//	avg.To("print", func() operators.Sink[average] {
//		return operators.NewPrintSink(os.Stdout, average.String)
//	})
//	err := env.Execute(ctx)
//
// The package's Example is this job, runnable. A job with checkpoints
// (WithCheckpointing) refuses a source that cannot be rewound
// (operators.Replayer), unless AllowAtMostOnceSources is given.
//
// Go methods cannot have type parameters, so operations that change the
// element type (Map, FlatMap, KeyBy, Aggregate) are functions; those that
// keep it (Filter, Union, SetParallelism, UID) are methods.
//
// An Environment is not safe for concurrent use while a job is built.
// User functions run on the subtask's goroutine, one call at a time per
// subtask; a function shared by several subtasks must be safe for that.
package stream
