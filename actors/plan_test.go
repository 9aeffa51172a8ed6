package actors

import (
	"errors"
	"strings"
	"testing"

	"github.com/edgedio/edged/operators"
)

func vtx(id int, name string, p int, source bool) *Vertex {
	v := &Vertex{ID: id, Name: name, UID: name, Parallelism: p, Out: intType()}
	if source {
		v.NewSource = func(*operators.Context) (operators.Operator, error) { return nil, nil }
	} else {
		v.In = intType()
		v.NewOperator = func(*operators.Context, any) (operators.Operator, any, error) { return nil, nil, nil }
	}
	return v
}

func chainNames(p *Plan) string {
	var s []string
	for _, c := range p.Chains {
		s = append(s, c.Name())
	}
	return strings.Join(s, " | ")
}

func TestBuildPlanChains(t *testing.T) {
	a, b, c, d, e := vtx(0, "a", 2, true), vtx(1, "b", 2, false), vtx(2, "c", 2, false), vtx(3, "d", 2, false), vtx(4, "e", 1, false)
	for _, tc := range []struct {
		name  string
		edges []*Edge
		want  string
	}{
		{"all forward", []*Edge{{From: a, To: b}, {From: b, To: c}, {From: c, To: d}, {From: d, To: e, Partition: Rebalance}}, "a -> b -> c -> d | e"},
		{"key-by splits", []*Edge{{From: a, To: b}, {From: b, To: c, Partition: KeyBy, KeyGroup: func(int64) int { return 0 }}, {From: c, To: d}, {From: d, To: e, Partition: Rebalance}}, "a -> b | c -> d | e"},
		{"fan-out splits", []*Edge{{From: a, To: b}, {From: a, To: c}, {From: b, To: d}, {From: c, To: d}, {From: d, To: e, Partition: Rebalance}}, "a | b | c | d | e"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := BuildPlan(&Job{Name: "j", Vertices: []*Vertex{a, b, c, d, e}, Edges: tc.edges})
			if err != nil {
				t.Fatal(err)
			}
			if got := chainNames(p); got != tc.want {
				t.Fatalf("chains %q, want %q", got, tc.want)
			}
		})
	}
}

func TestValidateReportsAllProblems(t *testing.T) {
	a, b := vtx(0, "a", 4, true), vtx(1, "b", 2, false)
	b.UID = "a"
	_, err := BuildPlan(&Job{Name: "j", MaxParallelism: 2, Vertices: []*Vertex{a, b}, Edges: []*Edge{{From: a, To: b}, {From: a, To: b, Partition: KeyBy}}})
	if !errors.Is(err, ErrInvalidJob) {
		t.Fatalf("got %v", err)
	}
	for _, want := range []string{"parallelism 4 exceeds max parallelism 2", `share uid "a"`, "forward needs equal parallelism", "key-by without a key"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
}
