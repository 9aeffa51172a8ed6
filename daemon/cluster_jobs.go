package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"
)

// The job list on a worker. The job masters run on the leader, so a
// worker holds no job of its own: GET /jobs asked of it reads the list
// from the leader (GET /jobs?local=1 there, which never forwards again)
// and says which node that is; each job carries the tasks this worker
// hosts of it. When the leader does not answer, the worker lists the jobs
// it hosts tasks of, with a note that says so: never an empty list that
// reads as "nothing runs".

// leaderListWait bounds a worker's read of the leader's job list.
const leaderListWait = 2 * time.Second

// localParam is the query parameter of GET /jobs that asks a node for its
// own jobs only (no read from the leader), and clusterParam the one that
// asks a worker for the cluster's jobs, read from the leader. Without
// either GET /jobs lists the node's own jobs, as it always has: the
// nodes that run job masters are told apart by it.
const (
	localParam   = "local"
	clusterParam = "cluster"
)

// jobsOf reads the job list of node's job masters.
func (p *peerClient) jobsOf(ctx context.Context, node string) (JobList, error) {
	var l JobList
	resp, err := p.do(ctx, http.MethodGet, node, "/jobs?"+localParam+"=1", nil, nil)
	if err != nil {
		return l, err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxPeerAnswer)).Decode(&l); err != nil {
		return l, fmt.Errorf("node %q: GET /jobs: %w", node, err)
	}
	return l, nil
}

// workerJobList is GET /jobs on a worker: the leader's list, each job
// with the tasks this node hosts of it, or, when the leader does not
// answer, the jobs this node hosts tasks of.
func (c *clusterNode) workerJobList(ctx context.Context) JobList {
	leader := c.leader()
	hosted := map[string]int{}
	var order []string
	if c.worker != nil {
		for _, j := range c.worker.Jobs() {
			hosted[j.Job] = len(j.Tasks)
			order = append(order, j.Job)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, leaderListWait)
	defer cancel()
	l, err := c.peers.jobsOf(ctx, leader)
	if err == nil {
		l.Node, l.Leader, l.From = c.cfg.Node, leader, leader
		if l.Jobs == nil {
			l.Jobs = []JobInfo{}
		}
		for i := range l.Jobs {
			n := hosted[l.Jobs[i].Name]
			l.Jobs[i].TasksHere = &n
		}
		return l
	}
	c.log.Warn("cluster: GET /jobs: the leader did not answer; listing the jobs this node hosts tasks of", "leader", leader, "err", err)
	l = JobList{Jobs: []JobInfo{}, Node: c.cfg.Node, Leader: leader, From: c.cfg.Node,
		Note: fmt.Sprintf("the leader %q (it runs the job masters) did not answer (%v): ", leader, err)}
	if len(order) == 0 {
		l.Note += "this node hosts no task of any job; the cluster's jobs are unknown here"
		return l
	}
	l.Note += "these are the jobs this node hosts tasks of, as it runs them; their attempts, checkpoints and errors are known to the leader only"
	for _, name := range order {
		n := hosted[name]
		l.Jobs = append(l.Jobs, JobInfo{Name: name, Status: StatusRunning, TasksHere: &n})
	}
	return l
}
