package daemon

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"

	"github.com/edgedio/edged/mqtt"
	"github.com/edgedio/edged/mqtt/ingestlog"
	"github.com/edgedio/edged/pipeline"
)

// DefaultBroker is the embedded broker's address when node.broker is not
// set.
const DefaultBroker = "127.0.0.1:1883"

// DefaultDataDir is node.data_dir when not set.
const DefaultDataDir = "edged-data"

// mqttNode is the node's MQTT side: the embedded broker, one ingest log
// per pipeline reading MQTT, and the simulator.
type mqttNode struct {
	broker *mqtt.Broker
	logs   map[string]*ingestlog.Log
	stop   context.CancelFunc
	wg     sync.WaitGroup
}

// usesMQTT reports whether any pipeline reads or writes MQTT or the node
// simulates sensors.
func usesMQTT(cfg *pipeline.Config) bool {
	if cfg.Node.Simulator != nil {
		return true
	}
	for _, pc := range cfg.Pipelines {
		if pc.Source.MQTT != nil {
			return true
		}
		for _, s := range pc.Sinks {
			if s.MQTT != nil {
				return true
			}
		}
	}
	return false
}

// startMQTT starts the embedded broker with a route into a durable ingest
// log for every pipeline reading MQTT, and the simulator; it returns the
// pipelines' inputs.
func (n *node) startMQTT(ctx context.Context, cfg *pipeline.Config) (pipeline.Inputs, error) {
	if !usesMQTT(cfg) {
		return pipeline.Inputs{}, nil
	}
	addr := cfg.Node.Broker
	if addr == "" {
		addr = DefaultBroker
	}
	dataDir := cfg.Node.DataDir
	if dataDir == "" {
		dataDir = DefaultDataDir
	}
	br, err := mqtt.NewBroker(mqtt.BrokerConfig{Address: addr, Filters: []string{"#"}, Logger: n.log}, nil)
	if err != nil {
		return pipeline.Inputs{}, err
	}
	m := &mqttNode{broker: br, logs: map[string]*ingestlog.Log{}}
	n.mqtt = m
	for _, pc := range cfg.Pipelines {
		src := pc.Source.MQTT
		if src == nil || src.Broker != "" {
			continue
		}
		dir := filepath.Join(dataDir, "ingest", pc.Name)
		log, err := ingestlog.Open(dir, ingestlog.DefaultOptions(), n.log.With("pipeline", pc.Name))
		if err != nil {
			return pipeline.Inputs{}, fmt.Errorf("ingest log of %q: %w", pc.Name, err)
		}
		m.logs[pc.Name] = log
		if err := br.AddRoute(src.Topics, log); err != nil {
			return pipeline.Inputs{}, err
		}
		n.log.Info("ingest log open", "pipeline", pc.Name, "dir", dir, "bytes", log.Stats().DiskBytes, "next_offset", log.Stats().NextOffset)
	}
	if err := br.Start(context.WithoutCancel(ctx)); err != nil {
		return pipeline.Inputs{}, err
	}
	url := "tcp://" + br.Addr()
	if sim := cfg.Node.Simulator; sim != nil {
		sctx, stop := context.WithCancel(context.WithoutCancel(ctx))
		m.stop = stop
		m.wg.Go(func() {
			err := mqtt.Simulate(sctx, mqtt.SimulatorConfig{Broker: url, Sensors: sim.Sensors, Rate: sim.Rate, Topic: sim.Topic})
			if err != nil {
				n.log.Error("simulator stopped", "err", err)
			}
		})
		n.log.Info("simulator publishing", "sensors", sim.Sensors, "rate", sim.Rate, "topic", sim.Topic)
	}
	return pipeline.Inputs{
		MQTTLog: func(name string) (*ingestlog.Log, error) {
			if l, ok := m.logs[name]; ok {
				return l, nil
			}
			return nil, fmt.Errorf("no ingest log for pipeline %q", name)
		},
		Broker: url,
	}, nil
}

// stopMQTT stops the simulator, then the broker, then closes the logs.
func (n *node) stopMQTT() error {
	m := n.mqtt
	if m == nil {
		return nil
	}
	if m.stop != nil {
		m.stop()
	}
	m.wg.Wait()
	errs := []error{m.broker.Close()}
	for _, l := range m.logs {
		errs = append(errs, l.Close())
	}
	return errors.Join(errs...)
}
