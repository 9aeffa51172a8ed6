package daemon

import (
	"testing"

	"github.com/edgedio/edged/snapshot"
)

func TestMergeHistory(t *testing.T) {
	st := func(id snapshot.ID, s snapshot.Status) snapshot.Stats {
		return snapshot.Stats{Checkpoint: id, Kind: snapshot.KindCheckpoint, Status: s}
	}
	ip, ok, bad := snapshot.InProgress, snapshot.Completed, snapshot.Failed
	tests := []struct {
		name              string
		prev, cur         []snapshot.Stats
		limit             int
		want              []snapshot.ID
		completed, failed int
	}{
		{"empty", nil, nil, 3, nil, 0, 0},
		{"new", nil, []snapshot.Stats{st(1, ok), st(2, bad), st(3, ip)}, 5, []snapshot.ID{1, 2, 3}, 1, 1},
		{"seen again", []snapshot.Stats{st(1, ok)}, []snapshot.Stats{st(1, ok)}, 5, []snapshot.ID{1}, 0, 0},
		{"completes later", []snapshot.Stats{st(1, ip)}, []snapshot.Stats{st(1, ok), st(2, ip)}, 5, []snapshot.ID{1, 2}, 1, 0},
		{"gone from runtime (job ended)", []snapshot.Stats{st(1, ok), st(2, ok)}, nil, 5, []snapshot.ID{1, 2}, 0, 0},
		{"trimmed to limit", []snapshot.Stats{st(1, ok), st(2, ok)}, []snapshot.Stats{st(3, ok), st(4, bad)}, 3, []snapshot.ID{2, 3, 4}, 1, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			prev := append([]snapshot.Stats(nil), tt.prev...)
			got, c, f := mergeHistory(tt.prev, tt.cur, tt.limit)
			var ids []snapshot.ID
			for _, s := range got {
				ids = append(ids, s.Checkpoint)
			}
			if len(ids) != len(tt.want) {
				t.Fatalf("ids = %v, want %v", ids, tt.want)
			}
			for i := range ids {
				if ids[i] != tt.want[i] {
					t.Fatalf("ids = %v, want %v", ids, tt.want)
				}
			}
			if c != tt.completed || f != tt.failed {
				t.Errorf("completed, failed = %d, %d; want %d, %d", c, f, tt.completed, tt.failed)
			}
			for i := range prev {
				if tt.prev[i] != prev[i] {
					t.Errorf("prev modified")
				}
			}
		})
	}
}
