package pipeline

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/mqtt/ingestlog"
	"github.com/edgedio/edged/stream"
)

// A device that sends the same reading twice after its window closed
// gives two late dead letters. Like the dead letters of malformed
// payloads, each must name its message's topic and ingest-log offset, so
// that the two differ: a write-ahead sink's msg_id is a function of the
// dead letter's line, and a consumer that drops repeated msg_ids (the
// README's exactly-once consumer) would otherwise see one of them and
// lose the other, though the window would have counted both.
func TestMQTTLateDeadLettersOfEqualReadingsDiffer(t *testing.T) {
	perEventWatermarks = true
	defer func() { perEventWatermarks = false }()
	cfg, err := Parse([]byte(mqttPipeline))
	if err != nil {
		t.Fatal(err)
	}
	pc := cfg.Pipelines[0]
	log, url := startPipelineBroker(t, pc, 0)

	var mu sync.Mutex
	var dead []string
	results := 0
	sub := paho.NewClient(paho.NewClientOptions().AddBroker(url).SetClientID("checker").
		SetDefaultPublishHandler(func(paho.Client, paho.Message) {}))
	if tok := sub.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscriber connect: %v", tok.Error())
	}
	defer sub.Disconnect(100)
	tok := sub.Subscribe("#", 1, func(_ paho.Client, m paho.Message) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case strings.HasPrefix(m.Topic(), "deadletter/"):
			dead = append(dead, string(m.Payload()))
		case strings.HasPrefix(m.Topic(), "agg/"):
			results++
		}
	})
	if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}

	env := stream.NewEnvironment("devices", EnvOptionsOrDie(t, pc)...)
	var out bytes.Buffer
	if _, err := BuildJobWith(pc, env, &out, Inputs{
		MQTTLog: func(string) (*ingestlog.Log, error) { return log, nil },
		Broker:  url,
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	job, err := env.ExecuteAsync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		cancel()
		job.Wait()
	}()

	dev := paho.NewClient(paho.NewClientOptions().AddBroker(url).SetClientID("device"))
	if tok := dev.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("device connect: %v", tok.Error())
	}
	defer dev.Disconnect(100)
	publish := func(p string) {
		t.Helper()
		if tok := dev.Publish("sensors/a/temperature", 1, false, p); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			t.Fatalf("publish: %v", tok.Error())
		}
	}
	// Readings at 0..12 s: the watermark passes 10 s and [0,10) fires.
	for s := 0; s <= 12; s++ {
		publish(fmt.Sprintf(`{"sensor":"a","t":20.5,"ts":%d}`, s))
	}
	testutil.Eventually(t, 30*time.Second, "the result of window [0,10)", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return results >= 1
	})
	// The same reading of [0,10) twice: both late.
	publish(`{"sensor":"a","t":21.5,"ts":3}`)
	publish(`{"sensor":"a","t":21.5,"ts":3}`)
	testutil.Eventually(t, 30*time.Second, "two late dead letters", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(dead) >= 2
	})
	mu.Lock()
	defer mu.Unlock()
	for _, d := range dead {
		if !strings.Contains(d, "late") {
			t.Fatalf("dead letter %s, want a late one", d)
		}
		if !strings.Contains(d, "topic sensors/a/temperature, ingest-log offset ") {
			t.Errorf("late dead letter %s does not say which message it was", d)
		}
	}
	if dead[0] == dead[1] {
		t.Errorf("the late dead letters of two messages are one line (so one msg_id through a write-ahead sink): %s", dead[0])
	}
}
