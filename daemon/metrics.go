package daemon

import (
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgedio/edged/cluster"
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
		deadLetters:   prometheus.NewDesc("edged_job_dead_letters_total", "Records sent to the dead-letter output by the subtasks on this node.", l, nil),
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
	// A cluster's worker counts the dead letters of the subtasks it
	// hosts, of jobs whose masters run elsewhere.
	jobs := c.n.jobList()
	for name, total := range c.n.deadCounts.hostedTotals() {
		if !slices.ContainsFunc(jobs, func(j *job) bool { return j.name == name }) {
			ch <- prometheus.MustNewConstMetric(c.deadLetters, prometheus.CounterValue, float64(total), name)
		}
	}
	for _, j := range jobs {
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
		ch <- prometheus.MustNewConstMetric(c.deadLetters, prometheus.CounterValue, float64(c.n.nodeDeadLetters(j)), j.name)
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

// clusterCollector exports the node's view of its cluster, read from the
// cluster's StatusProvider at scrape time. On a node without a cluster it
// exports edged_cluster_enabled 0 and nothing else.
type clusterCollector struct {
	n *node

	enabled, members, isLeader, leader, epoch, seesMajority, keyGroups, subtasks,
	failovers, rebalances, handbacks, lastHandback, lastFailover, lastFailoverAt, lastRebalancePause, lastRebalanceMoved,
	lastRebalanceBytes, lastRebalanceAt, rebalancesByMode, rebalancePause *prometheus.Desc
}

func newClusterCollector(n *node) *clusterCollector {
	return &clusterCollector{
		n:                  n,
		enabled:            prometheus.NewDesc("edged_cluster_enabled", "1 when the node runs a cluster, else 0.", nil, nil),
		members:            prometheus.NewDesc("edged_cluster_members", "Members this node knows, by state (alive, suspect, dead, left).", []string{"state"}, nil),
		isLeader:           prometheus.NewDesc("edged_cluster_is_leader", "1 when this node is the cluster's leader, else 0.", nil, nil),
		leader:             prometheus.NewDesc("edged_cluster_leader", "1 for the leader this node follows (absent while it knows none).", []string{"leader"}, nil),
		epoch:              prometheus.NewDesc("edged_cluster_epoch", "Highest epoch this node deployed or saw (the placement it runs, or ran last: it does not go back when a job stops).", nil, nil),
		seesMajority:       prometheus.NewDesc("edged_cluster_sees_majority", "1 while this node sees a majority of the cluster (it owns nothing otherwise), else 0.", nil, nil),
		keyGroups:          prometheus.NewDesc("edged_cluster_key_groups_owned", "Key groups owned by a node's subtasks under the current placement, summed over the keyed operators.", []string{"node"}, nil),
		subtasks:           prometheus.NewDesc("edged_cluster_subtasks_owned", "Keyed subtasks a node runs under the current placement.", []string{"node"}, nil),
		failovers:          prometheus.NewDesc("edged_cluster_failovers_total", "Failovers seen since this node started.", nil, nil),
		rebalances:         prometheus.NewDesc("edged_cluster_rebalances_total", "Rebalances since this node started (refused and failed ones included).", nil, nil),
		handbacks:          prometheus.NewDesc("edged_cluster_handbacks_total", "Hand-backs of the leadership this node took part in since it started (failed ones included).", nil, nil),
		lastHandback:       prometheus.NewDesc("edged_cluster_last_handback_seconds", "Durations of the latest hand-back of the leadership by step (savepoint, replicate, takeover, restore).", []string{"step", "outcome"}, nil),
		lastFailover:       prometheus.NewDesc("edged_cluster_last_failover_seconds", "Durations of the latest failover by phase (detection, placement, restore, first_record, total).", []string{"phase"}, nil),
		lastFailoverAt:     prometheus.NewDesc("edged_cluster_last_failover_timestamp_seconds", "When the latest failover's dead node was declared dead (Unix time).", nil, nil),
		lastRebalancePause: prometheus.NewDesc("edged_cluster_last_rebalance_pause_seconds", "How long each moved subtask paused in the latest rebalance.", []string{"subtask"}, nil),
		lastRebalanceMoved: prometheus.NewDesc("edged_cluster_last_rebalance_moved_key_groups", "Key groups that changed node in the latest rebalance.", []string{"trigger", "outcome"}, nil),
		lastRebalanceBytes: prometheus.NewDesc("edged_cluster_last_rebalance_bytes_shipped", "State bytes shipped to new owners in the latest rebalance.", nil, nil),
		lastRebalanceAt:    prometheus.NewDesc("edged_cluster_last_rebalance_timestamp_seconds", "When the latest rebalance started (Unix time).", nil, nil),
		rebalancesByMode: prometheus.NewDesc("edged_cluster_rebalances_by_mode_total",
			"Rebalances since this node started, by trigger (join, drain, manual), mode (handover: only the moved subtasks paused; redeploy: every job restarted from a savepoint; none: nothing moved) and outcome (done, refused, aborted, fell-back, failed).",
			[]string{"trigger", "mode", "outcome"}, nil),
		rebalancePause: prometheus.NewDesc("edged_cluster_rebalance_pause_seconds",
			"How long each moved subtask paused, over every rebalance since this node started, by mode (handover or redeploy).",
			[]string{"mode"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *clusterCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.enabled, c.members, c.isLeader, c.leader, c.epoch, c.seesMajority, c.keyGroups,
		c.subtasks, c.failovers, c.rebalances, c.handbacks, c.lastHandback, c.lastFailover, c.lastFailoverAt, c.lastRebalancePause, c.lastRebalanceMoved,
		c.lastRebalanceBytes, c.lastRebalanceAt, c.rebalancesByMode, c.rebalancePause} {
		ch <- d
	}
}

// Collect implements prometheus.Collector; called on a scrape's goroutine.
func (c *clusterCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.n.clusterStatus()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	b := func(v bool) float64 {
		if v {
			return 1
		}
		return 0
	}
	gauge(c.enabled, b(s.Enabled))
	if !s.Enabled {
		return
	}
	for st, n := range s.MembersByState() {
		gauge(c.members, float64(n), string(st))
	}
	gauge(c.isLeader, b(s.Leader != "" && s.Leader == s.Node))
	if s.Leader != "" {
		gauge(c.leader, 1, s.Leader)
	}
	gauge(c.epoch, float64(s.Epoch))
	if me, ok := s.Member(s.Node); ok {
		gauge(c.seesMajority, b(me.SeesMajority))
	}
	owned := s.KeyGroupsOwned()
	for _, p := range s.Placement {
		gauge(c.keyGroups, float64(owned[p.Node]), p.Node)
		gauge(c.subtasks, float64(len(p.Subtasks)), p.Node)
	}
	ch <- prometheus.MustNewConstMetric(c.failovers, prometheus.CounterValue, float64(s.FailoversTotal))
	ch <- prometheus.MustNewConstMetric(c.rebalances, prometheus.CounterValue, float64(s.RebalancesTotal))
	ch <- prometheus.MustNewConstMetric(c.handbacks, prometheus.CounterValue, float64(s.HandbacksTotal))
	if len(s.Handbacks) > 0 {
		// Only the steps this node timed: its record holds 0 for the
		// others, which the other node of the hand-back timed.
		h := s.Handbacks[0]
		for _, step := range cluster.HandbackSteps {
			if h.TimedBy(s.Node, step) {
				gauge(c.lastHandback, h.StepMS(step)/1000, step, h.Outcome)
			}
		}
	}
	if len(s.Failovers) > 0 {
		f := s.Failovers[0]
		for phase, v := range map[string]float64{"detection": f.DetectionMS, "placement": f.PlacementMS,
			"restore": f.RestoreMS, "first_record": f.FirstRecordMS, "total": f.TotalMS()} {
			gauge(c.lastFailover, v/1000, phase)
		}
		gauge(c.lastFailoverAt, float64(f.At.UnixMilli())/1000)
	}
	if len(s.Rebalances) > 0 {
		r := s.Rebalances[0]
		for sub, v := range r.PauseMS {
			gauge(c.lastRebalancePause, v/1000, sub)
		}
		gauge(c.lastRebalanceMoved, float64(r.MovedKeyGroups), string(r.Trigger), string(r.Outcome))
		gauge(c.lastRebalanceBytes, float64(r.BytesShipped))
		gauge(c.lastRebalanceAt, float64(r.At.UnixMilli())/1000)
	}
	if rc, ok := c.n.clusterProvider().(rebalanceCounter); ok {
		rc.rebalances().collect(ch, c.rebalancesByMode, c.rebalancePause)
	}
}

// rebalancePauseBuckets are the upper bounds, in seconds, of the
// histogram of the moved subtasks' pauses: from a handover's tens of
// milliseconds to a redeployment's seconds.
var rebalancePauseBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

// rebalanceKey labels one count of rebalanceTally.
type rebalanceKey struct {
	trigger, mode, outcome string
}

// pauseHist is the histogram of one mode's pauses.
type pauseHist struct {
	buckets []uint64 // cumulative counts, one per rebalancePauseBuckets
	count   uint64
	sum     float64 // seconds
}

// rebalanceTally counts the rebalances a node ran by trigger, mode and
// outcome, and the moved subtasks' pauses by mode, for the metrics. The
// history (cluster.Status.Rebalances) keeps only the latest ones; the
// tally counts every one since the node started. Safe for concurrent use.
type rebalanceTally struct {
	mu     sync.Mutex // guards counts and pauses
	counts map[rebalanceKey]uint64
	pauses map[string]*pauseHist
}

// modeLabel is the mode label of r: "none" when nothing moved (refused,
// aborted, or every job ran on the placement already).
func modeLabel(r cluster.Rebalance) string {
	if r.Mode == "" {
		return "none"
	}
	return string(r.Mode)
}

// add counts rec, once it has its outcome, and its moved subtasks'
// pauses.
func (t *rebalanceTally) add(rec cluster.Rebalance) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.counts == nil {
		t.counts, t.pauses = map[rebalanceKey]uint64{}, map[string]*pauseHist{}
	}
	mode := modeLabel(rec)
	t.counts[rebalanceKey{trigger: string(rec.Trigger), mode: mode, outcome: string(rec.Outcome)}]++
	if len(rec.PauseMS) == 0 {
		return
	}
	h := t.pauses[mode]
	if h == nil {
		h = &pauseHist{buckets: make([]uint64, len(rebalancePauseBuckets))}
		t.pauses[mode] = h
	}
	for _, ms := range rec.PauseMS {
		s := ms / 1000
		h.count++
		h.sum += s
		for i, le := range rebalancePauseBuckets {
			if s <= le {
				h.buckets[i]++
			}
		}
	}
}

// collect sends the tally's metrics to ch.
func (t *rebalanceTally) collect(ch chan<- prometheus.Metric, byMode, pause *prometheus.Desc) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for k, n := range t.counts {
		ch <- prometheus.MustNewConstMetric(byMode, prometheus.CounterValue, float64(n), k.trigger, k.mode, k.outcome)
	}
	for mode, h := range t.pauses {
		b := make(map[float64]uint64, len(rebalancePauseBuckets))
		for i, le := range rebalancePauseBuckets {
			b[le] = h.buckets[i]
		}
		ch <- prometheus.MustNewConstHistogram(pause, h.count, h.sum, b, mode)
	}
}

// rebalanceCounter is a cluster.StatusProvider that also counts every
// rebalance it ran (the daemon's clusterNode); the metrics export the
// counts when the provider is one.
type rebalanceCounter interface {
	rebalances() *rebalanceTally
}

func (c *clusterNode) rebalances() *rebalanceTally { return &c.tally }
