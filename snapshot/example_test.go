package snapshot_test

import (
	"fmt"
	"time"

	"github.com/edgedio/edged/snapshot"
)

// The checkpoint and restart settings of the seeds, from Flink's Java:
//
//	env.enableCheckpointing(30000L);
//	env.getCheckpointConfig().setCheckpointingMode(CheckpointingMode.EXACTLY_ONCE);
//	env.getCheckpointConfig().setCheckpointTimeout(60000L);
//	env.getCheckpointConfig().setMaxConcurrentCheckpoints(2);
//	env.getCheckpointConfig().setMinPauseBetweenCheckpoints(2000L);
//	env.getCheckpointConfig().setPreferCheckpointForRecovery(true);
//	env.getCheckpointConfig().setTolerableCheckpointFailureNumber(0);
//	env.setRestartStrategy(RestartStrategies.fixedDelayRestart(3, 10000L));
//	env.setRestartStrategy(RestartStrategies.failureRateRestart(3, Time.minutes(10), Time.minutes(1)));
func Example_seedSettings() {
	cfg := snapshot.DefaultConfig()
	cfg.Interval = 30 * time.Second // enableCheckpointing(30000)
	cfg.Mode = snapshot.ExactlyOnce
	cfg.Timeout = 60 * time.Second
	cfg.MaxConcurrent = 2
	cfg.MinPause = 2 * time.Second
	cfg.PreferCheckpointForRecovery = true
	cfg.TolerableFailures = 0
	cfg.Dir = "/var/lib/edged/jobs/sensors"
	if err := cfg.Validate(); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("checkpoint every %s, %s, timeout %s, max concurrent %d, min pause %s, retain %d\n",
		cfg.Interval, cfg.Mode, cfg.Timeout, cfg.MaxConcurrent, cfg.MinPause, cfg.Retain)

	// The YAML form of the same: restart: {strategy: fixed_delay, attempts: 3, delay: 10s}.
	fixed := &snapshot.FixedDelay{Attempts: 3, Delay: 10 * time.Second}
	start := time.Date(2024, 5, 1, 8, 0, 0, 0, time.UTC)
	for i := range 4 {
		restart, delay := fixed.OnFailure(start.Add(time.Duration(i) * time.Hour))
		fmt.Printf("fixed delay, failure %d: restart=%v after %s\n", i+1, restart, delay)
	}

	rate := &snapshot.FailureRate{MaxFailures: 3, Interval: 10 * time.Minute, Delay: time.Minute}
	for _, at := range []time.Duration{0, 2 * time.Minute, 4 * time.Minute, 6 * time.Minute} {
		restart, delay := rate.OnFailure(start.Add(at))
		fmt.Printf("failure rate, failure at +%s: restart=%v after %s\n", at, restart, delay)
	}

	// Output:
	// checkpoint every 30s, exactly_once, timeout 1m0s, max concurrent 2, min pause 2s, retain 2
	// fixed delay, failure 1: restart=true after 10s
	// fixed delay, failure 2: restart=true after 10s
	// fixed delay, failure 3: restart=true after 10s
	// fixed delay, failure 4: restart=false after 0s
	// failure rate, failure at +0s: restart=true after 1m0s
	// failure rate, failure at +2m0s: restart=true after 1m0s
	// failure rate, failure at +4m0s: restart=true after 1m0s
	// failure rate, failure at +6m0s: restart=false after 0s
}

// A coordinator driven by hand: the caller ticks it, and carries out what
// it returns.
func ExampleCoordinator() {
	cfg := snapshot.DefaultConfig()
	cfg.Interval, cfg.Dir = 30*time.Second, "/data/snapshots"
	src := snapshot.TaskID{Vertex: "mqtt-source", Subtask: 0}
	sink := snapshot.TaskID{Vertex: "alerts", Subtask: 0}
	c, err := snapshot.NewCoordinator(cfg, []snapshot.TaskID{src, sink}, []snapshot.TaskID{src})
	if err != nil {
		fmt.Println(err)
		return
	}
	t0 := time.UnixMilli(0)
	c.Tick(t0) // starts the clock
	show := func(acts []snapshot.Action) {
		for _, a := range acts {
			fmt.Printf("%T %+v\n", a, a)
		}
	}
	show(c.Tick(t0.Add(30 * time.Second)))
	show(c.Step(t0.Add(31*time.Second), snapshot.Ack{Checkpoint: 1, Task: src}))
	acts := c.Step(t0.Add(32*time.Second), snapshot.Ack{Checkpoint: 1, Task: sink})
	fmt.Printf("%T %d\n", acts[0], acts[0].(snapshot.Complete).Checkpoint)
	// The caller writes the metadata (Store.Commit) and reports it.
	show(c.Step(t0.Add(32*time.Second), snapshot.Persisted{Checkpoint: 1, Path: "/data/snapshots/checkpoints/chk-1"}))
	// Output:
	// snapshot.Trigger {Checkpoint:1 Timestamp:30000 Mode:exactly_once Savepoint:false Stop:false Path: Final:false}
	// snapshot.Complete 1
	// snapshot.NotifyComplete {Checkpoint:1 Stop:false Final:false}
}
