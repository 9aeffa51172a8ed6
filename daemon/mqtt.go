package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"path/filepath"
	"sync"
	"time"

	"github.com/edgedio/edged/mqtt"
	"github.com/edgedio/edged/mqtt/ingestlog"
	"github.com/edgedio/edged/pipeline"
)

// DefaultBroker is the embedded broker's address when node.broker is not
// set.
const DefaultBroker = "127.0.0.1:1883"

// DefaultDataDir is node.data_dir when not set.
const DefaultDataDir = "edged-data"

// mqttNode is the node's MQTT side: the embedded broker (nil when no
// pipeline, sink or simulator needs it), one ingest log per pipeline
// reading MQTT, a subscriber per pipeline reading an external broker, and
// the simulator.
type mqttNode struct {
	broker *mqtt.Broker
	logs   map[string]*ingestlog.Log
	// routed are the pipelines whose logs the embedded broker feeds.
	routed map[string]bool
	// shedMu serialises the decisions whether the logs shed
	// (shedStopped, noShedding).
	shedMu sync.Mutex
	// ending is set once the node ends its pipelines for good (shutdown,
	// or a pipeline that failed to start): no log sheds from then on.
	ending bool
	subs   []*mqtt.Subscriber
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

// startMQTT opens a durable ingest log for every pipeline reading MQTT,
// starts the embedded broker (if needed) with a route into the logs of
// the pipelines reading it, a Subscriber filling the log of every
// pipeline reading an external broker, and the simulator; it returns the
// pipelines' inputs.
//
// External brokers: a pipeline reads its ingest log whoever fills it; for
// an external broker a Subscriber does, acknowledging each message only
// once it is in the log, so the replay guarantees are those of the
// embedded broker.
//
// The Subscriber's client id is source.mqtt.client_id, default
// "edged-<pipeline>"; qos 0 in the config (also the unset value) means
// QoS 1, so an external source cannot subscribe at QoS 0.
//
// Limitation: pipeline.Inputs.Broker, where MQTT sinks publish, is one
// URL per node: the embedded broker's when it runs, else the external
// broker of the first pipeline reading one. With the embedded broker
// running, the sinks of a pipeline reading an external broker publish to
// the embedded one; with several external brokers and no embedded one,
// all sinks publish to the first.
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
	m := &mqttNode{logs: map[string]*ingestlog.Log{}, routed: map[string]bool{}}
	n.mqtt = m
	var br *mqtt.Broker
	if cfg.NeedsEmbeddedBroker() {
		var err error
		bc := mqtt.DefaultBrokerConfig()
		bc.Address, bc.Logger = addr, n.log
		// Persistent sessions, their queued results and the QoS 2 receipts
		// of the devices survive a restart or a crash of the node.
		bc.DataDir = filepath.Join(dataDir, "broker")
		bc.SessionMaxBytes = int64(max(n.mem.BrokerSessionBytes, 0)) // off: 0, no bound
		bc.RetainedMaxBytes = int64(n.mem.BrokerRetainedBytes)
		if n.mem.BrokerRetainedBytes == pipeline.ByteSizeOff {
			bc.RetainedMaxBytes = math.MaxInt64
		}
		bc.MaxConnections, bc.MaxSubscriptions = n.mem.BrokerConnections, n.mem.BrokerClientSubscriptions
		bc.MaxMessageBytes = cfg.EmbeddedMaxMessageBytes()
		br, err = mqtt.NewBroker(bc, nil)
		if err != nil {
			return pipeline.Inputs{}, err
		}
		m.broker = br
	}
	external := ""
	for _, pc := range cfg.Pipelines {
		src := pc.Source.MQTT
		if src == nil {
			continue
		}
		dir := filepath.Join(dataDir, "ingest", pc.Name)
		log, err := ingestlog.Open(dir, src.LogOptions(), n.log.With("pipeline", pc.Name))
		if err != nil {
			return pipeline.Inputs{}, fmt.Errorf("ingest log of %q: %w", pc.Name, err)
		}
		m.logs[pc.Name] = log
		n.log.Info("ingest log open", "pipeline", pc.Name, "dir", dir, "bytes", log.Stats().DiskBytes, "next_offset", log.Stats().NextOffset)
		warnLogBoundOverDisk(n.log, pc.Name, dir, src.LogOptions())
		if src.Broker == "" {
			if err := br.AddRoute(src.Topics, log); err != nil {
				return pipeline.Inputs{}, err
			}
			m.routed[pc.Name] = true
			continue
		}
		sub, err := mqtt.NewSubscriber(mqtt.SubscriberConfig{
			Broker: src.Broker, Pipeline: pc.Name, ClientID: src.ClientID,
			Topics: src.Topics, QoS: byte(src.QoS), Logger: n.log.With("pipeline", pc.Name),
			MaxPending: src.MaxPending, RedeliveryWindow: src.RedeliveryWindow, Client: src.Client,
			MaxPendingBytes: int64(n.mem.MQTTPendingBytes), MaxMessageBytes: src.MaxMessageBytes,
			AckDelay: src.SubscriberAckDelay(),
		}, log)
		if err != nil {
			return pipeline.Inputs{}, fmt.Errorf("mqtt source of %q: %w", pc.Name, err)
		}
		if err := sub.Start(context.WithoutCancel(ctx)); err != nil {
			return pipeline.Inputs{}, err
		}
		m.subs = append(m.subs, sub)
		if external == "" {
			external = src.Broker
		}
	}
	readies := make([]<-chan struct{}, len(m.subs))
	for i, s := range m.subs {
		readies[i] = s.Ready()
	}
	waitSubscribed(ctx, readies, subscribeWait, n.log)
	url := external
	if br != nil {
		if err := br.Start(context.WithoutCancel(ctx)); err != nil {
			return pipeline.Inputs{}, err
		}
		url = "tcp://" + br.Addr()
	}
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
		Broker:                url,
		BrokerMaxMessageBytes: cfg.EmbeddedMaxMessageBytes(),
	}, nil
}

