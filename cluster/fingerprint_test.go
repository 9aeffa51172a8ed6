package cluster

import (
	"errors"
	"strings"
	"testing"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/codec"
	"github.com/edgedio/edged/operators"
)

// testJob builds src(2) -forward-> map(2) -key-by-> agg(3) -rebalance->
// sink(2), and src -broadcast-> rules(2): every partitioner.
func testJob() *actors.Job {
	it := func() actors.ElemType { return actors.TypeOf(codec.For[int64](), nil) }
	src := func(*operators.Context) (operators.Operator, error) { return nil, nil }
	op := func(*operators.Context, any) (operators.Operator, any, error) { return nil, nil, nil }
	v := func(id int, uid string, p int, in, out bool) *actors.Vertex {
		x := &actors.Vertex{ID: id, Name: uid, UID: uid, Parallelism: p}
		if in {
			x.In, x.NewOperator = it(), op
		} else {
			x.NewSource = src
		}
		if out {
			x.Out = it()
		}
		return x
	}
	s, m, a, k, r := v(0, "src", 2, false, true), v(1, "map", 2, true, true), v(2, "agg", 3, true, true), v(3, "sink", 2, true, false), v(4, "rules", 2, true, false)
	a.Keyed = true
	return &actors.Job{Name: "sensors", Vertices: []*actors.Vertex{s, m, a, k, r}, Edges: []*actors.Edge{
		{From: s, To: m, Partition: actors.Forward},
		{From: m, To: a, Partition: actors.KeyBy, KeyGroup: func(int64) int { return 0 }},
		{From: a, To: k, Partition: actors.Rebalance},
		{From: s, To: r, Partition: actors.Broadcast},
	}}
}

func TestFingerprintStable(t *testing.T) {
	f1, err := FingerprintOf(testJob())
	if err != nil {
		t.Fatal(err)
	}
	f2, err := FingerprintOf(testJob())
	if err != nil {
		t.Fatal(err)
	}
	if f1 != f2 {
		t.Fatalf("two builds of one job: %s and %s", f1, f2)
	}
	if err := f1.Check("sensors", "node-b", f2); err != nil {
		t.Fatalf("Check of equal fingerprints: %v", err)
	}
}

func TestFingerprintRefusesMismatch(t *testing.T) {
	base, err := FingerprintOf(testJob())
	if err != nil {
		t.Fatal(err)
	}
	for name, change := range map[string]func(j *actors.Job){
		"parallelism":     func(j *actors.Job) { j.Vertices[2].Parallelism = 4 },
		"uid":             func(j *actors.Job) { j.Vertices[1].UID = "map2" },
		"partitioner":     func(j *actors.Job) { j.Edges[2].Partition = actors.Broadcast },
		"max parallelism": func(j *actors.Job) { j.MaxParallelism = 256 },
		"edge order":      func(j *actors.Job) { j.Edges[2], j.Edges[3] = j.Edges[3], j.Edges[2] },
		"side output": func(j *actors.Job) {
			j.Vertices[0].SideOutputs = map[string]actors.ElemType{"late": j.Vertices[0].Out}
		},
		"input type": func(j *actors.Job) {
			j.Vertices[4].In = actors.TypeOf(codec.For[int32](), nil)
			j.Vertices[0].Out = j.Vertices[4].In
			j.Vertices[1].In = j.Vertices[4].In
		},
		"chaining": func(j *actors.Job) { j.Vertices[1].NoChain = true },
		"job name": func(j *actors.Job) { j.Name = "other" },
		"settings": func(j *actors.Job) { j.Settings = "window 2s" },
	} {
		j := testJob()
		change(j)
		f, err := FingerprintOf(j)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		err = base.Check("sensors", "node-b", f)
		if !errors.Is(err, ErrPlanMismatch) {
			t.Errorf("%s: Check = %v, want ErrPlanMismatch", name, err)
			continue
		}
		if !strings.Contains(err.Error(), `node "node-b" runs plan `+f.Short()) {
			t.Errorf("%s: error %q does not name the peer and its plan", name, err)
		}
	}
}

func TestFingerprintInvalidJob(t *testing.T) {
	j := testJob()
	j.Vertices[0].UID = ""
	if _, err := FingerprintOf(j); !errors.Is(err, actors.ErrInvalidJob) {
		t.Fatalf("FingerprintOf(invalid) = %v, want ErrInvalidJob", err)
	}
}

// Both ends derive the same channel names from the plan, for every
// partitioner.
func TestPlanChannels(t *testing.T) {
	ids, err := PlanChannels(testJob(), 5)
	if err != nil {
		t.Fatal(err)
	}
	again, err := PlanChannels(testJob(), 5)
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != len(again) {
		t.Fatalf("two derivations: %d and %d channels", len(ids), len(again))
	}
	per := map[int]int{}
	for i, id := range ids {
		if id != again[i] {
			t.Fatalf("channel %d: %s and %s", i, id, again[i])
		}
		if i > 0 && ids[i-1].Compare(id) >= 0 {
			t.Fatalf("channels not in order: %s before %s", ids[i-1], id)
		}
		if id.Job != "sensors" || id.Epoch != 5 {
			t.Fatalf("channel %s: wrong job or epoch", id)
		}
		per[id.Edge]++
	}
	// The forward edge src->map is chained (src has two outputs, so it is
	// not: 2 channels i->i); key-by 2x3; rebalance 3x2; broadcast 2x2.
	want := map[int]int{0: 2, 1: 6, 2: 6, 3: 4}
	for e, n := range want {
		if per[e] != n {
			t.Errorf("edge %d: %d channels, want %d (all: %v)", e, per[e], n, per)
		}
	}
	for _, id := range ids {
		if id.Edge == 0 && id.From != id.To {
			t.Errorf("forward channel %s joins different subtasks", id)
		}
	}
	// A chained forward edge has no channel.
	j := testJob()
	j.Edges = j.Edges[:3]
	j.Vertices = j.Vertices[:4]
	ids, err = PlanChannels(j, 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if id.Edge == 0 {
			t.Fatalf("chained edge has channel %s", id)
		}
	}
}

// Jobs with the same graph differ by their settings digest: the same
// digest, the same fingerprint; another one, a mismatch.
func TestFingerprintCoversSettings(t *testing.T) {
	of := func(settings string) Fingerprint {
		j := testJob()
		j.Settings = settings
		f, err := FingerprintOf(j)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	if of("window 1s") != of("window 1s") {
		t.Fatal("the same settings: fingerprints differ")
	}
	if err := of("window 1s").Check("sensors", "node-b", of("window 2s")); !errors.Is(err, ErrPlanMismatch) {
		t.Fatalf("other settings: Check = %v, want ErrPlanMismatch", err)
	}
}
