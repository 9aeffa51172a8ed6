package daemon

import (
	"path/filepath"
	"testing"
)

// The job masters' node reports, keeps and compares the highest epoch it
// deployed or saw: its own deployments' epochs included, also once its
// job stopped (GET /cluster's epoch, edged_cluster_epoch, GET
// /cluster/worker's epoch and data_dir/cluster/epoch never go back).
func TestLeaderEpochStaysAfterItsJobStops(t *testing.T) {
	fc := newFailoverCluster(t, foOptions{})
	_, epoch := fc.startedPlacement("a", 0)
	a := fc.nodes["a"]
	if got := a.c.Status().Epoch; got != epoch {
		t.Fatalf("GET /cluster epoch %d while epoch %d runs", got, epoch)
	}
	j := fc.job("a")
	j.cancel()
	<-j.run.Done()
	if got := a.c.Status().Epoch; got != epoch {
		t.Errorf("GET /cluster epoch %d after the job stopped, want %d", got, epoch)
	}
	if got := a.c.highestEpoch(); got != epoch {
		t.Errorf("highest epoch %d after the job stopped, want %d", got, epoch)
	}
	if got, err := readEpoch(filepath.Join(a.dir, "cluster", "epoch")); err != nil || got != epoch {
		t.Errorf("data_dir/cluster/epoch holds %d (%v), want %d", got, err, epoch)
	}
}