// shedStopped makes the ingest log of j's pipeline shed once full
// (ingestlog.Log.ShedWhenFull) when the embedded broker feeds it: j
// ended with status while the node runs its other pipelines, nothing
// reads the log until the node restarts, and a full log would otherwise
// hold back every device publishing to its topics, for the other
// pipelines too. When no other pipeline runs (the node ends with j) or
// the node shuts down, no log sheds: the pipelines run again when the
// node restarts, and the readings a full log holds back are not
// acknowledged, so that the devices send them again to it.
func (n *node) shedStopped(j *job, status Status) {
	m := n.mqtt
	if m == nil {
		return
	}
	m.shedMu.Lock()
	defer m.shedMu.Unlock()
	if m.ending || n.ctx == nil || n.ctx.Err() != nil || !n.othersRun(j) {
		m.noSheddingLocked()
		return
	}
	if !m.routed[j.name] {
		return
	}
	l := m.logs[j.name]
	l.ShedWhenFull(true)
	st := l.Stats()
	n.log.Warn("pipeline no longer runs: its ingest log keeps its topics' readings for it until full, then stores no more (counted in edged_ingest_shed_total), so that devices are not held back for the other pipelines; restart the node to run it again",
		"job", j.name, "status", string(status), "unreleased_bytes", st.UnreleasedBytes, "next_offset", st.NextOffset)
}

// othersRun reports whether a job of the node other than j has not
// ended.
func (n *node) othersRun(j *job) bool {
	for _, o := range n.jobList() {
		if o == j {
			continue
		}
		select {
		case <-o.run.Done():
		default:
			return true
		}
	}
	return false
}

// noShedding makes every ingest log hold its devices back again once
// full, and no log shed from then on: the node ends its pipelines for
// good (it shuts down, or a pipeline failed to start), and they run
// again when it restarts.
func (n *node) noShedding() {
	m := n.mqtt
	if m == nil {
		return
	}
	m.shedMu.Lock()
	defer m.shedMu.Unlock()
	m.ending = true
	m.noSheddingLocked()
}

// noSheddingLocked is noShedding with m.shedMu held.
func (m *mqttNode) noSheddingLocked() {
	for name := range m.routed {
		m.logs[name].ShedWhenFull(false)
	}
}

// stopMQTT stops the simulator, then the subscribers and the broker (which
// drains: the publishes in flight are appended and acknowledged first),
// then closes the logs.
func (n *node) stopMQTT() error {
	m := n.mqtt
	if m == nil {
		return nil
	}
	if m.stop != nil {
		m.stop()
	}
	m.wg.Wait()
	var errs []error
	for _, s := range m.subs {
		errs = append(errs, s.Close())
	}
	if m.broker != nil {
		errs = append(errs, m.broker.Close())
	}
	for _, l := range m.logs {
		errs = append(errs, l.Close())
	}
	return errors.Join(errs...)
}

// subscribeWait bounds how long a node waits, before its jobs start, for
// its subscriptions at an external broker.
const subscribeWait = 5 * time.Second

// waitSubscribed waits, at most wait in all, until every subscriber has
// subscribed once (its Ready channel in readies is closed), so that a job reported running is one whose readings
// the broker already routes to edged: a broker delivers nothing published
// before a new session's first subscription. A broker that does not answer
// in time is logged and the jobs start anyway; the subscriber keeps
// retrying and subscribes once it can. It reports whether all subscribed.
func waitSubscribed(ctx context.Context, readies []<-chan struct{}, wait time.Duration, log *slog.Logger) bool {
	if len(readies) == 0 {
		return true
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	for _, r := range readies {
		select {
		case <-r:
		case <-t.C:
			log.Warn("mqtt subscriber not subscribed yet; the jobs start without waiting longer (readings published to a new session before it subscribes are not delivered by the broker)", "waited", wait)
			return false
		case <-ctx.Done():
			return false
		}
	}
	return true
}
