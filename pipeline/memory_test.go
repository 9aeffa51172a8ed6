package pipeline

import (
	"testing"
	"time"
)

// node.memory parses sizes with units, fills in the defaults of what is
// left out, and refuses what would not bound memory.
func TestNodeMemoryConfig(t *testing.T) {
	cfg, err := Parse([]byte(goodPipeline))
	if err != nil {
		t.Fatal(err)
	}
	got := cfg.Node.Memory.WithDefaults()
	want := MemoryConfig{Limit: 56 << 20, GCPercent: 100, BatchSize: 256, Credits: 8,
		MQTTPendingBytes: 8 << 20, BrokerSessionBytes: 16 << 20, BrokerRetainedBytes: 16 << 20,
		BrokerConnections: 1000, BrokerClientSubscriptions: 1000, IdleRelease: Interval(5 * time.Second)}
	if got != want || DefaultMemoryConfig() != want {
		t.Errorf("defaults = %+v (DefaultMemoryConfig %+v), want %+v", got, DefaultMemoryConfig(), want)
	}

	cfg, err = Parse([]byte(`
node:
  memory:
    limit: 48 MiB
    gc_percent: 50
    batch_size: 128
    credits: 4
    mqtt_pending_bytes: 2MB
    broker_session_bytes: "off"
    broker_retained_bytes: 1MiB
    broker_connections: 50
    broker_client_subscriptions: 20
    idle_release: 30s
` + goodPipeline))
	if err != nil {
		t.Fatal(err)
	}
	want = MemoryConfig{Limit: 48 << 20, GCPercent: 50, BatchSize: 128, Credits: 4,
		MQTTPendingBytes: 2_000_000, BrokerSessionBytes: ByteSizeOff, BrokerRetainedBytes: 1 << 20,
		BrokerConnections: 50, BrokerClientSubscriptions: 20, IdleRelease: Interval(30 * time.Second)}
	if got := cfg.Node.Memory.WithDefaults(); got != want {
		t.Errorf("parsed = %+v, want %+v", got, want)
	}

	wantProblems(t, `
node:
  memory:
    limit: 1MiB
    gc_percent: 5
    batch_size: -1
    credits: -2
    mqtt_pending_bytes: 1KiB
    broker_connections: -1
    broker_client_subscriptions: -3
`+goodPipeline,
		`node.memory.limit: (1MiB) must be at least 16MiB or off`,
		`node.memory.gc_percent: (5) must be -1 (off) or at least 10`,
		`node.memory.batch_size: (-1) must be at least 1`,
		`node.memory.credits: (-2) must be at least 1`,
		`node.memory.mqtt_pending_bytes: (1KiB) must be at least 64KiB`,
		`node.memory.broker_connections: (-1) must be at least 1`,
		`node.memory.broker_client_subscriptions: (-3) must be at least 1`)
	// A credit is a batch buffer every channel holds from the start: a
	// million of them held 180 MB of an idle node's heap, and 100 million
	// kept a node allocating for minutes, not stopping on SIGTERM.
	wantProblems(t, "node:\n  memory: {credits: 1000000}\n"+goodPipeline,
		`node.memory.credits: (1000000) must be at most 1024: every channel holds that many batch buffers from the start`)
	wantProblems(t, "node:\n  memory: {limit: \"off\", gc_percent: -1}\n"+goodPipeline,
		`node.memory.gc_percent: (-1) needs node.memory.limit: without either the heap would grow without bound`)
	wantProblems(t, "node:\n  memory: {limit: 12 parsecs, credits: many}\n"+goodPipeline,
		`node.memory.limit: "12 parsecs" is not valid: a size is a whole number of bytes with an optional unit (B, KiB, MiB, GiB, KB, MB, GB) or "off"`,
		`node.memory.credits: "many" is not an integer`)
	wantProblems(t, "node:\n  memory: {limit: \"off\", gc_percent: 200, broker_session_bytes: \"off\"}\n"+goodPipeline)
	wantProblems(t, "node:\n  memory: {idle_release: 10ms}\n"+goodPipeline,
		`node.memory.idle_release: (10ms) must be at least 1s or off`)
	wantProblems(t, "node:\n  memory: {idle_release: soon}\n"+goodPipeline,
		`node.memory.idle_release: "soon" is not valid: a period is a positive duration (as 5s or 1m) or "off"`)
	cfg, err = Parse([]byte("node:\n  memory: {idle_release: \"off\"}\n" + goodPipeline))
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Node.Memory.WithDefaults().IdleRelease; got != IntervalOff || got.String() != "off" {
		t.Errorf("idle_release: off parsed as %v", got)
	}
}

