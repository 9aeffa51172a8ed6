package daemon

import (
	"math"
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgedio/edged/pipeline"
)

// TaskInfo is one task (a chain of operators, one subtask) in GET
// /jobs/{name}/operators.
type TaskInfo struct {
	Chain       string   `json:"chain"`
	Operators   []string `json:"operators"`
	Subtask     int      `json:"subtask"`
	Parallelism int      `json:"parallelism"`
	RecordsIn   int64    `json:"records_in"`
	RecordsOut  int64    `json:"records_out"`
	BatchesIn   int64    `json:"batches_in"`
	BatchesOut  int64    `json:"batches_out"`
	// Watermark is the task's last watermark sent on, in ms; absent
	// before the first.
	Watermark *int64 `json:"watermark_ms,omitempty"`
	// BackpressureMS is how long the task waited for credit to send.
	BackpressureMS float64 `json:"backpressure_ms"`
	// Queued is the number of messages waiting in the task's mailbox.
	Queued int64 `json:"queued"`
}

// OperatorList is the answer of GET /jobs/{name}/operators.
type OperatorList struct {
	Job   string     `json:"job"`
	Tasks []TaskInfo `json:"tasks"`
}

func (n *node) handleOperators(w http.ResponseWriter, r *http.Request) {
	j, err := n.job(r.Context(), r.PathValue("name"))
	if err != nil {
		writeError(w, err)
		return
	}
	l := OperatorList{Job: j.name, Tasks: []TaskInfo{}}
	for _, m := range j.run.Metrics() {
		ti := TaskInfo{Chain: m.Chain, Operators: m.Operators, Subtask: m.Subtask, Parallelism: m.Parallelism,
			RecordsIn: m.RecordsIn, RecordsOut: m.RecordsOut, BatchesIn: m.BatchesIn, BatchesOut: m.BatchesOut,
			BackpressureMS: float64(m.Backpressure.Microseconds()) / 1000, Queued: m.Queued}
		if m.Watermark != math.MinInt64 {
			wm := m.Watermark
			ti.Watermark = &wm
		}
		l.Tasks = append(l.Tasks, ti)
	}
	writeJSON(w, http.StatusOK, l)
}

// taskCollector exports the live task counters and the ingest logs' size.
type taskCollector struct {
	n                                                                       *node
	records, recordsOut, backpressure, watermark, queued, logBytes, logShed *prometheus.Desc
	// The MQTT messages larger than source.mqtt.max_message_bytes: taken
	// as dead-letter records by a pipeline's subscriber, refused by the
	// embedded broker, or dead-lettered by it (too large for a record).
	tooLarge, brokerTooLarge, brokerDeadLetters *prometheus.Desc
	// Readings the embedded broker refused while the node was out of the
	// cluster (drained).
	brokerRefused *prometheus.Desc
	// Retained messages the embedded broker routed without retaining
	// them: over mqtt.BrokerConfig.RetainedMaxBytes.
	brokerRetainedRefused *prometheus.Desc
	// Connections and topic filters the embedded broker refused: over
	// node.memory.broker_connections and broker_client_subscriptions.
	brokerConnsRefused, brokerSubsRefused *prometheus.Desc
	// A file source's reads of its file from the start again: the file
	// at its path was replaced or truncated.
	fileResets *prometheus.Desc
	// An external broker's subscriber: its connection up or not, and
	// the connections the broker accepted.
	sourceConnected, sourceConnects *prometheus.Desc
	// The results an MQTT sink's subtask holds for its broker.
	sinkHeld *prometheus.Desc
}

