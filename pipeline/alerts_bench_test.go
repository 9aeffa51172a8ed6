package pipeline

import (
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/edgedio/edged/stream"
)

// BenchmarkAlerts runs configs/demo.yaml (10 s windows and a "held for
// 5 s" alert per sensor, event time) on a bounded generator of 200,000
// readings of 100 sensors, without and with the alert, and reports the
// records per second of each.
func BenchmarkAlerts(b *testing.B) {
	cfg, err := Load("../configs/demo.yaml")
	if err != nil {
		b.Fatal(err)
	}
	const count = 200_000
	run := func(alerts bool) time.Duration {
		pc := cfg.Pipelines[0]
		pc.Source.Generator.Count, pc.Source.Generator.Keys = count, 100
		if !alerts {
			pc.Alerts = nil
		}
		pc.plan = nil // compiled again by BuildJob
		opts, err := EnvOptions(pc)
		if err != nil {
			b.Fatal(err)
		}
		env := stream.NewEnvironment(pc.Name, opts...)
		if _, err := BuildJob(pc, env, io.Discard); err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		if err := env.Execute(b.Context()); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	for _, alerts := range []bool{false, true} {
		b.Run(fmt.Sprintf("alerts=%v", alerts), func(b *testing.B) {
			var d time.Duration
			for b.Loop() {
				d += run(alerts)
			}
			b.ReportMetric(float64(b.N)*count/d.Seconds(), "records/s")
		})
	}
}
