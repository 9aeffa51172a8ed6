package daemon

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgedio/edged/snapshot"
)

// jobCollector exports the node's per-job metrics, read from the job
// records at scrape time. Checkpoint counts are those the node has seen
// (it polls every Options.PollInterval), so a checkpoint that came and
// went between two polls of more than snapshot.HistorySize is missed.
type jobCollector struct {
	n *node

	up, attempts, completed, failed, lastDuration, lastSize, lastAlignment, deadLetters *prometheus.Desc
}

func newJobCollector(n *node) *jobCollector {
	l := []string{"job"}
	return &jobCollector{
		n:             n,
		up:            prometheus.NewDesc("edged_job_up", "1 while the job runs, else 0.", l, nil),
		attempts:      prometheus.NewDesc("edged_job_attempts_total", "Times the job was started (1 + restarts).", l, nil),
		completed:     prometheus.NewDesc("edged_job_checkpoints_completed_total", "Checkpoints and savepoints seen completing.", l, nil),
		failed:        prometheus.NewDesc("edged_job_checkpoints_failed_total", "Checkpoints and savepoints seen failing.", l, nil),
		lastDuration:  prometheus.NewDesc("edged_job_last_checkpoint_duration_seconds", "Duration of the latest completed checkpoint or savepoint.", l, nil),
		lastSize:      prometheus.NewDesc("edged_job_last_checkpoint_size_bytes", "State size of the latest completed checkpoint or savepoint.", l, nil),
		lastAlignment: prometheus.NewDesc("edged_job_last_checkpoint_alignment_seconds", "Longest barrier alignment of the latest completed checkpoint or savepoint.", l, nil),
		deadLetters:   prometheus.NewDesc("edged_job_dead_letters_total", "Records sent to the dead-letter output.", l, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *jobCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.up, c.attempts, c.completed, c.failed, c.lastDuration, c.lastSize, c.lastAlignment, c.deadLetters} {
		ch <- d
	}
}

// Collect implements prometheus.Collector; called on a scrape's goroutine.
func (c *jobCollector) Collect(ch chan<- prometheus.Metric) {
	for _, j := range c.n.jobs {
		if j.snapshot().Status == StatusRunning {
			j.observe()
		}
		s := j.snapshot()
		up := 0.0
		if s.Status == StatusRunning {
			up = 1
		}
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, up, j.name)
		ch <- prometheus.MustNewConstMetric(c.attempts, prometheus.CounterValue, float64(j.run.Attempts()), j.name)
		ch <- prometheus.MustNewConstMetric(c.completed, prometheus.CounterValue, float64(s.Completed), j.name)
		ch <- prometheus.MustNewConstMetric(c.failed, prometheus.CounterValue, float64(s.Failed), j.name)
		ch <- prometheus.MustNewConstMetric(c.deadLetters, prometheus.CounterValue, float64(j.pj.DeadLetters()), j.name)
		for i := len(s.History) - 1; i >= 0; i-- {
			if h := s.History[i]; h.Status == snapshot.Completed {
				ch <- prometheus.MustNewConstMetric(c.lastDuration, prometheus.GaugeValue, h.Duration.Seconds(), j.name)
				ch <- prometheus.MustNewConstMetric(c.lastSize, prometheus.GaugeValue, float64(h.Size), j.name)
				ch <- prometheus.MustNewConstMetric(c.lastAlignment, prometheus.GaugeValue, h.Alignment.Seconds(), j.name)
				break
			}
		}
	}
}
