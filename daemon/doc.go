// Package daemon runs an edged node: every pipeline of a config as a job
// (package stream), a REST API to list jobs and their checkpoints, take
// savepoints, stop and cancel jobs, show and steer the node's cluster
// (through the cluster.StatusProvider the node is given), and Prometheus
// metrics. Client talks to that API; the edged CLI uses it.
//
// Concurrency: Run owns the jobs. Each job has one watcher goroutine that
// waits for it and polls its checkpoint history; the HTTP handlers and the
// metrics collector read the job records under the record's mutex. Run
// returns once every job and every goroutine it started has ended.
package daemon
