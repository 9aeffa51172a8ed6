package test

import (
	"bytes"
	"context"
	"net/http"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// edgedList runs edged list against m and returns its output.
func edgedList(t *testing.T, m *clusterMember) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, edgedBin, "list", "--addr", m.apiAddr)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("edged list on %s: %v\n%s", m.id, err, stderr.String())
	}
	t.Logf("edged list on %s:\n%s", m.id, stdout.String())
	return stdout.String()
}

// jobLine returns the line of out that lists job, split into its columns.
func jobLine(out, job string) []string {
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] == job {
			return f
		}
	}
	return nil
}

// edged list (GET /jobs) asked of a worker lists the cluster's jobs, read
// from the leader, and says so: which node is the leader, and how many
// tasks of each job the worker hosts. Before, a worker answered an empty
// list, as if nothing ran. With the leader not answering (stopped with
// SIGSTOP) the worker says that, and lists the jobs it hosts tasks of.
func TestClusterWorkerListsTheClustersJobs(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test with three subprocesses")
	}
	members := startCluster(t, false)
	a, b := members[0], members[1]
	out := edgedList(t, a)
	if !strings.Contains(out, "node a, the leader: it runs the job masters") {
		t.Fatalf("edged list on the leader does not say it is the leader:\n%s", out)
	}
	out = edgedList(t, b)
	if !strings.Contains(out, "node b, a worker; the jobs of the leader, node a, which runs the job masters") {
		t.Fatalf("edged list on worker b does not name the leader:\n%s", out)
	}
	// NAME STATUS ATTEMPTS CHECKPOINTING DEAD LETTERS TASKS HERE ERROR
	if f := jobLine(out, "sensors"); len(f) < 6 || f[1] != "running" || f[2] != "1" || f[5] == "0" {
		t.Fatalf("edged list on worker b: the job sensors is not listed running with b's tasks:\n%s", out)
	}
	var l struct {
		Jobs []struct {
			Name      string `json:"name"`
			Status    string `json:"status"`
			TasksHere *int   `json:"tasks_here"`
		} `json:"jobs"`
		Node, Leader, From string
	}
	if err := b.get(&http.Client{Timeout: 10 * time.Second}, "/jobs?cluster=1", &l); err != nil {
		t.Fatal(err)
	}
	if l.Node != "b" || l.Leader != "a" || l.From != "a" || len(l.Jobs) != 1 || l.Jobs[0].Name != "sensors" ||
		l.Jobs[0].TasksHere == nil || *l.Jobs[0].TasksHere == 0 {
		t.Fatalf("GET /jobs on b: %+v", l)
	}

	if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	out = edgedList(t, b)
	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "node b, a worker; the leader, node a, did not answer") ||
		!strings.Contains(out, "these are the jobs this node hosts tasks of") {
		t.Fatalf("edged list on worker b with the leader stopped:\n%s", out)
	}
	if f := jobLine(out, "sensors"); len(f) < 6 || f[1] != "running" || f[2] != "-" || f[5] == "0" {
		t.Fatalf("edged list on worker b with the leader stopped: the job sensors is not listed with b's tasks:\n%s", out)
	}
}
