package mqtt

import (
	"context"
	"encoding/json"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/mqtt/ingestlog"
)

// The simulator publishes JSON readings of every sensor to the broker.
func TestSimulate(t *testing.T) {
	log := openLog(t, t.TempDir(), ingestlog.DefaultOptions())
	br := startBroker(t, log, "sensors/#")
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		errc <- Simulate(ctx, SimulatorConfig{Broker: "tcp://" + br.Addr(), Sensors: 3, Rate: 1000, Topic: "sensors/{id}/temperature"})
	}()
	deadline := time.Now().Add(20 * time.Second)
	for log.Stats().DurableOffset < 30 {
		if time.Now().After(deadline) {
			t.Fatal("the simulator published too little")
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	r, err := log.Reader(0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	seen := map[string]bool{}
	for range 30 {
		rec, ok, err := r.TryNext()
		if err != nil || !ok {
			t.Fatalf("read: %v %v", ok, err)
		}
		var m struct {
			Sensor string  `json:"sensor"`
			T      float64 `json:"t"`
			TS     int64   `json:"ts"`
		}
		if err := json.Unmarshal(rec.Payload, &m); err != nil || m.TS == 0 || m.T < 19 || m.T > 41 {
			t.Fatalf("reading %s: %v", rec.Payload, err)
		}
		if rec.Topic != "sensors/"+m.Sensor+"/temperature" {
			t.Fatalf("topic %s for %s", rec.Topic, m.Sensor)
		}
		seen[m.Sensor] = true
	}
	if len(seen) != 3 {
		t.Fatalf("sensors seen: %v", seen)
	}
}

// The simulator holds nothing per sensor: node.simulator.sensors takes
// any positive int, and one of a trillion sensors (or math.MaxInt) made
// the node die at start (`fatal error: runtime: out of memory` making the
// sensors' topics), while a hundred million kept it from stopping for
// minutes and took GiBs.
func TestSimulateManySensorsHoldsNothingPerSensor(t *testing.T) {
	log := openLog(t, t.TempDir(), ingestlog.DefaultOptions())
	br := startBroker(t, log, "sensors/#")
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		errc <- Simulate(ctx, SimulatorConfig{Broker: "tcp://" + br.Addr(), Sensors: math.MaxInt, Rate: 1000, Topic: "sensors/{id}/temperature"})
	}()
	testutil.Eventually(t, 20*time.Second, "the simulator's first readings", func() bool { return log.Stats().DurableOffset >= 3 })
	cancel()
	if err := testutil.Receive(t, 0, "Simulate to return", errc); err != nil {
		t.Fatal(err)
	}
	r, err := log.Reader(0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for i := range 3 {
		rec, ok, err := r.TryNext()
		if err != nil || !ok {
			t.Fatalf("read: %v %v", ok, err)
		}
		if want := "sensors/sensor_" + strconv.Itoa(i) + "/temperature"; rec.Topic != want {
			t.Fatalf("reading %d on %s, want %s", i, rec.Topic, want)
		}
	}
}