func newTaskCollector(n *node) *taskCollector {
	l := []string{"job", "task", "subtask"}
	return &taskCollector{
		n:            n,
		records:      prometheus.NewDesc("edged_task_records_in_total", "Records a task received from its input channels.", l, nil),
		recordsOut:   prometheus.NewDesc("edged_task_records_out_total", "Records a task sent to other tasks.", l, nil),
		backpressure: prometheus.NewDesc("edged_task_backpressure_seconds_total", "Time a task waited for credit to send: backpressure from downstream.", l, nil),
		watermark:    prometheus.NewDesc("edged_task_watermark_milliseconds", "Last event-time watermark a task sent on.", l, nil),
		queued:       prometheus.NewDesc("edged_task_queued_messages", "Messages waiting in a task's mailbox.", l, nil),
		logBytes:     prometheus.NewDesc("edged_ingest_log_bytes", "Bytes on disk of a pipeline's MQTT ingest log.", []string{"pipeline"}, nil),
		logShed: prometheus.NewDesc("edged_ingest_shed_total",
			"Readings for a pipeline that no longer runs on the node (stopped, cancelled or failed) that its full ingest log did not store, so that the devices publishing them were not held back for the other pipelines.", []string{"pipeline"}, nil),
		tooLarge: prometheus.NewDesc("edged_mqtt_messages_too_large_total",
			"MQTT messages over source.mqtt.max_message_bytes that a pipeline's subscriber appended as dead-letter records and acknowledged.", []string{"pipeline"}, nil),
		brokerTooLarge: prometheus.NewDesc("edged_broker_packets_too_large_total",
			"Packets over the embedded broker's maximum packet size (the largest max_message_bytes of the pipelines reading it): an MQTT 3.1.1 PUBLISH recorded as a dead letter, anything else refused (connection closed).", nil, nil),
		brokerDeadLetters: prometheus.NewDesc("edged_broker_dead_letters_total",
			"Messages the embedded broker appended as dead-letter records and acknowledged: over its maximum packet size (MQTT 3.1.1) or too large for an ingest-log record.", nil, nil),
		brokerRefused: prometheus.NewDesc("edged_broker_readings_refused_total",
			"Readings the embedded broker refused, unacknowledged, while the node was drained and out of the cluster.", nil, nil),
		brokerRetainedRefused: prometheus.NewDesc("edged_broker_retained_refused_total",
			"Retained messages the embedded broker routed and ingested without retaining them, since its retained messages would have passed their bound (16 MiB of topics and payloads); the retained message each would have replaced was cleared.", nil, nil),
		brokerConnsRefused: prometheus.NewDesc("edged_broker_connections_refused_total",
			"Connections the embedded broker closed as it accepted them, since it held node.memory.broker_connections already.", nil, nil),
		brokerSubsRefused: prometheus.NewDesc("edged_broker_subscriptions_refused_total",
			"Topic filters the embedded broker refused in a SUBACK, since their client held node.memory.broker_client_subscriptions already.", nil, nil),
		sourceConnected: prometheus.NewDesc("edged_mqtt_source_connected",
			"1 while a pipeline's subscriber holds a connection its external broker (source.mqtt.broker) accepted, else 0: 0 from a lost connection until the broker accepts the next.", []string{"pipeline"}, nil),
		sourceConnects: prometheus.NewDesc("edged_mqtt_source_connects_total",
			"Connections a pipeline's external broker accepted since the node started (1 + reconnects).", []string{"pipeline"}, nil),
		sinkHeld: prometheus.NewDesc("edged_sink_results_held",
			"Results of completed checkpoints that a subtask of an MQTT sink (checkpoints on) holds because its broker has not acknowledged them yet (down, hung or refusing, or a persistent session on the embedded broker full): what the sink's max_held bounds. Near max_held, the sink holds the job back.", []string{"job", "sink", "subtask"}, nil),
		fileResets: prometheus.NewDesc("edged_file_source_resets_total",
			"Times a pipeline's file source on this node read its file from the start again because the file at its path was replaced, truncated or rewritten (logged with the path, reason, old offset and size).", []string{"pipeline"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *taskCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.records, c.recordsOut, c.backpressure, c.watermark, c.queued, c.logBytes, c.logShed, c.tooLarge, c.brokerTooLarge, c.brokerDeadLetters, c.brokerRefused, c.brokerRetainedRefused, c.brokerConnsRefused, c.brokerSubsRefused, c.fileResets, c.sourceConnected, c.sourceConnects, c.sinkHeld} {
		ch <- d
	}
}

// Collect implements prometheus.Collector; called on a scrape's goroutine.
func (c *taskCollector) Collect(ch chan<- prometheus.Metric) {
	for _, j := range c.n.jobList() {
		for _, m := range j.run.Metrics() {
			sub := strconv.Itoa(m.Subtask)
			ch <- prometheus.MustNewConstMetric(c.records, prometheus.CounterValue, float64(m.RecordsIn), j.name, m.Chain, sub)
			ch <- prometheus.MustNewConstMetric(c.recordsOut, prometheus.CounterValue, float64(m.RecordsOut), j.name, m.Chain, sub)
			ch <- prometheus.MustNewConstMetric(c.backpressure, prometheus.CounterValue, m.Backpressure.Seconds(), j.name, m.Chain, sub)
			ch <- prometheus.MustNewConstMetric(c.queued, prometheus.GaugeValue, float64(m.Queued), j.name, m.Chain, sub)
			if m.Watermark != math.MinInt64 {
				ch <- prometheus.MustNewConstMetric(c.watermark, prometheus.GaugeValue, float64(m.Watermark), j.name, m.Chain, sub)
			}
		}
	}
	for name, held := range c.n.sinkResultsHeld() {
		for _, h := range held {
			ch <- prometheus.MustNewConstMetric(c.sinkHeld, prometheus.GaugeValue, float64(h.Results), name, h.Sink, strconv.Itoa(h.Subtask))
		}
	}
	for name, n := range c.n.fileSourceResets() {
		ch <- prometheus.MustNewConstMetric(c.fileResets, prometheus.CounterValue, float64(n), name)
	}
	if m := c.n.mqtt; m != nil {
		for name, l := range m.logs {
			st := l.Stats()
			ch <- prometheus.MustNewConstMetric(c.logBytes, prometheus.GaugeValue, float64(st.DiskBytes), name)
			ch <- prometheus.MustNewConstMetric(c.logShed, prometheus.CounterValue, float64(st.Shed), name)
		}
		for _, s := range m.subs {
			ch <- prometheus.MustNewConstMetric(c.tooLarge, prometheus.CounterValue, float64(s.TooLarge()), s.Pipeline())
			up := 0.0
			if s.Connected() {
				up = 1
			}
			ch <- prometheus.MustNewConstMetric(c.sourceConnected, prometheus.GaugeValue, up, s.Pipeline())
			ch <- prometheus.MustNewConstMetric(c.sourceConnects, prometheus.CounterValue, float64(s.Connects()), s.Pipeline())
		}
		if b := m.broker; b != nil {
			ch <- prometheus.MustNewConstMetric(c.brokerTooLarge, prometheus.CounterValue, float64(b.PacketsTooLarge()))
			ch <- prometheus.MustNewConstMetric(c.brokerDeadLetters, prometheus.CounterValue, float64(b.DeadLetters()))
			ch <- prometheus.MustNewConstMetric(c.brokerRefused, prometheus.CounterValue, float64(b.IngestRefused()))
			ch <- prometheus.MustNewConstMetric(c.brokerRetainedRefused, prometheus.CounterValue, float64(b.RetainedRefused()))
			ch <- prometheus.MustNewConstMetric(c.brokerConnsRefused, prometheus.CounterValue, float64(b.ConnectionsRefused()))
			ch <- prometheus.MustNewConstMetric(c.brokerSubsRefused, prometheus.CounterValue, float64(b.SubscriptionsRefused()))
		}
	}
}

// sinkResultsHeld returns, by pipeline, what the subtasks of its MQTT
// sinks on this node hold for their broker (pipeline.Job.SinkResultsHeld):
// those of the jobs it runs and, in a cluster, of the subtasks it hosts
// as a worker. Pipelines without such a sink open on the node are left
// out.
func (n *node) sinkResultsHeld() map[string][]pipeline.SinkHeld {
	out := map[string][]pipeline.SinkHeld{}
	type key struct {
		job, sink string
		subtask   int
	}
	seen := map[key]bool{} // a subtask is reported once
	add := func(name string, pj *pipeline.Job) {
		for _, h := range pj.SinkResultsHeld() {
			if k := (key{name, h.Sink, h.Subtask}); !seen[k] {
				seen[k] = true
				out[name] = append(out[name], h)
			}
		}
	}
	own := map[*pipeline.Job]bool{}
	for _, j := range n.jobList() {
		own[j.pj] = true
		add(j.name, j.pj)
	}
	for name, pj := range n.deadCounts.hostedJobs() {
		if !own[pj] {
			add(name, pj)
		}
	}
	return out
}

// fileSourceResets returns, by pipeline, the file sources' reads of their
// file from the start again on this node (pipeline.Job.FileSourceResets):
// those of the jobs it runs and, in a cluster, of the subtasks it hosted
// as a worker. Pipelines that read no file are left out.
func (n *node) fileSourceResets() map[string]int64 {
	out := map[string]int64{}
	own := map[*pipeline.Job]bool{}
	for _, j := range n.jobList() {
		own[j.pj] = true
		if j.pj.ReadsFile() {
			out[j.name] += j.pj.FileSourceResets()
		}
	}
	for name, pj := range n.deadCounts.hostedJobs() {
		if pj.ReadsFile() && !own[pj] {
			out[name] += pj.FileSourceResets()
		}
	}
	return out
}
