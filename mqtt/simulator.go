package mqtt

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
)

// SimulatorConfig configures Simulate.
type SimulatorConfig struct {
	// Broker is the URL to publish to, e.g. "tcp://127.0.0.1:1883".
	Broker string
	// Sensors is the number of simulated devices, "sensor_0".. .
	Sensors int
	// Rate is the readings per second of all sensors together.
	Rate float64
	// Topic is the topic template; {id} is replaced by the sensor id.
	Topic string
}

// Simulate publishes simulated temperature readings, QoS 1, as JSON
// objects {"sensor": id, "t": celsius, "ts": unix milliseconds}, until ctx
// is done. Temperatures drift slowly per sensor between about 20 and 40
// °C, so windows and threshold alerts have something to show. It returns
// nil when ctx ends, or the first connection or publish error.
func Simulate(ctx context.Context, cfg SimulatorConfig) error {
	tmpl, err := ParseTopicTemplate(cfg.Topic)
	if err != nil {
		return err
	}
	if cfg.Sensors < 1 || cfg.Rate <= 0 {
		return fmt.Errorf("%w: simulator needs at least one sensor and a positive rate", ErrInvalidConfig)
	}
	opts := paho.NewClientOptions().AddBroker(cfg.Broker).SetClientID("edged-simulator").
		SetAutoReconnect(true).SetConnectRetry(true).
		SetDefaultPublishHandler(func(paho.Client, paho.Message) {})
	c := paho.NewClient(opts)
	tok := c.Connect()
	select {
	case <-tok.Done():
		if err := tok.Error(); err != nil {
			return fmt.Errorf("mqtt: simulator connect: %w", err)
		}
	case <-ctx.Done():
		return nil
	}
	defer c.Disconnect(250)
	interval := time.Duration(float64(time.Second) / cfg.Rate)
	tick := time.NewTicker(max(interval, time.Millisecond))
	defer tick.Stop()
	// A sensor's topic is expanded at each of its readings: the simulator
	// holds nothing per sensor, since node.simulator.sensors takes any
	// positive int (the topics of them all, made at start, took the node
	// down with one of a trillion sensors, and kept it from stopping for
	// minutes with a hundred million).
	per := max(1, int(math.Round(cfg.Rate*max(interval, time.Millisecond).Seconds())))
	for n := 0; ; {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		for range per {
			i := n % cfg.Sensors
			now := time.Now().UnixMilli()
			// A slow drift per sensor: a sine over ~2 minutes, offset per
			// sensor, between 20 and 40.
			t := 30 + 10*math.Sin(float64(now)/20000+float64(i))
			id := "sensor_" + strconv.Itoa(i)
			topic, err := tmpl.Expand(func(string) string { return id })
			if err != nil {
				return err
			}
			payload := fmt.Sprintf(`{"sensor":%q,"t":%.2f,"ts":%d}`, id, t, now)
			tok := c.Publish(topic, 1, false, payload)
			select {
			case <-tok.Done():
				if err := tok.Error(); err != nil {
					return fmt.Errorf("mqtt: simulator publish: %w", err)
				}
			case <-ctx.Done():
				return nil
			}
			n++
		}
	}
}