// A node.memory key given as 0 is refused with what it must be, as a
// value below its bound is: taken as left out, limit: 0 was a limit of
// 56 MiB, gc_percent: 0 a percentage of 100 and credits: 0 eight
// credits, without a word.
func TestNodeMemoryZeroIsRefused(t *testing.T) {
	wantProblems(t, `
node:
  memory:
    limit: 0
    gc_percent: 0
    batch_size: 0
    credits: 0
    mqtt_pending_bytes: 0
    broker_session_bytes: 0
    broker_retained_bytes: 0 KiB
    broker_connections: 0
    broker_client_subscriptions: 0
`+goodPipeline,
		`node.memory.limit: (0B) must be at least 16MiB or off`,
		`node.memory.gc_percent: (0) must be -1 (off) or at least 10`,
		`node.memory.batch_size: (0) must be at least 1`,
		`node.memory.credits: (0) must be at least 1`,
		`node.memory.mqtt_pending_bytes: (0B) must be at least 64KiB`,
		`node.memory.broker_session_bytes: (0) must be positive (off: no bound)`,
		`node.memory.broker_retained_bytes: (0) must be positive (off: no bound)`,
		`node.memory.broker_connections: (0) must be at least 1`,
		`node.memory.broker_client_subscriptions: (0) must be at least 1`)
	// With the keys around it valid, and only it reported.
	wantProblems(t, "node:\n  memory: {limit: 40MiB, credits: 0, batch_size: 64}\n"+goodPipeline,
		`node.memory.credits: (0) must be at least 1`)
	// Left out, or the block empty, a key takes its default.
	for _, block := range []string{"node:\n  memory: {credits: 4}\n", "node:\n  memory: {}\n", "node:\n  memory:\n"} {
		cfg, err := Parse([]byte(block + goodPipeline))
		if err != nil {
			t.Fatalf("%q: %v", block, err)
		}
		if got := cfg.Node.Memory.WithDefaults(); got.Limit != DefaultMemoryLimit || got.BatchSize != DefaultBatchSize {
			t.Errorf("%q: %+v, want the defaults of the keys left out", block, got)
		}
	}
}

func TestByteSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want ByteSize
		ok   bool
	}{
		{"0", 0, true}, {"1024", 1024, true}, {"64MiB", 64 << 20, true}, {"64 MiB", 64 << 20, true},
		{"1gib", 1 << 30, true}, {"3 KB", 3000, true}, {"5B", 5, true}, {"OFF", ByteSizeOff, true},
		{"", 0, false}, {"-1", 0, false}, {"1.5MiB", 0, false}, {"10 TiB", 0, false},
		{"MiB", 0, false}, {"99999999999999999999", 0, false}, {"9000000000 GiB", 0, false},
	} {
		var b ByteSize
		err := b.UnmarshalText([]byte(tc.in))
		if (err == nil) != tc.ok || (tc.ok && b != tc.want) {
			t.Errorf("%q: %v, %v; want %v ok=%v", tc.in, b, err, tc.want, tc.ok)
		}
	}
	for b, want := range map[ByteSize]string{0: "0B", 1000: "1000B", 2048: "2KiB", 64 << 20: "64MiB", 3 << 30: "3GiB", ByteSizeOff: "off"} {
		if got := b.String(); got != want {
			t.Errorf("%d.String() = %q, want %q", int64(b), got, want)
		}
	}
}
